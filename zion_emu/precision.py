"""How float32 matmuls and convolutions are priced on zion.

The op cost model prices a float32 matmul-class op (mm, addmm, bmm, baddbmm,
linear, matmul) at the OAM's TF32 peak when the script allows TF32, and at
its bf16 peak under ``torch.set_float32_matmul_precision("medium")``, as
cuBLAS runs them on an Ampere or later GPU; a convolution at the TF32 peak
while ``torch.backends.cudnn.allow_tf32`` is True (its default). The numerics
stay those of the CPU op. The switches are torch's own:

- ``torch.set_float32_matmul_precision("high")`` (TF32) or ``"medium"`` (bf16);
- ``torch.backends.cuda.matmul.allow_tf32 = True`` (or ``.fp32_precision = "tf32"``);
- ``torch.zion.matmul.allow_tf32 = True``: the same flag under zion's name;
- ``torch.backends.cudnn.allow_tf32`` (or ``.conv.fp32_precision``) for convolutions.

A platform whose OAM has no TF32 peak (``oam.peak_flops.tf32`` left out)
prices them at fp32 and warns once. ``torch.zion.last_matmul_precision()``
says which precision priced the last one.
"""

from __future__ import annotations

from typing import Any

import torch

from zion_emu import _C


class _MatmulFlags:
    """``torch.zion.matmul``: the float32 matmul precision switch, as ``torch.backends.cuda.matmul``."""

    @property
    def allow_tf32(self) -> bool:
        """Whether float32 matmuls may run (and are priced) as TF32; the flag
        ``torch.backends.cuda.matmul.allow_tf32`` sets."""
        return bool(torch._C._get_cublas_allow_tf32())

    @allow_tf32.setter
    def allow_tf32(self, value: bool) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"torch.zion.matmul.allow_tf32 takes True or False, got {value!r}")
        torch._C._set_cublas_allow_tf32(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name != "allow_tf32":
            raise AttributeError(f"torch.zion.matmul has no setting '{name}'; allowed: allow_tf32")
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"torch.zion.matmul(allow_tf32={self.allow_tf32})"


matmul = _MatmulFlags()


def last_matmul_precision() -> dict[str, str] | None:
    """The last float32 matmul-class op or convolution priced in this process:
    ``{"op": ..., "requested": ..., "priced": ...}`` with the precision the
    settings asked for and the one whose peak priced it (``fp32``, ``tf32``
    or ``bf16``; ``priced`` is ``fp32`` where the platform has no peak for
    the one asked). None before the first."""
    return _C.device.last_fp32_matmul_pricing()
