#!/bin/bash
# A plain assignment makes a shell variable, not an environment variable: the worker never gets it.
here=$(cd "$(dirname "$0")" && pwd)
cd "${TMPDIR:-/tmp}"  # the job runs elsewhere: a relative path to this script no longer resolves
NCCL_PROTO=LL
python3 "$here/../_worker.py" "$@"
