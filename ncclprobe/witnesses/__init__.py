"""Witnesses: how evidence about a job is gathered (/proc and its native reader, ELF, nccl.conf files,
shell scripts, the probes' event logs, NCCL's INFO logs). Each returns what it saw, with reasons for
what it could not see; none of them judges."""
