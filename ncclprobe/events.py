"""The event log: JSONL files the probes write, one per process, and how to read them back.

Contract (DESIGN.md §4). Every line is one JSON object with `ev`, `t` (unix seconds, float), `host`,
`pid`, `src` (preload | profiler | envplugin | boot). Kinds and their own fields:

  process_start  boot      ppid, argv, exe, env (watched), exec_env_differs, exec_env (watched part of
                           /proc/self/environ, null if unreadable), python, mode (ephemeral|persistent),
                           forked_from (pid, for fork children), profile (applied profile: list of
                           {op, var, value, previous, applied}, watched vars only), profile_unwatched
                           (count of non-watched profile entries), pinned ({var: value|null}), prefix
                           (sys.prefix, tells venvs apart)
  env_write      boot      var, old, new (null = unset), where ("file:line function"), op
                           (set|unset|putenv|unsetenv), blocked (pinned: the write was refused)
  probe_error    any       message, part (a probe failed once and went silent for that part)
  plugin_load    profiler | envplugin   plugin (e.g. "ncclProfiler_v5"), nccl_version (int), lib,
                           nccl_suffix (envplugin)
  nccl_getenv    envplugin var, value (null if unset), lib
  comm_init      preload   api, call, comm, nranks, rank, parent, color, key, uid, config, env (watched,
                           as getenv saw it at the call), rc, lib, version, simulated, ms, dev;
                           also ndev, devlist (InitAll: one event per communicator, same call),
                           nid (Scalable: uid hashes all ids), exclude, flags (Shrink). A key is
                           absent where the API has no such argument; null means NULL/unknown.
                           config: {size, valid, version, <fields the caller set>} (fields left at
                           NCCL_CONFIG_UNDEF, past `size` or newer than `version` are left out;
                           magic instead of version when it is wrong); null for a NULL config.
                           rank/nranks/dev: asked from the new communicator after success, else
                           the arguments
  comm_plugin_init profiler comm_hash, comm_name, nnodes, nranks, rank, env, lib, call, plugin
  coll_summary   profiler  comm_hash, func, algo, proto, nchannels, bytes_min, bytes_max, count,
                           rank, reason (periodic | finalize | exit). Each line covers the
                           collectives since the previous line for that communicator: sum counts,
                           take min/max of sizes. bytes = count x element size
  comm_plugin_finalize profiler comm_hash
  comm_destroy   preload   comm, api, rc, call, ms, lib

`call` joins a profiler init to the preload hook whose real NCCL call it ran inside (same thread;
null when NCCL ran the init on another thread, e.g. inside ncclGroupEnd or non-blocking init).
A line whose bounded buffer could not hold every member says `"truncated": true` (members are left
out whole; string values are cut at 2048 bytes). Strings from the C probes escape bytes that are not
UTF-8 as JSON \\udcXX escapes: `value.encode("utf-8", "surrogateescape")` gives the bytes back.
Ids: `comm_hash` (NCCL's commHash, as the profiler init receives it), `uid` (the 64-bit FNV-1a hash
of the ncclUniqueId bytes; equal across the ranks of one communicator created from one id), `comm`
and `parent` (ncclComm_t pointers) are strings of "0x" and 16 lowercase hex digits, leading zeros
kept ("0x0bdba985b4a6820a"), or null. Readers normalise every id with ncclprobe.model.comm_id, so
logs of older probes (which dropped leading zeros and wrote `uid` without "0x") still join; a string
that is no hex number (a hand-made log's name for a communicator) is kept as written.
A log directory may also hold `run.json`, written by `ncclprobe run` (the command, what it set, what
it left alone, exit status).

Readers never trust the files: torn lines, garbage and unknown kinds are skipped and counted, and
files are opened without following symlinks.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SOURCES = ("preload", "profiler", "envplugin", "boot")
KINDS = ("process_start", "env_write", "probe_error", "plugin_load", "nccl_getenv", "comm_init",
         "comm_plugin_init", "coll_summary", "comm_plugin_finalize", "comm_destroy")
RUN_META = "run.json"
MAX_LINE = 1 << 20  # a longer line is not ours (the probes bound every field)


@dataclass
class EventLog:
    events: list[dict[str, Any]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)   # reason -> lines
    unknown: Counter = field(default_factory=Counter)   # unknown kind -> lines
    runs: list[dict[str, Any]] = field(default_factory=list)  # run.json of each directory
    dirs: list[str] = field(default_factory=list)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values()) + sum(self.unknown.values())


def check_sources(dirs, nccl_logs=()) -> None:
    """Log directories and NCCL logs a user named must be there and readable; raises Unexaminable
    (exit 3) before any work otherwise."""
    from ncclprobe.doc import Unexaminable
    for d in dirs:
        if not os.path.isdir(d):
            raise Unexaminable(f"no such log directory: {d}", "no log directory",
                               {"hint": "give the directory `ncclprobe run` printed, or the NCCLPROBE_DIR of the job"})
        if not os.access(d, os.R_OK | os.X_OK):
            raise Unexaminable(f"cannot read log directory: {d}", "permission",
                               {"hint": "log directories are private (0700) to the user who ran the job: "
                                        "run as that user or root"})
    for f in nccl_logs:
        if not os.path.isfile(f) or not os.access(f, os.R_OK):
            raise Unexaminable(f"cannot read NCCL log: {f}", "no nccl log",
                               {"hint": "give a readable file written with NCCL_DEBUG=INFO (NCCL_DEBUG_FILE)"})


def _open_nofollow(path: Path):
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    return os.fdopen(fd, "rb")


def _valid(obj: Any) -> str:
    """'' if obj is a well-formed event, else the reason it is not."""
    if not isinstance(obj, dict):
        return "not an object"
    if not isinstance(obj.get("ev"), str):
        return "no event kind"
    if not isinstance(obj.get("pid"), int) or not isinstance(obj.get("t"), (int, float)):
        return "no pid or time"
    if obj.get("src") not in SOURCES:
        return "unknown source"
    return ""


def read_file(path: Path, log: EventLog) -> None:
    try:
        fh = _open_nofollow(path)
    except OSError as exc:
        log.skipped[f"unreadable file ({exc.strerror})"] += 1
        return
    log.files.append(str(path))
    with fh:
        for raw in fh:
            if len(raw) > MAX_LINE or not raw.endswith(b"\n"):
                log.skipped["torn or oversized line"] += 1
                continue
            try:
                obj = json.loads(raw.decode("utf-8", errors="surrogateescape"))
            except (ValueError, UnicodeError):
                log.skipped["malformed line"] += 1
                continue
            reason = _valid(obj)
            if reason:
                log.skipped[reason] += 1
                continue
            if obj["ev"] not in KINDS:
                log.unknown[obj["ev"]] += 1
                continue
            obj.setdefault("host", "?")
            log.events.append(obj)


def read_dirs(dirs) -> EventLog:
    """Merge every *.jsonl file of each directory (several hosts' directories may be given)."""
    log = EventLog()
    for d in dirs:
        d = Path(d)
        log.dirs.append(str(d))
        for path in sorted(d.glob("*.jsonl")):
            if path.is_symlink() or not path.is_file():
                log.skipped["symlink or special file"] += 1
                continue
            read_file(path, log)
        meta = d / RUN_META
        if meta.is_file() and not meta.is_symlink():
            try:
                with _open_nofollow(meta) as fh:
                    run = json.loads(fh.read().decode("utf-8"))
                if isinstance(run, dict):
                    run["dir"] = str(d)
                    log.runs.append(run)
            except (OSError, ValueError, UnicodeError):
                log.skipped["malformed run.json"] += 1
    log.events.sort(key=lambda e: (e["t"], e.get("host", ""), e["pid"]))
    return log
