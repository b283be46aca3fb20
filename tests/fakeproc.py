"""A fake /proc under a test's tmp_path, and a reader that injects errors (CI runs as root, where
chmod 000 proves nothing)."""
from __future__ import annotations

import errno
import os
from pathlib import Path

from ncclprobe.witnesses.procs import Reader

BTIME = 1_700_000_000


class FakeProc:
    """`add` writes a process's files. `errors` collects the reads a real kernel refuses for what was
    added (`environ_error`); `reader()` raises them, as the kernel would."""

    def __init__(self, base: Path):
        self.errors: dict[tuple[int, str], BaseException | type] = {}
        self.owners: dict[int, int] = {}  # uid of /proc/<pid> where chown is not permitted (not root)
        self.root = base / "proc"
        self.root.mkdir(parents=True)
        (self.root / "stat").write_text(f"cpu  1 2 3 4\nbtime {BTIME}\n")
        (self.root / "self" / "ns").mkdir(parents=True)
        os.symlink("mnt:[4026531840]", self.root / "self" / "ns" / "mnt")

    def add(self, pid: int, ppid: int, comm: str = "python", cmdline: list[str] | None = None,
            env: dict[str, str] | bytes | None = None, maps: list[str] = (), state: str = "S",
            uid: int = 1000, start: int = 100, fds: list[str] = (), exe: str = "/usr/bin/python3",
            root: str = "/", cwd: str = "/", span: tuple[int, int, int, int] | None = None,
            flags: int = 0x400000, tgid: int | None = None,
            environ_error: BaseException | type | None = None) -> Path:
        """environ_error: what reading environ raises, e.g. `esrch()` for a zombie or a kernel thread
        on Linux >= 6.x, where the read fails instead of returning 0 bytes (needs `reader()`)."""
        d = self.root / str(pid)
        if environ_error is not None:
            self.errors[(pid, "environ")] = environ_error
        d.mkdir()
        try:
            os.chown(d, uid, -1)  # the kernel gives /proc/<pid> the task's euid
        except PermissionError:
            self.owners[pid] = uid  # seen through reader()
        if isinstance(env, bytes):
            raw = env
        else:
            raw = b"".join(f"{k}={v}".encode() + b"\0" for k, v in (env or {}).items())
        # stat's env_start..env_end spans the block, as the kernel shows it (empty block: start == end)
        span = span or (1000 + pid, 2000 + pid, 3000 + pid, 3000 + pid + len(raw))
        fields = [state, str(ppid), str(pid), str(pid), "0", "-1", str(flags)] + ["0"] * 12 + [str(start)]
        fields += ["0"] * (45 - len(fields)) + [str(x) for x in span] + ["0"]  # fields 48-51, then exit_code
        (d / "stat").write_text(f"{pid} ({comm}) " + " ".join(fields) + "\n")
        (d / "status").write_text(f"Name:\t{comm}\nState:\t{state}\nTgid:\t{tgid or pid}\nPid:\t{pid}\n"
                                  f"PPid:\t{ppid}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
        cmd = cmdline if cmdline is not None else [comm]
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in cmd))
        (d / "environ").write_bytes(raw)
        lines = []
        for i, path in enumerate(maps):
            addr = 0x7f0000000000 + i * 0x10000
            lines.append(f"{addr:x}-{addr + 0x1000:x} r--p 00000000 08:01 {1000 + i} {path}")
            lines.append(f"{addr + 0x1000:x}-{addr + 0x2000:x} r-xp 00001000 08:01 {1000 + i} {path}")
        if any(t.startswith("/dev/nvidia") for t in fds):  # CUDA maps the control device
            lines.append("7ffc00000000-7ffc00001000 rw-s 00000000 00:05 501 /dev/nvidiactl")
        lines.append("7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]")
        (d / "maps").write_text("\n".join(lines) + "\n")
        (d / "fd").mkdir()
        for i, target in enumerate(fds):
            os.symlink(target, d / "fd" / str(i))
        os.symlink(exe, d / "exe")
        os.symlink(root, d / "root")
        os.symlink(cwd, d / "cwd")
        (d / "ns").mkdir()
        os.symlink("mnt:[4026531840]", d / "ns" / "mnt")
        return d

    def reader(self, extra: dict[tuple[int, str], BaseException | type] | None = None) -> "FailingReader":
        return FailingReader({**self.errors, **(extra or {})}, self.owners)


def esrch() -> ProcessLookupError:
    """What Linux 6.x raises reading /proc/<pid>/environ of a process without an mm (zombie, kthread)."""
    return ProcessLookupError(errno.ESRCH, "No such process")


class FailingReader(Reader):
    """Raises `errors[(pid, file)]` (an exception instance or class) when that file is read."""

    def __init__(self, errors: dict[tuple[int, str], BaseException | type], owners: dict[int, int] | None = None):
        self.errors = errors
        self.owners = owners or {}

    def _check(self, path: Path):
        parts = Path(path).parts
        for (pid, name), exc in self.errors.items():
            if str(pid) in parts and parts[-1] == name:
                raise exc if isinstance(exc, BaseException) else exc(13 if exc is PermissionError else 2, name)

    def read_bytes(self, path):
        self._check(path)
        return super().read_bytes(path)

    def readlink(self, path):
        self._check(path)
        return super().readlink(path)

    def listdir(self, path):
        self._check(path)
        return super().listdir(path)

    def owner(self, path):
        """The stat of /proc/<pid> itself fails with errors[(pid, "owner")]."""
        exc = self.errors.get((int(Path(path).name), "owner")) if Path(path).name.isdigit() else None
        if exc is not None:
            raise exc if isinstance(exc, BaseException) else exc(13 if exc is PermissionError else 2, "owner")
        uid = self.owners.get(int(Path(path).name)) if Path(path).name.isdigit() else None
        return uid if uid is not None else super().owner(path)
