"""Readers never traceback: a generated corpus of malformed event logs and run.json files (every kind,
every field, every wrong type; torn, non-UTF-8, deeply nested, huge and out-of-order lines). `report
--json` exits 0, 1 or 3 with a document valid against the shipped schema, and what it skipped says why.
The corpus is generated here (seeded), never stored; most cases run the CLI in-process (CliRunner),
a few as real processes."""
from __future__ import annotations

import copy
import json
from collections import Counter
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from ncclprobe.witnesses import events

from ncclprobe import model, schemas
from ncclprobe.cli import main

pytest.importorskip("jsonschema")  # the test extra

LIB = "/opt/nccl/lib/libnccl.so.2"
COMM, HASH, UID = "0x000000000000abcd", "0x00000000000000ff", "0x0000000000001234"


def deep(n: int) -> list:
    node: list = []
    for _ in range(n):
        node = [node]
    return node


# (name, value): wrong for some field of every kind; raw text where json.dumps cannot write it
WRONG = [("null", None), ("true", True), ("zero", 0), ("int", 7), ("negative", -5), ("huge_int", 10 ** 30),
         ("digits_400", 10 ** 400), ("nan", math.nan), ("inf", math.inf), ("float", 1.5), ("str", "zero"),
         ("long_str", "x" * 100_001), ("list", [1, 2]), ("dict", {"a": 1}), ("empty_list", []),
         ("empty_dict", {}), ("deep", deep(60)), ("missing", KeyError)]


def base_events(pid: int, host: str = "h") -> list[dict]:
    """One valid process log with every kind and every documented field, in time order."""
    env = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    evs = [
        {"ev": "process_start", "src": "boot", "ppid": 1, "argv": ["python", "train.py"], "exe": "/usr/bin/python3",
         "env": env, "exec_env": env, "exec_env_differs": False, "python": "3.12.1", "mode": "ephemeral",
         "forked_from": 1, "profile": [{"op": "set", "var": "NCCL_PROTO", "value": "LL", "previous": None,
                                        "applied": True}],
         "profile_unwatched": 0, "pinned": {"NCCL_ALGO": "Ring"}, "prefix": "/usr"},
        {"ev": "env_write", "src": "boot", "var": "NCCL_ALGO", "old": "Ring", "new": "Tree",
         "where": "train.py:3 main", "op": "set", "blocked": False},
        {"ev": "probe_error", "src": "boot", "message": "OSError: gone", "part": "guard"},
        {"ev": "plugin_load", "src": "envplugin", "plugin": "ncclEnv_v1", "nccl_version": 22809, "lib": LIB,
         "nccl_suffix": ".2"},
        {"ev": "nccl_getenv", "src": "envplugin", "var": "NCCL_PROTO", "value": "LL", "lib": LIB},
        {"ev": "comm_init", "src": "preload", "api": "ncclCommInitRank", "call": 1, "comm": COMM, "nranks": 2,
         "rank": 0, "parent": COMM, "color": 0, "key": 0, "uid": UID, "config": {"size": 48, "valid": True,
                                                                               "version": 22809},
         "env": env, "rc": 0, "lib": LIB, "version": 22809, "simulated": False, "ms": 1.5, "dev": 0, "ndev": 2,
         "devlist": [0, 1], "nid": 1, "exclude": [1], "flags": 0},
        {"ev": "comm_plugin_init", "src": "profiler", "comm_hash": HASH, "comm_name": "tp", "nnodes": 1,
         "nranks": 2, "rank": 0, "env": env, "lib": LIB, "call": 1, "plugin": "ncclProfiler_v5"},
        {"ev": "coll_summary", "src": "profiler", "comm_hash": HASH, "func": "AllReduce", "algo": "Ring",
         "proto": "LL", "nchannels": 2, "bytes_min": 8, "bytes_max": 1024, "count": 3, "rank": 0,
         "reason": "finalize"},
        {"ev": "comm_plugin_finalize", "src": "profiler", "comm_hash": HASH},
        {"ev": "comm_destroy", "src": "preload", "comm": COMM, "api": "ncclCommDestroy", "rc": 0, "call": 2,
         "ms": 0.1, "lib": LIB},
    ]
    return [{"t": 1000.0 + pid + i / 100, "host": host, "pid": pid, **e} for i, e in enumerate(evs)]


KINDS = [e["ev"] for e in base_events(1)]


def line(obj) -> bytes:
    return (json.dumps(obj) + "\n").encode()


def write_log(d: Path, evs: list[dict]) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"h-{len(list(d.iterdir()))}.jsonl"
    path.write_bytes(b"".join(line(e) for e in evs))
    return path


IDS = ("comm", "parent", "uid", "comm_hash")  # an id is hex text or its 64-bit number (model.comm_id)


