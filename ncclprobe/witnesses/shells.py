"""Shell command lines that scope a variable to the wrong command.

In `NCCL_PROTO=LL cd /srv && python server.py`, the assignment is part of the `cd` simple command and
reaches only its environment (GNU Bash manual §3.7.1, §3.7.4); `NCCL_PROTO=LL; python server.py`
sets an unexported shell variable. Both are only visible while the shell is: bash 5 execs the last
command of `bash -c 'A && B'`, replacing itself, so where no shell is left nothing is claimed.
"""
from __future__ import annotations

import os
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass

from ncclprobe.model.watched import REDACTED

SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "busybox"})
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.S)
_SEPARATORS = {";", "&&", "||", "|", "&", "|&", ";;", "\n"}
_REDIRECT = re.compile(r"^[<>]+&?$|^&>>?$")
# Words that start a list element without being its command.
_KEYWORDS = {"then", "do", "else", "elif", "if", "while", "until", "!", "{", "(", "time", "}", ")", "fi", "done"}
# Commands that run the rest of their arguments as the command (the prefix still reaches it).
_WRAPPERS = {"env", "nohup", "exec", "nice", "stdbuf", "setsid", "taskset", "numactl", "chrt", "timeout",
             "sudo", "command", "builtin", "ionice"}
# Of those, the programs that exec their command (the pid stays; its program and environment change);
# timeout and sudo fork it instead, exec/command/builtin are the shell's own
EXEC_WRAPPERS = frozenset({"env", "nohup", "nice", "ionice", "stdbuf", "setsid", "taskset", "numactl", "chrt"})


@dataclass(frozen=True)
class SimpleCommand:
    assignments: tuple[tuple[str, str], ...]
    words: tuple[str, ...]  # the command and its arguments, wrappers removed
    text: str  # as written, for evidence
    exported: tuple[str, ...] = ()  # names made environment variables by `export`/`declare -x`
    tokens: tuple[str, ...] = ()  # the words as written, keywords and wrappers included

    def display(self, show: Callable[[str, str], str | None] | None = None) -> str:
        """The text with each NAME=VALUE word's value as show(NAME, VALUE) gives it (None: redacted),
        so evidence never prints a value the caller may not show (a token in a prefix, say)."""
        if show is None:
            return self.text
        words = []
        for tok in self.tokens:
            m = _ASSIGN.match(tok)
            if m is None:
                words.append(shlex.quote(tok) if tok else "''")
                continue
            value = show(m.group(1), m.group(2))
            words.append(f"{m.group(1)}=" + (REDACTED if value is None else shlex.quote(value) if value else ""))
        return " ".join(words)


def strip_comments(script: str) -> str:
    """The script without its comments (a `#` that starts a word, outside quotes, to the end of its
    line; the newline stays: it ends the command before it). A quote inside a comment (`# don't`) is
    no quote."""
    out: list[str] = []
    quote, i, n = "", 0, len(script)
    while i < n:
        ch = script[i]
        if quote:
            if ch == "\\" and quote == '"' and i + 1 < n:
                out.append(script[i:i + 2])
                i += 2
                continue
            if ch == quote:
                quote = ""
        elif ch == "\\" and i + 1 < n:
            out.append(script[i:i + 2])
            i += 2
            continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or script[i - 1] in " \t\n;&|()"):
            j = script.find("\n", i)
            i = n if j < 0 else j
            continue
        out.append(ch)
        i += 1
    return "".join(out)


def split_script(script: str) -> list[SimpleCommand]:
    """The simple commands of a shell list (`;`, `&&`, `||`, `|`, `&`, newlines), shlex-level: no
    expansion, quotes honoured, comments dropped. Raises ValueError on unbalanced quotes."""
    lex = shlex.shlex(strip_comments(script), posix=True, punctuation_chars=";&|<>()\n")
    lex.whitespace = " \t\r"
    lex.whitespace_split = True
    # comments by hand: shlex's own commenters swallow the newline that ends the command before them
    lex.commenters = ""
    commands: list[SimpleCommand] = []
    current: list[str] = []

    def flush():
        if current:
            commands.append(_simple(current))
            current.clear()

    skip_next = False
    for tok in lex:
        if skip_next:
            skip_next = False
            continue
        if tok and set(tok) <= set(";&|\n()") and tok not in ("(", ")"):
            flush()
            continue
        if _REDIRECT.match(tok):
            skip_next = True  # the redirection's target is not an argument
            if current and current[-1].isdigit():
                current.pop()  # `2>&1`: the fd number is not an argument either
            continue
        if tok in ("(", ")"):
            flush()
            continue
        current.append(tok)
    flush()
    return commands


