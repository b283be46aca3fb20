"""All-reduce as nccl-tests measures it: bandwidth formulas and the values a correct result holds.

The table entry for one collective, over the shared timing code in worker.py (nccl-tests keeps one
`<coll>.cu` per collective over `common.cu` the same way). No torch here.
"""
from __future__ import annotations

NAME = "all_reduce"
REDOP = "sum"
ROOT = -1  # nccl-tests prints root -1 for all-reduce


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in decimal GB/s: bytes / 1e9 / time (nccl-tests AllReduceGetBw)."""
    return nbytes / 1e9 / seconds if seconds > 0 else 0.0


def bus_factor(nranks: int) -> float:
    """busbw / algbw for all-reduce: 2(n-1)/n. Each element is reduced and broadcast, 2(n-1)
    transfers over n links whatever the algorithm (nccl-tests doc/PERFORMANCE.md); 1.75 at n=8,
    0 at n=1 (a single rank moves nothing between GPUs)."""
    return 2.0 * (nranks - 1) / nranks if nranks > 0 else 0.0


def busbw(nbytes: int, seconds: float, nranks: int) -> float:
    """Bus bandwidth: algbw x 2(n-1)/n, comparable to the hardware bottleneck (NVLink, PCIe, QPI)."""
    return algbw(nbytes, seconds) * bus_factor(nranks)


# Correctness pattern: rank r fills element i with (r + 1) * (1 + i % PERIOD); the sum over n ranks is
# (1 + i % PERIOD) * n(n + 1) / 2. Small integers, exact in bf16 up to 256, so any tolerance only
# absorbs rounding of larger sums, never hides corrupted lines (LL128 over PCIe corrupts whole lines).
PERIOD = 3


def rank_value(rank: int, i: int) -> int:
    return (rank + 1) * (1 + i % PERIOD)


def expected_value(nranks: int, i: int) -> int:
    return (1 + i % PERIOD) * nranks * (nranks + 1) // 2


def tolerance(dtype: str) -> float:
    """Relative tolerance for the check: half an ulp at 8 (bf16) or 11 (fp16) mantissa bits."""
    return {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11, "fp32": 1e-6}[dtype]
