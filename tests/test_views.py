"""views.process: one process shape for every command (schema ncclprobe/2, common.json#/$defs/process),
whether the process comes from the probes' model alone (report, run) or also from /proc (inspect, demo)."""
from __future__ import annotations

from ncclprobe import views
from ncclprobe.witnesses.libversions import LibVersion
from ncclprobe.model import ProcessView

LIB = "/opt/nccl/lib/libnccl.so.2"


def _model_process() -> ProcessView:
    return ProcessView(host="h", pid=5, ppid=1, argv=["python", "w.py"], exe="/usr/bin/python3",
                       start_env={"NCCL_PROTO": "LL"}, proc_exec_env={"NCCL_PROTO": "Simple"},
                       proc_env_source="exec", sources={"boot", "proc"}, libs={LIB})


def _record() -> dict:
    """inspect's record of the same process (procsnap.Snapshot.record's public keys)."""
    return {"pid": 5, "ppid": 1, "user": "root", "uid": 0, "name": "python", "cmdline": ["python", "w.py"],
            "command": "python w.py", "exe": "/usr/bin/python3", "state": "S", "start_time": "2026-01-01 00:00:00",
            "env_source": "exec", "env_reason": None, "env": {"NCCL_PROTO": "Simple", "OTHER": "x"}, "env_size": 40,
            "env_denied_by": None, "cuda_visible_devices": None,
            "nccl_libs": [{"path": LIB, "inode": 7, "version": "2.28.9", "version_source": "rodata", "simulated": False,
                           "kind": "shared", "defines": ["ncclCommInitRank"], "deleted": False, "reason": None,
                           "reached_by": "dynamic symbols (hookable)"}],
            "nccl_callers": [], "maps_reason": None, "gpus": [0], "gpus_source": "maps", "gpus_reason": None,
            "conf_files": [], "root": "/", "notes": [], "in_scope": True, "stale": None, "env_diff": None}


def test_report_and_inspect_give_one_shape_with_the_environments_named():
    versions = {("h", LIB): LibVersion(22809, "probe")}
    reported = views.process(_model_process(), versions)
    inspected = views.process(_model_process(), {}, _record())
    assert list(reported) == list(inspected)  # one shape: every key, in one order
    assert reported["start_env"] == {"NCCL_PROTO": "LL"} and reported["exec_env"] == {"NCCL_PROTO": "Simple"}
    assert inspected["exec_env"] == {"NCCL_PROTO": "Simple", "OTHER": "x"}  # /proc's record as shown (--all-vars)
    assert inspected["start_env"] == {"NCCL_PROTO": "LL"} and inspected["argv"] == ["python", "w.py"]
    assert reported["name"] is None and reported["gpus"] == [] and reported["gpus_source"] is None
    (lib,) = reported["nccl_libs"]
    (mapped,) = inspected["nccl_libs"]
    assert list(lib) == list(mapped)
    assert (lib["version"], lib["version_code"], lib["version_source"], lib["kind"]) == ("2.28.9", 22809, "probe", None)
    assert (mapped["version"], mapped["version_code"], mapped["version_source"], mapped["kind"]) == \
        ("2.28.9", 22809, "rodata", "shared")


def test_a_version_proc_could_not_read_is_the_one_the_probes_learnt():
    rec = _record()
    rec["nccl_libs"] = [{**rec["nccl_libs"][0], "version": None, "version_source": None, "reason": "vanished"}]
    (lib,) = views.process(_model_process(), {("h", LIB): LibVersion(2708, "plugin")}, rec)["nccl_libs"]
    assert (lib["version"], lib["version_code"], lib["version_source"], lib["reason"]) == ("2.7.8", 2708, "plugin", "vanished")
