"""Command line (the only click importer). Subcommands import their modules only when they run, so
their help loads neither torch nor NVML; `ncclprobe --help` itself is answered by toplevel (the
console entry point) without importing click at all."""
from __future__ import annotations

import sys

import click

from ncclprobe import about

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


def _version() -> str:
    from ncclprobe import __version__
    return __version__


def _emit(result, as_json: bool, strict: bool = False, code: int | None = None):
    code = result.exit_code(strict) if code is None else code
    _print(result, as_json, code)
    sys.exit(code)


def _print(result, as_json: bool, code: int | None = None) -> None:
    """The result on stdout; a reader that went away (`| head`) is stdstreams' to absorb, so the exit
    code that follows is the command's own."""
    from ncclprobe import render
    if as_json:
        render.render_json(result)
    else:
        tty = code is not None and result.command in ANSWERING and sys.stdout.isatty()
        render.render_text(result, answer_code=code if tty else None)
    sys.stdout.flush()


ANSWERING = ("run", "report", "inspect", "demo")  # in a terminal these end with the one-line answer and the exit status


def _unexaminable(exc, command: str, as_json: bool):
    from ncclprobe import render
    from ncclprobe.doc import Result
    from ncclprobe.diagnose.findings import EXIT_UNEXAMINABLE  # findings (dataclasses) stays off the --help path
    if as_json:
        res = Result(command, data={"error": {"message": str(exc), "reason": exc.reason, **exc.data}})
        render.render_json(res)
    else:
        render.error(str(exc), exc.data.get("hint", ""))
    sys.exit(EXIT_UNEXAMINABLE)


def _assignments(items, what: str) -> dict[str, str]:
    from ncclprobe.commands.envfile import AssignmentError, parse_assignments
    try:
        return parse_assignments(items, what)
    except AssignmentError as exc:
        raise click.UsageError(str(exc)) from None


def _guarded(command: str, as_json: bool, fn, *args, **kwargs):
    from ncclprobe.doc import Unexaminable
    from ncclprobe.commands.envfile import AssignmentError
    try:
        return fn(*args, **kwargs)
    except Unexaminable as exc:
        _unexaminable(exc, command, as_json)
    except AssignmentError as exc:
        raise click.UsageError(str(exc)) from None


json_option = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (schema ncclprobe/2).")
strict_option = click.option("--strict", is_flag=True, help="Exit 1 on warnings too, not only on errors.")


@click.group(context_settings=CONTEXT, help=f"{about.ABOUT}\n\n{about.EXIT_CODES}\n\n{about.OUTPUT}")
@click.version_option(version=None, package_name="ncclprobe", message="ncclprobe %(version)s")
def main():
    pass  # the group: its words are about.py's, which toplevel also prints for `ncclprobe --help` without click


@main.command(context_settings=CONTEXT)
@click.argument("pids", nargs=-1, type=int)
@click.option("--pgrep", metavar="PATTERN", help="Inspect every process whose command line matches PATTERN (a regex).")
@click.option("--expect", "expects", multiple=True, metavar="K=V", help="Expected value of a variable (repeatable).")
@click.option("--expect-file", type=click.Path(dir_okay=False), help="Expected values from a .env file.")
@click.option("--scope", type=click.Choice(["nccl", "all"]), default="nccl", show_default=True,
              help="Check expectations on processes that map libnccl or use a GPU (nccl), or on all.")
@click.option("--all-vars", is_flag=True, help="Show every variable, not only the watched set (secrets redacted).")
@click.option("--no-redact", is_flag=True, help="With --all-vars, do not redact secret-looking names.")
@click.option("--dir", "dirs", multiple=True, type=click.Path(file_okay=False),
              help="Merge the in-process events of this log directory (default: NCCLPROBE_DIR of the target).")
@click.option("--nccl-log", "nccl_logs", multiple=True, type=click.Path(dir_okay=False),
              help="Also read this NCCL_DEBUG=INFO log (repeatable).")
@click.option("--show-wiring", is_flag=True,
              help="Also show ncclprobe's own wiring (LD_PRELOAD, NCCL_*_PLUGIN, NCCLPROBE_*) in the tree.")
@click.option("--live", is_flag=True,
              help="Also read the environment each process holds now from its memory (setenv, os.environ and "
                   "NCCL's nccl.conf values included), without stopping it; needs ptrace access to it.")
