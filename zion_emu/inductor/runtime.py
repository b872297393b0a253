"""What the wrapper of a graph inductor lowered as CPU calls to run on zion.

Its header rebinds ``empty_strided_cpu`` and ``device`` to these, so its
buffers are zion tensors (extern kernels such as ``mm`` then run through
zion's fallback and are priced as in eager mode), and imports
``charge_kernel``, which it calls after each generated C++ kernel.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from zion_emu._C.device import charge_kernel

__all__ = ["charge_kernel", "device", "empty_strided"]


def empty_strided(index: int) -> Callable[..., torch.Tensor]:
    """``empty_strided_cpu(size, stride, dtype)``, allocating on zion:index."""
    zion = torch.device("zion", index)
    allocate = torch.empty_strided

    def empty_strided_zion(size: Any, stride: Any, dtype: torch.dtype) -> torch.Tensor:
        return allocate(size, stride, dtype=dtype, device=zion)

    return empty_strided_zion


def device(index: int) -> Callable[..., torch.device]:
    """``torch.device`` for a wrapper lowered as CPU: its CPU is zion:index."""
    zion = torch.device("zion", index)

    def zion_device(type: Any = None, index: int | None = None) -> torch.device:  # noqa: A002  (torch.device's keyword)
        d = torch.device(type) if index is None else torch.device(type, index)
        return zion if d.type == "cpu" else d

    return zion_device
