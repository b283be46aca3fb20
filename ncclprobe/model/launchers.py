"""Launchers: the programs that start the job's processes, how each is recognised from a process's
image (its command line and executable), and each one's own remedy for every way a variable gets
lost on its way to a worker (the propagation edges: README "One model, one rule set").

One table, LAUNCHERS. A launcher is recognised by its program's name (argv[0] or the executable's
basename, or the first word of a process title such as `ray::IDLE`, `gunicorn: worker [app]`,
`slurmstepd: [12.0]`), by the module an interpreter runs (`python -m torch.distributed.run`), by the
script it runs (console scripts: `python …/bin/torchrun`, `perl …/bin/parallel`), or by a mark in
`python -c` code (multiprocessing's spawn and forkserver entry points). `reach` says how far above the
edge's child it may stand and still be the launcher of that edge (0: only the child's own image, as
`env -i` is: it is the child before its exec). A remedy is a str.format template over the fields
`remedy_fields` builds; a launcher without a remedy for an edge kind leaves the generic hint.

The remedies state each tool's documented behaviour (the tool's own manual or reference):
multiprocessing/concurrent.futures (initializer, maxtasksperchild, max_tasks_per_child: spawn by
default, replacements started when a worker retires), Ray (runtime_env env_vars in ray.init or
.options), loky (reusable executor keeps its workers; get_reusable_executor(env=…)), Celery
(worker_process_init runs in each prefork child), gunicorn (-e/--env, raw_env), uvicorn (--env-file,
loaded with python-dotenv), Open MPI (-x), MPICH Hydra (-genv), Slurm (--export, default ALL), sudo
(--preserve-env, env_keep), su (-w/--whitelist-environment; --login clears all but TERM), tmux (the
global environment is copied once, at server start; set-environment -g, new-window -e), screen
(setenv), supervisord (environment= in [supervisord] or [program:x]), systemd (clean environment;
Environment=, EnvironmentFile=, set-environment, systemd-run --setenv), GNU parallel (--env), ssh
(SendEnv/AcceptEnv only), GNU make (only environment, command-line and `export`ed variables reach
recipes), env -i, docker/podman (-e/--env/--env-file), Kubernetes (a container's env:/envFrom: in the
pod spec; kubectl set env, kubectl run --env) and DeepSpeed's runner (`.deepspeed_env`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

Image = tuple[Sequence[str] | None, str | None]  # (argv, exe) of one program a process ran

# a process title's first word ends at a space or a colon (`sshd: user@notty`, `ray::IDLE`)
_TITLE_ENDS = (" ", ":")
# wrappers of a command that filter its environment (witnesses/shells.py finds them in scripts): each is a launcher
FILTERS = ("env -i", "env -u", "sudo", "su")
INTERPRETERS = ("python", "pypy", "perl")
_ARG_OPTIONS = frozenset({"-W", "-X"})  # python options that take the next word


@dataclass(frozen=True, eq=False)
class Launcher:
    name: str
    programs: frozenset[str] = frozenset()
    modules: tuple[str, ...] = ()          # `python -m M` where M is one of these or below it
    scripts: frozenset[str] = frozenset()
    marks: tuple[str, ...] = ()            # in `python -c` code
    flags: frozenset[str] = frozenset()    # one of these options must come before the command
    reach: int = 1
    forks: bool = False                    # its workers are forks of it: their command line is its own
    transport: bool = False                # a remote shell: the launcher that runs it is the one to fix
    remedies: Mapping[str, str] = field(default_factory=dict)
    # its clients: programs that hand the job to a daemon (srun, ssh, docker), so the workers run outside
    # the tree of the process that started them; program -> (what they run under, how to reach them)
    clients: Mapping[str, tuple[str, str]] = field(default_factory=dict)

    def remedy(self, kind: str) -> str | None:
        return self.remedies.get(kind)


def _all(text: str, *kinds: str) -> dict[str, str]:
    return dict.fromkeys(kinds or ("curated_env", "dropped_by_intermediate", "not_in_root"), text)


_MP_REPLACED = ("a replacement worker (Pool maxtasksperchild, ProcessPoolExecutor max_tasks_per_child) is "
                "started when the one before retires, with the environment of that moment")
_SLURM = ("Slurm starts the tasks with the environment that srun/sbatch `--export` names (ALL by default; "
          "NONE or a list keeps only those, and SBATCH_EXPORT or SLURM_EXPORT_ENV set it for you): run "
          "`srun --export=ALL,{export_list} …`, or export it in the batch script before srun")
_SSH = ("ssh does not forward the environment (only what ssh's SendEnv names and the server's AcceptEnv "
        "allows): put it on the remote command line (`ssh HOST {value} CMD`, pdsh likewise), or have the "
        "launcher that runs ssh send it")
_TMUX = ("a tmux server copies the environment it was started with into its global environment once (a "
         "server started earlier keeps its own), and new windows get that plus the session's: run `tmux "
         "set-environment -g {name1} {value1}` before the window is created, or create it with `tmux "
         "new-window -e {pair1}` (new-session -e likewise)")
_SUPERVISORD = ("supervisord starts its programs with its own environment plus the `environment=` of its "
                "[supervisord] and [program:x] sections: add `environment={quoted}` to the program's "
                "section, then `supervisorctl reread` and `supervisorctl update`")
_SYSTEMD = ("a systemd service starts with a clean environment, not its caller's: add `Environment={value}` "
            "(or an EnvironmentFile=) to the unit's [Service] section and restart it (`systemctl "
            "set-environment {value}` covers units started after it; `systemd-run --setenv={pair1}` a "
            "transient one)")
_MAKE = ("make passes to its recipes only the variables of its own environment, of its command line and "
         "those marked `export`: write `export {names}` in the Makefile (and no `unexport`), or run "
         "`make {value}`")
_CONTAINER = ("a container starts with its image's environment plus what `docker run`/`podman run` is "
              "given, never the client's own: add `{e_flags}` (--env, --env-file; `-e NAME` alone copies "
              "the client's value), or ENV in the image")
_DEEPSPEED = ("the deepspeed runner starts the ranks of a multi-node job (over pdsh, or the MPI or Slurm "
              "launcher it is given) with only the variables it exports: those of its environment whose "
              "names start with NCCL, PYTHON, UCX, MV2 or MLFLOW (and the accelerator's), and the KEY=VALUE "
              "lines of `.deepspeed_env` (DS_ENV_FILE names another) in the home directory or the working "
              "directory of the `deepspeed` command, read when it starts a multi-node job (a single-node "
              "job inherits its environment and reads no file): add `{value}` there")

_SLURM_CLIENT = ("Slurm's slurmstepd on the allocated nodes",
                 "run ncclprobe inside the step on each node: `srun … ncclprobe run --dir LOGS/$(hostname) -- CMD`, "
                 "or `ncclprobe inspect PID` of the step's processes on a node (`scontrol listpids`)")
_CONTAINER_CLIENT = ("the container runtime's shim (containerd-shim, conmon), not under this client",
                     "inspect the container's processes from the host: `ncclprobe inspect $(docker inspect -f "
                     "'{{.State.Pid}}' CONTAINER)`, or run ncclprobe inside the container (`ncclprobe inject "
                     "install` in its image, then `ncclprobe report` of its log directory)")

LAUNCHERS: tuple[Launcher, ...] = (
    Launcher("env -i", programs=frozenset({"env"}), flags=frozenset({"-i", "-", "--ignore-environment"}),
             reach=0, remedies=_all("`env -i` starts the command with an empty environment: name {value} "
                                    "after `env -i`", "curated_env", "not_in_root")),
    Launcher("env -u", programs=frozenset({"env"}), flags=frozenset({"-u", "--unset"}),
             reach=0, remedies=_all("`env -u {var}` starts the command without {var}: take `-u {var}` out of that "
                                    "line (or give {value} after it)", "curated_env", "not_in_root")),
    Launcher("ray", programs=frozenset({"raylet", "gcs_server", "ray"}),
             scripts=frozenset({"default_worker.py", "ray"}), modules=("ray",), remedies={
                 "set_after_start": "set {value} before ray.init(){at}: the raylet and the workers it starts "
                                    "copy the driver's environment when ray.init() starts them; or pass "
                                    "{runtime_env} to ray.init() or to the actor/task options",
                 "curated_env": "Ray starts workers with the raylet's environment plus the job's runtime_env: "
                                "pass {runtime_env} to ray.init() or where the actors are created",
                 "dropped_by_intermediate": "{who} starts workers with its own environment: pass {runtime_env} "
                                            "(ray.init or the actor options)",
                 "not_in_root": "pass {runtime_env} to ray.init() (every worker of the job gets it, on every "
                                "node), or export {value} on each node before `ray start`"}),
    Launcher("torchrun", programs=frozenset({"torchrun"}), scripts=frozenset({"torchrun"}),
             modules=("torch.distributed.run", "torch.distributed.launch", "torch.distributed.elastic"), remedies={
                 "set_after_start": "set {value} before torchrun is started{at}: torchrun and its workers copy "
                                    "the environment at their start",
                 "not_in_root": "export {value} where torchrun is started, on every node: its elastic agent "
                                "starts (and restarts) the workers with its own environment"}),
    Launcher("multiprocessing forkserver", marks=("multiprocessing.forkserver",), remedies={
        "set_after_start": "set {value} before the first multiprocessing start{at}: the forkserver is started "
                           "once, on first use, and its children copy its environment, not the parent's of the moment (a "
                           "Pool's replacement workers too); or set it in the worker (a Pool/Process target, a "
                           "ProcessPoolExecutor initializer)"}),
    Launcher("multiprocessing spawn", marks=("spawn_main", "multiprocessing.spawn"), reach=0, remedies={
        "set_after_start": "set {value} before the Process/Pool/ProcessPoolExecutor starts its workers{at}: "
                           "each spawned worker copies the parent's environment when it starts (" + _MP_REPLACED
                           + "); or set it in the worker (a Pool or ProcessPoolExecutor initializer)"}),
    Launcher("multiprocessing fork", reach=0, remedies={
        "set_after_start": "set {value} before the Pool/Process/ProcessPoolExecutor is created{at}: fork "
                           "children copy the parent's environment at the fork (a Pool with maxtasksperchild "
                           "forks each replacement when a worker retires); or set it in the worker (a Pool "
                           "initializer or a ProcessPoolExecutor initializer: they run in every worker)"}),
    Launcher("joblib/loky", modules=("joblib.externals.loky", "loky"), reach=0, remedies={
        "set_after_start": "set {value} before the first joblib Parallel (loky) call{at}: loky keeps its "
                           "worker processes from call to call (until idle_worker_timeout ends them), each "
                           "with the environment it was started with; or hand the workers the value: loky's "
                           "get_reusable_executor(env={env_vars})"}),
    Launcher("celery", programs=frozenset({"celery", "celeryd"}), scripts=frozenset({"celery"}),
             modules=("celery",), forks=True, remedies=_all(
                 "set {value} in the environment `celery worker` starts with (its systemd unit's Environment=, "
                 "or the shell that runs it){at}: the prefork pool's processes are forked from the worker, at "
                 "its start and whenever one is replaced; or set it in each of them in a `worker_process_init` "
                 "signal handler", "set_after_start", "not_in_root")),
    Launcher("gunicorn", programs=frozenset({"gunicorn"}), scripts=frozenset({"gunicorn"}), modules=("gunicorn",),
             forks=True, remedies=_all(
                 "give the gunicorn master the value{at}: `gunicorn --env {pair1}` (raw_env = [\"{pair1}\"] in "
                 "its config file), or export it where gunicorn starts: every worker is forked from the "
                 "master, also when one is restarted", "set_after_start", "not_in_root")),
    Launcher("uvicorn", programs=frozenset({"uvicorn"}), scripts=frozenset({"uvicorn"}), modules=("uvicorn",),
             remedies=_all("export {value} where uvicorn starts, or put it in a file given to `uvicorn "
                           "--env-file FILE` (loaded into uvicorn's environment, with python-dotenv, before "
                           "it starts its workers)", "not_in_root")),
    Launcher("mpirun", programs=frozenset({"mpirun", "mpiexec", "orterun", "orted", "prterun", "prted", "prte"}),
             remedies={
                 "curated_env": "mpirun forwards only what it is told to: add `{x_flags}` (or set it in the "
                                "rank's wrapper)",
                 "dropped_by_intermediate": "{who} forwards only what it is told to: add `mpirun {x_flags}`",
                 "not_in_root": "export {value} before mpirun and add `{x_flags}` to its command line: Open MPI "
                                "starts ranks on other nodes with only the variables -x names"}),
    Launcher("mpich hydra", programs=frozenset({"mpiexec.hydra", "hydra_pmi_proxy", "pmi_proxy"}),
             remedies=_all("name it for every rank: `mpiexec {genv_flags}` (Hydra passes the launching "
                           "environment unless told otherwise; -genv sets a variable for all ranks)")),
    Launcher("slurm", programs=frozenset({"slurmstepd", "srun", "sbatch", "salloc"}), remedies=_all(_SLURM),
             clients={"srun": _SLURM_CLIENT, "salloc": _SLURM_CLIENT,
                      "sbatch": ("a batch job Slurm starts later under slurmstepd",
                                 "put `ncclprobe run --dir LOGS/$(hostname) -- …` around the command inside the batch "
                                 "script (or around srun's CMD there)")}),
    Launcher("sudo", programs=frozenset({"sudo"}), remedies=_all(
        "sudo resets the environment of the command it runs (env_reset) but for a short list: run `sudo "
        "--preserve-env={csv} …`, or add `Defaults env_keep += \"{names}\"` to sudoers (visudo)")),
    Launcher("su", programs=frozenset({"su", "runuser"}), remedies=_all(
        "`su -` (--login; runuser -l likewise) clears the environment but for TERM: keep it with `su -w {csv}` "
        "(--whitelist-environment), or leave out `-`/--login (su then keeps the environment but for HOME, "
        "SHELL, USER and LOGNAME); the target user's login profile may set it too")),
    Launcher("tmux", programs=frozenset({"tmux"}), remedies=_all(_TMUX, "curated_env", "dropped_by_intermediate",
                                                                  "not_in_root", "set_after_start")),
    Launcher("screen", programs=frozenset({"screen"}), remedies=_all(
        "a screen session's windows get the environment its server started with: run `screen -X setenv "
        "{name1} {value1}` before the window is created, or start the session with it exported",
        "curated_env", "dropped_by_intermediate", "not_in_root", "set_after_start")),
    Launcher("supervisord", programs=frozenset({"supervisord"}), scripts=frozenset({"supervisord"}),
             modules=("supervisor",), remedies=_all(_SUPERVISORD)),
    Launcher("systemd", programs=frozenset({"systemd", "systemd-run"}), remedies=_all(_SYSTEMD),
             clients={"systemd-run": ("systemd (PID 1), in a transient unit",
                                      "`systemd-run … ncclprobe run -- CMD`, or `ncclprobe inspect` the unit's main "
                                      "PID (`systemctl show -p MainPID UNIT`)")}),
    Launcher("gnu parallel", programs=frozenset({"parallel"}), scripts=frozenset({"parallel"}), remedies=_all(
        "GNU parallel copies a variable to jobs on other hosts only when it is named: `parallel --env {name1}` "
        "(`--env _` for all exported ones, env_parallel for unexported ones); local jobs get parallel's own "
        "environment: export it before parallel")),
    Launcher("ssh", programs=frozenset({"ssh", "sshd", "pdsh"}), transport=True, remedies=_all(_SSH),
             clients={"ssh": ("sshd on the remote host", "run ncclprobe on the remote host: `ssh HOST ncclprobe run -- CMD`"),
                      "pdsh": ("sshd (or rsh) on each remote host",
                               "run ncclprobe on each host: `pdsh -w HOSTS ncclprobe run --dir LOGS/%h -- CMD`")}),
    Launcher("make", programs=frozenset({"make", "gmake"}), remedies=_all(_MAKE)),
    Launcher("container", programs=frozenset({"docker", "podman", "nerdctl", "conmon", "containerd-shim",
                                              "containerd-shim-runc-v2", "runc", "crun"}),
             remedies=_all(_CONTAINER), clients=dict.fromkeys(("docker", "podman", "nerdctl"), _CONTAINER_CLIENT)),
    Launcher("kubernetes", programs=frozenset({"kubectl"}), remedies=_all(
        "a pod's containers start with the environment of the pod spec (their `env:` and `envFrom:`), never "
        "kubectl's own: add `- name: {name1}` with `value: \"{value1}\"` under the container's `env:`, or run "
        "`kubectl set env deployment/NAME {value}` (`kubectl run --env={pair1}` for one pod)"),
             clients={"kubectl": ("the kubelet's container runtime on the pod's node",
                                  "run ncclprobe in the pod (`kubectl exec POD -- ncclprobe inspect 1`, or "
                                  "`kubectl debug --target`)")}),
    Launcher("deepspeed", programs=frozenset({"deepspeed"}), scripts=frozenset({"deepspeed"}),
             modules=("deepspeed.launcher",), remedies=_all(_DEEPSPEED)),
)
BY_NAME = {la.name: la for la in LAUNCHERS}


@dataclass(frozen=True)
class Client:
    """A launcher's client program: what its workers run under, and how to put ncclprobe where they are."""
    program: str
    launcher: str
    runs_under: str
    reach: str


