#!/bin/bash
# torchrun --no-python runs this once per rank; `export` puts NCCL_PROTO into the rank's environment.
here=$(cd "$(dirname "$0")" && pwd)
export NCCL_PROTO=LL; exec python3 "$here/../torchrun/worker.py" "$@"
