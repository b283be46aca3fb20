"""The demo's "inference engine" framework code: what a real engine does to the environment when
speculative decoding is switched on. The line numbers matter: the report names them."""
import os


def enable_speculative(buffsize: str = "16777216") -> None:
    # The operator's patch: more buffer for the bigger verify all-reduces. Too late: this process
    # already created its decode communicator, and NCCL caches NCCL_BUFFSIZE at its first read.
    os.environ["NCCL_BUFFSIZE"] = buffsize
    # Framework default for the verify path, written over whatever the operator exported.
    os.environ["NCCL_PROTO"] = "Simple"
