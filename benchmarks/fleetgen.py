"""Fleet-sized log directories built from a real run of the project (tests/data/demo-run, a kept
`ncclprobe demo` run), the way `srun ncclprobe run --dir LOGS/$(hostname) -- …` leaves them: one
directory per host, every line a real line of that run with its host, pids, ranks and communicator
hashes rewritten (no hand-written event).

    python benchmarks/fleetgen.py job OUT --hosts 256        # one job, 8 ranks per host, planted causes
    python benchmarks/fleetgen.py replicas OUT --hosts 256   # 256 independent copies of the demo's job

job: the demo's two ranks are copied 4 times per host (8 ranks a host); its communicators span every
host (same commHash, ranks host*8+k, nranks hosts*8). Planted causes (`PLANTED` says where):
  - the launcher of host `drop_host` drops NCCL_PROTO: its 8 workers start without it;
  - two ranks on two hosts (`odd`) get NCCL_ALGO=Tree where the others have Ring: their communicators
    diverge from the rest.
The demo's own causes (the curated-env worker, the late write, the speculative communicator) are on
every host alike."""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "tests" / "data" / "demo-run"
LAUNCHER, RANKED, SINGLES, HOST = 29562, (29565, 29566), (29564, 29567, 29569), "vm"
COPIES = 4  # copies of the demo's 2 ranks on a job's host: 8 ranks
PID_STEP = 100


def host_name(i: int) -> str:
    return f"node{i:04d}"


def planted(hosts: int) -> dict:
    """Where job() plants its causes: the host whose launcher drops NCCL_PROTO, the two odd ranks."""
    drop = hosts // 2 + 1
    return {"drop_host": host_name(drop), "drop_var": "NCCL_PROTO",
            "odd": [(host_name(1), 1 * 8 + 3), (host_name(hosts - 2), (hosts - 2) * 8 + 6)],
            "odd_var": "NCCL_ALGO", "odd_value": "Tree"}


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _rewrite(ev: dict, host: str, pids: dict[int, int], rank=None, nranks=None, hashes=None, env_edit=None) -> dict:
    ev = dict(ev)
    if ev.get("host") == HOST:
        ev["host"] = host
    for key in ("pid", "ppid"):
        if isinstance(ev.get(key), int) and ev[key] in pids:
            ev[key] = pids[ev[key]]
    if rank is not None and isinstance(ev.get("rank"), int):
        ev["rank"] = rank(ev["rank"])
    if nranks is not None and isinstance(ev.get("nranks"), int):
        ev["nranks"] = nranks
        if isinstance(ev.get("nnodes"), int):
            ev["nnodes"] = nranks // (2 * COPIES) or 1
    if hashes:
        for key in ("comm_hash", "uid"):
            if ev.get(key) in hashes:
                ev[key] = hashes[ev[key]]
    if env_edit is not None:
        for key in ("env", "exec_env"):
            if isinstance(ev.get(key), dict):
                ev[key] = env_edit(dict(ev[key]))
        if ev.get("ev") == "nccl_getenv":
            ev = env_edit.getenv(ev)
        if ev.get("ev") == "env_write" and ev.get("var") == env_edit.var and ev.get("old") == env_edit.was:
            ev["old"] = env_edit.value
    return ev


class _EnvEdit:
    """Drop a variable, or give it another value, in every environment a process's lines carry."""

    def __init__(self, var: str, value: str | None, was: str):
        self.var, self.value, self.was = var, value, was  # was: the launcher's value (the job's)

    def __call__(self, env: dict) -> dict:
        if self.var in env:
            if self.value is None:
                del env[self.var]
            else:
                env[self.var] = self.value
        return env

    def getenv(self, ev: dict) -> dict:
        if ev.get("var") == self.var and ev.get("value") == self.was:
            ev = dict(ev, value=self.value)
        return ev


def _debug_log(text: str, host: str, pid: int, new_pid: int, rank=None, nranks=None, hashes=None,
               edit=None) -> str:
    if edit is not None:  # NCCL's own "NCCL_X set by environment to V" line, as the edited environment gives it
        said = f"{edit.var} set by environment to {edit.was}\n"
        text = "".join(line if not line.endswith(said) else
                       "" if edit.value is None else line.replace(said, f"{edit.var} set by environment to {edit.value}\n")
                       for line in text.splitlines(keepends=True))
    text = text.replace(f"{HOST}:{pid}:{pid}", f"{host}:{new_pid}:{new_pid}")
    if rank is not None:
        text = re.sub(r"\brank (\d+) (nranks|nRanks) \d+", lambda m: f"rank {rank(int(m[1]))} {m[2]} {nranks}", text)
        text = re.sub(r"\bnNodes \d+", f"nNodes {nranks // (2 * COPIES) or 1}", text)
    for old, new in (hashes or {}).items():
        text = text.replace(old, new)
    return text


