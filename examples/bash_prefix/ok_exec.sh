#!/bin/bash
# The prefix belongs to the exec'ed command: the worker (the same process, now python) has it.
here=$(cd "$(dirname "$0")" && pwd)
cd "${TMPDIR:-/tmp}"  # the job runs elsewhere: a relative path to this script no longer resolves
NCCL_PROTO=LL exec python3 "$here/../_worker.py" "$@"