@click.option("--ras", "ras", metavar="HOST:PORT", is_flag=False, flag_value="", default=None,
              help="Ask NCCL's RAS service for every communicator of the job (NCCL >= 2.24; no restart, nothing "
                   "installed in it): at HOST:PORT, or with no value at the target's NCCL_RAS_ADDR, else "
                   "localhost:28028. On by default where a target maps libnccl >= 2.24.")
@click.option("--no-ras", is_flag=True, help="Do not ask NCCL's RAS service.")
@click.option("--ras-window", type=click.FloatRange(0.1, 600), metavar="SECONDS",
              help="Ask RAS twice, SECONDS apart: each communicator's collectives per second (active or idle).")
@click.option("--ras-diagnostics", is_flag=True,
              help="Also run NCCL's RAS diagnostics (NCCL >= 2.31): the NCCL_* values that differ across a "
                   "communicator's ranks, joined to the processes that hold them. Every process of the job runs "
                   "the checks (on 2.32 also lspci, dmesg, rdma_topo).")
@json_option
@strict_option
def inspect(pids, pgrep, expects, expect_file, scope, all_vars, no_redact, dirs, nccl_logs, show_wiring, live,
            ras, no_ras, ras_window, ras_diagnostics, as_json, strict):
    """The exec-time view of the process tree under each PID: environment, NCCL libraries, GPUs,
    nccl.conf files, and where that view cannot be trusted.

    A PID that is not there makes the exit code 3; the others are still shown (JSON: missing_pids)."""
    if ras and ras.isdigit():  # `inspect --ras PID`: a bare number is the PID (an address needs HOST:PORT)
        pids, ras = (*pids, int(ras)), ""
    if not pids and not pgrep:
        raise click.UsageError("give at least one PID or --pgrep PATTERN")
    if no_redact and not all_vars:
        raise click.UsageError("--no-redact needs --all-vars: without it only watched variables are shown, "
                               "and none of them is redacted")
    from ncclprobe.commands.envfile import read_env_file
    expect = {}
    if expect_file:
        expect.update(_guarded("inspect", as_json, read_env_file, expect_file))
    expect.update(_assignments(expects, "--expect"))
    if no_ras and (ras is not None or ras_window is not None or ras_diagnostics):
        raise click.UsageError("--ras (or --ras-window, --ras-diagnostics) and --no-ras contradict each other")
    from ncclprobe.commands import inspection
    try:
        result = _guarded("inspect", as_json, inspection.inspect_processes, list(pids), pgrep=pgrep,
                          expect=expect, scope=scope, all_vars=all_vars, redact=not no_redact,
                          log_dirs=list(dirs), nccl_logs=list(nccl_logs), show_wiring=show_wiring, live=live,
                          ras=False if no_ras else (
                              True if ras == "" or (ras is None and (ras_window or ras_diagnostics)) else ras),
                          ras_window=ras_window, ras_diagnostics=ras_diagnostics)
    except inspection.UsageError as exc:
        raise click.UsageError(str(exc)) from None
    _emit(result, as_json, strict)


@main.command(context_settings={**CONTEXT, "allow_interspersed_args": False})  # CMD's own options stay CMD's
@click.option("--set", "sets", multiple=True, metavar="K=V",
              help="Put K=V in CMD's environment, exactly as `env K=V CMD` (repeatable); what CMD's tree does "
                   "with it is what the report shows.")
@click.option("--set-default", "defaults", multiple=True, metavar="K=V",
              help="As --set, only when K is not already in the environment (repeatable).")
@click.option("--enforce", "enforces", multiple=True, metavar="K=V",
              help="Also re-apply K=V inside every Python interpreter of the tree that the boot probe reaches, "
                   "even one started without it (repeatable); the report lists it as injected.")
@click.option("--pin", "pins", multiple=True, metavar="K", help="Refuse in-process writes to K (the value stays).")
@click.option("--dir", "log_dir", type=click.Path(file_okay=False),
              help="Log directory (default: a fresh private one); one that holds an earlier run is refused.")
@click.option("--append", is_flag=True,
              help="With --dir: add this run to a directory earlier runs (or other hosts) use; runs are kept "
                   "apart by run id, and `report` of it merges them.")
