"""Shell command lines that scope a variable to the wrong command.

In `NCCL_PROTO=LL cd /srv && python server.py`, the assignment is part of the `cd` simple command and
reaches only its environment (GNU Bash manual §3.7.1, §3.7.4); `NCCL_PROTO=LL; python server.py`
sets an unexported shell variable. Both are only visible while the shell is: bash 5 execs the last
command of `bash -c 'A && B'`, replacing itself, so where no shell is left nothing is claimed (unless
a witness saw the shell's image before the exec: run's watch, or run's own CMD).

The command that became the child may also filter what it gets: `env -i`, `env -u NAME`, `exec env …`,
sudo (env_reset, unless -E/--preserve-env), `su -`/`su --login` (runuser -l): those are pitfalls too,
with what they keep. Every pitfall names the script's line (`lex`: a small lexer for shell syntax:
quotes, escapes, `$(…)` and backquotes as one word, line continuations, lists and pipes, comments,
here-document bodies skipped; no expansion).
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from ncclprobe.model.images import ASSIGN, WRAPPER_OPTION_ARGS, option_values, unwrap
from ncclprobe.model.watched import REDACTED
from ncclprobe.witnesses.shellsyntax import lex

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
# Words that start a list element without being its command.
_KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "!", "{", "(", "time", "}", ")", "fi", "done"}
# Commands that run the rest of their arguments as the command (the prefix still reaches it).
_WRAPPERS = {"env", "nohup", "exec", "nice", "stdbuf", "setsid", "taskset", "numactl", "chrt", "timeout",
             "sudo", "command", "builtin", "ionice"}
# (Of those, the programs that exec their command are model/images.EXEC_WRAPPERS; timeout and sudo fork it
# instead, exec/command/builtin are the shell's own. Their options: model/images.unwrap.)


@dataclass(frozen=True)
class SimpleCommand:
    assignments: tuple[tuple[str, str], ...]
    words: tuple[str, ...]  # the command and its arguments, wrappers removed
    text: str  # as written, for evidence
    exported: tuple[str, ...] = ()  # names made environment variables by `export`/`declare -x`
    tokens: tuple[str, ...] = ()  # the words as written, keywords and wrappers included
    line: int = 0  # the script's line it starts on (1-based; 0: not known)
    # the wrappers before the command, outermost first: (program, its options, the NAME=VALUE it passes)
    wrappers: tuple[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]], ...] = ()

    def display(self, show: Callable[[str, str], str | None] | None = None) -> str:
        """The text with each NAME=VALUE word's value as show(NAME, VALUE) gives it (None: redacted),
        so evidence never prints a value the caller may not show (a token in a prefix, say)."""
        if show is None:
            return self.text
        words = []
        for tok in self.tokens:
            m = ASSIGN.match(tok)
            if m is None:
                words.append(shlex.quote(tok) if tok else "''")
                continue
            value = show(m.group(1), m.group(2))
            words.append(f"{m.group(1)}=" + (REDACTED if value is None else shlex.quote(value) if value else ""))
        return " ".join(words)


def split_script(script: str) -> list[SimpleCommand]:
    """The simple commands of a shell list (`;`, `&&`, `||`, `|`, `&`, newlines), each with the line it
    starts on: no expansion, quotes honoured, comments and here-document bodies dropped, a command
    substitution one word. Raises ValueError on unbalanced quotes."""
    commands: list[SimpleCommand] = []
    current: list[str] = []
    first_line = 0

    def flush():
        if current:
            commands.append(_simple(current, first_line))
            current.clear()

    skip_next = False
    for tok in lex(script):
        if skip_next:
            skip_next = False
            continue
        if tok.op and tok.text[0] in "<>" or tok.text in ("&>", "&>>"):
            skip_next = True  # the redirection's target is not an argument
            if current and current[-1].isdigit():
                current.pop()  # `2>&1`: the fd number is not an argument either
            continue
        if tok.op:
            flush()
            continue
        if not current:
            first_line = tok.line
        current.append(tok.text)
    flush()
    return commands



def _simple(tokens: list[str], line: int = 0) -> SimpleCommand:
    text = " ".join(shlex.quote(t) if t != "" else "''" for t in tokens)
    written = tuple(tokens)
    while tokens and tokens[0] in _KEYWORDS:
        tokens = tokens[1:]
    assigns: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens) and ASSIGN.match(tokens[i]):
        m = ASSIGN.match(tokens[i])
        assigns.append((m.group(1), m.group(2)))
        i += 1
    words = tokens[i:]
    exported: list[str] = []
    if words and words[0] in ("export", "declare", "typeset") and (words[0] == "export" or "-x" in words[1:]):
        exported = [w.split("=", 1)[0] for w in words[1:] if not w.startswith("-")]
    wrappers: list[tuple[str, tuple[str, ...], tuple[tuple[str, str], ...]]] = []
    while words and os.path.basename(words[0]) in _WRAPPERS | {"su", "runuser"}:
        wrapper = os.path.basename(words[0])
        options, given, words = unwrap(wrapper, words[1:])
        assigns.extend(given)
        if wrapper in ("su", "runuser"):  # su [-] [USER] [-c CMD]: the command is the -c string
            takes = WRAPPER_OPTION_ARGS[wrapper]
            rest = list(words)
            words = []
            while rest:  # options may follow the user too (`su - bob -c CMD`)
                w = rest.pop(0)
                options.append(w)
                if w in takes and rest:
                    options.append(rest.pop(0))
            cmd = next((options[k + 1] for k, o in enumerate(options[:-1]) if o in ("-c", "--command")), None)
            words = tuple(split_script(cmd)[-1].words) if cmd and _safe_split(cmd) else ()
            wrappers.append((wrapper, tuple(options), tuple(given)))
            break
        wrappers.append((wrapper, tuple(options), tuple(given)))
    return SimpleCommand(tuple(assigns), tuple(words), text, tuple(exported), written, line, tuple(wrappers))


def _safe_split(cmd: str) -> bool:
    try:
        return bool(split_script(cmd))
    except ValueError:
        return False


def wrapped_command(argv: list[str]) -> list[str]:
    """The command an argv runs, its wrappers and their options removed (`env -i A=1 python3 w.py` ->
    [python3, w.py]); empty when it names none."""
    return list(_simple(list(argv)).words)


def shell_script(cmdline: list[str]) -> str | None:
    """The script of `sh -c SCRIPT ...` / `bash -lc SCRIPT`, or None for anything else."""
    if not cmdline:
        return None
    exe = os.path.basename(cmdline[0]).lstrip("-")  # login shells are named "-bash"
    args = cmdline[1:]
    if exe == "busybox" and args and args[0] in SHELLS:
        args = args[1:]
    elif exe not in SHELLS:
        return None
    for i, arg in enumerate(args):
        if arg == "--":
            return None
        if arg.startswith("-") and not arg.startswith("--") and "c" in arg[1:]:
            return args[i + 1] if i + 1 < len(args) else None
        if not arg.startswith(("-", "+")):
            return None  # a script file or a plain argument: not `-c`
    return None


def script_file(cmdline: list[str]) -> str | None:
    """The script path of `bash FILE args...` (no -c), as the shell saw it."""
    if not cmdline or os.path.basename(cmdline[0]).lstrip("-") not in SHELLS:
        return None
    for arg in cmdline[1:]:
        if arg == "--":
            continue
        if arg.startswith(("-", "+")):
            if "c" in arg[1:] and not arg.startswith("--"):
                return None
            continue
        return arg
    return None


# a parameter expansion or command substitution inside a word: matches any text once expanded
_EXPANSION = re.compile(r"\$\{[^{}]*\}|\$\([^()]*\)|`[^`]*`|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9@*#?$!-]")  # linear
_ALL_ARGS = {"$@", "${@}", "$*", "${*}"}


def _word_matches(word: str, arg: str) -> bool:
    if "$" not in word and "`" not in word:
        return word == arg
    parts = _EXPANSION.split(word)
    # each middle part at its first place, kept there (a lookahead, then its backreference): no backtracking
    return re.fullmatch(re.escape(parts[0]) + "".join(f"(?=(?P<p{i}>.*?{re.escape(p)}))(?P=p{i})" for i, p in enumerate(
        parts[1:-1])) + (".*" + re.escape(parts[-1]) if len(parts) > 1 else ""), arg, re.S) is not None


def _words_match(words: list[str], argv: list[str]) -> bool:
    """Script words against the argv they became: an expansion matches any text, "$@" any number of
    arguments (the script's own, which the shell's command line holds but nothing here checks)."""
    if not words:
        return not argv
    if words[0] in _ALL_ARGS:
        return any(_words_match(words[1:], argv[i:]) for i in range(len(argv) + 1))
    return bool(argv) and _word_matches(words[0], argv[0]) and _words_match(words[1:], argv[1:])


def _leads_to(cmd: SimpleCommand, child: list[str]) -> bool:
    """Is this simple command the one that became `child` (its exec'ed command line, or a wrapper that
    forks it: `sudo python3 w.py`)? Words with parameter expansions ($here/w.py, "$@") match what they
    can expand to."""
    if not cmd.words or not child:
        return False
    inner = wrapped_command(child)
    return any(_leads_to_one(cmd, c) for c in ([child, inner] if inner and inner != child else [child]))


def _leads_to_one(cmd: SimpleCommand, child: list[str]) -> bool:
    first, name = os.path.basename(cmd.words[0]), os.path.basename(child[0])
    if not _word_matches(first, name):
        # an interpreter may show its real name (python3.11 for python): the arguments then say
        if not (name.startswith(first) or first.startswith(name) or "$" in first or "`" in first):
            return False
        return len(cmd.words) > 1 and _words_match(list(cmd.words[1:]), child[1:])
    return _words_match(list(cmd.words[1:]), child[1:]) or len(cmd.words) == 1


@dataclass(frozen=True)
class PrefixPitfall:
    var: str  # "*" for a wrapper that drops every variable but those it keeps
    value: str
    command: str  # the simple command that received the assignment ("" for a bare assignment)
    led_to_target: str  # the simple command that became the path to the target
    kind: str  # prefix (scoped to another command) | unexported (bare assignment, never exported) |
    # a wrapper of the command that filters its environment: env -i | env -u | sudo | su
    line: int = 0  # the script's line of the assignment (of the wrapper, for a filtering one)
    kept: tuple[str, ...] = ()  # the names a filtering wrapper passes on




def _flag(options, letter: str, *longs: str) -> bool:
    return any(o in longs or (o.startswith("-") and not o.startswith("--") and letter in o[1:2]) for o in options)


SUDOERS = ("/etc/sudoers", "/etc/sudoers.d")
_ENV_KEEP = re.compile(r"\benv_keep\s*(\+?=|-=)\s*(\"[^\"]*\"|\S+)")
_policy: dict[tuple, tuple[bool, tuple[str, ...]]] = {}


def sudo_policy(paths: tuple[str, ...] = SUDOERS) -> tuple[bool, tuple[str, ...]]:
    """(env_reset, env_keep) as this host's sudoers files say, where they can be read (root only): every
    `Defaults` line, whoever it is for (what sudo keeps for someone only makes a claim less sure), its
    env_keep names and patterns (`LC_*`); `!env_reset` keeps the whole environment. Unreadable: sudo's
    default (env_reset on, none kept beyond its own short list)."""
    if paths in _policy:
        return _policy[paths]
    reset, keep = True, []
    files = []
    for path in paths:
        try:
            names = sorted(os.listdir(path)) if os.path.isdir(path) else [""]
        except OSError:
            continue
        files += [os.path.join(path, n) if n else path for n in names if "." not in n and not n.endswith("~")]
    for path in files:
        text = read_script(path) or ""
        for line in text.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            if not line.startswith("Defaults"):
                continue
            if re.search(r"!\s*env_reset\b", line):
                reset = False
            for op, value in _ENV_KEEP.findall(line):
                names = value.strip('"').split()
                keep = [n for n in keep if n not in names] if op == "-=" else (keep + names if op == "+=" else names)
    _policy[paths] = (reset, tuple(keep))
    return _policy[paths]


def filtering(cmd: SimpleCommand) -> list[tuple[str, str, tuple[str, ...]]]:
    """The wrappers of a simple command that filter the environment its command gets: (kind, the name
    it drops or "*" for all, the names it keeps). `env -i A=1 cmd` drops all but A; `env -u A` drops A;
    sudo resets it (env_reset, unless sudoers says !env_reset) unless -E/--preserve-env, keeping
    --preserve-env=LIST, NAME=VALUE and sudoers' env_keep (sudo_policy: names or patterns);
    `su -`/`su -l`/`su --login` (runuser likewise) keep only -w/--whitelist-environment's (and TERM)."""
    out: list[tuple[str, str, tuple[str, ...]]] = []
    for k, (prog, options, given) in enumerate(cmd.wrappers):
        later = tuple(n for _, _, g in cmd.wrappers[k:] for n, _ in g)  # what this and the inner wrappers pass on
        if prog == "env":
            if "-" in options or _flag(options, "i", "--ignore-environment"):
                out.append(("env -i", "*", later))
            out += [("env -u", name, ()) for name in option_values(options, "-u", "--unset") if name not in later]
        elif prog == "sudo":
            reset, env_keep = sudo_policy()
            if _flag(options, "E", "--preserve-env") or not reset:
                continue
            kept = tuple(n for v in option_values(options, "--preserve-env", "--preserve-env") for n in v.split(","))
            out.append(("sudo", "*", kept + later + env_keep))
        elif prog in ("su", "runuser") and ("-" in options or _flag(options, "l", "--login")):
            kept = tuple(n for v in option_values(options, "-w", "--whitelist-environment") for n in v.split(","))
            out.append(("su", "*", kept + ("TERM",)))
    return out


