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
_EXPANSION = re.compile(r"\$\{[^}]*\}|\$\([^)]*\)|`[^`]*`|\$[A-Za-z_][A-Za-z0-9_]*|\$[0-9@*#?$!-]")
_ALL_ARGS = {"$@", "${@}", "$*", "${*}"}


def _word_matches(word: str, arg: str) -> bool:
    if "$" not in word and "`" not in word:
        return word == arg
    parts = _EXPANSION.split(word)
    return re.fullmatch(".*".join(map(re.escape, parts)), arg, re.S) is not None


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