@click.option("--no-preload", is_flag=True, help="Do not LD_PRELOAD the probe library.")
@click.option("--no-plugins", is_flag=True, help="Do not set NCCL_PROFILER_PLUGIN / NCCL_ENV_PLUGIN.")
@click.option("--no-boot", is_flag=True, help="Do not wire the Python boot probe in.")
@click.option("--gpu-timing", is_flag=True,
              help="Also time every collective on the GPU (the profiler's KernelCh events): GPU time per call, "
                   "busbw and NCCL's share of the wall per communicator. It costs time: NCCL then adds a proxy "
                   "operation to every collective and a host callback to captured CUDA graphs.")
@click.option("--expect", "expects", multiple=True, metavar="K=V",
              help="Expected value (repeatable), checked on every process that uses NCCL (at each communicator's "
                   "creation) or, where none does, on every worker; the report names the edge where it was lost.")
@click.option("--live", is_flag=True,
              help="The /proc watch also reads the environment each process holds from its memory (setenv, "
                   "os.environ, NCCL's nccl.conf values), without stopping it, and records it where it changed.")
@click.option("--quiet", is_flag=True, help="Do not print the report at the end.")
@json_option
@click.option("--strict", is_flag=True, help="When CMD exits 0, exit 1 on warnings too, not only on errors.")
@click.argument("cmd", nargs=-1, required=True, type=click.UNPROCESSED)
def run(sets, defaults, enforces, pins, log_dir, append, no_preload, no_plugins, no_boot, gpu_timing, expects, live, quiet,
        as_json, strict, cmd):
    """Run CMD with the probes wired in, then print the report.

    Exit code: CMD's own when it is not 0 (128+N when killed by signal N); when CMD exits 0, 1 if
    the report has error-level findings (--strict: warnings too), else 0; 127 when CMD is not found
    and 126 when it cannot be executed, as in a shell (no log directory is left then, unless --dir).
    Options after CMD's first word are CMD's.

    Signals: the first SIGINT/SIGTERM/SIGHUP/SIGQUIT goes to CMD's process group; whatever of CMD's
    tree still runs 5 s later (NCCLPROBE_RUN_GRACE_S) gets SIGTERM, then SIGKILL after 5 s more;
    each further signal takes the next step at once. The whole tree is ended, processes that left
    CMD's session included, and so is what CMD leaves behind when a signal kills it. After a normal
    exit, what CMD left running stays running and is listed in the report.

    While CMD runs, its tree is watched from /proc every 0.5 s (NCCLPROBE_WATCH_S; 0: off): each
    process, Python or not, is recorded once in the log directory with its parent and the watched
    part of its exec-time environment. With --live, each process is also read from its memory when
    the watch records it, and the whole tree as often as 1 % of a core allows (a read of 256
    processes costs about 15 ms of CPU: every 1.5 s; a small tree at every scan), or every
    NCCLPROBE_LIVE_S seconds (0: every scan); a process's live environment is recorded where it
    changed, so a write is dated between two reads. --live needs ptrace access to the processes
    (same user, or root) and the watch (off with NCCLPROBE_WATCH_S=0).

    The profiler plugin counts every communicator's collectives (function, algorithm, protocol,
    channels, size, and launch: eager, captured into a CUDA graph, replayed from one) and writes
    them every 5 s (NCCLPROBE_FLUSH_S), at teardown and at exit: a killed job loses at most the
    last interval. The report's verdict has a time line per communicator.

    \b
    Example: ncclprobe run --set NCCL_PROTO=LL -- python serve.py --tp 8
    """
    from ncclprobe.commands import launch, profile as profile_mod
    from ncclprobe import render
    if append and log_dir is None:
        raise click.UsageError("--append needs --dir: a fresh directory holds no earlier run")
    given = _guarded("run", as_json, profile_mod.from_cli, sets, defaults, [])
    profile = _guarded("run", as_json, profile_mod.from_cli, enforces, [], pins, set_option="--enforce")
    expect = _assignments(expects, "--expect")
    try:
        result = _guarded("run", as_json, launch.run_command, list(cmd), profile=profile, given=given,
                          log_dir=log_dir,
                          preload=not no_preload, plugins=not no_plugins, boot=not no_boot,
                          expect=expect, stdout_to_stderr=as_json, gpu_timing=gpu_timing, live=live,
                          append=append)
    except launch.DirUsed as exc:
        raise click.UsageError(str(exc)) from None
    except launch.LaunchError as exc:
        if not as_json:
            render.error(str(exc))
            sys.exit(exc.code)
        result, quiet = exc.result(), False  # --quiet leaves out the report, never the error
    code = result.exit_code(strict)
    if not quiet:
        _print(result, as_json, code)  # a closed stdout (`>&-`, `| head`, a hung-up terminal) keeps CMD's code
    sys.exit(code)


