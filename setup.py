"""Builds probes/ (C probe library, simulated NCCL, boot probe) and native/ (the /proc reader) into
ncclprobe/_lib at install time."""
import importlib.util
from pathlib import Path

from setuptools import Distribution, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


def _probes_build():
    spec = importlib.util.spec_from_file_location("_probes_build", ROOT / "probes" / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class BuildPyWithProbes(build_py):
    def run(self):
        super().run()
        probes = _probes_build()
        probes.build(Path(self.build_lib) / "ncclprobe" / "_lib")
        if getattr(self, "editable_mode", False):
            probes.build(ROOT / "ncclprobe" / "_lib")


class BinaryDistribution(Distribution):
    # the wheel carries native libraries: tag it for this platform, not as pure Python
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithProbes}, distclass=BinaryDistribution)
