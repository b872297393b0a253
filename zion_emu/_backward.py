"""Where a zion backward pass runs: on the thread that called it, as for CPU.

Autograd's engine gives every accelerator device a worker thread of its own
and hands each backward pass to it, while the calling thread waits. On a real
GPU that thread only launches kernels; in the emulator it runs every op's CPU
kernel, so each backward pays two thread hand-offs, and on a busy machine the
scheduler can take milliseconds to run the woken thread. The engine's own
switch, ``torch.autograd.set_multithreading_enabled(False)``, runs a pass on
the calling thread instead; the emulator turns it on for each backward pass
that the user has not already made single-threaded. Results, modeled times,
streams (each backward op runs on its forward op's stream), reentrant
backward, and hooks (DDP's among them) are as before. Inside the pass,
``torch.autograd.is_multithreading_enabled()`` reads False.

``ZION_AUTOGRAD_DEVICE_THREADS=1`` (read when zion_emu is imported, so before
``import torch``) keeps the engine's worker thread per
device, as on CUDA.
"""

from __future__ import annotations

import os

import torch
from torch.autograd.variable import Variable

_ENV = "ZION_AUTOGRAD_DEVICE_THREADS"


def device_threads_requested() -> bool:
    value = os.environ.get(_ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{_ENV}={value!r}: expected 0 (backward on the calling thread) or 1 "
                         "(autograd's worker thread per zion device, as on CUDA)")
    return value == "1"


class CallerThreadEngine(torch._C._ImperativeEngine):
    """Autograd's engine, running each backward pass on the calling thread."""

    def run_backward(self, *args, **kwargs):  # type: ignore[override]
        if not torch._C._is_multithreading_enabled():
            return super().run_backward(*args, **kwargs)
        torch._C._set_multithreading_enabled(False)
        try:
            return super().run_backward(*args, **kwargs)
        finally:
            torch._C._set_multithreading_enabled(True)


def install() -> None:
    if device_threads_requested() or isinstance(Variable._execution_engine, CallerThreadEngine):
        return
    Variable._execution_engine = CallerThreadEngine()
