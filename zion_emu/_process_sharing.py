"""Sending a zion tensor to another process is refused by name.

``torch.multiprocessing`` sends a CPU tensor's storage through shared memory
and a CUDA tensor's through a CUDA IPC handle. A zion tensor's bytes are the
emulator's device memory inside this process, which no other process can map,
so its reducers raise an error that says so and what to do instead (in the
receiving process, when a ``multiprocessing.Queue`` sends it). (torch's
own reducer took it for a CPU tensor: "_share_fd_: only available on CPU".)
"""

from __future__ import annotations

import threading
from typing import Any, Callable

_MESSAGE = ("a zion {what} cannot be sent to another process through torch.multiprocessing: its bytes are the "
            "emulator's device memory inside this process, which no other process can map (a CUDA tensor goes by a "
            "CUDA IPC handle; zion has none). Send {how}.cpu() and move it to zion in the receiving process")


def _refused_on_arrival(message: str) -> Any:
    """What a receiving process gets for a zion tensor a Queue's feeder thread pickled: the error."""
    raise RuntimeError(message)


def _refusing_zion(reduce: Callable[[Any], Any], what: str, how: str) -> Callable[[Any], Any]:
    def reduce_unless_zion(obj: Any) -> Any:
        # A TypedStorage's own .device warns of its deprecation; its untyped storage's does not.
        if getattr(obj, "_untyped_storage", obj).device.type == "zion":
            message = _MESSAGE.format(what=what, how=how)
            # multiprocessing.Queue pickles on its feeder thread, which only prints an error and drops
            # the item: the receiver (a DataLoader waiting on its worker's batch) would wait forever.
            # There the item goes as the error itself, raised in the receiver when it takes it.
            if threading.current_thread().name == "QueueFeederThread":
                return _refused_on_arrival, (message,)
            raise RuntimeError(message)
        return reduce(obj)

    reduce_unless_zion.__wrapped__ = reduce  # type: ignore[attr-defined]
    return reduce_unless_zion


def install() -> None:
    """Wraps the reducers torch registered for tensors and storages."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions as reductions

    kinds = {reductions.reduce_tensor: ("tensor", "tensor"), reductions.reduce_storage: ("storage", "the tensor"),
             reductions.reduce_typed_storage: ("storage", "the tensor"),
             reductions.reduce_typed_storage_child: ("storage", "the tensor")}
    for cls, reduce in list(ForkingPickler._extra_reducers.items()):
        if reduce in kinds:
            ForkingPickler.register(cls, _refusing_zion(reduce, *kinds[reduce]))
