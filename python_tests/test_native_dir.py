"""ZION_EMU_NATIVE_DIR: another build of the native core, loaded before the
package's own (make sanitize runs the suite so, on its AddressSanitizer
build). The source tree stands first on sys.path in pytest and in the
processes the tests start (their working folder is the checkout), so without
it they would load the regular build."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import zion_emu
from zion_emu import _C
from processes import REPO, child_env, run_python

PACKAGE = Path(zion_emu.__file__).resolve().parent


def test_this_run_loads_the_native_core_the_environment_names():
    # Under make sanitize that is build/asan's; otherwise the package's own.
    native = os.environ.get("ZION_EMU_NATIVE_DIR")
    expected = Path(native).resolve() if native else PACKAGE
    assert Path(_C.__file__).resolve().parent == expected


def test_a_process_started_from_the_checkout_loads_the_named_build(tmp_path: Path):
    # A copy of the build this run loaded, in a folder of its own: the child,
    # started in the checkout (sys.path[0]), loads the copy and runs on it.
    built = Path(_C.__file__).resolve().parent
    for name in (Path(_C.__file__).name, "libzion_emu.so"):
        shutil.copy2(built / name, tmp_path / name)
    out = run_python("""
        import torch, zion_emu
        from zion_emu import _C
        print(_C.__file__)
        print((torch.ones(3, device="zion") + 1).cpu().tolist())
    """, env=child_env(ZION_EMU_NATIVE_DIR=str(tmp_path))).stdout.splitlines()
    assert Path(out[-2]).resolve().parent == tmp_path.resolve()
    assert out[-1] == "[2.0, 2.0, 2.0]"
    # Without it, the checkout's own package is loaded.
    plain = run_python("from zion_emu import _C; print(_C.__file__)", env=child_env(ZION_EMU_NATIVE_DIR=None))
    plain = plain.stdout.splitlines()
    assert Path(plain[-1]).resolve().parent == (REPO / "zion_emu").resolve()


def test_a_folder_without_a_native_core_is_an_error_naming_it(tmp_path: Path):
    # Not a silent fall back to the package's own build.
    out = run_python("import zion_emu", env=child_env(ZION_EMU_NATIVE_DIR=str(tmp_path / "none")), check=False)
    assert out.returncode != 0
    assert "ZION_EMU_NATIVE_DIR=" in out.stderr and "no native core there" in out.stderr and "none" in out.stderr
