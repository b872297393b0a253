"""Builds zion_emu and its native core zion_emu._C with CMake.

Install (after `pip install -r requirements.txt`):
    pip install --no-build-isolation -e .
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _install(path: Path, directory: Path) -> None:
    """Copies a shared library by rename, so a process that has the old one
    loaded (a test run) keeps a consistent file."""
    staged = directory / (path.name + ".tmp")
    shutil.copy2(path, staged)
    os.replace(staged, directory / path.name)


class CMakeExtension(Extension):
    def __init__(self, name: str) -> None:
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    """Configures once into build/cmake and rebuilds incrementally with ninja."""

    def build_extension(self, ext: Extension) -> None:
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(os.environ.get("ZION_BUILD_DIR", ROOT / "build" / "cmake")).resolve()
        build_dir.mkdir(parents=True, exist_ok=True)
        config = os.environ.get("ZION_BUILD_TYPE", "Release")
        args = [
            f"-DCMAKE_BUILD_TYPE={config}",
            f"-DZION_EXTENSION_DIR={out_dir}",
            f"-DPython3_EXECUTABLE={sys.executable}",
        ]
        if os.environ.get("ZION_CMAKE_ARGS"):
            args += os.environ["ZION_CMAKE_ARGS"].split()
        generator = []
        if not (build_dir / "CMakeCache.txt").exists():
            try:
                import ninja  # noqa: F401  (pip's ninja puts the binary on PATH)

                generator = ["-G", "Ninja"]
            except ImportError:
                pass
        subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *generator, *args])
        jobs = os.environ.get("ZION_BUILD_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call(["cmake", "--build", str(build_dir), "--target", "_C", "-j", jobs])
        # _C finds libzion_emu (the device library) beside itself ($ORIGIN):
        # in the build's output and in the source package (editable installs).
        library = build_dir / "libzion_emu.so"
        for target in {out_dir, ROOT / "zion_emu"}:
            target.mkdir(parents=True, exist_ok=True)
            _install(library, target)

setup(
    name="zion-emu",
    version="0.1.0",
    description="A virtual Facebook Zion training platform as a PyTorch device",
    packages=find_packages(include=["zion_emu", "zion_emu.*"]),
    package_data={"zion_emu": ["platforms/*.json", "libzion_emu.so"]},
    ext_modules=[CMakeExtension("zion_emu._C")],
    cmdclass={"build_ext": CMakeBuild},
    python_requires=">=3.10",
    install_requires=["torch==2.13.0", "numpy", "pyyaml"],
    entry_points={
        "console_scripts": ["zion-emu=zion_emu.__main__:program"],
        # torch imports these on a bare `import torch` (device backend autoload).
        "torch.backends": ["zion = zion_emu:_autoload"],
    },
)
