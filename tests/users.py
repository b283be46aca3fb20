"""Other users and their directories, for tests of what ncclprobe refuses to write into. CI runs as
root, where permission bits prove nothing: the tests make a throwaway user and chown to it."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def other_user():
    """uid of a throwaway user, created for the module that asks and removed after it."""
    if os.geteuid() != 0:
        pytest.skip("a directory or file of another user needs root (to create a user and chown to it)")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if not (useradd and userdel):
        pytest.skip("useradd/userdel not available to create a throwaway user")
    name = f"ncpt{os.getpid()}{uuid_suffix()}"
    made = subprocess.run([useradd, "--system", "--no-create-home", name], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd {name} failed: {made.stderr.strip()}")
    try:
        yield pwd.getpwnam(name).pw_uid
    finally:
        subprocess.run([userdel, name], capture_output=True)


def uuid_suffix() -> str:
    import uuid
    return uuid.uuid4().hex[:4]  # two modules of one session ask for one each


def made_dir(path: Path, mode: int = 0o700) -> Path:
    """A new directory with exactly this mode (mkdir's is cut by the umask)."""
    path.mkdir()
    os.chmod(path, mode)
    return path
