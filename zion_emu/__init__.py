"""zion-emu: a virtual Facebook Zion training platform as a PyTorch device.

This package registers and configures; the model of the hardware lives in
the native core (``zion_emu._C``), reached through :mod:`zion_emu.sim`.

Every public submodule is an attribute of the package (``zion_emu.sim``,
``zion_emu.report``, ...), imported on first use, as numpy and torch do:
``import zion_emu`` loads only what registering the device needs.
"""

from __future__ import annotations


def _autoload() -> None:
    """Entry point of torch's ``torch.backends`` group. Importing this package
    registers the device; defined before ``import torch`` because that import
    may itself call it while this package is still loading."""


import contextlib as _contextlib  # noqa: E402
import importlib as _importlib  # noqa: E402
import os as _os  # noqa: E402
import sys as _sys  # noqa: E402
import typing as _typing  # noqa: E402

import torch  # noqa: E402,F401  (the native core links libtorch)


def _native_core_first() -> None:
    """ZION_EMU_NATIVE_DIR names a folder holding another build of the native
    core (`_C` and `libzion_emu.so`: make sanitize's AddressSanitizer build),
    searched before this package's folder, so that build is the one loaded
    wherever this source tree stands on sys.path, in the tests and in every
    process they start."""
    named = _os.environ.get("ZION_EMU_NATIVE_DIR")
    if not named:
        return
    folder = _os.path.abspath(named)
    names = _os.listdir(folder) if _os.path.isdir(folder) else []
    if not any(n.startswith("_C.") and n.endswith(".so") for n in names):
        raise ImportError(f"ZION_EMU_NATIVE_DIR={named}: no native core there (a _C.*.so beside its "
                          "libzion_emu.so, as make sanitize builds into build/asan/pkg/zion_emu); "
                          "unset it to load this package's own build")
    __path__.insert(0, folder)  # noqa: F821  (the package's own)


_native_core_first()


def _running_the_cli() -> bool:
    """Whether this process is the command line, ``zion-emu`` or ``python -m
    zion_emu``: either imports this package before its main() runs."""
    if _os.path.basename(_sys.argv[0]) == "zion-emu":
        return True
    # python -m zion_emu (or -mzion_emu): sys.argv[0] is "-m" while runpy
    # imports the package; the interpreter's own arguments name the module.
    if _sys.argv[0] != "-m":
        return False
    argv = _sys.orig_argv
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m":
            return argv[i + 1:i + 2] == [__name__]
        if arg.startswith("-m"):
            return arg[2:] == __name__
    return False


@_contextlib.contextmanager
def _reading_the_environment() -> _typing.Iterator[None]:
    """Around the steps of this import that read ZION_* variables. A value one
    refuses raises ValueError naming the variable, the value and what it
    takes (under ``import torch``, the cause of torch's "Failed to load the
    backend extension"). Under the command line, whose main() is not running
    yet to say it, it is the command's one-line error and exit code 2."""
    try:
        yield
    except ValueError as e:
        if not _running_the_cli():
            raise
        print(f"zion-emu: error: {e}", file=_sys.stderr)
        raise SystemExit(2) from None


from zion_emu.platform import (  # noqa: E402
    ConfigError,
    Platform,
    current_platform,
    load_platform,
    preset_names,
    set_platform,
)
from zion_emu._register import register as _register  # noqa: E402

with _reading_the_environment():
    _register()  # ZION_AUTOGRAD_DEVICE_THREADS

from zion_emu import cost  # noqa: E402
from zion_emu._timing import mode, placeholder_reads  # noqa: E402
from zion_emu.device import DeviceProperties  # noqa: E402
from zion_emu.iterations import samples_per_iteration, throughput  # noqa: E402
from zion_emu.sockets import socket  # noqa: E402
from zion_emu.state import load_state_dict, state_dict  # noqa: E402
from zion_emu.timeline import DeviceCounters, clock, counters, reset_clock  # noqa: E402

__all__ = [
    # the machine modeled
    "ConfigError", "Platform", "current_platform", "load_platform", "preset_names", "set_platform",
    # the device and its modeled clock and counters
    "DeviceCounters", "DeviceProperties", "clock", "cost", "counters", "mode", "placeholder_reads", "reset_clock",
    # the host side, runs and checkpoints
    "load_state_dict", "samples_per_iteration", "socket", "state_dict", "throughput",
]

# The public submodules. Those not imported above are imported by
# __getattr__ when first named (PEP 562): the CLI, the report and the CUDA
# shims cost time nobody who only trains on the device should pay.
_SUBMODULES = (
    "astra", "async_ps", "breakdown", "cli", "comm", "cost", "cuda_compat", "data", "device", "distributed",
    "inductor", "inference", "iterations", "launch", "memory", "platform", "profiler", "report", "report_html", "report_text",
    "sim", "socket_tensor", "sockets", "state", "timeline", "torchrec", "trace", "virtual_clock",
)


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("zion-emu")
    except metadata.PackageNotFoundError:  # a source tree on sys.path, never installed
        return "0+unknown"


def __getattr__(name: str) -> _typing.Any:
    if name in _SUBMODULES:
        return _importlib.import_module(f"{__name__}.{name}")  # the import binds it here: asked once
    if name == "__version__":
        # Read from the installed package's metadata on first use: finding it
        # walks sys.path, which `import zion_emu` need not do.
        version = _version()
        globals()["__version__"] = version
        return version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_SUBMODULES, "__version__"})


from zion_emu.sockets import _apply_environment as _socket_from_environment  # noqa: E402

with _reading_the_environment():
    _socket_from_environment()
    if _os.environ.get("ZION_PROFILER_HOST_TIME"):  # zion_emu.profiler: the host track's clock
        from zion_emu.profiler import _apply_environment as _profiler_from_environment

        _profiler_from_environment()

# torchrec and fbgemm_gpu on zion, installed when (and if) they are imported.
from zion_emu.torchrec.hooks import watch as _watch_torchrec  # noqa: E402

_watch_torchrec()

# ZION_CUDA_COMPAT=1 (set by zion_emu.cuda_compat.enable(), so inherited by
# every process a --cuda-compat run starts: mp.spawn ranks, DataLoader
# workers): this process maps CUDA to zion too. Not in the command line itself.
if _os.environ.get("ZION_CUDA_COMPAT") == "1" and not _running_the_cli():
    from zion_emu import cuda_compat as _cuda_compat

    _cuda_compat.enable()
