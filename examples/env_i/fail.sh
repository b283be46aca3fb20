#!/bin/bash
# `env -i` starts the worker with an empty environment plus what it names: the operator's exported
# NCCL_PROTO is gone.
here=$(cd "$(dirname "$0")" && pwd)
env -i PATH="$PATH" python3 "$here/../_worker.py" "$@"
