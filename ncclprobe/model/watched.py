"""The watched set: the only environment variables ncclprobe ever logs or prints by default.

DESIGN.md §4: everything else stays out of logs and output unless the user asks (--all-vars), and
then secret-looking names are redacted unless --no-redact. Command lines and environment values are
redacted by one rule everywhere, the boot probe's own (redact_argv, _secretish), so the probe, inspect, run
and report agree. The tool reads them whole (the probe only its first ARGV_SCAN characters), in linear time.
"""
from __future__ import annotations

import functools
import re

from collections.abc import Mapping

WATCHED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "NCCLPROBE_")
WATCHED_NAMES = frozenset({
    "TORCH_DISTRIBUTED_DEBUG", "CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "PYTHONPATH",
    "SGLANG_NCCL_SO_PATH", "VLLM_NCCL_SO_PATH",
})
# The boot probe's lists (tests/test_secrets.py checks they are the same): a name holding a marker, or
# ending with an ending, looks secret (looks_secret says it, by the probe's own rule).
SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "PASSPHRASE", "KEY", "CREDENTIAL", "AUTH", "PRIVATE",
                  "COOKIE")
SECRET_ENDINGS = ("PASS", "_PAT", "-PAT", "_PWD", "-PWD")
REDACTED = "<redacted>"


def is_watched(name: str) -> bool:
    return name in WATCHED_NAMES or name.startswith(WATCHED_PREFIXES)


def looks_secret(name: str) -> bool:
    """A secret-looking name (HF_TOKEN, DB_PASS, GITHUB_PAT, MYSQL_PWD; not GIT_AUTHOR_NAME, PATH, PWD)."""
    from ncclprobe._lib import ncclprobe_boot
    return ncclprobe_boot._secretish(name)


def redact_argv(argv: list) -> list:
    """A command line as it may be shown or stored: the boot probe's redact_argv (secret-looking
    options and assignments, URL passwords, headers, known tools' password options...), over the whole
    command line. A list holding something other than strings (a foreign event) is redacted element
    by element."""
    from ncclprobe._lib import ncclprobe_boot
    if all(isinstance(a, str) for a in argv):
        if sum(map(len, argv)) <= 4096:  # (a long one is redacted afresh: the cache never holds a large line)
            return list(_redacted(tuple(argv)))
        return ncclprobe_boot.redact_argv(list(argv), None)
    return [ncclprobe_boot.redact_argv([a], None)[0] if isinstance(a, str) else a for a in argv]


@functools.lru_cache(maxsize=4096)
def _redacted(argv: tuple[str, ...]) -> tuple[str, ...]:
    """(a fleet's processes share a few command lines: each is redacted once)"""
    from ncclprobe._lib import ncclprobe_boot
    return tuple(ncclprobe_boot.redact_argv(list(argv), None))


def redact_text(text: str) -> str:
    """A command line or value given as one string (shell code, an environment value): redact_argv's rule."""
    return redact_argv([text])[0]


def select(env: Mapping[str, str] | None, all_vars: bool = False, redact: bool = True) -> dict[str, str] | None:
    """The part of env that may be shown: the watched set, or everything with secrets redacted (a
    secret-looking name's whole value; in other values, what redact_text hides: URL passwords, headers,
    tokens...)."""
    if env is None:
        return None
    if not all_vars:
        return {k: v for k, v in env.items() if is_watched(k)}
    if not redact:
        return dict(env)
    return {k: v if is_watched(k) else REDACTED if looks_secret(k) else redact_text(v) for k, v in env.items()}


def shown_values(values: Mapping[str, str]) -> dict[str, str]:
    """Assignments as output shows them (--expect, --set, --env): a value outside the watched set may
    be a secret, so only its name is shown."""
    return {k: v if is_watched(k) else REDACTED for k, v in values.items()}


# a NAME=VALUE word (in a command line, shell code)
ASSIGN_WORD = re.compile(r"(?<![\w-])([A-Za-z_][A-Za-z0-9_]*)=(\S*)")
# Command lines are shown on one line: a newline or tab in an argument (`python -c` scripts) is escaped.
_CONTROL = {**{i: f"\\x{i:02x}" for i in range(32)}, 9: "\\t", 10: "\\n", 13: "\\r", 127: "\\x7f"}


def one_line(text: str) -> str:
    return text if text.isprintable() else text.translate(_CONTROL)


def redact_assignments(text: str) -> str:
    """Shell code or a command line with the value of every NAME=VALUE word of a variable outside the
    watched set redacted (those are environment values, and may be secrets)."""
    return ASSIGN_WORD.sub(lambda m: m.group(0) if is_watched(m.group(1)) else f"{m.group(1)}={REDACTED}", text)