CLIENTS = {p: Client(p, la.name, *where) for la in LAUNCHERS for p, where in la.clients.items()}
_BY_PROGRAM: dict[str, list[Launcher]] = {}  # a program may be several launchers, told apart by their flags (env)
for _la in LAUNCHERS:
    for _p in _la.programs:
        _BY_PROGRAM.setdefault(_p, []).append(_la)
_BY_SCRIPT = {s: la for la in LAUNCHERS for s in la.scripts}
_BY_MARK = tuple((mark, la) for la in LAUNCHERS for mark in la.marks)
# a fork child of a Python process is multiprocessing's (os.fork alone is rare in a job's tree)
BY_VIA = {"fork": BY_NAME["multiprocessing fork"], "forkserver": BY_NAME["multiprocessing forkserver"],
          "spawn": BY_NAME["multiprocessing spawn"]}


# -------------------------------------------------------------------------------- recognising
def _base(path: str | None) -> str:
    return (path or "").rsplit("/", 1)[-1]


def title(arg0: str) -> str:
    """A command line's first word as a program name: `/usr/bin/tmux` -> tmux, `ray::IDLE` -> ray,
    `[celeryd: w@h:MainProcess]` -> celeryd, `sshd: root@notty` -> sshd."""
    word = arg0.lstrip("[")
    for end in _TITLE_ENDS:
        word = word.split(end, 1)[0]
    return _base(word)


