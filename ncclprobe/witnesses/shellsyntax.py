"""A small lexer for shell syntax, enough to find a script's simple commands and the line each starts on
(witnesses/shells.py): words with their quotes removed (a backslash escapes the next character, `'…'`
is literal, `"…"` keeps `$`, backquotes and `\\` escapes), parameter expansions and command substitutions
kept as written and one word however many spaces, operators or quotes they hold (`$(cd "$(dirname
"$0")" && pwd)`), line continuations joined, comments dropped, here-document bodies skipped. No
expansion, no aliases, no `case` patterns: what it cannot read it raises on (ValueError), and the
caller claims nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

# Operators, longest first; a redirection's next word is its target (a here-document's: its delimiter)
_OPERATORS = ("&>>", "<<<", "<<-", ";;&", "&&", "||", ";;", ";&", "|&", "&>", ">>", "<<", ">&", "<&", "<>", ">|",
              ";", "&", "|", "(", ")", "<", ">", "\n")
_WORD_ENDS = frozenset(" \t\r\n;&|<>()")
_PAIRS = {"(": ")", "{": "}"}
MAX_DEPTH = 64  # nested substitutions and quotes deeper than this are not read (ValueError), not recursed into


@dataclass(frozen=True)
class Token:
    text: str  # a word with its quotes removed (expansions kept as written: `$x`, `$(cmd)`), or an operator
    line: int  # the line it starts on (1-based)
    op: bool = False


def _closing(s: str, i: int, depth: int = 0) -> int:
    """The index just past the construct that starts at s[i] (`$(`, `${`, `$((`, a backquote), nested
    ones and quotes inside skipped. Raises ValueError where it never closes, or nests too deep."""
    if depth > MAX_DEPTH:
        raise ValueError("nested too deep")
    if s[i] == "`":
        j = i + 1
        while j < len(s) and s[j] != "`":
            j += 2 if s[j] == "\\" else 1
        if j >= len(s):
            raise ValueError("unclosed `")
        return j + 1
    opener = s[i + 1]
    closer, level, j = _PAIRS[opener], 0, i + 1
    while j < len(s):
        ch = s[j]
        if ch == "\\":
            j += 2
            continue
        if ch == "'" and opener == "(":
            k = s.find("'", j + 1)
            if k < 0:
                raise ValueError("unclosed '")
            j = k + 1
            continue
        if ch == '"':
            j = _dquote_end(s, j, depth + 1)
            continue
        if ch == "$" and j + 1 < len(s) and s[j + 1] in "({" or ch == "`":
            j = _closing(s, j, depth + 1)
            continue
        if ch == opener:
            level += 1
        elif ch == closer:
            level -= 1
            if level == 0:
                return j + 1
        j += 1
    raise ValueError(f"unclosed ${opener}")


def _dquote_end(s: str, i: int, depth: int = 0) -> int:
    """The index just past the double-quoted string that starts at s[i]."""
    j = i + 1
    while j < len(s):
        ch = s[j]
        if ch == "\\":
            j += 2
        elif ch == '"':
            return j + 1
        elif ch == "$" and j + 1 < len(s) and s[j + 1] in "({" or ch == "`":
            j = _closing(s, j, depth + 1)
        else:
            j += 1
    raise ValueError('unclosed "')


def _word(s: str, i: int) -> tuple[str, int]:
    """One word from s[i]: its text with quotes removed (a backslash escapes the next character; a
    backslash-newline is a line continuation, gone), expansions kept as written; and where it ends."""
    out: list[str] = []
    n = len(s)
    while i < n and s[i] not in _WORD_ENDS:
        ch = s[i]
        if ch == "\\":
            if s[i + 1:i + 2] != "\n":
                out.append(s[i + 1:i + 2])
            i += 2
        elif ch == "'":
            j = s.find("'", i + 1)
            if j < 0:
                raise ValueError("unclosed '")
            out.append(s[i + 1:j])
            i = j + 1
        elif ch == "$" and s[i + 1:i + 2] == "'":  # $'...': ANSI-C quoting, kept as its escapes are written
            j = i + 2
            while j < n and s[j] != "'":
                j += 2 if s[j] == "\\" else 1
            if j >= n:
                raise ValueError("unclosed $'")
            out.append(s[i + 2:j])
            i = j + 1
        elif ch == '"':
            j = _dquote_end(s, i)
            inner, k = s[i + 1:j - 1], 0
            while k < len(inner):  # inside double quotes a backslash escapes only $ ` " \ and the newline
                c = inner[k]
                if c == "\\" and k + 1 < len(inner) and inner[k + 1] in '$`"\\\n':
                    if inner[k + 1] != "\n":
                        out.append(inner[k + 1])
                    k += 2
                elif c == "$" and k + 1 < len(inner) and inner[k + 1] in "({" or c == "`":
                    e = _closing(inner, k)
                    out.append(inner[k:e])
                    k = e
                else:
                    out.append(c)
                    k += 1
            i = j
        elif ch == "$" and s[i + 1:i + 2] in ("(", "{") or ch == "`":
            j = _closing(s, i)
            out.append(s[i:j])
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out), i


def lex(script: str) -> list[Token]:
    """The tokens of a shell script: words (quotes removed, expansions kept as written) and operators,
    each with the line it starts on. Comments (a `#` that starts a word) are dropped, line
    continuations joined, here-document bodies skipped. Raises ValueError on an unclosed quote or
    substitution."""
    s, i, n, line = script, 0, len(script), 1
    out: list[Token] = []
    heredocs: list[tuple[str, bool]] = []  # delimiters of the here-documents whose bodies start at the next line
    while i < n:
        ch = s[i]
        if ch == "\\" and s[i + 1:i + 2] == "\n":
            i, line = i + 2, line + 1
            continue
        if ch in " \t\r":
            i += 1
            continue
        if ch == "#":
            j = s.find("\n", i)
            i = n if j < 0 else j
            continue
        if ch == "\n":
            out.append(Token("\n", line, True))
            i, line = i + 1, line + 1
            for delim, tabs in heredocs:  # the bodies, one after the other, each to its delimiter's line
                while i < n:
                    j = s.find("\n", i)
                    body = s[i:n if j < 0 else j]
                    i, line = (n, line) if j < 0 else (j + 1, line + 1)
                    if (body.lstrip("\t") if tabs else body) == delim:
                        break
            heredocs.clear()
            continue
        op = next((o for o in _OPERATORS if s.startswith(o, i)), None)
        if op is not None:
            out.append(Token(op, line, True))
            i += len(op)
            if op in ("<<", "<<-"):
                while i < n and s[i] in " \t":
                    i += 1
                delim, i = _word(s, i)
                heredocs.append((delim, op == "<<-"))
                out.append(Token(delim, line))
            continue
        start = line
        j = i
        text, i = _word(s, i)
        line += s.count("\n", j, i)
        out.append(Token(text, start))
    return out
