#!/bin/bash
# `env -i` with the variable named: the worker has it (and nothing else but PATH).
here=$(cd "$(dirname "$0")" && pwd)
env -i PATH="$PATH" NCCL_PROTO=LL python3 "$here/../_worker.py" "$@"
