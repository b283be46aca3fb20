"""`ncclprobe demo`: a miniature inference server with planted NCCL propagation faults, diagnosed.

The worker modules here are imported by the demo's own processes; the story itself lives in
`story` and is imported only when the demo runs."""


def run_demo(real: bool = False, keep: bool = False, show_wiring: bool = False):
    from ncclprobe.demo.story import run_demo as _run
    return _run(real=real, keep=keep, show_wiring=show_wiring)