def identify(argv: Sequence[str] | None, exe: str | None = None) -> Launcher | None:
    """The launcher one image is, if any: the executable's name first (argv[0] may be a title)."""
    argv = list(argv or ())
    names = [n for n in (_base(exe), title(argv[0]) if argv else "") if n]
    for name in names:
        hit = next((la for la in _BY_PROGRAM.get(name.lower(), ()) if _flagged(la, argv)), None)
        if hit is not None:
            return hit
    if argv and any(n.startswith(INTERPRETERS) for n in names):
        return _run_by_interpreter(argv[1:])
    return None


def _flagged(la: Launcher, argv: list[str]) -> bool:
    """Whether a launcher that needs an option (env's -i) has it before its command."""
    if not la.flags:
        return True
    for a in argv[1:]:
        if a in la.flags or a.split("=", 1)[0] in la.flags or (a[:2] in la.flags and len(a) > 2 and a[1] != "-"):
            return True  # (also --unset=NAME, -uNAME)
        if not a.startswith("-") or "=" in a:  # the command, or env's NAME=VALUE: options are over
            return False
    return False


def _run_by_interpreter(args: list[str]) -> Launcher | None:
    """What `python [opts] -m MOD | -c CODE | SCRIPT …` (or perl's `SCRIPT`) runs, as a launcher."""
    it = iter(args)
    for a in it:
        if a == "-m":
            return _module(next(it, ""))
        if a in ("-c", "-e"):
            code = next(it, "")
            return next((la for mark, la in _BY_MARK if mark in code), None)
        if a in _ARG_OPTIONS:
            next(it, None)
            continue
        if not a.startswith("-"):  # a script named after a program is that program (a wrapper: a site's `ssh`)
            name = _base(a)
            by_name = next((la for la in _BY_PROGRAM.get(name.lower(), ()) if not la.flags), None)
            return _BY_SCRIPT.get(name) or _BY_SCRIPT.get(name.removesuffix(".py")) or by_name
    return None


