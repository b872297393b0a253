"""zion-emu: a virtual Facebook Zion training platform as a PyTorch device.

This package registers and configures; the model of the hardware lives in
the native core (``zion_emu._C``), reached through :mod:`zion_emu.sim`.
"""


def _autoload() -> None:
    """Entry point of torch's ``torch.backends`` group. Importing this package
    registers the device; defined before ``import torch`` because that import
    may itself call it while this package is still loading."""


import torch  # noqa: E402,F401  (the native core links libtorch)

from zion_emu.platform import ConfigError, Platform, load_platform, preset_names

__all__ = ["ConfigError", "Platform", "load_platform", "preset_names"]
__version__ = "0.1.0"


from zion_emu._register import register as _register  # noqa: E402

_register()

from zion_emu import cost  # noqa: E402
from zion_emu.device import DeviceProperties  # noqa: E402
from zion_emu.platform import current_platform, set_platform  # noqa: E402
from zion_emu.timeline import DeviceCounters, clock, counters, reset_clock  # noqa: E402
from zion_emu.sockets import socket  # noqa: E402
from zion_emu.iterations import samples_per_iteration  # noqa: E402

__all__ += ["DeviceCounters", "DeviceProperties", "clock", "cost", "counters", "current_platform", "reset_clock",
            "samples_per_iteration", "set_platform", "socket"]
from zion_emu.state import load_state_dict, state_dict  # noqa: E402

__all__ += ["load_state_dict", "state_dict"]

from zion_emu.sockets import _apply_environment as _socket_from_environment  # noqa: E402

_socket_from_environment()
