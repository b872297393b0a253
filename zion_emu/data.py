"""Data ingestion: reader hosts feeding a trainer over the front-end network.

On Zion, training data is read and preprocessed by separate reader
machines and arrives over the front-end NICs. :class:`ReaderService` wraps
any iterable of batches (a ``DataLoader``) and charges each batch to the
modeled timeline as that pipeline would deliver it:

1. **Readers.** ``readers`` hosts preprocess batches in parallel, each
   sample costing ``preprocess_s_per_sample`` seconds of one reader: batch
   k is ready at ``r_k = r_{k-1} + n_k * c / R``, with r_0 the host time of
   the first request (the pool is a pipeline of throughput R / c samples/s
   that works ahead of the trainer).
2. **Front-end network.** The batch's bytes cross this rank's share of the
   node's front-end NICs (``frontend_nic.count x bandwidth`` split evenly
   over the node's ranks): it arrives at ``a_k = max(r_k, a_{k-1}) +
   bytes / share + frontend_nic.latency``.
3. **Trainer.** When the script asks for batch k at host time h, the host
   waits until ``a_k`` (the wait is counted), copies the batch into pinned
   memory on the rank's socket at DDR bandwidth, and, with ``device=``,
   starts the host-to-device copies over PCIe (non-blocking, priced by the
   link model).

:meth:`ReaderService.summary` says whether ingestion or training is the
bottleneck and how many readers a throughput needs.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Iterator

import torch
from torch.utils._pytree import tree_flatten, tree_map

from zion_emu import _C

_timeline = _C.timeline


@dataclass(frozen=True)
class IngestionSummary:
    batches: int
    samples: int
    bytes: int
    wait_s: float               # host time spent waiting for data to arrive
    elapsed_s: float            # host time from the first request to the last batch handed out
    reader_limit_samples_per_s: float   # readers / preprocess cost
    network_limit_samples_per_s: float  # NIC share / bytes per sample
    trainer_samples_per_s: float        # what the trainer consumed, waits excluded
    bottleneck: str             # "ingestion" or "training"

    @property
    def ingestion_limit_samples_per_s(self) -> float:
        return min(self.reader_limit_samples_per_s, self.network_limit_samples_per_s)


class ReaderService:
    """Wraps ``loader`` (an iterable of batches: tensors, or tuples/dicts of
    tensors) as if ``readers`` reader hosts fed it (see the module docstring).

    ``samples_per_batch``: the samples in one batch (default: the first
    dimension of the first tensor). ``device``: move each batch there after
    staging it in pinned memory. ``local_world_size``: ranks of this node
    sharing the front-end NICs (default ``$LOCAL_WORLD_SIZE`` or 1).
    ``nic_bandwidth_bytes_per_s`` overrides the platform's share.
    """

    def __init__(self, loader: Iterable[Any], readers: int = 1, preprocess_s_per_sample: float = 0.0,
                 samples_per_batch: int | None = None, device: Any = None, local_world_size: int | None = None,
                 nic_bandwidth_bytes_per_s: float | None = None) -> None:
        from zion_emu import current_platform

        if isinstance(readers, bool) or not isinstance(readers, int) or readers < 1:
            raise ValueError(f"ReaderService: readers must be a positive integer, got {readers!r}")
        if not preprocess_s_per_sample >= 0:
            raise ValueError(f"ReaderService: preprocess_s_per_sample must be >= 0 seconds, got {preprocess_s_per_sample!r}")
        if samples_per_batch is not None and samples_per_batch < 1:
            raise ValueError(f"ReaderService: samples_per_batch must be positive, got {samples_per_batch}")
        platform = current_platform()
        local = local_world_size or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        if local < 1:
            raise ValueError(f"ReaderService: local_world_size must be positive, got {local}")
        if nic_bandwidth_bytes_per_s is None:
            count = platform.get("frontend_nic.count")
            gbit = platform.get("frontend_nic.bandwidth_gbit_per_s")
            nic_bandwidth_bytes_per_s = count * gbit * 1e9 / 8 / local
        if not nic_bandwidth_bytes_per_s > 0:
            raise ValueError(f"ReaderService: the front-end NIC share must be positive, got {nic_bandwidth_bytes_per_s}")
        self.loader = loader
        self.readers = readers
        self.preprocess = float(preprocess_s_per_sample)
        self.samples_per_batch = samples_per_batch
        self.device = torch.device(device) if device is not None else None
        self.nic_share = float(nic_bandwidth_bytes_per_s)
        self.nic_latency = platform.get("frontend_nic.latency_ns") * 1e-9
        self.ddr_bandwidth = platform.get("socket.ddr_bandwidth_gb_per_s") * 1e9
        self._reset()

    def _reset(self) -> None:
        self._ready = 0.0    # when the readers finish the next batch
        self._arrived = 0.0  # when the network delivered the last batch
        self.batches = self.samples = self.bytes = 0
        self.wait_s = 0.0
        self._first_request: float | None = None
        self._last_handed = 0.0

    def _samples(self, tensors: list[torch.Tensor]) -> int:
        if self.samples_per_batch is not None:
            return self.samples_per_batch
        if not tensors or tensors[0].dim() == 0:
            raise ValueError("ReaderService: cannot tell the samples in a batch without tensors of at least one "
                             "dimension; pass samples_per_batch=")
        return int(tensors[0].shape[0])

    def _stage(self, batch: Any) -> Any:
        def move(t: Any) -> Any:
            if not isinstance(t, torch.Tensor):
                return t
            pinned = t.pin_memory() if not t.is_pinned() else t
            return pinned.to(self.device, non_blocking=True) if self.device is not None else pinned

        return tree_map(move, batch)

    def __iter__(self) -> Iterator[Any]:
        self._reset()
        for batch in self.loader:
            tensors = [t for t in tree_flatten(batch)[0] if isinstance(t, torch.Tensor)]
            n = self._samples(tensors)
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            now = _C.device.host_time()
            if self._first_request is None:
                # The readers start when the trainer starts iterating.
                self._first_request = self._ready = self._arrived = now
            self._ready = self._ready + n * self.preprocess / self.readers
            self._arrived = max(self._ready, self._arrived) + nbytes / self.nic_share + self.nic_latency
            if self._arrived > now:
                self.wait_s += self._arrived - now
                _timeline.wait_until(self._arrived)
            _timeline.advance_host(nbytes / self.ddr_bandwidth)  # into pinned staging on the rank's socket
            staged = self._stage(batch)
            self.batches += 1
            self.samples += n
            self.bytes += nbytes
            self._last_handed = _C.device.host_time()
            yield staged

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def summary(self) -> IngestionSummary:
        elapsed = self._last_handed - (self._first_request or 0.0)
        per_sample = self.bytes / self.samples if self.samples else 0.0
        reader_limit = self.readers / self.preprocess if self.preprocess > 0 else math.inf
        network_limit = self.nic_share / per_sample if per_sample > 0 else math.inf
        busy = elapsed - self.wait_s
        trainer = self.samples / busy if busy > 0 else math.inf
        # Training is the bottleneck when the trainer almost never waited for data.
        bottleneck = "ingestion" if elapsed > 0 and self.wait_s > 0.05 * elapsed else "training"
        return IngestionSummary(self.batches, self.samples, self.bytes, self.wait_s, elapsed, reader_limit,
                                network_limit, trainer, bottleneck)

    def readers_needed(self, samples_per_s: float) -> int:
        """Reader hosts that preprocess ``samples_per_s``; raises if this rank's
        front-end NIC share cannot carry that rate at all."""
        if not samples_per_s > 0:
            raise ValueError(f"readers_needed takes a positive throughput, got {samples_per_s}")
        s = self.summary()
        if samples_per_s > s.network_limit_samples_per_s:
            raise ValueError(f"{samples_per_s:,.0f} samples/s needs more than this rank's front-end NIC share "
                             f"({self.nic_share / 1e9:.2f} GB/s carries {s.network_limit_samples_per_s:,.0f} samples/s "
                             f"of {self.bytes / max(self.samples, 1):,.0f} bytes); no number of readers is enough")
        return max(1, math.ceil(samples_per_s * self.preprocess - 1e-9))
