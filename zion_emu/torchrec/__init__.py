"""torchrec and fbgemm_gpu on zion: DistributedModelParallel models run on zion
devices natively and under ``--cuda-compat``, their losses those of a CPU run.

Nothing to call: once ``zion_emu`` is imported, importing fbgemm_gpu or
torchrec installs, module by module (:mod:`zion_emu.torchrec.hooks`):

- :mod:`~zion_emu.torchrec.tbe_autograd`: zion autograd kernels for fbgemm's
  table-batched embedding lookups (fused optimizers included);
- :mod:`~zion_emu.torchrec.planner`: the sharding planner plans zion with the
  platform's HBM, DDR and bandwidths and places shards on ``zion:i``;
- :mod:`~zion_emu.torchrec.dense_tables`: data-parallel tables live on zion.

The fbgemm ops a training step runs are priced by the op cost model's
formulas (csrc/sim/op_formulas_fbgemm.cpp).
"""

from __future__ import annotations

from zion_emu.torchrec.hooks import installed

__all__ = ["installed"]