def _write(out: Path, host: str, pid: int, events: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{host}-{pid}.jsonl").write_text("".join(json.dumps(e, separators=(",", ":")) + "\n" for e in events))


def _hashes(src: Path) -> set[str]:
    found = set()
    for f in src.glob("*.jsonl"):
        for ev in _lines(f):
            for key in ("comm_hash", "uid"):
                if isinstance(ev.get(key), str):
                    found.add(ev[key])
    return found


def replicas(out: Path, hosts: int, src: Path = SRC) -> list[Path]:
    """`hosts` independent copies of the demo's job, each on its own host with its own pids and
    communicator hashes."""
    files = {int(f.stem.split("-")[1]): _lines(f) for f in src.glob(f"{HOST}-*.jsonl")}
    pids = sorted({*files, 29517, 29568})
    dirs = []
    for i in range(hosts):
        host = host_name(i)
        d = out / host
        pid_map = {p: p + (i % 300) * PID_STEP for p in pids}
        hashes = {h: f"0x{int(h, 16) ^ (i + 1) << 8:016x}" for h in _hashes(src)}
        for pid, events in files.items():
            _write(d, host, pid_map[pid], [_rewrite(e, host, pid_map, hashes=hashes) for e in events])
        for f in src.glob("nccl-debug.*"):
            pid = int(f.name.rsplit(".", 1)[1])
            (d / f"nccl-debug.{host}.{pid_map[pid]}").write_text(
                _debug_log(f.read_text(), host, pid, pid_map[pid], hashes=hashes))
        dirs.append(d)
    return dirs


def job(out: Path, hosts: int, src: Path = SRC) -> list[Path]:
    """One job of `hosts` hosts × 8 ranks whose communicators span every host, with planted causes."""
    files = {int(f.stem.split("-")[1]): _lines(f) for f in src.glob(f"{HOST}-*.jsonl")}
    logs = {int(f.name.rsplit(".", 1)[1]): f.read_text() for f in src.glob("nccl-debug.*")}
    plant = planted(hosts)
    odd = dict(plant["odd"])
    job_env = files[LAUNCHER][0]["env"]
    nranks = hosts * 2 * COPIES
    dirs = []
    for i in range(hosts):
        host = host_name(i)
        d = out / host
        base = 20000 + (i % 300) * PID_STEP
        pid_map = {p: base + (p - 29500) for p in (29517, 29568, LAUNCHER, *SINGLES)}
        for pid in SINGLES + (LAUNCHER,):
            _write(d, host, pid_map[pid], [_rewrite(e, host, pid_map) for e in files[pid]])
        for k in range(COPIES):
            for r, pid in enumerate(RANKED):
                new_pid = base + 80 + 2 * k + r
                rank_of = (lambda k: lambda old: i * 2 * COPIES + 2 * k + old)(k)
                my_rank = rank_of(r)
                edit = None
                if host == plant["drop_host"]:
                    edit = _EnvEdit(plant["drop_var"], None, job_env.get(plant["drop_var"]))
                elif odd.get(host) == my_rank:
                    edit = _EnvEdit(plant["odd_var"], plant["odd_value"], job_env.get(plant["odd_var"]))
                m = {**pid_map, pid: new_pid}
                _write(d, host, new_pid, [_rewrite(e, host, m, rank_of, nranks, env_edit=edit) for e in files[pid]])
                if pid in logs:
                    (d / f"nccl-debug.{host}.{new_pid}").write_text(
                        _debug_log(logs[pid], host, pid, new_pid, rank_of, nranks, edit=edit))
        dirs.append(d)
    return dirs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=["job", "replicas"])
    ap.add_argument("out", type=Path)
    ap.add_argument("--hosts", type=int, default=256)
    a = ap.parse_args(argv)
    dirs = (job if a.kind == "job" else replicas)(a.out, a.hosts)
    print(f"{len(dirs)} host directories under {a.out}" + (f"; planted: {planted(a.hosts)}" if a.kind == "job" else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