def pitfalls(script: str, child: list[str], watched, shell_env=None,
             show: Callable[[str, str], str | None] | None = None) -> list[PrefixPitfall]:
    """Assignments to watched variables in `script` that cannot have reached `child`, the command
    line of the shell's child on the way to the target. Nothing is claimed unless one simple command
    of the script is recognisably that child. A bare assignment is only claimed unexported when the
    shell's own environment (shell_env) is known and lacks the name (assigning an inherited,
    hence exported, variable updates the exported value). `show` decides how the values of the
    commands' NAME=VALUE words appear in the pitfall's texts (SimpleCommand.display)."""
    try:
        commands = split_script(script)
    except ValueError:
        return []
    target = [c for c in commands if _leads_to(c, child)]
    if not target:
        return []
    lead = target[0]
    lead_index = commands.index(lead)
    exported = {n for c in commands[:lead_index] for n in c.exported}
    prefixed_lead = {n for n, _ in lead.assignments}
    out = []
    for kind, name, kept in filtering(lead):  # the command's own wrappers: what they drop never reaches it
        if name == "*" or watched(name):
            out.append(PrefixPitfall(name, "", lead.display(show), lead.display(show), kind, lead.line, kept))
    for i, c in enumerate(commands):
        if i == lead_index:
            continue
        for name, value in c.assignments:
            if not watched(name) or name in prefixed_lead:
                continue
            if c.words:
                out.append(PrefixPitfall(name, value, c.display(show), lead.display(show), "prefix", c.line))
            elif (shell_env is not None and name not in shell_env and name not in exported
                  and i < lead_index):
                out.append(PrefixPitfall(name, value, "", lead.display(show), "unexported", c.line))
    return out


