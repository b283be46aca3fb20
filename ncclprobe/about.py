"""What ncclprobe says about itself at the top of its help: what it is for, its exit codes, its output,
and each command's summary. toplevel.py (`ncclprobe --help`, without click) and cli.py (the click
group) both read it, so neither imports the other for its words; it imports nothing, so --help stays cheap."""
from __future__ import annotations

ABOUT = ("Which NCCL tuning each communicator of a running multi-process GPU server actually got, where each "
         "value came from, what NCCL then ran, and which setting is worth having here.")
EXIT_CODES = ("Exit codes: 0 nothing at error level; 1 error-level findings (--strict: warnings too); "
              "2 usage error; 3 the target could not be examined. A reader that stops reading (`| head`) "
              "never changes them.")
OUTPUT = ("Output: the verdict first, then one finding per cause, then the details; COLUMNS wide, else "
          "the terminal's width, else 80; words are never cut; colour on a terminal, also piped with "
          "FORCE_COLOR, never with NO_COLOR; --json on every command (schema ncclprobe/2).")
# command -> the first sentence of its help
COMMANDS = {
    "bench": "All-reduce latency per NCCL configuration on this machine, with nccl-tests semantics; each "
             "configuration in a fresh set of worker processes.",
    "demo": "Replay the 'did my workers get NCCL_PROTO=LL?' story on a miniature server and diagnose it.",
    "explain": "What NCCL does with VAR: cached per process or re-read per communicator, default, values.",
    "inject": "Install a persistent boot probe into a Python interpreter's site-packages.",
    "inspect": "The exec-time view of the process tree under each PID: environment, NCCL libraries, GPUs, "
               "nccl.conf files, and where that view cannot be trusted.",
    "report": "Per process and per communicator: what NCCL got, read and ran, from one or more log directories "
              "(several hosts' directories merge).",
    "run": "Run CMD with the probes wired in, then print the report.",
    "topo": "The GPU interconnect as NCCL will see it (NVML): links, P2P status, PCIe, NUMA.",
}
