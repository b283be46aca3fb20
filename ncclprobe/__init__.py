"""ncclprobe: which NCCL tuning each communicator of a multi-process GPU server actually got."""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("ncclprobe")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0+unknown"

SCHEMA = "ncclprobe/1"