def same_class(value, like, fld: str) -> bool:
    """Whether value is of the JSON type the valid base value has (int/float alike for a float field)."""
    if like is None or value is None:  # every field but the common ones may be null
        return True
    if fld in IDS and type(value) is int:
        return 0 <= value < 1 << 64
    if isinstance(like, bool) or isinstance(value, bool):
        return type(value) is type(like)
    if isinstance(like, float):
        return isinstance(value, (int, float)) and math.isfinite(value) and value >= 0
    return type(value) is type(like)


def in_range(value) -> bool:
    if isinstance(value, int) and not isinstance(value, bool):
        return abs(value) < 1 << 64
    if isinstance(value, str):
        return len(value) <= 65536
    if isinstance(value, list):
        return all(in_range(v) for v in value) and len(json.dumps(value)) < 2000 and "[[[[[[[[" not in json.dumps(value)
    return True


RUNNER = CliRunner()


def report_json(dirs) -> tuple[int, dict]:
    """`ncclprobe report DIRS --json`, in-process: its exit code and its document, validated."""
    r = RUNNER.invoke(main, ["report", *map(str, dirs), "--json"], catch_exceptions=True)
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise AssertionError(f"traceback: {type(r.exception).__name__}: {str(r.exception)[:200]}")
    assert r.exit_code in (0, 1, 3), r.exit_code
    doc = json.loads(r.stdout)
    schemas.validate(doc)
    assert ("error" in doc) == (r.exit_code == 3)
    return r.exit_code, doc