def _module(mod: str) -> Launcher | None:
    for la in LAUNCHERS:
        if any(mod == m or mod.startswith(m + ".") for m in la.modules):
            return la
    return None


# -------------------------------------------------------------------------------- choosing
def nearest(levels: Sequence[Sequence[Image]], kind: str, fixed: Mapping[int, Launcher] | None = None,
            anywhere: bool = False) -> tuple[Launcher | None, Launcher | None]:
    """(the launcher whose remedy the edge gets, the nearest one recognised within its reach) from the
    images of the edge's child (levels[0]), its parent (levels[1]) and their ancestors, each newest
    first. `fixed`: a launcher known at a level without its images (a fork child's multiprocessing).
    `anywhere`: reach is not asked (no process on the path had the value: the root's edge). A remote
    shell (ssh) yields to a launcher above it that has a remedy for the edge."""
    seen: Launcher | None = None
    found = [(d, la) for d, la in _recognised(levels, fixed or {}) if anywhere or d <= la.reach]
    for d, la in found:
        seen = seen or la
        if la.remedy(kind) is None:
            continue
        if la.transport:  # whatever its reach: the edge is on its way through the remote shell
            outer = next((o for _, o in _recognised(levels[d + 1:], {}) if not o.transport and o.remedy(kind)), None)
            return outer or la, seen
        return la, seen
    return None, seen


