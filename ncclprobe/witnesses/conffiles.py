"""The nccl.conf files that apply to a process, parsed the way NCCL parses them, and what each would
add to its environment.

NCCL's initEnv (src/misc/param.cc) reads `$NCCL_CONF_FILE` (NCCL >= 2.23, instead of ~/.nccl.conf;
`~` not expanded, relative to the process's cwd) or `~/.nccl.conf` (home of the process's uid), then
`/etc/nccl.conf`, applying each line with setenv(name, value, 0): a real variable always wins, and the
first file to set a name wins over later ones (nccl-internals §1.1).

A file that cannot be read is absent (ENOENT, ENOTDIR: NCCL's fopen fails the same way and it reads
nothing), refused (EACCES, EPERM: the file or a directory above it; whether it exists cannot be told),
out of sight (NotVisible: the process's root cannot be entered), or there but unreadable.
"""
from __future__ import annotations

import errno
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

CONF_FILE_SINCE = (2, 23)  # NCCL_CONF_FILE honoured from 2.23.4 (src/misc/param.cc)
COMMENTS_SINCE = (2, 26)  # lines starting with '#' skipped from 2.26
_MAX = 1023  # envVar/envValue buffers are char[1024]
_ABSENT = (errno.ENOENT, errno.ENOTDIR)
_REFUSED = (errno.EACCES, errno.EPERM)


class NotVisible(OSError):
    """read_text cannot look at any path of the process (its root cannot be entered): the message says why."""


@dataclass(frozen=True)
class ConfEntry:
    var: str
    value: str
    line: int
    effect: str  # applies | env wins | earlier file wins | unknown (environment unreadable)
    note: str = ""

    def to_json(self) -> dict:
        return {"var": self.var, "value": self.value, "line": self.line, "effect": self.effect,
                "note": self.note}


@dataclass(frozen=True)
class ConfFile:
    path: str  # as the process sees it
    role: str  # NCCL_CONF_FILE | ~/.nccl.conf | /etc/nccl.conf
    exists: bool | None  # None: cannot be told (refused, or out of sight)
    reason: str | None = None  # why it could not be read, or why NCCL would not read it
    entries: tuple[ConfEntry, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {"path": self.path, "role": self.role, "exists": self.exists, "reason": self.reason,
                "entries": [e.to_json() for e in self.entries]}


def parse(text: str, comments: bool = True) -> list[tuple[int, str, str, str]]:
    """(line, name, value, note) as NCCL's setEnvFile reads them: the name is everything before the
    first '=' (no trimming), the value everything after, each cut at 1023 bytes; lines without '='
    are ignored; '#' lines are skipped from 2.26 (before, they set a variable named '#...')."""
    out = []
    for lineno, line in enumerate(text.split("\n"), 1):
        if comments and line.startswith("#"):
            continue
        name, eq, value = line.partition("=")
        if not eq:
            continue
        note = ""
        if name != name.strip() or " " in name or name.startswith("export"):
            note = "NCCL takes the name literally (spaces, 'export' included); no variable of this name is read"
        elif value != value.strip() or value[:1] in ("'", '"'):
            note = "NCCL keeps spaces and quotes in the value"
        out.append((lineno, name[:_MAX], value[:_MAX], note))
    return out


def _version_tuple(version: str | None) -> tuple[int, int] | None:
    try:
        major, minor = version.split(".")[:2]  # type: ignore[union-attr]
        return int(major), int(minor)
    except (AttributeError, ValueError):
        return None


def home_of(uid: int | None, read_text: Callable[[str], str]) -> str | None:
    """The uid's home from /etc/passwd inside the process's root (getpwuid, as NCCL calls it);
    NotVisible propagates: then the home is not known to be absent."""
    if uid is None:
        return None
    try:
        text = read_text("/etc/passwd")
    except NotVisible:
        raise
    except OSError:
        return None
    for line in text.split("\n"):
        parts = line.split(":")
        if len(parts) >= 6 and parts[2] == str(uid):
            return parts[5]
    return None


def applicable(env: Mapping[str, str] | None, uid: int | None, nccl_version: str | None,
               read_text: Callable[[str], str], cwd: str | None = None) -> list[ConfFile]:
    """The conf files NCCL would read in this process, in order, with each entry's effect.

    read_text(path) reads a path as the process sees it (inside its root); it raises OSError
    (NotVisible when no path of the process can be looked at)."""
    ver = _version_tuple(nccl_version)
    conf_env = (env or {}).get("NCCL_CONF_FILE", "")
    candidates: list[tuple[str, str, ConfFile | None]] = []  # a ConfFile: decided without reading
    if conf_env and (ver is None or ver >= CONF_FILE_SINCE):
        path = conf_env if conf_env.startswith("/") or not cwd else f"{cwd.rstrip('/')}/{conf_env}"
        candidates.append((path, "NCCL_CONF_FILE", None))
    else:
        try:
            home = home_of(uid, read_text)
        except NotVisible as exc:
            candidates.append(("~/.nccl.conf", "~/.nccl.conf", unread("~/.nccl.conf", "~/.nccl.conf", exc)))
        else:
            if home:
                candidates.append((f"{home.rstrip('/')}/.nccl.conf", "~/.nccl.conf", None))
        if conf_env:
            candidates.append((conf_env, "NCCL_CONF_FILE", ConfFile(
                conf_env, "NCCL_CONF_FILE", exists=False, reason=f"ignored before NCCL 2.23 (this is {nccl_version})")))
    candidates.append(("/etc/nccl.conf", "/etc/nccl.conf", None))

    out: list[ConfFile] = []
    set_by: dict[str, str] = {}
    comments = ver is None or ver >= COMMENTS_SINCE
    for path, role, decided in candidates:
        if decided is not None:
            out.append(decided)
            continue
        try:
            text = read_text(path)
        except OSError as exc:
            out.append(unread(path, role, exc))
            continue
        entries = []
        for lineno, name, value, note in parse(text, comments):
            if env is None:
                effect = "unknown"
            elif name in env:
                effect = "env wins"
            elif name in set_by:
                effect = "earlier file wins"
            else:
                effect = "applies"
                set_by[name] = path
            entries.append(ConfEntry(name, value, lineno, effect, note))
        out.append(ConfFile(path, role, exists=True, entries=tuple(entries)))
    return out


def unread(path: str, role: str, exc: OSError) -> ConfFile:
    """The file read_text could not read, with what that error says about it and nothing more."""
    if isinstance(exc, NotVisible):
        return ConfFile(path, role, exists=None, reason=f"cannot tell whether it exists: {exc}")
    if exc.errno in _ABSENT:
        return ConfFile(path, role, exists=False)
    if exc.errno in _REFUSED:  # the file's mode or a directory above it: either way, nothing is known of it
        return ConfFile(path, role, exists=None, reason="cannot be read: permission denied")
    return ConfFile(path, role, exists=True, reason=f"unreadable: {exc.strerror or exc}")


def describe(conf: Mapping) -> str:
    """One line for a conf file (its JSON form): the role, the path where it differs, and what the file
    sets or why it sets nothing."""
    where = conf["role"] if conf["role"] == conf["path"] else f"{conf['role']} {conf['path']}"
    applied = [f"{e['var']}={e['value']}" for e in conf["entries"] if e["effect"] == "applies"]
    return f"{where}: " + (", ".join(applied) or conf["reason"] or "nothing applies")
