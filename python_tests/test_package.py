"""The package ``zion_emu``: what ``import zion_emu`` gives, as numpy and torch do.

Every public submodule is an attribute (``zion_emu.sim`` after a bare
``import zion_emu``), imported on first use; ``__all__`` names the top-level
API and every name in it resolves; ``__version__`` is the installed
package's.
"""

import importlib.metadata
import os
import pkgutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

import zion_emu


def fresh_python(code: str) -> str:
    """stdout of ``code`` in a new interpreter (nothing of this one's imports)."""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    return r.stdout


def public_submodules() -> list[str]:
    """The package's Python modules and subpackages not named with a leading
    underscore (libzion_emu.so beside them is the native library, no module)."""
    package = Path(zion_emu.__file__).parent
    return sorted(m.name for m in pkgutil.iter_modules([str(package)])
                  if not m.name.startswith("_") and (m.ispkg or (package / f"{m.name}.py").is_file()))


def test_a_bare_import_reaches_the_model_through_zion_emu_sim():
    # The docstrings point users at zion_emu.sim.OpCall and zion_emu.sim.collective_time.
    assert fresh_python("import zion_emu; print(zion_emu.sim.collective_time.__name__, zion_emu.sim.OpCall.__name__)") \
        == "collective_time OpCall\n"


def test_every_public_submodule_is_an_attribute_after_a_bare_import():
    # A fresh interpreter: here another test's import may already have bound one.
    names = public_submodules()
    out = fresh_python("import zion_emu\n"
                       f"for name in {names!r}:\n"
                       "    assert name in dir(zion_emu), name\n"
                       "    print(name, getattr(zion_emu, name).__name__)")
    assert out.splitlines() == [f"{name} zion_emu.{name}" for name in names]


@pytest.mark.parametrize("name", public_submodules())
def test_every_public_submodule_is_a_module_of_the_package(name):
    module = getattr(zion_emu, name)
    assert isinstance(module, types.ModuleType) and module.__name__ == f"zion_emu.{name}"


def test_every_name_in_all_resolves_and_is_listed_once():
    assert len(zion_emu.__all__) == len(set(zion_emu.__all__))
    for name in zion_emu.__all__:
        assert getattr(zion_emu, name) is not None, name


def test_the_top_level_api_is_the_submodules_own():
    assert zion_emu.set_platform is zion_emu.platform.set_platform
    assert zion_emu.clock is zion_emu.timeline.clock
    assert zion_emu.samples_per_iteration is zion_emu.iterations.samples_per_iteration


def test_a_bare_import_leaves_the_cli_the_report_and_the_cuda_shims_unloaded():
    loaded = fresh_python("import sys, zion_emu; print(' '.join(sorted(sys.modules)))").split()
    for lazy in ("zion_emu.cli", "zion_emu.report", "zion_emu.trace", "zion_emu.cuda_compat", "zion_emu.sim",
                 "zion_emu.astra", "zion_emu.launch", "zion_emu.virtual_clock"):
        assert lazy not in loaded


def test_an_unknown_attribute_is_an_attribute_error_naming_it():
    with pytest.raises(AttributeError, match="module 'zion_emu' has no attribute 'simulator'"):
        zion_emu.simulator  # noqa: B018


def test_the_version_is_the_installed_package_metadata():
    assert zion_emu.__version__ == importlib.metadata.version("zion-emu")
