#!/bin/bash
# torchrun --no-python runs this once per rank. The assignment is a prefix of `true` alone (GNU Bash
# manual §3.7.4): the rank's python never gets NCCL_PROTO.
here=$(cd "$(dirname "$0")" && pwd)
NCCL_PROTO=LL true; exec python3 "$here/../torchrun/worker.py" "$@"
