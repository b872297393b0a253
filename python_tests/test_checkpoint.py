"""Checkpoints: a training run saved after k steps (model, optimizer and
``zion_emu.state_dict()``) and resumed in a new process gives the same losses,
bit for bit, as the run that never stopped, and its modeled clock, counters
and label totals continue exactly where they stopped.

Each run is a subprocess executing this file as a script (``main`` below):
the resumed run is a new process, as after a restart.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

import zion_emu
from processes import PYTHON, run, spawn

STEPS, SAVE_AFTER = 6, 3
RUN_TIMEOUT_S = 120


class _Model(torch.nn.Module):
    """A DLRM in miniature: a sparse embedding bag and dense features through an MLP."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(500, 8, mode="sum", sparse=True)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(8 + 4, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))

    def forward(self, dense: torch.Tensor, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.mlp(torch.cat([self.bag(ids, offsets), dense], dim=1))


def _batch(step: int, device: str) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(100 + step)
    batch = 16
    dense = torch.randn(batch, 4, generator=g)
    ids = torch.randint(0, 500, (batch * 3,), generator=g)
    offsets = torch.arange(0, batch * 3, 3)
    target = torch.randn(batch, 1, generator=g)
    return tuple(t.to(device) for t in (dense, ids, offsets, target))


def _optimizer(name: str, model: torch.nn.Module) -> torch.optim.Optimizer:
    if name == "sgd":
        return torch.optim.SGD(model.parameters(), lr=0.05)
    return torch.optim.Adagrad(model.parameters(), lr=0.05)


def _load_optimizer(opt: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """Loads an optimizer state read with map_location="zion". That moved
    Adagrad's step counters to zion too, where the optimizer would read each
    one back with a host sync every step (modeled time the uninterrupted run
    never spent); they go back to the CPU, where the optimizer keeps them."""
    opt.load_state_dict(state)
    for s in opt.state.values():
        if torch.is_tensor(s.get("step")):
            s["step"] = s["step"].cpu()


def _summary() -> dict[str, Any]:
    torch.zion.synchronize()
    c = zion_emu.counters(0)
    return {
        "clock": zion_emu.clock().hex(),
        "stream": zion_emu._C.device.stream_time(0, 0).hex(),
        "counters": [float(c.flops).hex(), float(c.bytes).hex(), float(c.copy_bytes).hex(), c.busy_s.hex(), c.ops,
                     c.guessed_ops],
        "labels": {k: [v[0].hex(), v[1]] for k, v in zion_emu._C.timeline.label_totals().items()},
        "peak_bytes": torch.zion.max_memory_allocated(0),
        "ddr_peaks": [zion_emu._C.host_memory.stats(s)["peak"] for s in range(zion_emu._C.host_memory.sockets())],
    }


def main(argv: list[str]) -> None:
    """``test_checkpoint.py OPTIMIZER FIRST LAST [--save PATH] [--resume PATH]``:
    trains steps FIRST..LAST-1 and prints the losses (float.hex) and the
    modeled clock and counters as JSON."""
    opt_name, first, last = argv[0], int(argv[1]), int(argv[2])
    save = argv[argv.index("--save") + 1] if "--save" in argv else None
    resume = argv[argv.index("--resume") + 1] if "--resume" in argv else None
    torch.manual_seed(0)
    model = _Model().to("zion")
    opt = _optimizer(opt_name, model)
    out: dict[str, Any] = {}
    if resume:
        ckpt = torch.load(resume, map_location="zion", weights_only=True)
        model.load_state_dict(ckpt["model"])
        _load_optimizer(opt, ckpt["optimizer"])
        # Last: what loading cost above is not part of the run being resumed.
        zion_emu.load_state_dict(ckpt["zion"])
        out["restored"] = _summary()
    else:
        zion_emu.reset_clock()  # the run starts at zero in both cases
    losses = []
    for step in range(first, last):
        dense, ids, offsets, target = _batch(step, "zion")
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(dense, ids, offsets), target)
        loss.backward()
        opt.step()
        losses.append(loss.item().hex())
    out["losses"] = losses
    if save:
        # The emulator's state first: the copies torch.save makes are not part of the run.
        sd = zion_emu.state_dict()
        out["saved"] = _summary()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "zion": sd}, save)
    out["end"] = _summary()
    print(json.dumps(out))