def _recognised(levels: Sequence[Sequence[Image]], fixed: Mapping[int, Launcher]):
    for d, images in enumerate(levels):
        if d in fixed:
            yield d, fixed[d]
        for argv, exe in images:
            la = identify(argv, exe)
            if la is not None:
                yield d, la
                break


# -------------------------------------------------------------------------------- the remedy
def remedy_fields(items: Mapping[str, tuple], shown, at: str = "", who: str = "?") -> dict[str, str]:
    """The fields a remedy template may use, for the variables lost ({var: (target, have)}): a value is
    written out only where shown(var) (the watched set); elsewhere its name stands alone or as <value>."""
    names = list(items)
    pairs = [f"{v}={tg}" if shown(v) and tg is not None else f"{v}=<value>" for v, (tg, _) in items.items()]
    value = " ".join(f"{v}={tg}" if shown(v) and tg is not None else v for v, (tg, _) in items.items())
    env_vars = "{" + ", ".join(f'"{v}": "{tg if shown(v) else "..."}"' for v, (tg, _) in items.items()) + "}"
    first_target = items[names[0]][0]
    return {"value": value, "var": ", ".join(names), "csv": ",".join(names), "names": " ".join(names),
            "at": at, "who": who, "pair1": pairs[0], "name1": names[0],
            "value1": first_target if shown(names[0]) and first_target is not None else "<value>",
            "env_vars": env_vars, "runtime_env": f'runtime_env={{"env_vars": {env_vars}}}',
            "x_flags": " ".join(f"-x {v}" for v in names),
            "genv_flags": " ".join(f"-genv {p.replace('=', ' ', 1)}" for p in pairs),
            "e_flags": " ".join(f"-e {v}" if not shown(v) else f"-e {p}" for v, p in zip(names, pairs)),
            "export_list": ",".join(p if shown(v) else v for v, p in zip(names, pairs)),
            "quoted": ",".join(p.replace("=", '="', 1) + '"' for p in pairs)}


def remedy(name: str | None, kind: str, fields: Mapping[str, str]) -> str | None:
    """The named launcher's remedy for this kind of edge, filled in; None where it has none."""
    la = BY_NAME.get(name or "")
    template = la.remedy(kind) if la is not None else None
    return template.format(**fields) if template is not None else None


def client_of(argv: Sequence[str] | None, exe: str | None = None) -> Client | None:
    """The client a command line runs (by its program's name: argv[0] or the executable's), or None. A tree
    whose only endpoints are clients holds no worker to check (diagnose/coverage.py)."""
    for name in ((argv or [""])[0], exe or ""):
        if _base(name) in CLIENTS:
            return CLIENTS[_base(name)]
    return None
