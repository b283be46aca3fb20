"""`ncclprobe bench`: all-reduce latency per NCCL configuration, one fresh worker set per configuration
(the only package that imports torch, and only inside the workers and when a command runs)."""
from __future__ import annotations


def bench_command(**opts):
    from ncclprobe.bench.command import bench_command as run
    return run(**opts)


__all__ = ["bench_command"]
