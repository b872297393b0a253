"""Data-parallel (DENSE kernel) tables on zion.

torchrec builds a data-parallel table's ``DenseTableBatchedEmbeddingBagsCodegen``
with ``use_cpu=True`` on any device that is not CUDA or MTIA, and fbgemm's only
other device choice is ``torch.cuda.current_device()``. The table would live on
the CPU and its lookup run unpriced. Here a table torchrec builds for a zion
device is built on that device: its weights drawn by the zion generator, as a
CPU run draws them from the CPU one, so both runs start from the same numbers.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable

import torch

ZION = "zion"

_building = threading.local()  # .device: the zion device a torchrec DENSE table is being built for
_cuda_current_device_lock = threading.Lock()


def _build_on_zion(init: Callable[..., None]) -> Callable[..., None]:
    """DenseTableBatchedEmbeddingBagsCodegen.__init__, building on the zion
    device torchrec asked for (fbgemm's current_device is
    torch.cuda.current_device() whenever use_cpu is False)."""

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        device = getattr(_building, "device", None)
        if device is None:
            return init(self, *args, **kwargs)
        kwargs.update(use_cpu=False, use_mtia=False)
        with _cuda_current_device_lock:
            current_device = torch.cuda.current_device
            torch.cuda.current_device = lambda: device
            try:
                init(self, *args, **kwargs)
            finally:
                torch.cuda.current_device = current_device

    return __init__


def _for_zion_device(init: Callable[..., None]) -> Callable[..., None]:
    """BatchedDenseEmbedding(Bag).__init__: marks the zion device it builds for."""

    @functools.wraps(init)
    def __init__(self: Any, config: Any, pg: Any = None, device: Any = None, *args: Any, **kwargs: Any) -> None:
        target = torch.device(device) if device is not None else None
        if target is None or target.type != ZION:
            return init(self, config, pg, device, *args, **kwargs)
        _building.device = target
        try:
            init(self, config, pg, device, *args, **kwargs)
        finally:
            _building.device = None

    return __init__


def install_fbgemm(training: Any) -> None:
    """fbgemm_gpu.split_table_batched_embeddings_ops_training."""
    cls = training.DenseTableBatchedEmbeddingBagsCodegen
    cls.__init__ = _build_on_zion(cls.__init__)


def install_torchrec(kernels: Any) -> None:
    """torchrec.distributed.batched_embedding_kernel."""
    for name in ("BatchedDenseEmbeddingBag", "BatchedDenseEmbedding"):
        cls = getattr(kernels, name)
        cls.__init__ = _for_zion_device(cls.__init__)
