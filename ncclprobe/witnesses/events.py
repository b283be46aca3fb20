"""The event log: JSONL files the probes write, one per process, and how to read them back.

Contract (DESIGN.md §4). Every line is one JSON object with `ev`, `t` (unix seconds, float), `host`,
`pid`, `src` (preload | profiler | envplugin | boot | proc). Kinds and their own fields:

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
  comm_plugin_init profiler comm_hash, comm_name, nnodes, nranks, rank, env, lib, call, plugin, timing (gpu | off),
                           version (the library's ncclGetVersion), simulated
  coll_summary   profiler  comm_hash, func, algo, proto, nchannels, bytes_min, bytes_max, count,
                           rank, reason (periodic | finalize | exit), mode (eager | captured |
                           replayed; null: unknown, profiler v4), size_log2 (the size bucket: bytes in
                           [2^k, 2^(k+1))), bytes_sum; with GPU timing on also gpu_count, gpu_ns (sum
                           of GPU times), untimed, gpu_hist ([[bin, n], ...], model/timing.py's bins).
                           Each line covers the collectives of its shape since the previous line
                           for it: sum counts, bytes, times and bins, take min/max of sizes (which
                           hold since the communicator's start). bytes = count x element size
  comm_activity  profiler  comm_hash, rank, nranks, first_t and last_t (its first and latest
                           collective, unix seconds; null: none yet), api_eager and
                           api_captured (collective calls since the previous line, eager or captured
                           into a CUDA graph), timing (gpu | off), flush_s (the flush interval), flush
                           (1, 2, ...), reason: with every flush that moved, and always at finalize
                           and exit (a communicator whose last one is periodic ended unflushed)
  comm_plugin_finalize profiler comm_hash
  comm_destroy   preload   comm, api, rc, call, ms, lib
  proc_seen      proc      `ncclprobe run`'s /proc watch (commands/watch.py), one line per process of CMD's
                           tree when a scan first saw it; `pid` is THAT process's. ppid, start (its start
                           time, unix seconds, 10 ms resolution), argv (redacted), exe (null: unreadable),
                           exec_env (watched part of /proc/<pid>/environ; null: unreadable, see env_reason),
                           env_reason (null, permission, vanished, clobbered, partly overwritten, "fork child,
                           gone before a second look": its parent's block, and what it exec'd no read saw, ...),
                           env_hash (keyed hash of the raw block, key per run and never written: equal
                           hashes, one block, e.g. fork children), execs (0; n: seen again after its n-th
                           exec since), nccl_libs (optional, not written yet)
  proc_exit      proc      `ncclprobe run`'s watch in kernel mode: a process it recorded ended (`t`: when, from the
                           kernel's event); start (its start, as its proc_seen said)
  watch_summary  proc      the watch's end (`pid` is run's): scans, walks (scans that read the tree),
                           interval_s, seen, missed_known (processes known to have run that no scan saw
                           running: first seen as zombies, orphans run reaped, CMD itself), missed_pids
                           (the first 100), reaped_unseen (scan mode, null in kernel mode: a parent's pid
                           once per child, at least, that it reaped and no scan saw, witnesses/reaping.py; the
                           first 1000), cpu_s (the watch thread's CPU), wall_s, reader (native |
                           python), errors, error (first error's type), lost_lines, stuck (did not end in time),
                           mode (kernel: the kernel's process events had each process of the tree read at its
                           exec, and scans; scan: scans only), kernel_refused (why not kernel), kernel_events,
                           kernel_reads, kernel_vanished (exec'ed and gone before the read), kernel_overruns
                           (the event queue overflowed: events lost), kernel_cpu_s;
                           with --live also live_s (how often the whole tree was read: NCCLPROBE_LIVE_S;
                           null: as its cost allowed, watch.LIVE_SHARE), live_reads (reads),
                           live_processes (process reads), live_bytes, live_cpu_s (the watch's CPU in them),
                           live_reader (native | python)
  live_env       proc      `ncclprobe run --live`'s watch: the environment a process of CMD's tree holds, read
                           from its memory (witnesses/livewatch.py), where it changed; `pid` is THAT process's.
                           env (its watched variables now; null: not read, see reason), reason (null, or why
                           it could not be read: permission, static binary, process gone...; said once, before
                           any reading), since (the start of the latest read that still showed the previous
                           env; null for the first reading), execs (the image, as proc_seen's). `t` is the end
                           of the read: a write it shows was made in (since, t]
  spawn          boot | preload  an edge: this process started another (or exec'd), as the probe in it saw the call:
                           call (as the caller spelled it: subprocess.Popen, multiprocessing, pty.spawn, os.execve,
                           os.posix_spawn, ...; execve, posix_spawn, ... from the native probe), where ("file:line"
                           of the caller outside the standard library; null: native), argv (redacted),
                           argv_dropped (elements not kept), exe (the executable resolved; null: unknown), child
                           (its pid; null for an exec, which keeps the pid, or unknown), ppid (optional: the
                           writer's parent), exec (the call replaces the caller's image), env_given (the caller
                           passed its own environment: env=, envp; false: the child inherits the caller's), env
                           (the watched part of the environment passed), env_count (how many variables it held in
                           all), rc (optional: the call failed, its errno or return code; child is then null)

  log_budget     any       reached (bytes | files), limit: the writer's budget (the shared log-bounding policy:
                           NCCLPROBE_MAX_BYTES per process file, NCCLPROBE_MAX_FILES per host and directory)
                           is spent; nothing more is written by that process (bytes), or by any process of
                           the host that starts after it (files: the first one over the budget writes this line)
Any line may say `"dropped": K`: K lines its writer could not write since its previous line (a stalled or
full filesystem, a full queue); they are lost, not late.
Identity: `pid` is the process's pid as the /proc its writer could read shows it. A process outside the
kernel's initial pid namespace (a container, `unshare --pid`) adds `ns_pid` (its pid in its own namespace)
and `pidns` (that namespace's inode): where /proc is the host's, `pid` is the host's pid; where /proc was
mounted inside the namespace, `pid` equals `ns_pid`, and the model joins the line to a /proc witness's
sighting of (pidns, ns_pid) to find the pid the host's shell sees. run.json's `pidns` is run's own.

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
A log directory may also hold run metadata, written by `ncclprobe run` (the command, what it set, what
it left alone, exit status): `run-<host>-<run id>.json`, one file per run, so that several hosts (and
`run --append`) writing one directory never collide; older versions wrote one `run.json`, still read.

Readers read only *.jsonl (and the run metadata): the writers' `<host>.files` counter is no event file.
Readers never trust the files. Every field of every kind (and of run metadata) is checked against FIELDS
(RUN_FIELDS) on read, here and nowhere else: a field of the wrong type, out of range or too big is
dropped (treated as absent; counted in EventLog.dropped) or, where the table says "skip", the whole
line is skipped and counted with its reason; fields the table does not know are dropped. Torn,
malformed, too deeply nested and oversized lines and unknown kinds are skipped and counted, each once.
Files are read by witnesses/jsonlines.py: bounded chunks, holes and NUL runs stepped over, at most
FILE_CAP bytes of data and FILE_LINES lines each (what was not read is a note), never a symlink or a
FIFO. stream_dirs lists the directories without materialising them, reads at most FILES_MAX files (more are refused whole: the
model keeps a process per file) and merges them in time order: small files read whole (at most WHOLE_BUDGET bytes of
them), the others streamed, so memory is bounded by that budget and by what the model keeps. `report` reads them one
writing host after another (by_host): memory then holds one host's events at a time.
"""
from __future__ import annotations