@main.command(context_settings=CONTEXT)
@click.argument("dirs", nargs=-1, metavar="[DIR|NCCL_LOG]...")
@click.option("--nccl-log", "nccl_logs", multiple=True, help="Also read this NCCL_DEBUG=INFO log (repeatable).")
@click.option("--expect", "expects", multiple=True, metavar="K=V", help="Expected value of a variable (repeatable).")
@click.option("--details", is_flag=True, help="Of many hosts: also each finding's evidence, the processes, "
              "communicators and per-host lines (one host: always shown).")
@json_option
@strict_option
def report(dirs, nccl_logs, expects, details, as_json, strict):
    """Per process and per communicator: what NCCL got, read and ran, from one or more log
    directories (several hosts' directories merge).

    An argument that is a file, not a directory, is read as an NCCL_DEBUG=INFO log, as --nccl-log
    reads it; one with no NCCL log line in it is an error (exit 3)."""
    if not dirs and not nccl_logs:
        raise click.UsageError("give at least one log directory, or --nccl-log FILE")
    import os
    files = [d for d in dirs if os.path.exists(d) and not os.path.isdir(d)]  # `report nccl.log`: as --nccl-log
    from ncclprobe.commands import report as report_mod
    result = _guarded("report", as_json, report_mod.build_report, [d for d in dirs if d not in files],
                      nccl_logs=[*nccl_logs, *files], expect=_assignments(expects, "--expect"), details=details)
    _emit(result, as_json, strict)


@main.group(context_settings=CONTEXT)
def inject():
    """Install a persistent boot probe into a Python interpreter's site-packages."""


@inject.command("install", context_settings=CONTEXT)
@click.option("--python", "python", default=None, help="Interpreter to install into (default: this one).")
@click.option("--set", "sets", multiple=True, metavar="K=V", help="Set a variable at interpreter start.")
@click.option("--set-default", "defaults", multiple=True, metavar="K=V", help="Set it only where absent.")
@click.option("--pin", "pins", multiple=True, metavar="K", help="Refuse in-process writes to K.")
@click.option("--dir", "log_dir", type=click.Path(file_okay=False),
              help="Log directory for the events (default: per user, private; see below).")
@click.option("--replace", is_flag=True,
              help="Replace a probe installed with another profile or log directory (never merged).")
@json_option
def inject_install(python, sets, defaults, pins, log_dir, replace, as_json):
    """Write the boot probe (.pth, module, PEP 829 .start) into the interpreter's site-packages.

    A probe already installed there with another profile (--set, --set-default, --pin) or log
    directory is left as it is and the command fails (exit 2), naming the installed variables;
    --replace installs this profile in its place (profiles are not merged). The same profile and
    directory again just rewrite the probe's files.

    Without --dir, each user's processes log where no other user can have made the directory first:
    $XDG_RUNTIME_DIR/ncclprobe (or /run/user/UID/ncclprobe) where that runtime directory is the user's
    own (mode 0700), else ~/.ncclprobe-logs. install makes them for this user; other users of the
    interpreter log where they have a runtime directory, or once they made ~/.ncclprobe-logs (mode 0700).
    A NCCLPROBE_DIR in a process's environment wins.

    A log directory the probe refuses (another user's, writable by others, a symlink) costs one
    `ncclprobe:` line on stderr per process tree, then silence; NCCLPROBE_QUIET=1 silences that line."""
    from ncclprobe.commands import inject as inject_mod, profile as profile_mod
    profile = _guarded("inject install", as_json, profile_mod.from_cli, sets, defaults, pins)
    try:
        result = _guarded("inject install", as_json, inject_mod.install, python, profile=profile,
                          log_dir=log_dir, replace=replace)
    except inject_mod.InstalledDiffers as exc:
        raise click.UsageError(str(exc)) from None
    _emit(result, as_json)