def check(failures: list, name: str, fn) -> None:
    """Run one case; collect its failure (the suite reports them all, counted)."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a case's failure of any kind is what is collected
        failures.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")


def finish(failures: list, cases: int) -> None:
    assert not failures, f"{len(failures)} of {cases} cases failed:\n" + "\n".join(failures[:40])


def one_field_case(d: Path, kind: str, fld: str, value) -> None:
    """The event of `kind` with `fld` set to value (or removed): its file reads without a traceback, the
    line is either kept with the field as valid as the base's (or absent) or skipped for a reason that
    names the field; every other line is kept."""
    evs = base_events(10)
    target = next(e for e in evs if e["ev"] == kind)
    like = target.get(fld)
    if value is KeyError:
        target.pop(fld, None)
    else:
        target[fld] = copy.deepcopy(value)
    write_log(d, evs)
    log = events.read_dirs([d])
    got = list(log.events)
    skipped = {**log.skipped, **{f"unknown {k}": v for k, v in log.unknown.items()}}
    assert len(got) + sum(skipped.values()) == len(evs), (len(got), skipped)
    assert len(got) >= len(evs) - 1, skipped
    kept = [e for e in got if e["ev"] == kind and e.get("pid") == target.get("pid")]
    if len(got) < len(evs):
        assert any(fld in reason or (fld == "ev" and reason.startswith("unknown")) for reason in skipped), skipped
    elif kept and value is not KeyError and fld in kept[0]:
        assert same_class(kept[0][fld], like, fld) and in_range(kept[0][fld]), (fld, repr(kept[0][fld])[:80])
    m = model.build(events.stream_dirs([d]))
    assert m.processes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", KINDS)
def test_every_field_of_every_kind_with_every_wrong_type(tmp_path, kind):
    failures: list[str] = []
    cases = 0
    target = next(e for e in base_events(10) if e["ev"] == kind)
    for wname, value in WRONG:
        dirs = []
        for fld in target:
            cases += 1
            d = tmp_path / wname / fld
            dirs.append(d)
            check(failures, f"{kind}.{fld}={wname}", lambda: one_field_case(d, kind, fld, value))
        cases += 1
        check(failures, f"{kind}=*{wname} report", lambda: report_json(dirs))
    finish(failures, cases)


def garbage_cases(rng: random.Random) -> dict[str, bytes]:
    """Whole files that are not logs, or logs around lines no reader should hold or trust."""
    good = b"".join(line(e) for e in base_events(20))
    nest = b'{"ev": "comm_init", "t": 1.0, "host": "h", "pid": 20, "src": "preload", "config": ' + \
        b"[" * 100_000 + b"]" * 100_000 + b"}\n"
    return {
        "torn_last": good + line(base_events(20)[0])[:-20],
        "torn_middle": good[:100] + b"\n" + good,
        "non_utf8": good + b'{"ev": "\xff\xfe", "t": 1.0, "host": "h\xc3", "pid": 20, "src": "boot"}\n' + b"\xff" * 50 + b"\n",
        "non_utf8_value": good + line(base_events(20)[4])[:-2].replace(b'"LL"', b'"L\xffL"') + b"}\n",
        "nesting_100k_line": nest + good,
        "nesting_100k_bare": b"[" * 100_000 + b"\n" + b"{" * 100_000 + b"\n" + good,
        "digits_5000": good + b'{"ev": "process_start", "t": ' + b"9" * 5000 + b', "host": "h", "pid": 21, "src": "boot"}\n',
        "float_overflow": good + b'{"ev": "process_start", "t": 1e400, "host": "h", "pid": 21, "src": "boot"}\n',
        "nan_literals": good + b'{"ev": "process_start", "t": NaN, "host": "h", "pid": NaN, "src": "boot"}\n',
        "huge_line": good + b'{"ev": "probe_error", "message": "' + b"x" * (3 << 20) + b'"}\n' + good,
        "huge_unterminated": good + b"y" * (5 << 20),
        "random_bytes": bytes(rng.randrange(256) for _ in range(4096)) + b"\n" + good,
        "not_objects": b"[]\n1\n\"s\"\nnull\ntrue\n" + good,
        "empty": b"",
    }


def random_mutations(rng: random.Random, n: int) -> bytes:
    """n lines: base events with a random field set to a random wrong value, or cut at a random byte."""
    out = []
    for i in range(n):
        e = rng.choice(base_events(30 + i % 5))
        fld = rng.choice(list(e))
        value = rng.choice(WRONG)[1]
        if value is KeyError:
            e.pop(fld)
        else:
            e[fld] = value
        raw = line(e)
        out.append(raw[: rng.randrange(1, len(raw))] + b"\n" if rng.random() < 0.1 else raw)
    return b"".join(out)


@pytest.mark.timeout(120)
def test_garbage_and_huge_lines_are_skipped_and_counted(tmp_path):
    rng = random.Random(12)
    failures: list[str] = []
    cases = garbage_cases(rng)
    cases["random_mutations"] = random_mutations(rng, 400)
    for name, data in cases.items():
        d = tmp_path / name
        d.mkdir()
        (d / "h-20.jsonl").write_bytes(data)

        def case(d=d, name=name):
            code, doc = report_json([d])
            if name not in ("empty",):
                assert code in (0, 1), (code, doc.get("error"))
                assert 20 in [p["pid"] for p in doc["processes"]] or name == "random_mutations"
            if name not in ("empty", "not_objects", "non_utf8_value"):
                assert doc.get("skipped") or doc["error"]["skipped"], doc.get("skipped")
        check(failures, name, case)
    finish(failures, len(cases))


def test_a_huge_line_is_skipped_and_the_next_line_kept(tmp_path):
    big = b'{"ev": "probe_error", "t": 1.0, "host": "h", "pid": 5, "src": "boot", "message": "' + b"x" * (3 << 20)
    (tmp_path / "h-5.jsonl").write_bytes(big + b'"}\n' + line(base_events(5)[0]) + b"z" * (2 << 20))
    log = events.read_dirs([tmp_path])
    assert [e["ev"] for e in log.events] == ["process_start"]
    assert log.skipped == {"oversized line": 2}  # the unterminated tail is over MAX_LINE too: counted once


RUN_VARIANTS = {
    "notes_int": b'{"notes": 5}', "notes_ints": b'{"notes": [1, 2]}', "command_str": b'{"command": "rm -rf /"}',
    "command_ints": b'{"command": [1, 2]}', "list": b"[1, 2]", "string": b'"run"', "null": b"null",
    "deep": b'{"notes": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "digits": b'{"started": ' + b"9" * 400 + b"}",
    "digits_5000": b'{"returncode": ' + b"9" * 5000 + b"}", "overflow": b'{"returncode": 1e400, "ended": 1e400}',
    "preload_str": b'{"preload": "yes", "boot": 1, "plugins": "profiler"}', "profile_int": b'{"profile": {"set": 5}}',
    "profile_list": b'{"profile": [1]}', "expect_ints": b'{"expect": {"NCCL_PROTO": 5}}',
    "non_utf8": b'{"notes": ["\xff\xfe"]}', "torn": b'{"notes": ["a"', "huge": b'{"status": "' + b"s" * (2 << 20) + b'"}',
    "nested_note": b'{"notes": [{"a": [1]}], "status": {"x": 1}, "host": 5, "log_dir": []}',
}


@pytest.mark.timeout(120)
def test_run_json_variants_never_traceback(tmp_path):
    failures: list[str] = []
    for name, data in RUN_VARIANTS.items():
        d = tmp_path / name
        write_log(d, base_events(40))
        (d / "run.json").write_bytes(data)  # an older version's name, and this version's
        (d / "run-h-20261204T120000Z-0123456789ab.json").write_bytes(data)

        def case(d=d):
            code, doc = report_json([d])
            assert code in (0, 1), doc.get("error")
            for run in doc["runs"]:
                assert all(isinstance(n, str) for n in run.get("notes", []))
            assert doc["runs"] or any("run metadata" in k for k in doc["skipped"]), doc["skipped"]
        check(failures, name, case)
        # text output reads the same runs (header_doc's notes)
        r = RUNNER.invoke(main, ["report", str(d)])
        if r.exception is not None and not isinstance(r.exception, SystemExit):
            failures.append(f"{name} (text): {type(r.exception).__name__}: {r.exception}")
    finish(failures, 2 * len(RUN_VARIANTS))


def model_of(dirs) -> dict:
    from ncclprobe.views import report
    return report.model_json(model.build(events.stream_dirs(dirs)))


@pytest.mark.parametrize("whole", [True, False], ids=["read-whole", "streamed"])
def test_a_file_out_of_time_order_reads_as_if_sorted(tmp_path, monkeypatch, whole):
    if not whole:  # a large file (or past the budget of files read whole): its order is looked at first
        monkeypatch.setattr(events, "WHOLE_MAX", 0)
    rng = random.Random(3)
    evs = base_events(50) + base_events(51)
    write_log(tmp_path / "sorted", sorted(evs, key=lambda e: e["t"]))
    shuffled = evs[:]
    rng.shuffle(shuffled)
    write_log(tmp_path / "shuffled", shuffled)
    assert model_of([tmp_path / "shuffled"]) == model_of([tmp_path / "sorted"])
    log = events.stream_dirs([tmp_path / "shuffled"])
    list(log.events)
    assert len(log.resorted) == 1 and not log.skipped


def test_files_merge_in_time_order_and_build_iterates_once(tmp_path):
    for pid in (60, 61, 62):
        write_log(tmp_path, base_events(pid))
    log = events.stream_dirs([tmp_path])
    assert not isinstance(log.events, list)
    once = iter(log.events)
    seen: list[float] = []

    def tap():
        for e in once:
            seen.append(e["t"])
            yield e
    log.events = tap()
    m = model.build(log)
    assert seen == sorted(seen) and len(seen) == 30 and len(m.processes) == 3
    assert next(once, None) is None


# A few cases through the real CLI: a real process, its stdout and its exit code
CLI_CASES = ["nesting_100k_line", "digits_5000", "huge_unterminated"]


@pytest.mark.timeout(120)
def test_the_cli_never_tracebacks_on_hostile_logs(tmp_path):
    cases = garbage_cases(random.Random(12))
    for name in CLI_CASES:
        d = tmp_path / name
        d.mkdir()
        (d / "h-20.jsonl").write_bytes(cases[name])
        pid_list = base_events(21)
        pid_list[0]["pid"] = [1, 2]
        pid_list[5]["comm"] = {"a": 1}
        pid_list[0]["argv"] = [1, 2]
        write_log(d, pid_list)
        (d / "run.json").write_bytes(RUN_VARIANTS["notes_int"])
        r = subprocess.run([sys.executable, "-m", "ncclprobe", "report", str(d), "--json"], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode in (0, 1), (name, r.returncode, r.stderr[-2000:])
        assert "Traceback" not in r.stderr, r.stderr[-2000:]
        doc = json.loads(r.stdout)
        schemas.validate(doc)
        assert sum(doc["skipped"].values()) >= 1


# ---- adversarial lines, each case bounded in time (issue 21) ----------------------------------------

CASE_CPU_S = 5.0  # CPU seconds per case (process_time: the suite shares its cores); each takes well under 1


def _big_json_number(digits: int) -> bytes:
    return b'{"ev": "process_start", "t": 1080.0, "host": "h", "pid": ' + b"7" * digits + b', "src": "boot"}'


def adversarial_lines(rng: random.Random) -> dict[str, bytes]:
    """name -> the bytes of one file: a valid first line, then the adversarial content, then a valid last
    line (each case says whether the last must survive: cases whose content ends a line do)."""
    ok = line(base_events(70)[0])
    mx = events.MAX_LINE
    head = b'{"ev": "probe_error", "t": 1080.0, "host": "h", "pid": 70, "src": "boot", "message": "'
    return {
        "just_under_max_line": head + b"m" * (mx - len(head) - 4) + b'"}\n',
        "just_over_max_line": head + b"m" * (mx - len(head) + 4) + b'"}\n',
        "nesting_list_500k": b"[" * 500_000 + b"\n",
        "nesting_object_100k": b'{"a": ' * 100_000 + b"1" + b"}" * 100_000 + b"\n",
        "nesting_in_config": b'{"ev": "comm_init", "t": 1080.0, "host": "h", "pid": 70, "src": "preload", "config": '
                             + b'{"x": ' * 3000 + b"1" + b"}" * 3000 + b"}\n",
        "digits_4300": _big_json_number(4300) + b"\n",   # under int's digit limit: parsed, refused as a pid
        "digits_4301": _big_json_number(4301) + b"\n",   # over it (ValueError, 3.11+ and 3.10.7+)
        "digits_900k": _big_json_number(900_000) + b"\n",
        "float_exponents": b'{"ev": "process_start", "t": 1e999999999, "host": "h", "pid": 70, "src": "boot"}\n'
                           b'{"ev": "process_start", "t": -0.0, "host": "h", "pid": 70, "src": "boot"}\n'
                           b'{"ev": "process_start", "t": 1e-400, "host": "h", "pid": 70, "src": "boot"}\n'
                           b'{"ev": "process_start", "t": 0.' + b"1" * 500_000 + b', "host": "h", "pid": 70, "src": "boot"}\n',
        "nan_infinity": b'{"ev": "process_start", "t": Infinity, "host": "h", "pid": 70, "src": "boot", "ppid": NaN}\n',
        "invalid_utf8": b'{"ev": "proc\xff\xfe", "t": 1080.0, "host": "h\xc0\xaf", "pid": 70, "src": "boot"}\n'
                        b'{"ev": "env_write", "t": 1080.0, "host": "h", "pid": 70, "src": "boot", "var": "NCCL_\xf4\x90\x80\x80",'
                        b' "new": "\xed\xa0\x80"}\n',
        "escaped_surrogates_and_nul": b'{"ev": "env_write", "t": 1080.0, "host": "h", "pid": 70, "src": "boot", '
                                      b'"var": "NCCL_PROTO", "new": "\\ud800\\u0000LL", "where": "\\udfff"}\n',
        "raw_nul_inside_a_line": b'{"ev": "env_write", "t": 1080.0, "host": "h", "pid": 70, "src": "boot", "var": "NC'
                                 + b"\0" * 7 + b'CL_PROTO"}\n',
        "nul_megabytes": b"\0" * (3 << 20) + b"\n",
        "nul_alternating": b"a\0" * (1 << 20) + b"\n",
        "newline_alternating": b"{\n" * (1 << 16),
        "cr_only": (line(base_events(70)[1]).rstrip(b"\n") + b"\r") * 5000 + b"\n",
        "bom": b"\xef\xbb\xbf" + line(base_events(70)[1]),
        "many_keys": b"{" + b", ".join(b'"k%d": %d' % (i, i) for i in range(60_000)) + b', "ev": "probe_error", '
                     b'"t": 1080.0, "host": "h", "pid": 70, "src": "boot"}\n',
        "duplicate_keys": b'{"ev": "probe_error", "ev": "comm_init", "pid": 1, "pid": 70, "t": 1080.0, "t": 1080.5, '
                          b'"host": "h", "src": "boot", "src": "preload"}\n',
        "huge_argv": line({**base_events(70)[0], "argv": ["a"] * 100_000}),
        "huge_ev_name": line({**base_events(70)[1], "ev": "e" * 500_000}),
        "budget_variants": b"".join(line({"ev": "log_budget", "t": 1080.0, "host": "h", "pid": 70, "src": "boot", **v})
                                    for v in ({"reached": "bytes", "limit": 1 << 70}, {"reached": ["bytes"]},
                                              {"reached": "files", "limit": -1}, {"reached": None},
                                              {"reached": "bytes", "dropped": 1e300}, {"dropped": "3"})),
        "dropped_everywhere": b"".join(line({**e, "dropped": rng.choice([0, 1, 10 ** 20, -1, 2.5, True, None, "x"])})
                                       for e in base_events(70)),
        "random_json": b"".join(line(_random_json(rng, 6)) for _ in range(300)),
        "random_bytes": bytes(rng.randrange(256) for _ in range(200_000)) + b"\n",
        "zero_fill_then_line": b'{"ev": "process_start", "t": 1080' + b"\0" * (1 << 20),  # the last line follows
        "hole_8g": [b'{"ev": "process_start", "t": 1080', 8 << 30],   # a torn line, then a sparse 8 GiB
    }


def write_parts(path: Path, parts) -> None:
    """bytes, and an int for a hole of that many bytes (a sparse file: seek past the end, then write)."""
    with open(path, "wb") as fh:
        for part in parts:
            if isinstance(part, int):
                fh.seek(part, 1)
            else:
                fh.write(part)


def _random_json(rng: random.Random, depth: int):
    """A random JSON value, objects often shaped like events."""
    kind = rng.randrange(8 if depth > 0 else 5)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, 1 << 31, 1 << 64, 10 ** 30, rng.randrange(-1000, 1000)])
    if kind == 2:
        return rng.choice([0.5, -1e308, 1e-300, 1.7e9])
    if kind in (3, 4):
        return rng.choice(["", "x" * rng.randrange(70_000), "NCCL_PROTO", "0x" + "f" * 16, "\udc80", "\0"])
    if kind == 5:
        return [_random_json(rng, depth - 1) for _ in range(rng.randrange(5))]
    base = rng.choice(base_events(71))
    obj = {k: (v if rng.random() < 0.7 else _random_json(rng, depth - 1)) for k, v in base.items()}
    obj.update({f"extra{i}": _random_json(rng, depth - 1) for i in range(rng.randrange(3))})
    return obj


def _bounded(failures: list, name: str, fn) -> None:
    t0 = time.process_time()
    check(failures, name, fn)
    spent = time.process_time() - t0
    if spent > CASE_CPU_S:
        failures.append(f"{name}: {spent:.1f} CPU s (bound {CASE_CPU_S})")


@pytest.mark.timeout(300)
def test_adversarial_jsonl_lines_never_traceback_and_each_case_is_bounded(tmp_path):
    failures: list[str] = []
    cases = adversarial_lines(random.Random(21))
    first, last = line(base_events(70)[0]), line({**base_events(70)[2], "t": 3000.0})
    for name, body in cases.items():
        d = tmp_path / name
        d.mkdir()
        write_parts(d / "h-70.jsonl", [first, *(body if isinstance(body, list) else [body]), last])

        def case(d=d, name=name):
            log = events.read_dirs([d])
            seen = {(e["ev"], e["t"], e["pid"]) for e in log.events}
            assert {("process_start", 1070.0, 70), ("probe_error", 3000.0, 70)} <= seen, (len(seen), log.skipped)
            m = model.build(events.stream_dirs([d]))
            assert (("h", 70)) in m.processes
            code, doc = report_json([d])
            assert code in (0, 1)
        _bounded(failures, name, case)
    finish(failures, len(cases))


def _nccl_adversarial(rng: random.Random) -> dict[str, bytes]:
    init = b"h:5:5 [0] NCCL INFO ncclCommInitRank comm 0x1000 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 " \
           b"commId 0xa - Init COMPLETE"
    return {
        "long_message": b"h:5:5 [0] NCCL INFO " + b"x" * 60_000,
        "over_max_line": b"h:5:5 [0] NCCL INFO " + b"x" * (70_000),
        "anchors": b":1:1 " * 12_000,
        "anchors_with_tails": b"a:1:1 [0] NCCL INFO " * 3_000,
        "host_300": b"h" * 300 + b":5:5 [0] NCCL INFO NCCL_PROTO set by environment to LL",
        "huge_ranks": init.replace(b"rank 0 nranks 2", b"rank 99999999999 nranks -99999999999"),
        "huge_commid": init.replace(b"0xa", b"0x" + b"f" * 40),
        "huge_tuning": b"h:5:5 [0] NCCL INFO AllReduce: " + b"9" * 30 + b" Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}",
        "tuning_ids": b"h:5:5 [0] NCCL INFO AllReduce: 8 Bytes -> Algo 999999 proto -7 time 1e999",
        "nul_and_utf8": b"h:5:5 [0] NCCL INFO NCCL_PROTO set by environment to \0\xff\xfe\xed\xa0\x80",
        "escapes": b"h:5:5 [0] NCCL INFO NCCL_ALGO set by environment to \x1b[31mRing\x1b]0;title\x07",
        "levels": b"h:5:5 [0] NCCL INFO " * 4_000,
        "glued_inits": init * 500,
        "cr_only": (init + b"\r") * 2_000,
        "many_pids": b"\n".join(b"h:%d:%d [0] NCCL INFO NCCL_PROTO set by environment to LL" % (i, i) for i in range(1_000)),
        "many_comms": b"\n".join(init.replace(b"0x1000", b"0x%x" % (0x1000 + i)).replace(b"0xa", b"0x%x" % i)
                                 for i in range(1_000)),
        "random_bytes": bytes(rng.randrange(256) for _ in range(300_000)),
        "hole_8g": [init + b"\nh:5:5 [0] NCCL INFO NCCL_PR", 8 << 30, b"OTO set by environment to LL"],
    }


@pytest.mark.timeout(300)
def test_adversarial_nccl_log_lines_never_traceback_and_each_case_is_bounded(tmp_path):
    from ncclprobe.witnesses import nccllog, nccllog_model
    failures: list[str] = []
    cases = _nccl_adversarial(random.Random(22))
    for name, body in cases.items():
        p = tmp_path / f"{name}.log"
        write_parts(p, [*(body if isinstance(body, list) else [body]), b"\n"])

        def case(p=p):
            log = nccllog.parse_files([p])
            assert log.files == [str(p)] and log.counts["lines"] >= 1
            m = nccllog_model.merge(model.Model(), [p])
            json.dumps(m.skipped)
            r = RUNNER.invoke(main, ["report", "--nccl-log", str(p), "--json"], catch_exceptions=True)
            if r.exception is not None and not isinstance(r.exception, SystemExit):
                raise AssertionError(f"traceback: {type(r.exception).__name__}: {str(r.exception)[:200]}")
            schemas.validate(json.loads(r.stdout))
        _bounded(failures, name, case)
    finish(failures, len(cases))


def test_every_event_kind_enters_the_model_through_its_one_handler():
    """model/build.py is the one door: each kind the readers accept has its handler there (watch_summary is
    run's own, about no process of the job), and a handler for a kind no reader accepts would never run."""
    from ncclprobe.model.build import HANDLERS
    assert set(HANDLERS) == set(events.FIELDS) - {"watch_summary"}


# The reader's shortcuts (an nccl_getenv line read by a pattern, a line's order key read from its bytes) give what
# json.loads and the FIELDS checks give, or step aside: lines of the probes' form, mutated byte by byte.
SHORTCUT_LINES = [
    b'{"ev":"nccl_getenv","t":1796163000.231813,"pid":20080,"src":"envplugin","host":"node0000",'
    b'"var":"NCCL_PROTO","value":null,"lib":"/opt/nccl/lib/libnccl.so.2"}\n',
    b'{"ev":"nccl_getenv","t":1796163000,"pid":7,"src":"envplugin","host":"h","var":"NCCL_ALGO","value":"Ring",'
    b'"lib":null}\n',
    b'{"ev":"process_start","t":1.5e9,"host":"h","pid":9,"src":"boot","env":{"NCCL_PROTO":"LL"},"argv":["x"]}\n',
]
MUTATIONS = [b"\\", b'"', b"{", b"}", b"\x00", b"\x1f", b"\xff", b"\xe2\x82", b" ", b"9", b"-", b".", b"e", b",",
             b"t", b'"t":5,', b'"host":"x",', b'"pid":3,', b"null", b"1e999", b"0" * 40]


def _slow(raw: bytes):
    """The event json.loads and the FIELDS checks make of a line (None: skipped)."""
    obj, reason = events._parse(raw)
    if reason or not isinstance(obj, dict):
        return None
    ev, reason = events.checked(obj, events.COMMON, "", Counter())
    table = None if reason else events.FIELDS.get(ev["ev"])
    fields, reason = events.checked(obj, table, "", Counter()) if table is not None else ({}, "unknown")
    return None if reason else {**ev, "host": ev.get("host", "?"), **fields}


def test_reader_shortcuts_agree_with_json_loads():
    rng = random.Random(24)
    hits = Counter()
    strings = events.Strings()  # one pool for every line, as one read has: a spelling seen before is its copy
    for _ in range(20_000):
        raw = bytearray(rng.choice(SHORTCUT_LINES))
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(raw))
            if rng.random() < 0.5:
                raw[at:at + 1] = rng.choice(MUTATIONS)
            else:
                raw[at:at] = rng.choice(MUTATIONS)
        raw = bytes(raw)
        slow = _slow(raw)
        fast = events._getenv_line(raw, strings)
        hits["getenv"] += fast is not None
        if fast is not None:
            assert slow is not None and fast == slow and list(fast) == list(slow), raw
            assert all(type(fast[k]) is type(slow[k]) for k in fast), raw
        key = events._raw_key(raw)
        hits["key"] += key is not None and slow is not None
        if key is not None and slow is not None:
            assert key == (slow["t"], slow["host"], slow["pid"]) and type(key[0]) is type(slow["t"]), raw
    assert hits["getenv"] > 300 and hits["key"] > 300  # the shortcuts were taken, not only stepped aside


