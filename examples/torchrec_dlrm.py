"""torchrec's DLRM trained with DistributedModelParallel: a script written for
CUDA, as torchrec's own examples are.

    torchrun --nproc-per-node 2 examples/torchrec_dlrm.py --device cpu       # CPU, gloo
    python -m zion_emu run --nproc 2 examples/torchrec_dlrm.py --device zion # zion, natively
    python -m zion_emu run --nproc 2 --cuda-compat examples/torchrec_dlrm.py # the CUDA script on zion

Tables: t0 table-wise on rank 0, t1 row-wise (or table-wise on rank 1 with
--sharding table_wise), t2 column-wise over all ranks, t3 data-parallel, and
with more tables than four, the rest table-wise round robin; or the planner's
plan (--plan planner). The embedding optimizer is fused into the backward
(--optimizer), the dense part trains with SGD. Rank 0 prints each loss; on
zion also the modeled time per iteration, the ops the last iteration priced
by the default guess, and its pooled-embedding all-to-alls.
"""

from __future__ import annotations

import argparse
import gc
import inspect
import math
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.nn  # noqa: F401  (before the group exists: see main)

BACKENDS = {"cpu": "gloo", "cuda": "nccl", "zion": "zion"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=sorted(BACKENDS), default="cuda")
    p.add_argument("--plan", choices=["explicit", "planner"], default="explicit")
    p.add_argument("--sharding", choices=["row_wise", "table_wise"], default="row_wise", help="t1's sharding")
    p.add_argument("--optimizer", choices=["sgd", "adagrad", "rowwise_adagrad"], default="rowwise_adagrad")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=4, help="per rank")
    p.add_argument("--tables", type=int, default=4)
    p.add_argument("--rows", type=int, default=100)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--pooling", type=int, default=2, help="most lookups per sample and feature")
    p.add_argument("--batches", choices=["per-rank", "shared"], default="per-rank",
                   help="per-rank: each rank draws its own batches; shared: every rank draws the same ones")
    return p.parse_args(argv)


def build_plan(args: argparse.Namespace, ebc: Any, sharder: Any, model: Any, world: int, device_type: str) -> Any:
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))  # ranks per node, as torchrun gives them
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.sharding_plan import (column_wise, construct_module_sharding_plan, data_parallel,
                                                    row_wise, table_wise)
    from torchrec.distributed.types import ShardingPlan, ShardingType

    if args.plan == "planner":
        kinds = {"t0": ShardingType.TABLE_WISE, "t1": ShardingType.ROW_WISE if args.sharding == "row_wise" else
                 ShardingType.TABLE_WISE, "t2": ShardingType.COLUMN_WISE, "t3": ShardingType.DATA_PARALLEL}
        constraints = {name: ParameterConstraints(sharding_types=[kind.value]) for name, kind in kinds.items()}
        # Topology takes the machine's HBM, DDR and bandwidths; on zion from the platform.
        planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, local_world_size=local,
                                                             compute_device=device_type),
                                           constraints=constraints)
        return planner.collective_plan(model, [sharder], dist.GroupMember.WORLD)
    per_table = {"t0": table_wise(rank=0, compute_kernel="fused"),
                 "t1": row_wise(compute_kernel="fused") if args.sharding == "row_wise" else
                 table_wise(rank=1 % world, compute_kernel="fused"),
                 # Column shards must divide the dimension: over all ranks where they do.
                 "t2": column_wise(ranks=list(range(math.gcd(args.dim, world))), compute_kernel="fused"),
                 "t3": data_parallel()}
    for t in range(4, args.tables):
        per_table[f"t{t}"] = table_wise(rank=t % world, compute_kernel="fused")
    module_plan = construct_module_sharding_plan(ebc, {k: v for k, v in per_table.items()
                                                       if int(k[1:]) < args.tables},
                                                 sharder=sharder, local_size=local, world_size=world,
                                                 device_type=device_type)
    return ShardingPlan({"model.sparse_arch.embedding_bag_collection": module_plan})


