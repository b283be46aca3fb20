"""`ncclprobe bench`: all-reduce latency per NCCL configuration, one fresh worker set per configuration
(the only package that imports torch, and only inside the workers and when a command runs).

Each size's rows are printed the moment they are measured, in nccl-tests' layout (live.py): on stdout,
or on stderr under --json, whose stdout is the JSON document alone. Progress goes to stderr.

A configuration's `status` in the JSON: `ok` (measured, every result correct), `wrong` (measured, some
results wrong), `hang` (killed at --timeout), `error` (a rank failed), `interrupted` (SIGINT or SIGTERM
arrived while it ran: its workers were killed, the sizes it had finished are in its `results`). An
interrupted run still returns its Result: `incomplete` true, `interrupted` says where (signal, config,
sizes done, the configurations `not_run`), and the exit code is 128 + the signal (130 for Ctrl-C).

On gloo, NCCL variables change nothing, so only NCCL's defaults run unless --proto, --algo or --config
ask for more; the output says so in `notes`.
"""
from __future__ import annotations


def bench_command(**opts):
    from ncclprobe.bench.command import bench_command as run
    return run(**opts)


__all__ = ["bench_command"]
