"""Wiring the boot probe (probes/ncclprobe_boot.py) into Python interpreters.

Ephemeral (`ncclprobe run`): ephemeral_env() prepares a fresh directory holding a sitecustomize.py
that runs the probe (in two files as below, unless with a profile) and then the sitecustomize that
would have run without it; the caller puts the returned variables (PYTHONPATH first of all) into the
command's environment. `python -E/-I/-S` and launchers that drop PYTHONPATH lose it (user-pain.md §4):
their processes have no process_start.

Persistent (`ncclprobe inject install`): a uniquely named .pth (plus PEP 829 .start) and the probe
module (with the rest of the probe, loaded on first use, in a second file) in the interpreter's
site-packages. site reads .pth files even under -I and -E; only -S
disables it, and status() lists live processes of that interpreter that ran without it.
"""
from __future__ import annotations

import ast
import json
import os
import py_compile
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ncclprobe import __version__

from ncclprobe.commands import logdir
from ncclprobe._lib import lib_path, ncclprobe_boot as _boot
from ncclprobe.doc import Result, Table, Text, Title, Unexaminable
from ncclprobe.witnesses.events import read_dirs
from ncclprobe.commands.profile import Profile, parse as parse_profile
from ncclprobe.model.watched import is_watched, redact_argv

BOOT_FILE = "ncclprobe_boot.py"
MODULE = "_ncclprobe_boot"
# site reads a directory's .pth files in sorted order: '00' puts ours before the others, so the
# guard is already in place when other .pth-imported code touches os.environ.
PTH = "00_ncclprobe_boot.pth"
START = "00_ncclprobe_boot.start"  # PEP 829 (3.15+): disables the import line of the same-named .pth
INSTALLED_LINE = "INSTALLED = None"
# What every interpreter needs at start stays in MODULE; what follows this line of the probe (profile
# parser, recording of guarded writes) goes into REST, which MODULE runs on first use (start-up cost).
REST_LINE = "# ncclprobe: the rest of the probe"
REST = f"{MODULE}_rest"
REST_HEADER = ("# ncclprobe boot probe, the part only some processes need (written by ncclprobe `inject install` or\n"
               "# `run`): {module}._rest() runs it in the namespace of {module}; it is no module of its own.\n\n")
RECENT = 20
# Where probes installed by older versions log without --dir: a name anyone can create first.
LEGACY_DEFAULT = "/tmp/ncclprobe-{uid}"
DEFAULT_SCHEME = "runtime-or-home"  # the INSTALLED key "default_log_dir": the probe's default_log_dir()

SITECUSTOMIZE = '''\
"""ncclprobe ephemeral boot (written by `ncclprobe run`): runs the probe, then the sitecustomize
that would have run without it."""


def _ncclprobe_boot_and_chain():
    import os
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        import ncclprobe_boot
        ncclprobe_boot.RUN_DIR = os.path.dirname(here)  # the probe's directory is made in run's log directory
        ncclprobe_boot.start()
    except Exception:
        pass  # the probe never stops the interpreter
    # leave sys.path as it would have been; children still get PYTHONPATH from the environment
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
    try:  # the import system's own modules: importlib.util would import contextlib & co. at start-up
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder
    except ImportError:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec
    spec = PathFinder.find_spec("sitecustomize", sys.path)
    if spec is None or spec.loader is None:
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module  # `import sitecustomize` in site returns this one
    spec.loader.exec_module(module)


_ncclprobe_boot_and_chain()
'''


def _boot_source() -> str:
    path = lib_path(BOOT_FILE)
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise Unexaminable(f"the boot probe is not built ({path}: {exc.strerror})", reason="not built",
                           data={"hint": "run `python probes/build.py` or reinstall ncclprobe"}) from None


def _boot_files(module: str, installed: dict | None = None) -> list[tuple[str, str]]:
    """The probe as two files: <module>.py, what every interpreter loads (INSTALLED set to `installed`),
    and <module>_rest.py, what _rest() runs on first use (start-up cost: most interpreters never do)."""
    source = _boot_source()
    if source.count(INSTALLED_LINE) != 1:
        raise Unexaminable("the boot probe has no INSTALLED line to configure", reason="not built")
    split = source.find("\n" + REST_LINE)
    if split < 0 or source.count("\n" + REST_LINE) != 1 or source.find(INSTALLED_LINE) > split:
        raise Unexaminable("the boot probe has no line where its rest begins", reason="not built")
    hot = source[:split + 1]
    if installed is not None:
        hot = hot.replace(INSTALLED_LINE, "INSTALLED = " + repr(installed), 1)
    return [(f"{module}.py", hot), (f"{module}_rest.py", REST_HEADER.format(module=module) + source[split + 1:])]