import heapq
import json
import math
import operator
import os
import re
import stat
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from ncclprobe.witnesses import jsonlines

SOURCES = ("preload", "profiler", "envplugin", "boot", "proc")
RUN_META = "run.json"  # older versions of `run`: one per directory (run_meta_name's files since)
RUN_PREFIX = "run-"
RUNS_MAX = 4096      # run metadata files one report reads (all directories given); more are skipped, counted
MAX_LINE = jsonlines.MAX_LINE
MAX_RUN_META = 1 << 20
# event files one report reads (all directories given): each costs a merge head and a process in the model,
# about 5 KiB and 0.3 ms of CPU (benchmarks/bench_log_readers.py files), so at most ~80 MiB and ~5 s; the
# writers create at most NCCLPROBE_MAX_FILES (4096 by default) per host and directory. A user with more
# raises NCCLPROBE_REPORT_MAX_FILES.
FILES_MAX = 16_384
NAME, TEXT = 4096, 65536   # caps: a name or path (PATH_MAX), any other string
ITEMS = 4096         # cap on the entries of a list or map
NODES, DEPTH = 1024, 6  # caps on a nested object (config, profile): values in all, levels
INT32, UINT64 = (-(1 << 31), (1 << 31) - 1), (0, (1 << 64) - 1)
BAD = object()       # what a check returns for a value it refuses


# check -> the test of v it makes, for the checks written from one (_tested): what _checker writes in line
_INLINE: dict[Callable[[Any], Any], str] = {}


def _tested(test: str) -> Callable[[Any], Any]:
    """The check that passes a value for which `test` (an expression of v, made here of our own bounds) holds,
    and refuses the others; _checker writes the same test in line."""
    check = eval(f"lambda v: v if {test} else BAD", {"BAD": BAD})  # noqa: S307 (no text of a log is in it)
    _INLINE[check] = test
    return check


def _int(lo: int, hi: int) -> Callable[[Any], Any]:
    return _tested(f"type(v) is int and {int(lo)} <= v <= {int(hi)}")


def _num(lo: float, hi: float) -> Callable[[Any], Any]:
    """A finite number (json.loads gives inf for 1e400 and accepts NaN/Infinity)."""
    return lambda v: v if (type(v) is int or (type(v) is float and math.isfinite(v))) and lo <= v <= hi else BAD


def _str(cap: int) -> Callable[[Any], Any]:
    return _tested(f"type(v) is str and len(v) <= {int(cap)}")


_bool = _tested("type(v) is bool")