def _largest_message(call: dict[str, Any], rank: int) -> int:
    """The largest block this rank sends to or receives from another rank in
    an all_to_all_single (splits count rows of dim 0)."""
    row_bytes = {}
    blocks = []
    for name, tensor in (("input_split_sizes", call["input"]), ("output_split_sizes", call["output"])):
        row_bytes[name] = tensor.element_size() * (tensor[0].numel() if tensor.dim() > 1 else 1)
        splits = call.get(name)
        n = dist.get_world_size(call.get("group"))
        splits = list(splits) if splits else [tensor.shape[0] // n] * n
        blocks += [s * row_bytes[name] for peer, s in enumerate(splits) if peer != rank]
    return max(blocks, default=0)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    dist.init_process_group(BACKENDS[args.device])
    code = train(args)
    # The groups' backends are freed, and gloo's worker threads joined, once
    # nothing holds them: train's model and optimizers are gone with its frame
    # (a collection drops their cycles), and torch.distributed.nn, imported
    # before the group was made, holds none in its functions' default
    # arguments. A gloo worker left at interpreter
    # teardown can abort the process as it drops a tensor.
    gc.collect()
    dist.destroy_process_group()
    return code


def train(args: argparse.Namespace) -> int:
    """Builds the sharded DLRM on the initialized process group, trains it and prints (rank 0) what it measured."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.keyed import KeyedOptimizerWrapper

    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    elif args.device == "zion":
        device = torch.device("zion", local_rank)
        torch.zion.set_device(device)
    else:
        device = torch.device("cpu")
    on_zion = device.type == "zion"  # also under --cuda-compat, where "cuda" is zion

    torch.manual_seed(0)
    features = [f"f{t}" for t in range(args.tables)]
    tables = [EmbeddingBagConfig(name=f"t{t}", embedding_dim=args.dim, num_embeddings=args.rows,
                                 feature_names=[features[t]]) for t in range(args.tables)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(DLRM(embedding_bag_collection=ebc, dense_in_features=4, dense_arch_layer_sizes=[8, args.dim],
                           over_arch_layer_sizes=[8, 1], dense_device=device))
    optimizer = {"sgd": EmbOptimType.EXACT_SGD, "adagrad": EmbOptimType.EXACT_ADAGRAD,
                 "rowwise_adagrad": EmbOptimType.EXACT_ROWWISE_ADAGRAD}[args.optimizer]
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer, "learning_rate": 0.1})
    plan = build_plan(args, model.model.sparse_arch.embedding_bag_collection, sharder, model, world, device.type)
    dmp = DistributedModelParallel(model, device=device, plan=plan, sharders=[sharder])
    dense_optimizer = KeyedOptimizerWrapper(dict(dmp.named_parameters()), lambda p: torch.optim.SGD(p, lr=0.1))

    pooled_all_to_alls: list[dict[str, Any]] = []
    if on_zion:
        import zion_emu
        from zion_emu import distributed as zion_dist

        all_to_all_single = dist.all_to_all_single
        signature = inspect.signature(all_to_all_single)

        def recorded(*a: Any, **kw: Any) -> Any:
            work = all_to_all_single(*a, **kw)
            call = signature.bind(*a, **kw).arguments
            if recording and call["input"].is_floating_point():
                record = dict(zion_dist.last_collective(call.get("group")))
                record["largest_message_bytes"] = _largest_message(call, rank)
                pooled_all_to_alls.append(record)
            return work

        dist.all_to_all_single = recorded

    g = torch.Generator().manual_seed(rank if args.batches == "per-rank" else 0)
    recording = False
    modeled_s = wall_s = 0.0
    for it in range(args.iters):
        lengths = torch.randint(0, args.pooling + 1, (args.tables * args.batch_size,), generator=g)
        values = torch.randint(0, args.rows, (int(lengths.sum()),), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=features, values=values, lengths=lengths)
        batch = Batch(dense_features=torch.randn(args.batch_size, 4, generator=g), sparse_features=kjt,
                      labels=torch.randint(0, 2, (args.batch_size,), generator=g).float()).to(device)
        last = it == args.iters - 1
        if on_zion and last:
            guessed_before = zion_emu.cost.guessed_ops(device)
            recording = True
        start_modeled, start_wall = (zion_emu.clock() if on_zion else 0.0), time.perf_counter()
        loss, _ = dmp(batch)
        dense_optimizer.zero_grad()
        loss.backward()
        dense_optimizer.step()
        loss_value = loss.item()
        if on_zion:
            torch.zion.synchronize()
        if it > 0:  # the first iteration builds what later ones reuse
            modeled_s += (zion_emu.clock() - start_modeled) if on_zion else 0.0
            wall_s += time.perf_counter() - start_wall
        if rank == 0:
            print(f"loss {it} {loss_value!r}", flush=True)
    timed = max(args.iters - 1, 1)
    if rank == 0:
        if on_zion:
            guessed = {op: n - guessed_before.get(op, 0) for op, n in zion_emu.cost.guessed_ops(device).items()}
            print(f"guessed_ops {dict((op, n) for op, n in guessed.items() if n)}")
            print(f"modeled_ms_per_iter {modeled_s / timed * 1e3:.4f}")
            for r in pooled_all_to_alls:
                print(f"pooled_all_to_all largest_message_bytes {r['largest_message_bytes']} time_s {r['time']!r} "
                      f"algorithm {r['algorithm']}")
        print(f"wall_ms_per_iter {wall_s / timed * 1e3:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