def _write_private(path: Path, text: str, mode: int = 0o600) -> None:
    fd = os.open(path, logdir.FILE_FLAGS, mode)  # always a new file: nothing planted at the name is opened
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as fh:
        fh.write(text)


# ---------------------------------------------------------------------------- ephemeral mode

def ephemeral_env(base_env: Mapping[str, str], log_dir: str | Path, profile: Profile | None = None) -> dict[str, str]:
    """The variables to add to or change in base_env so that every Python process of the command
    that keeps PYTHONPATH runs the boot probe, logging into log_dir.

    Returns the profile's changes (Profile.env_changes: every `set`, each `default` base_env lacks),
    PYTHONPATH (a fresh directory under log_dir first, then the profile's or base_env's value),
    NCCLPROBE_DIR, and NCCLPROBE_PROFILE (the profile file the probe re-applies in each interpreter,
    and which holds the pins) when the profile is not empty. Nothing else.
    """
    log_dir = logdir.check(log_dir)  # logdir.Unfit if the log discipline refuses it
    boot_dir = Path(tempfile.mkdtemp(prefix="boot-", dir=log_dir))  # 0700
    # Two files, as installed: most interpreters never load the rest. With a profile, every one does
    # at start (the profile parser is there): then one file loads faster.
    with_profile = profile is not None and not profile.empty
    files = [(BOOT_FILE, _boot_source())] if with_profile else _boot_files(BOOT_FILE[:-len(".py")])
    files.append(("sitecustomize.py", SITECUSTOMIZE))
    for name, text in files:
        _write_private(boot_dir / name, text)
    os.mkdir(boot_dir / "__pycache__", 0o700)  # py_compile (and each interpreter) would make it 0755
    for name, _ in files:  # for this interpreter, even under PYTHONDONTWRITEBYTECODE
        try:
            py_compile.compile(str(boot_dir / name), doraise=True)
        except (OSError, py_compile.PyCompileError):
            pass  # each process compiles it then
    changes: dict[str, str] = {}
    if profile is not None and not profile.empty:
        changes.update(profile.env_changes(base_env))
        _write_private(boot_dir / "profile", profile.to_text())
        changes[_boot.PROFILE_VAR] = str(boot_dir / "profile")
    rest = changes.get("PYTHONPATH", base_env.get("PYTHONPATH"))
    changes["PYTHONPATH"] = str(boot_dir) + (os.pathsep + rest if rest else "")
    changes[_boot.DIR_VAR] = str(log_dir)
    return changes


# ---------------------------------------------------------------------------- the target interpreter

_QUERY = ("import json, sys, sysconfig; print(json.dumps({'executable': sys.executable, "
          "'prefix': sys.prefix, 'base_prefix': getattr(sys, 'base_prefix', sys.prefix), "
          "'purelib': sysconfig.get_paths()['purelib'], 'version': sys.version.split()[0], "
          "'cache_tag': sys.implementation.cache_tag}))")


def _quiet_env() -> dict[str, str]:
    # an installed probe stays silent in ncclprobe's own queries
    return {**os.environ, _boot.OFF_VAR: "off"}


_ANSWER = ("executable", "prefix", "base_prefix", "purelib", "version", "cache_tag")


def _echoes_query(line: str) -> bool:
    """Whether a line repeats part of _QUERY: a program that is no Python names the arguments it got."""
    return any(_QUERY[i:i + 16] in line for i in range(0, len(_QUERY) - 16, 8))