# ------------------------------------------------------------------ scripts named in a model's command lines
MAX_SCRIPT = 1 << 20
SHELL_NAMES = ("bash", "sh", "dash", "zsh", "ksh", "ash")


def read_script(path: str) -> str | None:
    """A script's text, if path names a regular file of at most MAX_SCRIPT bytes (opened without
    following a FIFO into a block; never raises)."""
    import stat as stat_mod
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat_mod.S_ISREG(st.st_mode) or st.st_size > MAX_SCRIPT:
            return None
        return os.read(fd, MAX_SCRIPT).decode("utf-8", "surrogateescape")
    except OSError:
        return None
    finally:
        os.close(fd)


def _shell_script_of(path: str) -> str | None:
    """The text of path if it is a shell script (#! of a shell), else None."""
    if not path.startswith("/"):
        return None
    text = read_script(path)
    if text is None or not text.startswith("#!"):
        return None
    interp = text[2:].split("\n", 1)[0].split()
    words = [os.path.basename(w) for w in interp[:2]]
    return text if any(w in SHELL_NAMES for w in words) else None


def model_pitfalls(m, covered: set[int] = frozenset(), watched=None, shells: bool = True) -> list[dict]:
    """Shell pitfalls found from the model alone (no live /proc reading): the script of each shell
    process (its -c string, or the file its command line names: by an absolute path, by one relative to
    the shell's working directory, or as its fd 255 named it when the watch saw it), against each of its
    children; a shell that exec'd its command (`bash -c 'exec env -i … python3 w.py'`: the pid ran the
    shell, then became the command), against what it became; and a wrapper script that exec'd its
    command (`torchrun --no-python wrap.sh`, where bash became the worker): the script its parent's
    command line names (relative ones against the parent's working directory), against the process it
    became. Shell pids in `covered` were read live already. Values of unwatched assignments are not
    shown."""
    from ncclprobe.model.watched import is_watched, redact_assignments
    watched = watched or is_watched

    def show(name, value):
        return value if watched(name) else None

    kids: dict = {}  # (host, pid) -> its children, made when first asked (most trees hold no pitfall)

    def children(key) -> list:
        if not kids:
            for p in m.processes.values():
                kids.setdefault((p.host, p.ppid), []).append(p)
        return kids.get(key, [])

    def subtree(p) -> list[int]:
        out, stack = [], [p]
        while stack:
            q = stack.pop()
            out.append(q.pid)
            stack.extend(children((q.host, q.pid)))
        return sorted(out)

    def is_shell(argv, exe=None) -> bool:
        return os.path.basename(exe or (argv or [""])[0]).lstrip("-") in SHELL_NAMES

    def one(text: str) -> str:
        return " ".join(text.split())

    def script_of(argv, script, cwd) -> tuple[str, str, str | None] | None:
        """(its text, the name a hint gives it, its path) of a shell command line's script."""
        inline = shell_script(argv)
        if inline is not None:
            return inline, f"`{os.path.basename(argv[0]).lstrip('-')} -c`", None
        path = script or resolve(script_file(argv) or "", cwd) if script_file(argv) else script
        text = read_script(path) if path else None
        return (text, os.path.basename(path), path) if text is not None else None

    def record(pf, shell_pid, shell_argv, name, subtree_of, **extra) -> dict:
        return {"shell": shell_pid, "shell_command": redact_assignments(one(" ".join(shell_argv)))[:200],
                "pids": subtree(subtree_of), "var": pf.var, "value": pf.value,
                "command": redact_assignments(one(pf.command)),
                "led_to_target": redact_assignments(one(pf.led_to_target)), "kind": pf.kind, **pitfall_fields(pf, name), **extra}

    out: list[dict] = []
    for s in m.processes.values() if shells else ():
        if s.pid in covered or not s.argv or not is_shell(s.argv, s.exe):
            continue
        found = script_of(s.argv, getattr(s, "script", None), getattr(s, "cwd", None))
        if found is None:
            continue
        script, name, path = found
        env = s.proc_exec_env if s.proc_exec_env is not None else s.start_env
        for child in children((s.host, s.pid)):
            if child.argv == s.argv or not child.argv:
                continue
            for pf in pitfalls(script, child.argv, watched, env, show):
                out.append(record(pf, s.pid, s.argv, name, child, **({"script": path} if path else {})))
    became: set = set()  # the processes a shell's own image (seen, or run's CMD) already explained
    for x in m.processes.values() if shells else ():  # a shell that exec'd its command: the pid became it
        if x.pid in covered or not x.argv or is_shell(x.argv, x.exe):
            continue
        given = m.given_for(x) or {}  # what the run that started it gave its CMD
        first = [given["command"]] if x.ppid == given.get("pid") and given.get("command") else []  # run's CMD
        for image in reversed(first + [i for i in x.images if i != given.get("command")]):
            if not is_shell(image):
                continue
            found = script_of(image, None, getattr(x, "cwd", None))
            if found is not None:
                became.add((x.host, x.pid))
                for pf in pitfalls(found[0], x.argv, watched, None, show):
                    if pf.kind != "unexported":  # its own environment then is unknown: no claim of that kind
                        out.append(record(pf, x.pid, image, found[1], x, exec=True, script=found[2] or found[1],
                                          started_by=x.ppid))
            break
    scripts: dict[int, tuple] = {}  # the shell scripts a command line names, once per command line
    shell_parent: dict[int, bool] = {}  # id(parent) -> is_shell, once per parent (the model's processes live on)
    for x in m.processes.values():  # a wrapper script that exec'd: the shell became x
        parent = m.processes.get((x.host, x.ppid)) if x.ppid else None
        if parent is None or not parent.argv or not x.argv or x.pid in covered or (x.host, x.pid) in became:
            continue
        is_sh = shell_parent.get(id(parent))
        if is_sh is None:
            is_sh = shell_parent[id(parent)] = is_shell(parent.argv, parent.exe)
        if is_sh:
            continue
        hit = scripts.get(id(parent.argv))
        if hit is None:
            named = [(a, p, s) for a in parent.argv[1:] if not a.startswith("-")
                     for p in [resolve(a, getattr(parent, "cwd", None))] if p for s in [_shell_script_of(p)] if s]
            hit = scripts[id(parent.argv)] = (parent.argv, named)
        for arg, path, script in hit[1]:
            for pf in pitfalls(script, x.argv, watched, None, show):
                if pf.kind != "unexported":  # the wrapper's own environment is unknown: only what it wrote is sure
                    out.append(record(pf, x.pid, [arg], os.path.basename(path), x, exec=True, script=path,
                                      started_by=parent.pid,
                                      shell_command=f"{arg} (a wrapper script that exec'd)"))
    return out

