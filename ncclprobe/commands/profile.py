"""Profiles: what `run --set/--set-default/--pin`, `inject install` and the boot probe apply in every
Python process they reach.

The text format (parsed by the boot probe's own parser, so the tool and the probe cannot disagree):

    # comment
    set NCCL_PROTO=LL            NCCL_PROTO=LL in every process
    default NCCL_ALGO=Ring       only where NCCL_ALGO is absent
    pin NCCL_PROTO               refuse in-process writes that would change NCCL_PROTO

A value is everything after the first '='; it may be empty, must not hold a newline or NUL. Only
watched variables can be pinned (the probe guards only those).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from ncclprobe._lib import ncclprobe_boot as _boot
from ncclprobe.commands.envfile import AssignmentError
from ncclprobe.model.watched import REDACTED, is_watched


@dataclass(frozen=True)
class Profile:
    sets: tuple[tuple[str, str], ...] = ()
    defaults: tuple[tuple[str, str], ...] = ()
    pins: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.sets or self.defaults or self.pins)

    def entries(self) -> list[tuple[str, str, str | None]]:
        return ([("set", k, v) for k, v in self.sets] + [("default", k, v) for k, v in self.defaults]
                + [("pin", k, None) for k in self.pins])

    def to_text(self) -> str:
        return _boot.format_profile(self.entries())

    def env_changes(self, base_env: Mapping[str, str]) -> dict[str, str]:
        """The variables to add or change in base_env: every `set`, and each `default` whose name
        base_env lacks."""
        out = {k: v for k, v in self.defaults if k not in base_env}
        out.update(self.sets)
        return out

    def to_json(self, redact: bool = True) -> dict:
        """JSON view; values of non-watched variables are shown as <redacted> unless redact=False."""
        def shown(k, v):
            return v if is_watched(k) or not redact else "<redacted>"
        return {"set": {k: shown(k, v) for k, v in self.sets},
                "default": {k: shown(k, v) for k, v in self.defaults},
                "pin": list(self.pins)}


def _from_entries(entries) -> Profile:
    sets = tuple((n, v) for op, n, v in entries if op == "set")
    defaults = tuple((n, v) for op, n, v in entries if op == "default")
    pins = tuple(n for op, n, _ in entries if op == "pin")
    return Profile(sets, defaults, pins)


def parse(text: str, source: str = "profile") -> Profile:
    """Profile text -> Profile; AssignmentError names `source:line`."""
    try:
        return _from_entries(_boot.parse_profile(text, source))
    except _boot.ProfileError as exc:
        raise AssignmentError(str(exc)) from None


def read(path: str | Path) -> Profile:
    p = Path(path)
    try:
        text = p.read_bytes().decode("utf-8", errors="surrogateescape")
    except OSError as exc:
        raise AssignmentError(f"{p}: cannot read ({exc.strerror or exc})") from None
    return parse(text, str(p))


def from_cli(sets: Iterable[str] = (), defaults: Iterable[str] = (), pins: Iterable[str] = (),
             set_option: str = "--set") -> Profile:
    """--set K=V (or set_option: --enforce), --set-default K=V and --pin K options -> Profile;
    AssignmentError names the option and the variable, never a value of a variable outside the watched
    set (it may be a token)."""
    entries = []
    for option, op, items in ((set_option, "set", sets), ("--set-default", "default", defaults),
                              ("--pin", "pin", pins)):
        for item in items:
            where = f"{option} {_shown(item)}"
            if op != "pin" and "=" not in item:
                if is_watched(item.strip()):
                    raise AssignmentError(f"{where}: expected NAME=VALUE")
                # `--set $HF_TOKEN`: the argument may be the value itself
                raise AssignmentError(f"{option}: expected NAME=VALUE (the argument has no '='; not shown, "
                                      "it may be a value)")
            try:
                entry = _boot.parse_line(f"{op} {item}", where)
            except _boot.ProfileError as exc:
                raise AssignmentError(str(exc)) from None
            if entry is None:
                raise AssignmentError(f"{option}: empty value")
            entries.append(entry + (where,))
    try:
        return _from_entries(_boot.check_entries(entries))
    except _boot.ProfileError as exc:
        raise AssignmentError(str(exc)) from None


def _shown(item: str) -> str:
    """An option's argument as an error may show it: NAME=VALUE with the value of a variable
    outside the watched set as <redacted>."""
    name, eq, _ = item.partition("=")
    return item if not eq or is_watched(name.strip()) else f"{name}={REDACTED}"