def _null(check: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """check, or null: one test where check is one (the optional fields of most kinds: one call each)."""
    test = _INLINE.get(check)
    if test is not None:
        return _tested(f"v is None or ({test})")
    return lambda v: None if v is None else check(v)


def _list(item: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda v: v if type(v) is list and len(v) <= ITEMS and all(item(x) is not BAD for x in v) else BAD


def _map(value: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """{name: value}: an environment, the pinned variables."""
    return lambda v: (v if type(v) is dict and len(v) <= ITEMS and
                      all(len(k) <= NAME and value(x) is not BAD for k, x in v.items()) else BAD)


def _tree(v: Any) -> Any:
    """A small JSON object of scalars, lists and objects (config, profile entries): DEPTH levels and
    NODES values at most, strings capped, numbers finite."""
    budget = [NODES]

    def ok(x: Any, depth: int) -> bool:
        budget[0] -= 1
        if budget[0] < 0 or depth > DEPTH:
            return False
        if x is None or type(x) in (bool, int):
            return True
        if type(x) is float:
            return math.isfinite(x)
        if type(x) is str:
            return len(x) <= TEXT
        if type(x) is list:
            return all(ok(y, depth + 1) for y in x)
        return type(x) is dict and all(len(k) <= NAME and ok(y, depth + 1) for k, y in x.items())
    return v if ok(v, 0) else BAD


def _obj(v: Any) -> Any:
    return v if type(v) is dict and _tree(v) is not BAD else BAD


def _id(v: Any) -> Any:
    """A communicator id as written (model.comm_id normalises it): int, hex or a foreign name."""
    return v if (type(v) is int and UINT64[0] <= v <= UINT64[1]) or (type(v) is str and len(v) <= 64) else BAD


PID = _int(0, (1 << 31) - 1)
S, T = _str(NAME), _str(TEXT)
OS, OT, OI32, OU64, OB, OID = _null(S), _null(T), _null(_int(*INT32)), _null(_int(*UINT64)), _null(_bool), _null(_id)


def _env(v: Any) -> Any:
    """An environment as written ({name: value or null}, null): _null(_map(_null(_str(TEXT)))) in one loop (every
    process_start, comm_init and sighting has one or two)."""
    if v is None:
        return None
    if type(v) is not dict or len(v) > ITEMS:
        return BAD
    for k, x in v.items():
        if len(k) > NAME or (x is not None and (type(x) is not str or len(x) > TEXT)):
            return BAD
    return v


ENV = _env
INTS = _list(_int(*INT32))

# Every field a reader uses, per kind: (check, what a refused value costs). "drop": the field is
# treated as absent; "skip": the line is skipped ("bad <field>"); "need": skipped also when absent.
# Checks of optional fields let null through (the probes write null for NULL/unknown).
COMMON = {"ev": (S, "need"), "t": (_num(0, 1e12), "need"), "pid": (PID, "need"),
          "src": (lambda v: v if v in SOURCES else BAD, "need"), "host": (_str(255), "skip"),
          "truncated": (_bool, "drop"), "dropped": (_int(0, UINT64[1]), "drop"),
          "ns_pid": (PID, "drop"), "pidns": (_int(1, UINT64[1]), "drop")}
FIELDS: dict[str, dict[str, tuple[Callable[[Any], Any], str]]] = {
    "process_start": {"ppid": (_null(PID), "drop"), "argv": (_null(_list(T)), "drop"), "exe": (OT, "drop"),
                      "env": (ENV, "drop"), "exec_env_differs": (OB, "drop"), "exec_env": (ENV, "drop"),
                      "python": (OS, "drop"), "mode": (OS, "drop"), "forked_from": (_null(PID), "drop"),
                      "profile": (_null(_list(_obj)), "drop"), "profile_unwatched": (OI32, "drop"),
                      "pinned": (_null(_map(OT)), "drop"), "prefix": (OT, "drop"),
                      "start": (_null(_num(0, 1e12)), "drop")},
    "env_write": {"var": (S, "need"), "old": (OT, "drop"), "new": (OT, "drop"), "where": (OT, "drop"),
                  "op": (OS, "drop"), "blocked": (OB, "drop")},
    "probe_error": {"message": (OT, "drop"), "part": (OS, "drop")},
    "plugin_load": {"plugin": (OS, "drop"), "nccl_version": (OI32, "drop"), "lib": (OT, "drop"),
                    "nccl_suffix": (OS, "drop")},
    "nccl_getenv": {"var": (S, "need"), "value": (OT, "drop"), "lib": (OT, "drop")},
    "comm_init": {"api": (OS, "drop"), "call": (OU64, "drop"), "comm": (OID, "drop"), "nranks": (OI32, "drop"),
                  "rank": (OI32, "drop"), "parent": (OID, "drop"), "color": (OI32, "drop"), "key": (OI32, "drop"),
                  "uid": (OID, "drop"), "config": (_null(_obj), "drop"), "env": (ENV, "drop"),
                  "rc": (OI32, "drop"), "lib": (OT, "drop"), "version": (OI32, "drop"), "simulated": (OB, "drop"),
                  "ms": (_null(_num(0, 1e15)), "drop"), "dev": (OI32, "drop"), "ndev": (OI32, "drop"),
                  "devlist": (_null(INTS), "drop"), "nid": (OI32, "drop"), "exclude": (_null(INTS), "drop"),
                  "flags": (OI32, "drop")},
    "comm_plugin_init": {"comm_hash": (OID, "drop"), "comm_name": (OS, "drop"), "nnodes": (OI32, "drop"),
                         "nranks": (OI32, "drop"), "rank": (OI32, "drop"), "env": (ENV, "drop"),
                         "lib": (OT, "drop"), "call": (OU64, "drop"), "plugin": (OS, "drop"),
                         "timing": (OS, "drop"), "version": (OI32, "drop"), "simulated": (OB, "drop")},
    "coll_summary": {"comm_hash": (OID, "drop"), "func": (OS, "drop"), "algo": (OS, "drop"), "proto": (OS, "drop"),
                     "nchannels": (OI32, "drop"), "bytes_min": (OU64, "drop"), "bytes_max": (OU64, "drop"),
                     "count": (OU64, "drop"), "rank": (OI32, "drop"), "reason": (OS, "drop"),
                     "mode": (OS, "drop"), "size_log2": (_null(_int(-1, 63)), "drop"), "bytes_sum": (OU64, "drop"),
                     "gpu_count": (OU64, "drop"), "gpu_ns": (OU64, "drop"), "untimed": (OU64, "drop"),
                     "gpu_hist": (_null(_list(lambda v: v if type(v) is list and len(v) == 2 and all(
                         type(x) is int and 0 <= x < 1 << 40 for x in v) else BAD)), "drop")},
    "comm_activity": {"comm_hash": (OID, "drop"), "rank": (OI32, "drop"), "nranks": (OI32, "drop"),
                      "first_t": (_null(_num(0, 1e12)), "drop"), "last_t": (_null(_num(0, 1e12)), "drop"),
                      "api_eager": (OU64, "drop"), "api_captured": (OU64, "drop"), "timing": (OS, "drop"),
                      "flush_s": (_null(_num(0, 1e7)), "drop"), "flush": (OU64, "drop"), "reason": (OS, "drop")},
    "comm_plugin_finalize": {"comm_hash": (OID, "drop")},
    "comm_destroy": {"comm": (OID, "drop"), "api": (OS, "drop"), "rc": (OI32, "drop"), "call": (OU64, "drop"),
                     "ms": (_null(_num(0, 1e15)), "drop"), "lib": (OT, "drop")},
    "proc_seen": {"ppid": (_null(PID), "drop"), "start": (_null(_num(0, 1e12)), "drop"), "argv": (_null(_list(T)), "drop"),
                  "exe": (OT, "drop"), "exec_env": (ENV, "drop"), "env_reason": (OS, "drop"),
                  "env_hash": (_null(_str(64)), "drop"), "execs": (OI32, "drop"), "nccl_libs": (_null(_list(T)), "drop"),
                  "cwd": (OT, "drop"), "script": (OT, "drop")},
    "proc_exit": {"start": (_null(_num(0, 1e12)), "drop")},
    "parent_seen": {"of": (PID, "need"), "ppid": (_null(PID), "drop"), "start": (_null(_num(0, 1e12)), "drop"),
                    "argv": (_null(_list(T)), "drop"), "exe": (OT, "drop"), "exec_env": (ENV, "drop"),
                    "env_reason": (OS, "drop"), "script": (OT, "drop")},
    "watch_summary": {"scans": (OU64, "drop"), "walks": (OU64, "drop"), "interval_s": (_null(_num(0, 3600)), "drop"),
                      "seen": (OU64, "drop"), "missed_known": (OU64, "drop"), "missed_pids": (_null(_list(PID)), "drop"),
                      "reaped_unseen": (_null(_list(PID)), "drop"),
                      "cpu_s": (_null(_num(0, 1e9)), "drop"), "wall_s": (_null(_num(0, 1e9)), "drop"),
                      "reader": (OS, "drop"), "errors": (OU64, "drop"), "error": (OS, "drop"),
                      "lost_lines": (OU64, "drop"), "stuck": (OB, "drop"), "live_s": (_null(_num(0, 3600)), "drop"),
                      "live_reads": (OU64, "drop"), "live_processes": (OU64, "drop"), "live_bytes": (OU64, "drop"),
                      "live_cpu_s": (_null(_num(0, 1e9)), "drop"), "live_reader": (OS, "drop"),
                      "mode": (OS, "drop"), "kernel_refused": (OT, "drop"), "kernel_events": (OU64, "drop"),
                      "kernel_reads": (OU64, "drop"), "kernel_vanished": (OU64, "drop"),
                      "kernel_overruns": (OU64, "drop"), "kernel_cpu_s": (_null(_num(0, 1e9)), "drop"),
                      "kernel_complete": (OB, "drop")},
    "log_budget": {"reached": (lambda v: v if v in ("bytes", "files") else BAD, "need"), "limit": (OU64, "drop")},
    "live_env": {"env": (ENV, "drop"), "reason": (OT, "drop"), "since": (_null(_num(0, 1e12)), "drop"),
                 "execs": (OI32, "drop")},
    "spawn": {"call": (OS, "drop"), "where": (OT, "drop"), "argv": (_null(_list(T)), "drop"),
              "argv_dropped": (OU64, "drop"), "exe": (OT, "drop"), "child": (_null(PID), "drop"),
              "ppid": (_null(PID), "drop"), "exec": (OB, "drop"), "env_given": (OB, "drop"), "env": (ENV, "drop"),
              "env_count": (OU64, "drop"), "rc": (OI32, "drop")},
}
KINDS = tuple(FIELDS)
# run metadata as `ncclprobe run` writes it (launch.py); an open object in the JSON, but only these are kept
RUN_FIELDS = {"run_id": (lambda v: v if is_run_id(v) else BAD, "drop"),
              "command": (_list(T), "drop"), "host": (S, "drop"), "started": (_num(0, 1e12), "drop"),
              "ended": (_num(0, 1e12), "drop"), "log_dir": (T, "drop"), "notes": (_list(T), "drop"),
              "expect": (_map(T), "drop"),
              "profile": (_null(lambda v: v if type(v) is dict and set(v) == {"set", "default", "pin"} and
                                _map(T)(v["set"]) is not BAD and _map(T)(v["default"]) is not BAD and
                                _list(S)(v["pin"]) is not BAD else BAD), "drop"),
              "preload": (_bool, "drop"), "plugins": (_list(S), "drop"), "boot": (_bool, "drop"),
              "returncode": (OI32, "drop"), "status": (T, "drop"), "run_pid": (PID, "drop"), "cmd_pid": (PID, "drop"),
              "set": (_map(T), "drop"), "enforced": (_map(T), "drop"), "given_env": (_map(T), "drop"),
              "watch_s": (_num(0, 3600), "drop"), "gpu_timing": (_bool, "drop"), "live": (_bool, "drop"),
              "live_s": (_null(_num(0, 3600)), "drop"), "pidns": (_int(1, UINT64[1]), "drop")}


class Strings:
    """One string for each spelling, for one read of the logs and the model built from it: a fleet's lines repeat
    the same few hosts, names, values and library paths tens of thousands of times, and the model keeps one
    copy of each, not one a line. Only short spellings (SHORT bytes or characters) are kept, at most MAX of
    them; others are made each time."""
    SHORT = 256
    MAX = 1 << 16

    def __init__(self) -> None:
        self.texts: dict[bytes, str] = {}
        self.strs: dict[str, str] = {}

    def text(self, raw: bytes) -> str:
        """raw (UTF-8, as the probes write it) as text: the pool's copy (one()), found by its bytes."""
        text = self.texts.get(raw)
        if text is None:
            text = self.one(raw.decode("utf-8", "surrogateescape"))
            if len(raw) <= self.SHORT and len(self.texts) < self.MAX:
                self.texts[raw] = text
        return text

    def one(self, text: str) -> str:
        """The pool's copy of text."""
        got = self.strs.get(text)
        if got is None:
            got = text
            if len(text) <= self.SHORT and len(self.strs) < self.MAX:
                self.strs[text] = text
        return got


@dataclass
class EventLog:
    events: Iterable[dict[str, Any]] = field(default_factory=list)  # time order; an iterator from stream_dirs
    files: list[str] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)   # reason -> lines (complete once events is consumed)
    skipped_files: Counter = field(default_factory=Counter)  # reason -> files (symlinks, FIFOs, unreadable)
    notes: list[dict[str, Any]] = field(default_factory=list)  # {path, note, bytes}: what of a file was not read
    refused: str | None = None                          # why no file was read (more than FILES_MAX of them)
    file_cap: int = jsonlines.FILE_CAP                  # data bytes read per file
    file_lines: int = jsonlines.FILE_LINES              # lines read per file
    fold: bool = False  # a writer's run of plain nccl_getenv lines as one event with "reads" (stream_dirs)
    nccl_debug: list[str] = field(default_factory=list)  # the directories' NCCL_DEBUG_FILE copies (nccl-debug*)
    unknown: Counter = field(default_factory=Counter)   # unknown kind -> lines
    dropped: Counter = field(default_factory=Counter)   # "kind.field" -> values refused, line kept
    resorted: list[str] = field(default_factory=list)   # files not in time order, sorted whole
    by_host: bool = False  # one host's events after another's, each host's in time order (stream_dirs)
    split_hosts: set[str] = field(default_factory=set)  # by_host: hosts whose events more than one writer named
    strings: Strings = field(default_factory=Strings)  # this read's strings, one copy each (the model's too)
    runs: list[dict[str, Any]] = field(default_factory=list)  # each run's metadata, in start order
    dirs: list[str] = field(default_factory=list)

    @property
    def skipped_total(self) -> int:
        return sum(self.skipped.values()) + sum(self.unknown.values()) + sum(self.skipped_files.values())


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


def checked(obj: dict[str, Any], table: dict, prefix: str, dropped: Counter) -> tuple[dict[str, Any], str]:
    """(the fields of obj that pass table, '') or ({}, the reason the whole object is refused): each field in
    table's order, the first refusal the reason."""
    hit = _BY_KEYS.get((id(table), keys := tuple(obj)))
    if hit is None or hit[0] is not table:
        hit = (table, _checker_for(table, keys))
        if len(_BY_KEYS) < 4096:
            _BY_KEYS[(id(table), keys)] = hit
    return hit[1](obj, prefix, dropped)


# checked's function per table and keys of an object as given (a log has a few shapes), and per table and the
# fields of it an object has (the function depends on those alone); each entry holds its table, so that the
# table's id is never another's. Past COMPILED_MAX functions (a log of endless shapes) the fields are checked
# one at a time (_each_field): a function costs ~0.1 ms to write, a field ~0.3 us to check.
_BY_KEYS: dict[tuple[int, tuple], tuple[dict, Callable]] = {}
_COMPILED: dict[tuple[int, tuple], tuple[dict, Callable]] = {}
COMPILED_MAX = 512


def _checker_for(table: dict, keys: tuple) -> Callable[[dict, str, Counter], tuple[dict[str, Any], str]]:
    have = set(keys)
    fields = (id(table), tuple(name for name in table if name in have))
    hit = _COMPILED.get(fields)
    if hit is not None and hit[0] is table:
        return hit[1]
    if len(_COMPILED) >= COMPILED_MAX:
        return lambda obj, prefix, dropped: _each_field(obj, table, prefix, dropped)
    fn = _checker(table, keys)
    _COMPILED[fields] = (table, fn)
    return fn


def _each_field(obj: dict[str, Any], table: dict, prefix: str, dropped: Counter) -> tuple[dict[str, Any], str]:
    """checked(), a field at a time: what each function _checker writes does."""
    out = {}
    for name, (check, cost) in table.items():
        if name not in obj:
            if cost == "need":
                return {}, f"no {name}"
            continue
        value = check(obj[name])
        if value is BAD:
            if cost != "drop":
                return {}, f"bad {name}"
            dropped[prefix + name] += 1
        else:
            out[name] = value
    return out, ""


def _checker(table: dict, keys: tuple) -> Callable[[dict, str, Counter], tuple[dict[str, Any], str]]:
    """checked() for objects with these keys, as one function: table's fields that they have, in table's
    order, each tested in line (the common checks) or by its check; a needed one they lack is the reason
    at its place. Written from table's names and _INLINE alone (no text of a log is in it)."""
    have, code, env = set(keys), ["def checker(obj, prefix, dropped):", "    out = {}"], {"BAD": BAD}
    for i, (name, (check, cost)) in enumerate(table.items()):
        if name not in have:
            if cost == "need":
                code.append(f"    return {{}}, {'no ' + name!r}")
                break
            continue
        test = _INLINE.get(check)
        if test is None:
            env[f"check{i}"] = check
            code += [f"    v = check{i}(obj[{name!r}])", "    if v is not BAD:"]
        else:
            code += [f"    v = obj[{name!r}]", f"    if {test}:"]
        refused = f"        dropped[prefix + {name!r}] += 1" if cost == "drop" else f"        return {{}}, {'bad ' + name!r}"
        code += [f"        out[{name!r}] = v", "    else:", refused]
    else:
        code.append("    return out, ''")
    exec("\n".join(code), env)  # noqa: S102 (code made of the table's own field names)
    return env["checker"]


def _parse(raw: bytes) -> tuple[Any, str]:
    try:
        return json.loads(raw.decode("utf-8", errors="surrogateescape")), ""
    except RecursionError:  # json's C scanner recurses per nesting level
        return None, "nesting too deep"
    except (ValueError, UnicodeError):  # also ints past sys.get_int_max_str_digits (3.11+)
        return None, "not JSON"


_sort_key = operator.itemgetter("t", "host", "pid")  # an event's place in time order: (t, host, pid)


def read_file(path: Path, log: EventLog) -> Iterator[dict[str, Any]]:
    """The checked events of one file, in its order; log.notes says what of it was not read."""
    try:
        src = jsonlines.Source(path, log.file_cap)
    except OSError as exc:
        _skip_file(log, str(path), exc.strerror if isinstance(exc, jsonlines.NotRegular) else
                   f"unreadable ({exc.strerror})")
        return
    lines = jsonlines.Lines(log.skipped, log.file_lines)
    if log.fold:
        yield from _folded(lines.of(src.pieces()), log)
    else:
        for raw in lines.of(src.pieces()):
            ev = _event(raw, log)
            if ev is not None:
                yield ev
    _note_file(log, path, src, lines)


def _folded(raws: Iterable[bytes], log: EventLog) -> Iterator[dict[str, Any]]:
    """_event of each line, where a run of plain nccl_getenv lines (a worker's 70+, one after another) of one
    process, in time order, is one event: the first line's, with "reads": [(t, var, value, lib), ...] of
    every line of the run (the first too); a reader need not make, sort and hand on an object per line."""
    run: dict[str, Any] | None = None
    for raw in raws:
        if raw.startswith(b'{"ev":"nccl_getenv",') and (m := _GETENV.fullmatch(raw)) is not None and \
                (read := _getenv_fields(m, log.strings)) is not None:
            t, pid, host = read[0], read[1], read[2]
            if run is not None and run["pid"] == pid and run["host"] == host and t >= run["reads"][-1][0]:
                run["reads"].append((t, *read[3:]))
                continue
            if run is not None:
                yield run
            run = {"ev": "nccl_getenv", "t": t, "pid": pid, "src": "envplugin", "host": host, "var": read[3],
                   "value": read[4], "lib": read[5], "reads": [(t, *read[3:])]}
            continue
        ev = _event(raw, log)
        if ev is None:
            continue
        if run is not None:
            yield run
            run = None
        yield ev
    if run is not None:
        yield run


def _skip_file(log: EventLog, path: str, why: str) -> None:
    log.skipped_files[why] += 1
    log.notes.append({"path": path, "note": f"skipped: {why}", "bytes": None})


def _event(raw: bytes, log: EventLog) -> dict[str, Any] | None:
    """One line's checked event; None (counted in log.skipped or log.unknown) where there is none."""
    if raw.startswith(b'{"ev":"nccl_getenv",') and (ev := _getenv_line(raw, log.strings)) is not None:
        return ev
    obj, reason = _parse(raw)
    if not reason and not isinstance(obj, dict):
        reason = "not an object"
    if not reason:
        ev = _plain_common(obj)
        if ev is None:
            ev, reason = checked(obj, COMMON, "", log.dropped)
    if reason:
        log.skipped[reason] += 1
        return None
    table = FIELDS.get(ev["ev"])
    if table is None:
        log.unknown[ev["ev"][:64]] += 1
        return None
    fields, reason = checked(obj, table, ev["ev"] + ".", log.dropped)
    if reason:
        log.skipped[f"{ev['ev']}: {reason}"] += 1
        return None
    ev.setdefault("host", "?")
    return {**ev, **fields}


_RARE = ("truncated", "dropped", "ns_pid", "pidns")  # COMMON's optional fields


def _plain_common(obj: dict[str, Any]) -> dict[str, Any] | None:
    """COMMON's fields of a line that has all of them right and none of the rare ones, as checked() gives
    them (same order) without a call per field; None: let checked() look."""
    ev, t, pid, src, host = obj.get("ev"), obj.get("t"), obj.get("pid"), obj.get("src"), obj.get("host")
    if (type(ev) is str and len(ev) <= NAME and (type(t) is int or (type(t) is float and math.isfinite(t)))
            and 0 <= t <= 1e12 and type(pid) is int and 0 <= pid < 1 << 31 and src in SOURCES
            and type(host) is str and len(host) <= 255 and obj.keys().isdisjoint(_RARE)):
        return {"ev": ev, "t": t, "pid": pid, "src": src, "host": host}
    return None


_S = rb'([^"\\\x00-\x1f]*)'  # a JSON string's body with no escape and no control character: its bytes are its text
_GETENV = re.compile(rb'\{"ev":"nccl_getenv","t":(-?(?:0|[1-9][0-9]{0,30})(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?),'
                     rb'"pid":((?:0|[1-9][0-9]{0,30})),"src":"envplugin","host":"' + _S + rb'","var":"' + _S +
                     rb'","value":(?:null|"' + _S + rb'"),"lib":(?:null|"' + _S + rb'")\}[ \t\r\n]*')


def _getenv_line(raw: bytes, strings: Strings) -> dict[str, Any] | None:
    """An nccl_getenv line (70+ a worker) as the envplugin writes it, read without json.loads or checked(): the
    event _event would give; None where the line is any other (a field more, an escape): _event parses it."""
    m = _GETENV.fullmatch(raw)
    read = _getenv_fields(m, strings) if m is not None else None
    if read is None:
        return None
    t, pid, host, var, value, lib = read
    return {"ev": "nccl_getenv", "t": t, "pid": pid, "src": "envplugin", "host": host, "var": var, "value": value,
            "lib": lib}


def _getenv_fields(m: re.Match, strings: Strings) -> tuple | None:
    """(t, pid, host, var, value, lib) of a _GETENV match, checked as FIELDS would; None: out of bounds."""
    ts, ps, host, var, value, lib = m.groups()
    t = float(ts) if b"." in ts or b"e" in ts or b"E" in ts else int(ts)  # json.loads' type
    pid = int(ps)
    if not (0 <= t <= 1e12 and pid < 1 << 31 and len(host) <= 255 * 4 and len(var) <= NAME * 4
            and (value is None or len(value) <= TEXT * 4) and (lib is None or len(lib) <= TEXT * 4)):
        return None  # (0 <= nan, inf: False; a character is at most 4 bytes: no decode of what cannot fit)
    text = strings.text
    host, var = text(host), text(var)
    value, lib = value if value is None else text(value), lib if lib is None else text(lib)
    if not (len(host) <= 255 and len(var) <= NAME and (value is None or len(value) <= TEXT)
            and (lib is None or len(lib) <= TEXT)):
        return None
    return t, pid, host, var, value, lib


def _note_file(log: EventLog, path: Path, src: jsonlines.Source, lines: jsonlines.Lines) -> None:
    words, nul = jsonlines.size_words, src.holes + lines.nul
    if nul:
        log.notes.append({"path": str(path), "note": f"{words(nul)} of NUL bytes skipped (a hole or "
                          "a zero fill: a crash, a truncate)", "bytes": nul})
    if lines.capped:
        left = lines.unread + max(0, src.size - src.offset)
        log.notes.append({"path": str(path), "note": f"read its first {log.file_lines} lines (the per-file cap, "
                          f"NCCLPROBE_REPORT_MAX_FILE_LINES); {words(left)} after them not read", "bytes": left})
    elif src.not_read:
        log.notes.append({"path": str(path), "note": f"read the first {words(src.cap)} of its data (the per-file "
                          f"cap, NCCLPROBE_REPORT_MAX_FILE_BYTES); {words(src.not_read)} after it not read",
                          "bytes": src.not_read})


# A line's order key straight from its bytes, where the bytes allow no other reading: no backslash (no escape
# can spell a key or hide a quote) and "t", "host" and "pid" each written once (no duplicate or nested key), so
# a line json.loads keeps has exactly these values (t and pid are required, so a lone one is the line's own;
# numbers of at most 31 digits); any other line is parsed (_in_order).
_NUM = re.compile(rb'\s*:\s*(-?(?:0|[1-9][0-9]{0,30})(\.[0-9]+)?([eE][-+]?[0-9]+)?)\s*[,}]')
_STR = re.compile(rb'\s*:\s*"([^"]*)"')


def _raw_key(raw: bytes) -> tuple | None:
    """(t, host, pid) of a plain line, read without parsing it; None: parse it to know."""
    i, j, k = raw.find(b'"t"'), raw.find(b'"pid"'), raw.find(b'"host"')
    if (i < 0 or j < 0 or k < 0 or b"\\" in raw or raw.find(b'"t"', i + 1) >= 0 or raw.find(b'"pid"', j + 1) >= 0
            or raw.find(b'"host"', k + 1) >= 0):
        return None
    inner = raw.find(b"{", raw.find(b"{") + 1)  # the first nested object (or a brace in a string) begins here
    if 0 <= inner < k:  # host is no required field: a lone one past a nested object's start may be its
        return None
    t, pid, host = _NUM.match(raw, i + 3), _NUM.match(raw, j + 5), _STR.match(raw, k + 6)
    if t is None or pid is None or pid[2] or pid[3] or host is None:
        return None
    return (float(t[1]) if t[2] or t[3] else int(t[1]), host[1].decode("utf-8", errors="surrogateescape"),
            int(pid[1]))


def _in_order(path: Path, file_cap: int, file_lines: int) -> bool:
    """Whether a file's events are in time order (one writer appending; a foreign writer may not be).
    Only the common fields are checked here: the keys of a superset of the lines read_file keeps, so
    in order here means in order there. A plain line's key is read from its bytes (_raw_key)."""
    try:
        src = jsonlines.Source(path, file_cap)
    except OSError:
        return True
    last, ignored = None, Counter()
    for raw in jsonlines.Lines(ignored, file_lines).of(src.pieces()):
        key = _raw_key(raw)
        if key is None:
            obj, reason = _parse(raw)
            if reason or not isinstance(obj, dict):
                continue
            ev, reason = checked(obj, COMMON, "", ignored)
            if reason:
                continue
            key = (ev["t"], ev.get("host", "?"), ev["pid"])
        if last is not None and key < last:
            return False
        last = key
    return True


WHOLE_MAX = 1 << 20      # a file this small is read once, whole (a fleet's: tens of KiB each; _small_files) ...
WHOLE_BUDGET = 256 << 20  # ... while the files so read hold at most this many bytes in all (a job of 2,000 hosts x 8
#                          ranks; memory: about 5x that where the model keeps none of their events, read in time
#                          order; one host's share at a time, read one host after another: by_host)


def _file_events(path: Path, log: EventLog) -> Iterator[dict[str, Any]]:
    """A large file's events in time order: streamed where it is in order (_in_order looks first), so that
    memory follows the model and not the file; else sorted whole."""
    if not _in_order(path, log.file_cap, log.file_lines):
        log.resorted.append(str(path))
        yield from sorted(read_file(path, log), key=_sort_key)
        return
    last = None
    for e in read_file(path, log):
        key = _sort_key(e)
        if last is not None and key < last:  # appended out of order since _in_order looked
            log.skipped["line out of time order"] += 1
            continue
        last = key
        yield e


def _small_files(paths: list[Path], log: EventLog) -> Iterator[dict[str, Any]]:
    """The events of small files, each read once, in time order: all of them sorted at once (a stable sort,
    so lines of one time keep their file's order and the files' order; each file's run of sorted lines is
    merged, not compared line by line). A file one writer appended is in order or nearly (threads and
    writers of one process take their clocks apart: two files in three of a real run); one that is not is
    said in log.resorted. Each event is let go as it is handed on."""
    evs: list[dict[str, Any]] = []
    key = _sort_key
    for p in paths:
        mine = list(read_file(p, log))
        if any(key(b) < key(a) for a, b in zip(mine, mine[1:])):
            log.resorted.append(str(p))
        evs += mine
    evs.sort(key=key)
    evs.reverse()
    pop = evs.pop
    while evs:
        yield pop()


def _read_whole(paths: list[Path], sizes: dict[Path, int]) -> list[bool]:
    """Which of paths are read whole (_small_files): each small file (its size as listed), in order, while
    WHOLE_BUDGET lasts."""
    left, out = WHOLE_BUDGET, []
    for p in paths:
        size = sizes.get(p)
        whole = size is not None and size <= WHOLE_MAX and size <= left
        left -= size if whole else 0
        out.append(whole)
    return out


def is_run_id(v: Any) -> bool:
    """A run id as `run` makes them (launch.new_run_id): a short word of letters, digits, '.', '_', '-'."""
    return type(v) is str and 0 < len(v) <= 64 and v.isascii() and all(c.isalnum() or c in "._-" for c in v)


def run_meta_name(host: str, run_id: str) -> str:
    """The metadata file of one run: per host and per run, so no two runs in one directory share it."""
    return f"{RUN_PREFIX}{host.replace('/', '_')}-{run_id}.json"


def is_run_meta(name: str) -> bool:
    """Whether a directory entry is run metadata: this version's per-run files or an older `run.json`."""
    return name == RUN_META or (name.startswith(RUN_PREFIX) and name.endswith(".json") and len(name) <= NAME)


def holds_run(d: str | os.PathLike) -> str | None:
    """What in d shows that a run (or a probe) wrote there already: the first run metadata or event file
    by name, or None for a directory no run used."""
    with os.scandir(d) as it:
        for entry in it:
            if is_run_meta(entry.name) or entry.name.endswith(".jsonl"):
                return entry.name
    return None


def _read_run(path: Path, log: EventLog) -> dict[str, Any] | None:
    try:
        data = jsonlines.read_small(path, MAX_RUN_META)
    except OSError as exc:
        why = exc.strerror if isinstance(exc, jsonlines.NotRegular) else "unreadable"
        log.skipped_files[f"run metadata {why}"] += 1
        return None
    run, reason = (None, "oversized") if len(data) > MAX_RUN_META else _parse(data)
    if not reason and not isinstance(run, dict):
        reason = "not an object"
    if reason:
        log.skipped_files[f"malformed run metadata ({reason})"] += 1
        return None
    return checked(run, RUN_FIELDS, "run.json.", log.dropped)[0]


def _read_runs(d: Path, names: list[str], log: EventLog) -> None:
    """The run metadata files of d (names: as _event_files listed them, at most RUNS_MAX in all), each
    checked; a symlink or anything not a regular file is never opened."""
    for name in sorted(names):
        path = d / name
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = None
        if mode is not None and not stat.S_ISREG(mode):  # read_small refuses it too (O_NOFOLLOW, fstat)
            _skip_file(log, str(path), "symlink (not followed)" if stat.S_ISLNK(mode) else
                       f"not a regular file ({jsonlines.kind_of(mode)})")
            continue
        run = _read_run(path, log)
        if run is not None:
            log.runs.append({**run, "dir": str(d), "file": name})


def _knob(name: str, default: int) -> int:
    """A positive integer from the environment; anything else is the default."""
    text = os.environ.get(name, "")
    return int(text) if text.isdigit() and 0 < len(text) < 19 and int(text) > 0 else default


def _event_files(d: Path, log: EventLog, seen: set, cap: int, metas: list[str],
                 sizes: dict[Path, int]) -> list[Path] | None:
    """The *.jsonl files of d, by name (another name of a file listed before is left out), listed without
    holding more than `cap` entries: None as soon as more than `cap` are found in all. The names of run
    metadata files are added to metas, each file's size to sizes, and NCCL's logs (nccl-debug*, regular
    files) to log.nccl_debug."""
    found, debug = [], []
    with os.scandir(d) as it:
        for entry in it:
            if entry.name.startswith("nccl-debug"):
                try:
                    if entry.is_file(follow_symlinks=False):
                        debug.append(str(d / entry.name))
                except OSError:
                    pass
                continue
            if not entry.name.endswith(".jsonl"):
                if is_run_meta(entry.name):
                    if len(log.runs) + len(metas) < RUNS_MAX:
                        metas.append(entry.name)
                    else:  # bounded: listed no further, counted
                        log.skipped_files[f"more than {RUNS_MAX} run metadata files"] += 1
                continue  # run metadata, <host>.files (the writers' file counter), nccl-debug*: not events
            try:
                st = entry.stat(follow_symlinks=False)  # lstat: a device or FIFO is never opened
            except OSError:
                st = None
            found.append((entry.name, st))
            if len(log.files) + len(found) > cap:
                return None
    paths = []
    for name, st in sorted(found, key=lambda f: f[0]):
        if st is not None and not stat.S_ISREG(st.st_mode):
            _skip_file(log, str(d / name), "symlink (not followed)" if stat.S_ISLNK(st.st_mode) else
                       f"not a regular file ({jsonlines.kind_of(st.st_mode)})")
            continue
        key = (st.st_dev, st.st_ino) if st is not None else (None, str(d / name))
        if key in seen:
            _skip_file(log, str(d / name), "another name of a file already read (a hard link)")
            continue
        seen.add(key)
        paths.append(d / name)
        if st is not None:
            sizes[paths[-1]] = st.st_size
    log.nccl_debug += sorted(debug)
    return paths


def stream_dirs(dirs, fold: bool = False, by_host: bool = False) -> EventLog:
    """Every *.jsonl file of each directory (several hosts' directories may be given), merged in time
    order as an iterator: events, skipped and dropped are complete once it has been consumed. More than
    NCCLPROBE_REPORT_MAX_FILES (FILES_MAX) files in all are not read: log.refused says so. fold: a run
    of plain nccl_getenv lines is one event with "reads" (_folded; model.build takes either). by_host: the
    files of one writing host (by name, `<host>-<pid>.jsonl`) merged, then the next host's (_host_major)."""
    log = EventLog(file_cap=_knob("NCCLPROBE_REPORT_MAX_FILE_BYTES", jsonlines.FILE_CAP),
                   file_lines=_knob("NCCLPROBE_REPORT_MAX_FILE_LINES", jsonlines.FILE_LINES), fold=fold,
                   by_host=by_host)
    paths: list[Path] = []
    seen: set = set()
    sizes: dict[Path, int] = {}
    cap = _knob("NCCLPROBE_REPORT_MAX_FILES", FILES_MAX)
    for d in dirs:
        d = Path(d)
        try:
            ident = os.stat(d)
        except OSError:
            ident = None
        if ident is not None and (ident.st_dev, ident.st_ino) in seen:
            continue  # a directory named twice is read once
        seen.add((ident.st_dev, ident.st_ino) if ident is not None else (None, str(d)))
        log.dirs.append(str(d))
        metas: list[str] = []
        try:
            found = _event_files(d, log, seen, cap, metas, sizes)
        except OSError as exc:
            log.skipped_files[f"unreadable directory ({exc.strerror})"] += 1
            continue
        if found is None:
            log.refused = (f"more than {cap} event files (*.jsonl) in {', '.join(log.dirs)}: the report reads at most "
                           f"{cap} (NCCLPROBE_REPORT_MAX_FILES), as its memory grows with each file and process")
            log.files, log.events = [], iter(())
            return log
        paths += found
        log.files += map(str, found)
        _read_runs(d, metas, log)
    log.runs.sort(key=lambda r: r.get("started", 0))
    whole = dict(zip(paths, _read_whole(paths, sizes)))  # decided once: it decides the order of equal keys
    log.events = _host_major(paths, whole, log) if by_host else _merged(paths, whole, log)
    return log


def _merged(paths: list[Path], whole: dict[Path, bool], log: EventLog) -> Iterator[dict[str, Any]]:
    """The events of paths in time order: small files read whole (_small_files), the others streamed after
    them (heapq.merge puts an earlier input first where keys are equal)."""
    small = _small_files([p for p in paths if whole[p]], log)
    if all(whole[p] for p in paths):
        return small
    return heapq.merge(small, *(_file_events(p, log) for p in paths if not whole[p]), key=_sort_key)


def _host_major(paths: list[Path], whole: dict[Path, bool], log: EventLog) -> Iterator[dict[str, Any]]:
    """The events of each writing host's files (as their names give it; other names: one group) in time order,
    one host after another in the order they are listed: memory holds one host's events at a time, not the
    fleet's, and the model builds one host's part at a time. Each host's events keep the order a merge of all
    would give them, which is all model.build needs (hosts share no state but the order of what they add, and
    build puts that back). A host whose events lie in the files of more than one name (a hand-made or renamed
    file) is in log.split_hosts: such a log is read again in time order (commands/report.load)."""
    groups: dict[str | None, list[Path]] = {}
    for p in paths:
        groups.setdefault(_writer(p.name), []).append(p)
    owner: dict[str, str | None] = {}
    for name, group in groups.items():
        last = None
        for e in _merged(group, whole, log):
            host = e["host"]
            if host != last:
                if owner.setdefault(host, name) != name:
                    log.split_hosts.add(host)
                last = host
            yield e


def _writer(name: str) -> str | None:
    """The host a probe's event file is named for (`<host>-<pid>.jsonl`), or None for another name."""
    host, _, pid = name[:-6].rpartition("-")
    return host if host and pid.isdigit() else None


def read_dirs(dirs) -> EventLog:
    """stream_dirs with the events in one list (for readers that look at them more than once)."""
    log = stream_dirs(dirs)
    log.events = list(log.events)
    return log