def test_files_are_read_whole_only_while_small_and_within_the_budget(tmp_path, monkeypatch):
    sizes = {tmp_path / name: n for name, n in {"a": 10, "b": 2000, "c": 30, "d": 40}.items()}
    monkeypatch.setattr(events, "WHOLE_MAX", 1000)
    monkeypatch.setattr(events, "WHOLE_BUDGET", 60)
    assert events._read_whole([*sizes, tmp_path / "gone"], sizes) == [True, False, True, False, False]


def _getenv(pid: int, t: float, var: str, value, lib: str = LIB, host: str = "h") -> dict:
    return {"ev": "nccl_getenv", "t": t, "pid": pid, "src": "envplugin", "host": host, "var": var, "value": value,
            "lib": lib}


@pytest.mark.parametrize("seed", range(6))
def test_reads_folded_into_runs_give_the_model_each_line_gives(tmp_path, seed):
    """report reads a writer's run of nccl_getenv lines as one event (stream_dirs(fold=True)): the model is the
    one the lines give one by one, whatever their order, duplicates, other kinds between them, a second file
    of the same process, lines the shortcut does not take (an escape) or refuses (a time out of bounds)."""
    rng = random.Random(seed)
    for f in range(3):
        evs = base_events(70 + f % 2)
        for _ in range(rng.randint(20, 80)):
            pid = 70 + (f % 2 if rng.random() < 0.85 else rng.randrange(2))  # mostly the file's own writer
            var = rng.choice(["NCCL_PROTO", "NCCL_ALGO", "NCCL_BUFFSIZE", "NCCL_IB_HCA"])
            value = rng.choice([None, "LL", "Ring", "4194304", 'a"quoted"'])
            evs.append(_getenv(pid, round(rng.uniform(1.0, 9.0), 3), var, value,
                               lib=rng.choice([LIB, "/other/libnccl.so.2"])))
        if rng.random() < 0.3:
            evs.append(_getenv(70, 1e13, "NCCL_PROTO", "LL"))  # out of bounds: refused either way
        if rng.random() < 0.5:
            evs.sort(key=lambda e: e["t"])
        tmp_path.mkdir(exist_ok=True)  # as the env plugin writes them: compact, the shortcut's form
        (tmp_path / f"h-{f}.jsonl").write_bytes(b"".join(
            (json.dumps(e, separators=(",", ":")) + "\n").encode() if e["ev"] == "nccl_getenv" else line(e)
            for e in evs))
    lines = sum(1 for p in tmp_path.iterdir() for _ in p.open("rb"))
    assert len(list(events.stream_dirs([tmp_path], fold=True).events)) < lines - 20  # runs were folded
    one = report_model(tmp_path, fold=False)
    folded = report_model(tmp_path, fold=True)
    assert folded == one
    assert any(p["nccl_reads"] for p in one["processes"])