def interpreter(python: str | None) -> dict:
    """Facts about the target interpreter, asked of the interpreter itself (-I: its own view, not
    this process's PYTHONPATH or user site). What a program that is not Python prints is never
    shown: it would repeat the query."""
    exe = python or sys.executable
    try:
        proc = subprocess.run([exe, "-I", "-c", _QUERY], capture_output=True, text=True, timeout=60,
                              stdin=subprocess.DEVNULL, env=_quiet_env(), errors="backslashreplace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Unexaminable(f"cannot run the interpreter {exe}: {exc}", reason="no interpreter") from None
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        if not tail or _echoes_query(tail):
            raise Unexaminable(f"{exe} is not a Python interpreter (it exited with status {proc.returncode})",
                               reason="no interpreter")
        raise Unexaminable(f"{exe} is not a working Python interpreter ({tail})", reason="no interpreter")
    try:
        info = json.loads(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        info = None
    if not isinstance(info, dict) or not all(isinstance(info.get(k), str) for k in _ANSWER):
        raise Unexaminable(f"{exe} is not a Python interpreter (it did not answer ncclprobe's query)",
                           reason="no interpreter")
    info["site_packages"] = info["purelib"]
    return info


def _site(info: dict) -> Path:
    sp = Path(info["purelib"])
    if not sp.is_dir():
        raise Unexaminable(f"site-packages of {info['executable']} does not exist: {sp}", reason="no site-packages")
    return sp


def _installed_config(sp: Path) -> dict | None:
    """The INSTALLED dictionary of an installed probe, None if not installed."""
    try:
        text = (sp / f"{MODULE}.py").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("INSTALLED = "):
            try:
                value = ast.literal_eval(line[len("INSTALLED = "):])
            except (ValueError, SyntaxError):
                return {}
            return value if isinstance(value, dict) else {}
    return {}


def _installed_files(sp: Path) -> list[Path]:
    files = [sp / PTH, sp / START, sp / f"{MODULE}.py", sp / f"{REST}.py"]
    cache = sp / "__pycache__"
    if cache.is_dir():
        files += sorted(cache.glob(f"{MODULE}.*.pyc")) + sorted(cache.glob(f"{REST}.*.pyc"))
    return [f for f in files if f.exists() or f.is_symlink()]


# ---------------------------------------------------------------------------- persistent mode

class InstalledDiffers(Exception):
    """A probe is installed with another profile or log directory, and replace was not asked for
    (the CLI makes it a usage error, exit 2). The message names variables, never their values."""


def _installed_profile(config: Mapping) -> Profile | None:
    try:
        return parse_profile(config.get("profile", ""), "installed profile")
    except ValueError:
        return None


def _names(profile: Profile | None) -> str:
    """`set NCCL_PROTO, HF_TOKEN; pin NCCL_PROTO`: what a profile touches, without a value."""
    if profile is None:
        return "an unreadable profile"
    parts = [f"{op} {', '.join(names)}" for op, names in (
        ("set", [k for k, _ in profile.sets]), ("default", [k for k, _ in profile.defaults]),
        ("pin", list(profile.pins))) if names]
    return "; ".join(parts) or "no profile"


def _log_dir_label(log_dir: str | None) -> str:
    return f"log directory {log_dir}" if log_dir else "the default log directory"


def install(python: str | None = None, profile: Profile | None = None, log_dir: str | Path | None = None,
            replace: bool = False) -> Result:
    """Write the probe into the site-packages of `python` (default: this interpreter), atomically:
    every file is written under a temporary name first, then renamed into place, the .pth last.

    A probe installed there already with another profile or log directory is kept (InstalledDiffers)
    unless `replace`: then this profile replaces it whole; profiles are never merged. The same
    profile and directory again just rewrite the files (a newer ncclprobe's probe)."""
    info = interpreter(python)
    sp = _site(info)
    profile = profile or Profile()
    if not os.access(sp, os.W_OK):
        raise Unexaminable(f"cannot install into {sp}: not writable by this user; nothing was written",
                           reason="permission",
                           data={"hint": "run as the owner of that interpreter, or install into a venv"})
    log_dir = Path(log_dir).expanduser().absolute() if log_dir else None
    previous = _installed_config(sp)
    pycache = sp / "__pycache__"
    config = {"log_dir": str(log_dir) if log_dir else None, "default_log_dir": DEFAULT_SCHEME,
              "profile": profile.to_text(), "entries": [list(e) for e in profile.entries()], "installed_at": round(time.time(), 3), "ncclprobe": __version__,
              "pycache_created": (previous or {}).get("pycache_created", not pycache.exists())}
    replaced = None
    if previous is not None and (previous.get("profile") != config["profile"]
                                 or previous.get("log_dir") != config["log_dir"]):
        old = _installed_profile(previous)
        if not replace:
            raise InstalledDiffers(
                f"the boot probe is already installed in {info['executable']} with another configuration. "
                f"Installed: {_names(old)}, {_log_dir_label(previous.get('log_dir'))}. "
                f"This install: {_names(profile)}, {_log_dir_label(config['log_dir'])}. Nothing was changed: "
                "give --replace to install this one in its place (profiles are not merged), or run "
                "`ncclprobe inject uninstall` first.")
        replaced = (old, previous.get("log_dir"))
    _check_log_dir(log_dir)  # (a refused install makes no directory)
    files = _boot_files(MODULE, config) + [(START, f"{MODULE}:start\n"), (PTH, f"import {MODULE}; {MODULE}.start()\n")]
    _atomic_write_all(sp, files, fresh=previous is None)
    compiled = _compile(info, sp / f"{MODULE}.py", sp / f"{REST}.py")
    return _install_result(info, sp, config, profile, compiled, replaced)


def _default_dirs() -> list[str]:
    """This user's default log directories (the probe's default_log_dir): the one in its runtime
    directory, where processes with a login session log, and the one in its home, where the others do
    (daemons, cron, batch jobs); those this user can have."""
    return [d for d in (_boot.default_log_dir("runtime"), _boot.default_log_dir("home")) if d]


def _check_log_dir(log_dir: Path | None) -> None:
    """The log directory must be one the probe will log into, for this user (logdir), made now (0700,
    its last component only) if missing: --dir, or else this user's default ones (other users of the
    interpreter log only where they have a runtime directory, or once they made ~/.ncclprobe-logs)."""
    paths = [log_dir] if log_dir is not None else _default_dirs()
    hint = "give --dir a directory of yours that only you can write (mode 0700)"
    if not paths:
        raise Unexaminable("this user has no private place for the default log directory (no runtime directory "
                           "of its own, no home directory that only it can write to); nothing was installed",
                           reason="bad log directory", data={"hint": hint})
    for path in paths:
        try:
            logdir.check(path, create=True)
        except logdir.Unfit as exc:
            raise Unexaminable(f"{exc}; nothing was installed", reason="bad log directory",
                               data={"hint": hint}) from None


def _log_dirs(config: Mapping) -> list[str]:
    """Where an installed probe of this configuration logs for this user (the first: where this
    process's own interpreters would)."""
    if config.get("log_dir"):
        return [config["log_dir"]]
    if config.get("default_log_dir") != DEFAULT_SCHEME:  # installed by an older ncclprobe
        return [LEGACY_DEFAULT.format(uid=os.geteuid())]
    return _default_dirs() or [str(Path.home() / ".ncclprobe-logs")]


def _atomic_write_all(sp: Path, files: list[tuple[str, str]], fresh: bool) -> None:
    temps: list[tuple[Path, Path]] = []
    placed: list[Path] = []
    try:
        for name, text in files:
            tmp = sp / f".{name}.{os.getpid()}.ncclprobe-tmp"  # no .pth suffix: site never reads it
            _write_private(tmp, text, 0o644)
            os.chmod(tmp, 0o644)  # readable by every user of the interpreter, whatever the umask
            temps.append((tmp, sp / name))
        for tmp, dest in temps:  # module first, .pth last: the probe is active only when complete
            os.replace(tmp, dest)
            placed.append(dest)
    except OSError as exc:
        for tmp, _ in temps:
            tmp.unlink(missing_ok=True)
        if fresh:
            for dest in placed:
                dest.unlink(missing_ok=True)
        raise Unexaminable(f"cannot install into {sp}: {exc.strerror or exc}; nothing was written",
                           reason="permission",
                           data={"hint": "run as the owner of that interpreter, or install into a venv"}) from None


def _compile(info: dict, *modules: Path) -> bool:
    """Byte-compile with the target interpreter now, so no process pays for it (or fails to cache it)."""
    code = "import py_compile, sys; [py_compile.compile(m, doraise=True) for m in sys.argv[1:]]"
    try:
        proc = subprocess.run([info["executable"], "-I", "-c", code, *map(str, modules)], capture_output=True,
                              timeout=60, env=_quiet_env())
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def _profile_rows(profile: Profile) -> list[list[str]]:
    view = profile.to_json()
    rows = [["set", k, v] for k, v in view["set"].items()]
    rows += [["default", k, v] for k, v in view["default"].items()]
    rows += [["pin", k, ""] for k in view["pin"]]
    return rows


def _install_result(info, sp, config, profile, compiled, replaced) -> Result:
    dirs = _log_dirs(config)
    log_dir = dirs[0]
    files = [str(sp / name) for name in (PTH, START, f"{MODULE}.py", f"{REST}.py")]
    doc = [Title(f"Boot probe installed into {info['executable']} (Python {info['version']})"),
           Table(["file"], [[f] for f in files], title="written"),
           Text(f"log directory: {log_dir}{_dir_note(config, dirs)}")]
    if replaced is not None:
        doc.append(Text(f"Replaced what was installed: {_names(replaced[0])}, {_log_dir_label(replaced[1])}.",
                        "warn"))
    if not profile.empty:
        doc.append(Table(["op", "variable", "value"], _profile_rows(profile), title="profile"))
    doc.append(Text("Runs in every process of this interpreter, also under -I and -E; not under -S.", "note"))
    if any(not is_watched(k) for k, _ in profile.sets + profile.defaults):
        doc.append(Text(f"The profile's values are stored in {files[2]}, readable by every user of this "
                        "interpreter.", "warn"))
    if not compiled:
        doc.append(Text("Could not byte-compile the module now; each process will compile it.", "warn"))
    return Result("inject install", data={
        "installed": True, "python": info, "site_packages": str(sp), "files": files,
        "log_dir": log_dir, "profile": profile.to_json(), "compiled": compiled,
        "replaced": None if replaced is None else {
            "profile": replaced[0].to_json() if replaced[0] is not None else None, "log_dir": replaced[1]}}, doc=doc)


def _dir_note(config: Mapping, dirs: list[str]) -> str:
    if config.get("log_dir"):
        return ""
    if config.get("default_log_dir") != DEFAULT_SCHEME:
        return " (the default of a probe installed by an older ncclprobe, a name others can take first: install again)"
    return " (default, per user" + (f"; {dirs[1]} for processes without a login session)" if len(dirs) > 1 else ")")


def uninstall(python: str | None = None) -> Result:
    """Remove every file install() wrote (and __pycache__ if install created it and it is empty).
    Idempotent: a second call removes nothing and says so."""
    info = interpreter(python)
    sp = _site(info)
    config = _installed_config(sp) or {}
    files = _installed_files(sp)
    removed = []
    try:
        for f in files:  # the .pth first: from then on no new process loads the probe
            f.unlink()
            removed.append(str(f))
        cache = sp / "__pycache__"
        if config.get("pycache_created") and cache.is_dir() and not any(cache.iterdir()):
            cache.rmdir()
            removed.append(str(cache))
    except OSError as exc:
        raise Unexaminable(f"cannot remove {exc.filename}: {exc.strerror}", reason="permission",
                           data={"removed": removed}) from None
    if removed:
        doc = [Title(f"Boot probe removed from {info['executable']}"),
               Table(["file"], [[f] for f in removed], title="removed")]
    else:
        doc = [Title(f"The boot probe is not installed in {info['executable']}; nothing to remove")]
    return Result("inject uninstall", data={"installed": False, "python": info, "site_packages": str(sp),
                                            "removed": removed}, doc=doc)


# ---------------------------------------------------------------------------- status

def status(python: str | None = None, proc_root: Path = Path("/proc")) -> Result:
    """Where the probe is installed, its profile and log directory, the processes it saw recently,
    and live processes of this interpreter that ran without it (`python -S`, started before install)."""
    info = interpreter(python)
    sp = _site(info)
    config = _installed_config(sp)
    if config is None:
        return Result("inject status", data={"installed": False, "python": info, "site_packages": str(sp)},
                      doc=[Title(f"The boot probe is not installed in {info['executable']}")])
    try:
        profile = parse_profile(config.get("profile", ""), "installed profile")
    except ValueError:
        profile = Profile()
    dirs = _log_dirs(config)
    log_dir = dirs[0]
    starts = []
    found = [d for d in dirs if Path(d).is_dir()]
    if found:
        log = read_dirs(found)
        starts = [e for e in log.events if e["ev"] == "process_start" and e.get("mode") == "persistent"
                  and e.get("prefix") == info["prefix"]]
    seen = [{"pid": e["pid"], "host": e.get("host"), "t": e["t"], "ppid": e.get("ppid"),
             "forked_from": e.get("forked_from"),  # events of older probes may hold raw argv
             "argv": redact_argv(e["argv"]) if isinstance(e.get("argv"), list) else None} for e in starts[-RECENT:]]
    without = live_without_probe(info, starts, proc_root)
    doc = [Title(f"Boot probe installed in {info['executable']} (Python {info['version']})"),
           Table(["file"], [[str(f)] for f in _installed_files(sp)], title="files"),
           Text(f"log directory: {log_dir}{_dir_note(config, dirs)}")]
    if not profile.empty:
        doc.append(Table(["op", "variable", "value"], _profile_rows(profile), title="profile"))
    doc.append(Table(["pid", "ppid", "started", "command"],
                     [[str(s["pid"]) + (f" (fork of {s['forked_from']})" if s["forked_from"] else ""),
                       str(s["ppid"]), time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(s["t"])),
                       " ".join(map(str, s["argv"] or []))] for s in reversed(seen)],
                     title=f"processes it saw (latest {len(seen)} of {len(starts)})"))
    if without:
        doc.append(Table(["pid", "why", "command"], [[str(w["pid"]), w["reason"], " ".join(w["argv"])]
                                                     for w in without],
                         title="live processes of this interpreter that run without the probe"))
    return Result("inject status", data={
        "installed": True, "python": info, "site_packages": str(sp),
        "files": [str(f) for f in _installed_files(sp)], "log_dir": log_dir,
        "profile": profile.to_json(), "installed_at": config.get("installed_at"),
        "seen": seen, "seen_total": len(starts), "without_probe": without}, doc=doc)


def _site_disabled(argv: list[str]) -> bool:
    """Whether the interpreter options (before -c/-m/script) include -S."""
    args = iter(argv[1:])
    for a in args:
        if a in ("-c", "-m") or not a.startswith("-") or a == "--":
            return False
        if a in ("-X", "-W"):
            next(args, None)  # these take an argument
        elif not a.startswith("--") and a[1:].isalpha() and "S" in a[1:]:
            return True
    return False


def _boot_time(proc_root: Path) -> float | None:
    try:
        for line in (proc_root / "stat").read_text().splitlines():
            if line.startswith("btime "):
                return float(line.split()[1])
    except OSError:
        pass
    return None


def _venv_of(argv0: str, cwd: str) -> str | None:
    """The venv an interpreter path belongs to (the directory holding pyvenv.cfg), if any."""
    path = os.path.abspath(os.path.join(cwd, argv0))
    root = os.path.dirname(os.path.dirname(path))
    return root if os.path.exists(os.path.join(root, "pyvenv.cfg")) else None


def live_without_probe(info: dict, starts: list[dict], proc_root: Path = Path("/proc")) -> list[dict]:
    """Live processes of the target interpreter (same binary; same venv, judged from argv[0]) with
    no process_start of this host since they started."""
    real = os.path.realpath(info["executable"])
    target_venv = info["prefix"] if info["prefix"] != info["base_prefix"] else None
    host = os.uname().nodename
    seen = {e["pid"]: e["t"] for e in starts if e.get("host") == host}
    btime = _boot_time(proc_root)
    ticks = os.sysconf("SC_CLK_TCK")
    out = []
    for entry in proc_root.iterdir() if proc_root.is_dir() else ():
        if not entry.name.isdigit():
            continue
        pid = int(entry.name)
        try:
            if os.path.realpath(os.readlink(entry / "exe")) != real:
                continue
            argv = [os.fsdecode(a) for a in (entry / "cmdline").read_bytes().split(b"\0")[:-1]]
            cwd = os.readlink(entry / "cwd")
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone, or not ours to read
        if not argv:
            continue
        venv = _venv_of(argv[0], cwd)
        if (venv and os.path.realpath(venv)) != (target_venv and os.path.realpath(target_venv)):
            continue
        started = None
        if btime is not None:
            started = btime + int(stat.rsplit(")", 1)[1].split()[19]) / ticks
        t = seen.get(pid)
        if t is not None and (started is None or t >= started - 1.0):
            continue
        out.append({"pid": pid, "argv": redact_argv(argv), "started": started,
                    "reason": "site disabled (-S)" if _site_disabled(argv)
                    else "no process_start in the log directory (started before install, "
                         f"{_boot.OFF_VAR}=off, or logging elsewhere)"})
    return out
