"""Test-session settings shared by every test file."""
from __future__ import annotations

import os
import signal

import pytest

from users import other_user  # noqa: F401 (a fixture: every test module may ask for it)


@pytest.fixture(autouse=True, scope="session")
def _installed_package_in_subprocesses(tmp_path_factory):
    """Subprocesses run `python -m ncclprobe`, which puts the working directory first on sys.path: from
    the repository root that is the source tree, whose native parts are built only by an install.
    Run them from elsewhere, so every test exercises the installed package (PYTHONSAFEPATH does the
    same on Python >= 3.11; the chdir covers 3.10)."""
    old_cwd, old_safe = os.getcwd(), os.environ.get("PYTHONSAFEPATH")
    os.environ["PYTHONSAFEPATH"] = "1"
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(old_cwd)
    if old_safe is None:
        os.environ.pop("PYTHONSAFEPATH", None)
    else:
        os.environ["PYTHONSAFEPATH"] = old_safe


@pytest.fixture(autouse=True, scope="session")
def _no_colour_settings_from_the_caller():
    """NO_COLOR / FORCE_COLOR of the caller (CI runners often set FORCE_COLOR) would colour the plain text
    that tests read from subprocesses: tests that need them set them."""
    saved = {k: os.environ.pop(k) for k in ("NO_COLOR", "FORCE_COLOR") if k in os.environ}
    yield
    os.environ.update(saved)


@pytest.fixture(autouse=True, scope="session")
def _sigint_as_a_terminal_gives_it():
    """Tests Ctrl-C their children (run, bench). A pytest started as a background job (`&` without job
    control, nohup) inherits SIGINT ignored, and exec keeps an ignored signal ignored, so every child
    would ignore it too and those tests hang. A handled signal is reset to default at exec: handle it."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)
