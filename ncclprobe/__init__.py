"""ncclprobe: which NCCL tuning each communicator of a multi-process GPU server actually got."""

SCHEMA = "ncclprobe/2"


def __getattr__(name: str):
    # importlib.metadata costs ~20 ms: read the version only when something asks for it (not --help)
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("ncclprobe")
        except PackageNotFoundError:  # a source tree that was never installed
            return "0+unknown"
    raise AttributeError(f"module 'ncclprobe' has no attribute {name!r}")