@inject.command("status", context_settings=CONTEXT)
@click.option("--python", "python", default=None, help="Interpreter to look at (default: this one).")
@json_option
def inject_status(python, as_json):
    """Where the boot probe is installed, its profile and log directory, and what it saw."""
    from ncclprobe.commands import inject as inject_mod
    _emit(_guarded("inject status", as_json, inject_mod.status, python), as_json)


@inject.command("uninstall", context_settings=CONTEXT)
@click.option("--python", "python", default=None, help="Interpreter to remove it from (default: this one).")
@json_option
def inject_uninstall(python, as_json):
    """Remove the boot probe, restoring site-packages exactly (idempotent)."""
    from ncclprobe.commands import inject as inject_mod
    _emit(_guarded("inject uninstall", as_json, inject_mod.uninstall, python), as_json)


@main.command(context_settings=CONTEXT)
@click.argument("var", required=False)
@click.option("--list", "list_all", is_flag=True, help="List every variable the catalog knows.")
@json_option
def explain(var, list_all, as_json):
    """What NCCL does with VAR: cached per process or re-read per communicator, default, values.

    A VAR the catalog does not know is a usage error (exit 2), with the nearest known names."""
    from ncclprobe.commands import explain as explain_mod
    if not var and not list_all:
        raise click.UsageError("give a variable name or --list")
    if var and list_all:
        raise click.UsageError(f"give a variable name or --list, not both ({var} and --list)")
    result = explain_mod.explain_list() if list_all else explain_mod.explain(var)
    error = result.data.get("error")
    if error and not as_json:  # an unknown name is a usage error (exit 2): on stderr, with the nearest names
        raise click.UsageError(error["message"])
    _emit(result, as_json)


@main.command(context_settings=CONTEXT)
@json_option
def topo(as_json):
    """The GPU interconnect as NCCL will see it (NVML): links, P2P status, PCIe, NUMA."""
    from ncclprobe import topo as topo_mod
    _emit(_guarded("topo", as_json, topo_mod.topo_command), as_json)


@main.command(context_settings={**CONTEXT, "ignore_unknown_options": False})
@click.option("--gpus", type=int, default=None, help="GPUs (one worker process each), for --backend nccl. Default: all visible.")
@click.option("--backend", type=click.Choice(["nccl", "gloo"]), default="nccl", show_default=True)
@click.option("--ranks", type=int, default=None, help="Ranks for --backend gloo (CPU). Default: 2.")
@click.option("--proto", default=None, help="Protocols to force, comma-separated ('' for none). Default: LL,LL128,Simple "
              "with NCCL, none with gloo.")
@click.option("--algo", default=None, help="Algorithms to force, comma-separated ('' for none). Default: Ring,Tree "
              "with NCCL, none with gloo.")
@click.option("--config", "configs", multiple=True, metavar="NAME:K=V,K=V", help="An extra configuration (repeatable).")
@click.option("--env", "envs", multiple=True, metavar="K=V", help="Set for every configuration (repeatable).")
@click.option("-b", "--minbytes", default=None, help="Smallest size (K/M/G suffixes are powers of 1024). Default: 1K.")
@click.option("-e", "--maxbytes", default=None, help="Largest size. Default: 64M.")
@click.option("-f", "--stepfactor", type=int, default=None, help="Multiply the size by this each step. Default: 4.")
@click.option("--hidden", type=int, default=None, help="Model hidden size: sizes become tokens x hidden x dtype bytes "
              "(instead of -b/-e/-f).")
@click.option("--tokens", default=None, help="Tokens per step for --hidden (decode, verify k). Default: 1,2,3,4.")
@click.option("--layers", type=int, default=None, help="Layers, for --hidden's per-forward communication projection.")
@click.option("--step-ms", type=float, default=None, metavar="D",
              help="The measured plain decode step of the model, in ms (with --hidden): each k-token verify step "
                   "is projected at D plus the extra communication of k tokens.")
@click.option("--accept-len", default=None, metavar="A|K:A,...",
              help="Tokens accepted per verify step (with --step-ms): one number for every k >= A, or K:A pairs "
                   "per k. Adds projected tokens/s per k against plain decoding and the break-even cycle time A x D.")
@click.option("--dtype", type=click.Choice(["bf16", "fp16", "fp32"]), default="bf16", show_default=True)
@click.option("-n", "--iters", type=int, default=20, show_default=True, help="Timed iterations per size.")
@click.option("-w", "--warmup", type=int, default=5, show_default=True, help="Warm-up iterations per size.")
@click.option("--graph/--no-graph", default=None, help="Also time under CUDA graph capture. Default: on with NCCL "
              "(gloo has no CUDA graphs).")