def _run(*args: str) -> dict[str, Any]:
    proc = run([PYTHON, __file__, *args], timeout_s=RUN_TIMEOUT_S, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("opt_name", ["sgd", "adagrad"])
def test_a_run_resumed_in_a_new_process_matches_the_uninterrupted_run(tmp_path, opt_name):
    ckpt = str(tmp_path / "ckpt.pt")
    whole = _run(opt_name, "0", str(STEPS))
    before = _run(opt_name, "0", str(SAVE_AFTER), "--save", ckpt)
    after = _run(opt_name, str(SAVE_AFTER), str(STEPS), "--resume", ckpt)

    # Losses: bit-equal, step by step.
    assert before["losses"] + after["losses"] == whole["losses"]
    # The resumed process starts from the saved clocks and counters, not from
    # the cost of building its model and loading the checkpoint.
    assert after["restored"]["clock"] == before["saved"]["clock"]
    assert after["restored"]["counters"] == before["saved"]["counters"]
    assert after["restored"]["labels"] == before["saved"]["labels"]
    assert after["restored"]["peak_bytes"] >= before["saved"]["peak_bytes"]
    assert all(a >= b for a, b in zip(after["restored"]["ddr_peaks"], before["saved"]["ddr_peaks"], strict=True))
    # ... and ends where the uninterrupted run ends.
    for key in ("clock", "stream", "counters", "labels"):
        assert after["end"][key] == whole["end"][key], key
    assert float.fromhex(whole["end"]["clock"]) > float.fromhex(before["saved"]["clock"]) > 0


def test_state_dict_round_trips_in_process_and_refuses_a_foreign_state():
    torch.ones(8, device="zion").mul_(2)
    torch.zion.synchronize()
    sd = zion_emu.state_dict()
    clock = zion_emu.clock()
    torch.ones(1000, device="zion").add_(1).sum().item()  # more modeled work
    assert zion_emu.clock() > clock
    zion_emu.load_state_dict(sd)
    assert zion_emu.clock() == clock
    assert zion_emu._C.timeline.state()["devices"] == sd["timeline"]["devices"]

    with pytest.raises(ValueError, match="taken on platform 'hgx-h100' with 8 devices; this process runs 'zion'"):
        zion_emu.load_state_dict(dict(sd, platform="hgx-h100"))
    with pytest.raises(ValueError, match="version 99 is not supported"):
        zion_emu.load_state_dict(dict(sd, version=99))
    with pytest.raises(ValueError, match="the state has no timeline"):
        zion_emu.load_state_dict({k: v for k, v in sd.items() if k != "timeline"})
    with pytest.raises(ValueError, match="takes the dict zion_emu.state_dict\\(\\) returned, got list"):
        zion_emu.load_state_dict([1, 2])
    broken = dict(sd, timeline=dict(sd["timeline"], host_s="soon"))
    with pytest.raises(ValueError, match="host_s must be a number, got str"):
        zion_emu.load_state_dict(broken)
    short = dict(sd, timeline=dict(sd["timeline"], streams_s=sd["timeline"]["streams_s"][:3]))
    with pytest.raises(ValueError, match=r"the saved timeline has 3 tracks .* this one has 16 \(one per device, then one per CPU socket\)"):
        zion_emu.load_state_dict(short)
    assert zion_emu.clock() == clock  # a refused state changes nothing


def test_ddr_pool_peaks_are_saved_and_a_version_1_state_is_still_read():
    host = zion_emu._C.host_memory
    x = torch.ones(1 << 20).pin_memory()  # 4 MiB in socket 0's pool (OAM 0's switch hangs off socket 0)
    peak = host.stats(0)["peak"]
    del x
    sd = zion_emu.state_dict()
    assert sd["version"] == 2 and len(sd["sockets"]) == host.sockets() == 8
    assert sd["sockets"][0]["peak_bytes"] == peak >= 4 << 20
    host.reset_peak(0)
    assert host.stats(0)["peak"] < peak
    zion_emu.load_state_dict(sd)
    assert host.stats(0)["peak"] == peak

    host.reset_peak(0)
    version_1 = {k: v for k, v in sd.items() if k != "sockets"} | {"version": 1}
    zion_emu.load_state_dict(version_1)  # read; the pools' peaks are left as they are
    assert host.stats(0)["peak"] == host.stats(0)["in_use"] < peak

    with pytest.raises(ValueError, match=r"'sockets' must hold one entry per CPU socket \(8\)"):
        zion_emu.load_state_dict(dict(sd, sockets=sd["sockets"][:1]))
    negative = [dict(sd["sockets"][0], peak_bytes=-1)] + sd["sockets"][1:]
    with pytest.raises(ValueError, match=r"sockets\[0\] holds a negative count"):
        zion_emu.load_state_dict(dict(sd, sockets=negative))
    with pytest.raises(ValueError, match=r"sockets\[2\] must be a dict of ints with peak_bytes and num_ooms"):
        zion_emu.load_state_dict(dict(sd, sockets=sd["sockets"][:2] + [None] + sd["sockets"][3:]))
    assert host.stats(0)["peak"] == host.stats(0)["in_use"]  # refused states changed nothing


def _rank_worker(rank: int, nprocs: int, store: str, first: int, last: int, save: str, resume: str,
                 out: str, api: str) -> None:
    """One rank of a data-parallel run: trains steps first..last-1 on
    zion:rank (gradients averaged with all_reduce), saves or resumes, and
    writes its losses and clocks to ``out``. ``api``: "torch" keeps model,
    optimizer and emulator state in one file per rank; "dcp" saves model and
    optimizer with torch.distributed.checkpoint into one directory (the
    replicated parameters written once) and each rank's emulator state in a
    file of its own."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    import torch.distributed as dist
    from datetime import timedelta

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                            timeout=timedelta(seconds=60))
    torch.zion.set_device(rank)
    device = f"zion:{rank}"
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    opt = torch.optim.Adagrad(model.parameters(), lr=0.05)
    result: dict[str, Any] = {}
    if resume and api == "dcp":
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=resume)
        set_state_dict(model, opt, model_state_dict=model_sd, optim_state_dict=optim_sd)
        zion_emu.load_state_dict(torch.load(f"{resume}/zion-rank{rank}.pt", weights_only=True))
    elif resume:
        ckpt = torch.load(resume.format(rank=rank), map_location=device, weights_only=True)
        model.load_state_dict(ckpt["model"])
        _load_optimizer(opt, ckpt["optimizer"])
        zion_emu.load_state_dict(ckpt["zion"])
    else:
        zion_emu.reset_clock()
    losses = []
    for step in range(first, last):
        g = torch.Generator().manual_seed(1000 * rank + step)
        x, y = torch.randn(8, 12, generator=g).to(device), torch.randn(8, 1, generator=g).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad.div_(nprocs)
        opt.step()
        losses.append(loss.item().hex())
    result["losses"] = losses
    if save and api == "dcp":
        sd = zion_emu.state_dict()
        model_sd, optim_sd = get_state_dict(model, opt)
        dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=save)
        torch.save(sd, f"{save}/zion-rank{rank}.pt")
    elif save:
        sd = zion_emu.state_dict()
        torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "zion": sd}, save.format(rank=rank))
    torch.zion.synchronize(rank)
    result["clock"] = zion_emu.clock().hex()
    result["stream"] = zion_emu._C.device.stream_time(rank, 0).hex()
    with open(out.format(rank=rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


def _spawn_ranks(tmp_path: Path, tag: str, first: int, last: int, save: str = "", resume: str = "",
                 api: str = "torch") -> list[dict]:
    run_dir = tmp_path / tag  # its own rendezvous store
    run_dir.mkdir()
    out = str(run_dir / "rank{rank}.json")
    spawn(_rank_worker, 2, run_dir, first, last, save, resume, out, api, timeout_s=RUN_TIMEOUT_S)
    return [json.loads(Path(out.format(rank=r)).read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.multiproc
@pytest.mark.timeout(240)
@pytest.mark.parametrize("api", ["torch", "dcp"])
def test_two_ranks_resumed_from_their_own_files_match_the_uninterrupted_run(tmp_path, api):
    ckpt = str(tmp_path / "ckpt-rank{rank}.pt") if api == "torch" else str(tmp_path / "dcp")
    whole = _spawn_ranks(tmp_path, "whole", 0, STEPS)
    before = _spawn_ranks(tmp_path, "before", 0, SAVE_AFTER, save=ckpt, api=api)
    after = _spawn_ranks(tmp_path, "after", SAVE_AFTER, STEPS, resume=ckpt, api=api)
    for rank in range(2):
        assert before[rank]["losses"] + after[rank]["losses"] == whole[rank]["losses"], rank
        assert after[rank]["clock"] == whole[rank]["clock"], rank
        assert after[rank]["stream"] == whole[rank]["stream"], rank


def _sharded_worker(rank: int, nprocs: int, store: str, ckpt: str, out: str) -> None:
    """Saves and loads with torch.distributed.checkpoint a ShardedTensor whose
    rows are all on rank 0, as a torchrec table-wise table is: rank 1 holds
    no shard of it."""
    from datetime import timedelta

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec

    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                            timeout=timedelta(seconds=60))
    torch.zion.set_device(rank)
    spec = ChunkShardingSpec(dim=0, placements=["rank:0/zion:0"])
    saved = sharded_tensor.empty(spec, 4, 3)
    for shard in saved.local_shards():
        shard.tensor.copy_(torch.arange(12.0).reshape(4, 3))
    dcp.save({"table": saved}, checkpoint_id=ckpt)
    loaded = sharded_tensor.zeros(spec, 4, 3)
    dcp.load({"table": loaded}, checkpoint_id=ckpt)
    result = {"device": str(loaded.device), "shards": [s.tensor.cpu().tolist() for s in loaded.local_shards()]}
    # ShardedTensor.to, as on NCCL with CUDA: "zion" is the current device
    # (the tensor itself, already there), and a rank with no shard starts
    # from zion's current device (torch asked torch.cuda).
    result["to zion is itself"] = loaded.to("zion") is loaded
    wide = loaded.to(torch.float64)
    result["float64"] = [str(wide.dtype), str(wide.device), [s.tensor.dtype == torch.float64 and s.tensor.cpu().tolist()
                                                             for s in wide.local_shards()]]
    placements = {str(m.placement.device()) for m in wide.metadata().shards_metadata}
    result["float64 placements"] = sorted(placements)
    with open(out.format(rank=rank), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


@pytest.mark.multiproc
@pytest.mark.timeout(120)
def test_a_sharded_tensor_with_no_shard_on_a_rank_saves_loads_and_moves(tmp_path):
    # ShardedTensor.device on a rank with no shard asked torch.cuda.current_device() on any group but gloo, so
    # loading a torchrec model whose table lives on another rank failed natively ("Torch not compiled with CUDA").
    out = str(tmp_path / "rank{rank}.json")
    spawn(_sharded_worker, 2, tmp_path, str(tmp_path / "dcp"), out, timeout_s=RUN_TIMEOUT_S)
    first, second = (json.loads(Path(out.format(rank=r)).read_text()) for r in range(2))
    rows = [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0], [6.0, 7.0, 8.0], [9.0, 10.0, 11.0]]
    assert first == {"device": "zion:0", "shards": [rows], "to zion is itself": True,
                     "float64": ["torch.float64", "zion:0", [rows]], "float64 placements": ["zion:0"]}
    # Its own current device, as on NCCL CUDA's (torch moves every placement to the calling rank's device).
    assert second == {"device": "zion:1", "shards": [], "to zion is itself": True,
                      "float64": ["torch.float64", "zion:1", []], "float64 placements": ["zion:1"]}


if __name__ == "__main__":
    main(sys.argv[1:])