def _simple(tokens: list[str]) -> SimpleCommand:
    text = " ".join(shlex.quote(t) if t != "" else "''" for t in tokens)
    written = tuple(tokens)
    while tokens and tokens[0] in _KEYWORDS:
        tokens = tokens[1:]
    assigns: list[tuple[str, str]] = []
    i = 0
    while i < len(tokens) and _ASSIGN.match(tokens[i]):
        m = _ASSIGN.match(tokens[i])
        assigns.append((m.group(1), m.group(2)))
        i += 1
    words = tokens[i:]
    exported: list[str] = []
    if words and words[0] in ("export", "declare", "typeset") and (words[0] == "export" or "-x" in words[1:]):
        exported = [w.split("=", 1)[0] for w in words[1:] if not w.startswith("-")]
    while words and os.path.basename(words[0]) in _WRAPPERS:
        wrapper = os.path.basename(words[0])
        words = words[1:]
        while words and (words[0].startswith("-") or (wrapper == "env" and _ASSIGN.match(words[0]))):
            m = _ASSIGN.match(words[0])
            if m:
                assigns.append((m.group(1), m.group(2)))
            words = words[1:]
        if wrapper in ("timeout",) and words and re.match(r"^\d", words[0]):
            words = words[1:]
    return SimpleCommand(tuple(assigns), tuple(words), text, tuple(exported), written)


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
    """Is this simple command the one that became `child` (its exec'ed command line)? Words with
    parameter expansions ($here/w.py, "$@") match what they can expand to."""
    if not cmd.words or not child:
        return False
    if not _word_matches(os.path.basename(cmd.words[0]), os.path.basename(child[0])):
        # an interpreter may show its real name (python3.11 for python); compare the arguments
        return len(cmd.words) > 1 and _words_match(list(cmd.words[1:]), child[1:])
    return _words_match(list(cmd.words[1:]), child[1:]) or len(cmd.words) == 1


@dataclass(frozen=True)
class PrefixPitfall:
    var: str
    value: str
    command: str  # the simple command that received the assignment ("" for a bare assignment)
    led_to_target: str  # the simple command that became the path to the target
    kind: str  # prefix (scoped to another command) | unexported (bare assignment, never exported)


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
    for c in commands[:lead_index] + commands[lead_index + 1:]:
        for name, value in c.assignments:
            if not watched(name) or name in prefixed_lead:
                continue
            if c.words:
                out.append(PrefixPitfall(name, value, c.display(show), lead.display(show), "prefix"))
            elif (shell_env is not None and name not in shell_env and name not in exported
                  and commands.index(c) < lead_index):
                out.append(PrefixPitfall(name, value, "", lead.display(show), "unexported"))
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
    process whose command line names it by an absolute path (or whose `script` the watch recorded),
    against each of its children; and a wrapper script that exec'd its command (`torchrun --no-python
    wrap.sh`, where bash became the worker): the script its parent's command line names, against the
    process it became. Shell pids in `covered` were read live already. Values of unwatched assignments
    are not shown."""
    from ncclprobe.model.watched import is_watched, redact_assignments
    watched = watched or is_watched

    def show(name, value):
        return value if watched(name) else None

    kids: dict = {}
    for p in m.processes.values():
        kids.setdefault((p.host, p.ppid), []).append(p)

    def subtree(p) -> list[int]:
        out, stack = [], [p]
        while stack:
            q = stack.pop()
            out.append(q.pid)
            stack.extend(kids.get((q.host, q.pid), []))
        return sorted(out)

    def is_shell(p) -> bool:
        return os.path.basename((p.exe or "") or (p.argv or [""])[0]) in SHELL_NAMES

    def one(text: str) -> str:
        return " ".join(text.split())

    out: list[dict] = []
    for s in m.processes.values() if shells else ():
        if s.pid in covered or not s.argv or not is_shell(s):
            continue
        path = getattr(s, "script", None) or script_file(s.argv)
        script = shell_script(s.argv) or (read_script(path) if path and path.startswith("/") else None)
        if script is None:
            continue
        env = s.proc_exec_env if s.proc_exec_env is not None else s.start_env
        for child in kids.get((s.host, s.pid), []):
            if child.argv == s.argv or not child.argv:
                continue
            for pf in pitfalls(script, child.argv, watched, env, show):
                out.append({"shell": s.pid, "shell_command": redact_assignments(one(" ".join(s.argv)))[:200], "pids": subtree(child),
                            "var": pf.var, "value": pf.value, "command": redact_assignments(one(pf.command)),
                            "led_to_target": redact_assignments(one(pf.led_to_target)), "kind": pf.kind})
    scripts: dict[int, tuple] = {}  # the shell scripts a command line names, once per command line
    for x in m.processes.values():  # a wrapper script that exec'd: the shell became x
        parent = m.processes.get((x.host, x.ppid)) if x.ppid else None
        if parent is None or not parent.argv or not x.argv or is_shell(parent) or x.pid in covered:
            continue
        hit = scripts.get(id(parent.argv))
        if hit is None:
            named = [(a, s) for a in parent.argv[1:] if a.startswith("/") for s in [_shell_script_of(a)] if s]
            hit = scripts[id(parent.argv)] = (parent.argv, named)
        for arg, script in hit[1]:
            for pf in pitfalls(script, x.argv, watched, None, show):
                if pf.kind == "prefix":  # the wrapper's own environment is unknown: only prefixes are sure
                    out.append({"shell": x.pid, "shell_command": f"{arg} (a wrapper script that exec'd)",
                                "pids": subtree(x), "var": pf.var, "value": pf.value, "command": redact_assignments(one(pf.command)),
                                "led_to_target": redact_assignments(one(pf.led_to_target)), "kind": pf.kind,
                                "exec": True, "script": arg, "started_by": parent.pid})
    return out
