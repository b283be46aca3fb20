"""Build c_daemon/daemon.c with the system C compiler (`cc`) into a temporary directory, or use a
binary built earlier (`--daemon PATH`). No binary is ever kept in the repository."""
from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "c_daemon" / "daemon.c"


def build(dest: Path) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        sys.exit("this example needs a C compiler (cc)")
    out = dest / "daemon"
    subprocess.run([cc, "-O1", "-Wall", "-o", str(out), str(SOURCE)], check=True)
    return out


@contextmanager
def binary(prebuilt: str | None) -> Iterator[str]:
    if prebuilt:
        yield prebuilt
        return
    with tempfile.TemporaryDirectory(prefix="ncclprobe-daemon-") as d:
        yield str(build(Path(d)))
