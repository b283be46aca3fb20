"""What to measure: the configuration matrix and the message sizes (no torch here)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from ncclprobe.model import tuning
from ncclprobe.commands.envfile import AssignmentError, parse_assignment

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
_SUFFIX = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}  # powers of 1024, as nccl-tests parses
_NAME_RE = re.compile(r"^[A-Za-z0-9_.+-]+$")
DEFAULTS = "defaults"


@dataclass(frozen=True)
class Config:
    """One NCCL configuration: a name and the variables it sets (on top of --env)."""
    name: str
    env: dict[str, str] = field(default_factory=dict)

    def forced(self, var: str) -> str | None:
        return self.env.get(var)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)B?\s*", str(text), re.IGNORECASE)
    if not m:
        raise AssignmentError(f"bad size {text!r} (expected e.g. 1024, 8K, 64M)")
    return int(m.group(1)) * _SUFFIX[m.group(2).upper()]


def sweep(minbytes: int, maxbytes: int, stepfactor: int, elem: int) -> list[int]:
    """nccl-tests' -b/-e/-f sweep, rounded down to whole elements (at least one)."""
    if minbytes <= 0 or maxbytes < minbytes:
        raise AssignmentError(f"bad size range {minbytes}..{maxbytes}")
    if stepfactor < 2:
        raise AssignmentError("-f/--stepfactor must be at least 2")
    out, size = [], minbytes
    while size <= maxbytes:
        out.append(max(elem, size // elem * elem))
        size *= stepfactor
    return sorted(set(out))


def parse_tokens(text: str) -> list[int]:
    try:
        tokens = sorted({int(t) for t in str(text).split(",") if t.strip()})
    except ValueError:
        raise AssignmentError(f"--tokens: expected comma-separated integers, got {text!r}") from None
    if not tokens or tokens[0] < 1:
        raise AssignmentError("--tokens needs positive integers")
    return tokens


def model_sizes(hidden: int, tokens: list[int], dtype: str) -> dict[int, int]:
    """tokens -> all-reduce bytes of one hidden-state reduction: tokens x hidden x dtype bytes (the
    full hidden size, not divided by TP: row-parallel layers reduce the whole activation)."""
    if hidden <= 0:
        raise AssignmentError("--hidden must be positive")
    return {t: t * hidden * DTYPE_BYTES[dtype] for t in tokens}


def _split(text: str) -> list[str]:
    return [p.strip() for p in str(text or "").split(",") if p.strip()]


def parse_config(text: str) -> Config:
    """`NAME:K=V,K=V` (values cannot contain commas; use --env for such variables)."""
    name, sep, rest = text.partition(":")
    name = name.strip()
    if not sep or not _NAME_RE.match(name):
        raise AssignmentError(f"--config {text!r}: expected NAME:K=V[,K=V...] (NAME of letters, digits, _.+-)")
    env = dict(parse_assignment(item, f"--config {name}") for item in _split(rest))
    if not env:
        raise AssignmentError(f"--config {text!r} sets no variable")
    return Config(name, env)


_EXAMPLE = {"NCCL_PROTO": "^LL128", "NCCL_ALGO": "^NVLS"}


def _known(name: str, universe: tuple[str, ...]) -> str | None:
    """NCCL's spelling of `name` when NCCL knows it; NCCL compares these names case-insensitively."""
    return next((n for n in universe if n.lower() == name.strip().lower()), None)


def _forced(option: str, var: str, text: str, universe: tuple[str, ...]) -> list[Config]:
    out = []
    for name in _split(text):
        known = _known(name, universe)
        if known is None:
            raise AssignmentError(
                f"{option} {name!r}: NCCL has no such {'protocol' if var == 'NCCL_PROTO' else 'algorithm'}; "
                f"valid names (any case): "
                f"{', '.join(universe)} (for a selector such as {_EXAMPLE[var]} use --config NAME:{var}=...)")
        out.append(Config(f"{option[2:]}={known}", {var: known}))
    return out


def check_selector(var: str, value: str, where: str) -> None:
    """NCCL_PROTO / NCCL_ALGO as NCCL parses them (names, a leading ^, `func:list;...` since 2.24):
    a name NCCL does not know is a usage error here instead of a configuration NCCL silently ignores."""
    universe = tuning.PROTOS if var == "NCCL_PROTO" else tuning.ALGOS
    for entry in value.split(";"):
        names = entry.split(":", 1)[1] if ":" in entry else entry
        names = names.strip()
        names = names[1:] if names.startswith("^") else names
        bad = [n.strip() for n in names.split(",") if n.strip() and _known(n, universe) is None]
        if bad:
            raise AssignmentError(f"{where}: {var}={value}: unknown name {', '.join(map(repr, bad))}; valid "
                                  f"names (any case): {', '.join(universe)}")


def build_matrix(protos: str, algos: str, configs=()) -> list[Config]:
    """NCCL's defaults, then each protocol forced, each algorithm forced, then the --config entries.
    NCCL_PROTO / NCCL_ALGO are read at each communicator's tuning (src/graph/tuning.cc). Names are
    checked against NCCL's and written in NCCL's spelling (proto=LL128 for --proto ll128)."""
    out = [Config(DEFAULTS)]
    out += _forced("--proto", "NCCL_PROTO", protos, tuning.PROTOS)
    out += _forced("--algo", "NCCL_ALGO", algos, tuning.ALGOS)
    extra = [parse_config(c) for c in configs]
    for c in extra:
        for var in ("NCCL_PROTO", "NCCL_ALGO"):
            if var in c.env:
                check_selector(var, c.env[var], f"--config {c.name}")
    out += extra
    names = [c.name for c in out]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise AssignmentError(f"configuration names must be unique: {', '.join(dup)}")
    return out


NCCL_PROTOS, NCCL_ALGOS = "LL,LL128,Simple", "Ring,Tree"  # the default matrix on NCCL
GLOO_ONE_CONFIG = ("gloo: one configuration, NCCL's defaults: NCCL variables cannot change a gloo "
                   "all-reduce, so more configurations would only measure noise (--proto, --algo or "
                   "--config run them anyway)")


def select(backend: str, protos: str | None, algos: str | None, configs=()) -> tuple[list[Config], str]:
    """The configurations to run, and a note when the backend narrowed them. None means the option
    was not given: on NCCL that forces each protocol and each algorithm; gloo reads no NCCL variable,
    so there the defaults run, plus only what the user asked for."""
    if backend == "gloo":
        cfgs = build_matrix(protos or "", algos or "", configs)
        return cfgs, GLOO_ONE_CONFIG if len(cfgs) == 1 and protos is None and algos is None else ""
    return build_matrix(NCCL_PROTOS if protos is None else protos,
                        NCCL_ALGOS if algos is None else algos, configs), ""


def export_line(env: dict[str, str]) -> str:
    import shlex
    return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items())) if env else ""