def report_model(d: Path, fold: bool) -> dict:
    from ncclprobe.views import report
    log = events.stream_dirs([d], fold=fold)
    m = model.build(log)
    return {**report.model_json(m), "skipped": dict(log.skipped), "resorted": len(log.resorted) > 0}


def _checked_by_the_rule(obj: dict, table: dict, prefix: str, dropped: Counter) -> tuple[dict, str]:
    """events.checked's rule, a field at a time: each field of table in its order; a needed one missing or
    a refused one that is not merely dropped refuses the whole object there (drops before it counted)."""
    out = {}
    for name, (check, cost) in table.items():
        if name not in obj:
            if cost == "need":
                return {}, f"no {name}"
            continue
        value = check(obj[name])
        if value is events.BAD:
            if cost != "drop":
                return {}, f"bad {name}"
            dropped[prefix + name] += 1
        else:
            out[name] = value
    return out, ""


@pytest.mark.parametrize("written", [True, False])
@pytest.mark.parametrize("table", ["COMMON", "RUN_FIELDS", *events.KINDS])
def test_checked_gives_what_its_rule_gives_for_any_shape_and_value(table, written, monkeypatch):
    """checked() runs one function written per shape (the common checks in line), or past COMPILED_MAX of
    them checks a field at a time: either way, on objects of random shapes (fields left out, unknown ones
    added, in any order) with good and wrong values, its fields, reason and drop counts are the rule's."""
    monkeypatch.setattr(events, "_BY_KEYS", {})
    monkeypatch.setattr(events, "_COMPILED", {})
    monkeypatch.setattr(events, "COMPILED_MAX", 512 if written else 0)
    fields = getattr(events, table) if table in ("COMMON", "RUN_FIELDS") else events.FIELDS[table]
    good = {}
    for e in base_events(7):
        good.update({k: v for k, v in e.items()})
    good.update({"ev": "x", "t": 1.5, "pid": 7, "src": "boot", "host": "h", "run_id": "r1", "command": ["a"],
                 "reached": "bytes", "of": 3})
    wrong = [v for _, v in WRONG if v is not KeyError] + ["y" * 5000, 1 << 31, 1 << 40, -1, 2.5e12]  # past a name, a pid, an int32
    rng, seen = random.Random(sum(map(ord, table))), Counter()
    for _ in range(400):
        names = [n for n in fields if rng.random() < 0.85] + [n for n in ("zz", "t2") if rng.random() < 0.2]
        rng.shuffle(names)
        obj = {n: (rng.choice(wrong) if rng.random() < 0.3 or n not in good else good[n]) for n in names}
        for prefix in ("", f"{table}."):
            got_drops, want_drops = Counter(), Counter()
            got = events.checked(obj, fields, prefix, got_drops)
            want = _checked_by_the_rule(obj, fields, prefix, want_drops)
            assert got == want and got_drops == want_drops, (table, obj)
            assert list(got[0]) == list(want[0])  # the table's order
            seen["refused" if got[1] else "kept"] += 1
            seen["dropped"] += bool(got_drops)
    refusing = any(cost != "drop" for _, cost in fields.values())  # else a field is only ever dropped
    assert seen["kept"] > 40 and seen["dropped"] > 40 and (seen["refused"] > 5) == refusing, seen


def test_a_log_of_endless_shapes_writes_a_bounded_number_of_checkers(monkeypatch):
    """Lines that differ only in keys no table has share one written function; lines of ever new sets of fields
    are checked a field at a time once COMPILED_MAX functions are written: a hostile log never costs a
    function per line."""
    monkeypatch.setattr(events, "_BY_KEYS", {})
    monkeypatch.setattr(events, "_COMPILED", {})
    monkeypatch.setattr(events, "COMPILED_MAX", 8)
    table, dropped = events.FIELDS["comm_init"], Counter()
    for i in range(5000):  # a junk key of its own on each line
        assert events.checked({"api": "x", "rank": 1, f"junk{i}": 0}, table, "", dropped) == ({"api": "x", "rank": 1}, "")
    assert len(events._COMPILED) == 1 and len(events._BY_KEYS) == 4096
    names = list(table)
    rng = random.Random(5)
    for _ in range(300):  # ever new sets of fields
        obj = {n: None for n in rng.sample(names, 6)}
        assert events.checked(obj, table, "", dropped) == _checked_by_the_rule(obj, table, "", Counter())
    assert len(events._COMPILED) == 8
