"""Makes ``torch.device("zion")`` exist: PrivateUse1 renamed, the device
module ``torch.zion``, and the generated Tensor methods (``.zion()``,
``.is_zion``). Idempotent. The device runtime itself starts on first use, so
``ZION_PLATFORM`` or ``zion_emu.set_platform`` may still choose the platform."""

from __future__ import annotations

import atexit
import sys

import torch

from zion_emu._parent_death import die_with_launcher

_done = False


def register() -> None:
    global _done
    if _done:
        return
    die_with_launcher()  # a rank started by torchrun or zion-emu run does not outlive it
    from zion_emu import _C  # noqa: F401  (loads libzion_emu: kernels, allocator, guard, hooks, autocast)
    from zion_emu import device as zion_device

    if torch._C._get_privateuse1_backend_name() != "zion":
        torch.utils.rename_privateuse1_backend("zion")
    torch._register_device_module("zion", zion_device)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    from zion_emu import distributed  # noqa: F401  (registers the "zion" torch.distributed backend)
    from zion_emu import inductor

    inductor.install_on_import()  # torch.compile's inductor lowers zion graphs as CPU, priced on zion

    from zion_emu import comm, precision

    zion_device.matmul = precision.matmul  # torch.zion.matmul.allow_tf32, as torch.backends.cuda.matmul
    zion_device.last_matmul_precision = precision.last_matmul_precision

    # torch.zion.comm, as torch.cuda.comm; torch.nn.parallel's comm functions
    # send zion tensors to it (DataParallel, replicate, scatter, gather).
    comm.install()
    zion_device.comm = comm
    sys.modules["torch.zion.comm"] = comm
    from zion_emu import memory

    zion_device.memory = memory  # torch.zion.memory, as torch.cuda.memory: history and snapshots
    sys.modules["torch.zion.memory"] = memory

    # Before finalization: autograd's zion worker threads must not be holding
    # a finished backward pass (and its Python objects) when the interpreter
    # goes away, or the process aborts at exit.
    atexit.register(_C.device.drain_autograd_threads)

    from zion_emu import _process_sharing

    _process_sharing.install()  # a zion tensor sent through torch.multiprocessing is refused by name

    from zion_emu import _backward

    _backward.install()  # a zion backward pass runs on the calling thread, as a CPU one does

    from zion_emu import _timing

    if _timing.requested():
        _timing.prefer_cpp_meta()  # timing-only mode runs every op's Meta kernel: the C++ ones are fast
    _timing.install_placeholder_printing()  # print(loss) in timing-only mode shows placeholders
    _done = True