def cwd_and_script(reader, base: str, argv: list[str] | None) -> tuple[str | None, str | None]:
    """A process's working directory (base: its /proc/PID), and for a shell that runs a script file
    (`bash run.sh`, not `-c`), the script as its fd 255 names it: bash keeps the script it reads open
    there (shell.c, default_buffered_input), so it names it after the script changed directory. Only
    where the descriptor names a file of the script's name (else fd 255 is put to another use).
    Never raises."""
    try:
        cwd = reader.readlink(base + "/cwd")
    except (OSError, ValueError):
        cwd = None
    path = script_file(list(argv)) if argv else None
    script = None
    if path is not None:
        try:
            target = reader.readlink(base + "/fd/255")
        except (OSError, ValueError):
            target = None
        if target and target.startswith("/") and os.path.basename(target) == os.path.basename(path.rstrip("/")):
            script = target
    return cwd, script


def resolve(path: str, cwd: str | None) -> str | None:
    """A script path as a process named it, made absolute against its working directory (None where it
    is relative and the directory is not known)."""
    if path.startswith("/"):
        return path
    return os.path.normpath(os.path.join(cwd, path)) if cwd and cwd.startswith("/") else None


def where(pf: PrefixPitfall, name: str) -> str:
    """FILE:LINE of a pitfall (name: the script's file, or `bash -c` for an inline one)."""
    return f"{name}:{pf.line}" if pf.line else name


def pitfall_fields(pf: PrefixPitfall, name: str) -> dict:
    """The fields of a pitfall record that say where it is and what a filtering wrapper keeps (the
    model's and inspect's records alike)."""
    return {"line": pf.line or None, "where": where(pf, name), "kept": list(pf.kept)}