@click.option("--check/--no-check", default=True, show_default=True, help="Check every result for correctness.")
@click.option("--timeout", type=float, default=120.0, show_default=True, help="Seconds per configuration before it is marked hang.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None, help="Write a PNG plot (needs matplotlib).")
@click.option("--basis", type=click.Choice(["graph", "eager"]), default=None, help="Mode the recommendation is based on.")
@click.option("--gpu-timing", is_flag=True,
              help="Also time each all-reduce on the GPU (the profiler's KernelCh events): GPU time per call per "
                   "size beside the host times, and graph replays counted. It costs time: NCCL adds a proxy "
                   "operation to every collective and a host callback to captured graphs.")
@click.option("--keep", is_flag=True, help="Keep the workers' directory (logs, specs, events) and say where it is.")
@json_option
def bench(as_json, **opts):
    """All-reduce latency per NCCL configuration on this machine, with nccl-tests semantics; each
    configuration in a fresh set of worker processes.

    Each size's row is printed as soon as it is measured, in nccl-tests' columns; the comparison
    and the recommendation follow at the end. With --json, stdout is only the JSON document and the
    rows go to stderr. Progress is on stderr. On --backend gloo only NCCL's defaults run (NCCL
    variables cannot change gloo) unless --proto, --algo or --config ask for more.

    Exit codes: 0 measured, no error-level finding; 1 error-level findings; 2 usage error;
    3 nothing could be measured (no torch, no GPU, every configuration failed); 130 Ctrl-C (what was
    measured is printed, and with --json written with "incomplete": true).
    """
    from ncclprobe import bench as bench_mod
    result = _guarded("bench", as_json, bench_mod.bench_command, rows_to=sys.stderr if as_json else sys.stdout,
                      progress_to=sys.stderr, **opts)
    _emit(result, as_json)


@main.command(context_settings=CONTEXT)
@click.option("--real", is_flag=True, help="Use torch with the real NCCL on the GPUs present.")
@click.option("--keep", is_flag=True, help="Keep the demo's log directory and say where it is.")
@click.option("--show-wiring", is_flag=True, help="Also show ncclprobe's own wiring in the process tree.")
@json_option
def demo(real, keep, show_wiring, as_json):
    """Replay the 'did my workers get NCCL_PROTO=LL?' story on a miniature server and diagnose it.

    Without --real it runs on ncclprobe's simulated NCCL (no GPU needed; labelled as simulated).
    The findings are the planted faults, so the exit code says whether the diagnosis was right:
    0 when every planted cause was named and nothing else was, 1 otherwise."""
    from ncclprobe import demo as demo_mod
    result = _guarded("demo", as_json, demo_mod.run_demo, real=real, keep=keep, show_wiring=show_wiring)
    _emit(result, as_json)


def _wants_json(argv: list[str]) -> bool:
    """--json among ncclprobe's own arguments (not CMD's, after `--` or the command of `run`)."""
    return "--json" in (argv[:argv.index("--")] if "--" in argv else argv)


def _command_of(argv: list[str]) -> str | None:
    return next((a for a in argv if not a.startswith("-")), None)


def run_cli(argv: list[str] | None = None) -> None:
    """The console entry point past --help: usage errors exit 2, as JSON under --json (error.reason
    "usage_error"), as click's message otherwise."""
    argv = list(sys.argv[1:] if argv is None else argv)
    from ncclprobe import stdstreams
    stdstreams.guard()  # toplevel did it already; `python -m ncclprobe.cli` comes here first
    try:
        code = main.main(args=argv, prog_name="ncclprobe", standalone_mode=False)
    except click.UsageError as exc:
        if _wants_json(argv):
            from ncclprobe import render
            from ncclprobe.doc import Result
            sub = (exc.ctx.command_path.split(" ", 1)[-1] if exc.ctx is not None and exc.ctx.command is not main
                   else _command_of(argv))  # "inject install", as the Result of that command names itself
            render.render_json(Result(sub or "ncclprobe", data={"error": {
                "message": exc.format_message(), "reason": "usage_error"}}))
        else:
            exc.show()
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except click.Abort:
        click.echo("Aborted!", err=True)
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":  # pragma: no cover
    run_cli()
