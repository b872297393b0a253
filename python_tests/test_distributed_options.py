"""The model a ``zion`` group prices with: ``pg_options=zion_emu.distributed.Options``
per group, the ZION_COLLECTIVE_ALGO / ZION_LINK_MODEL environment for what
the options leave out, and clear errors for names the model does not know.
The link model's old spellings, ``Options(mode=...)`` and ZION_COLLECTIVE_MODE,
still work.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import zion_emu
import zion_emu.distributed as zd
from zion_emu import sim
from test_distributed import _Clock, _init, _last, _spawn

F32 = 4


def test_options_name_the_allowed_algorithms_and_link_models() -> None:
    with pytest.raises(ValueError, match=r"Options: unknown collective algorithm 'rng'; allowed: auto, ring, direct"):
        zd.Options(algorithm="rng")
    with pytest.raises(ValueError, match=r"Options: unknown link model 'fast'; allowed: fair, unaware, astra"):
        zd.Options(link_model="fast")
    with pytest.raises(TypeError, match="Options.algorithm must be a string or None, got int"):
        zd.Options(algorithm=1)  # type: ignore[arg-type]


def test_options_leave_to_the_environment_what_they_do_not_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZION_COLLECTIVE_MODE", raising=False)
    monkeypatch.setenv("ZION_COLLECTIVE_ALGO", "direct")
    monkeypatch.setenv("ZION_LINK_MODEL", "astra")
    assert zd._group_model(zd.Options(algorithm="ring")) == ("ring", "astra")
    assert zd._group_model(None) == ("direct", "astra")
    monkeypatch.delenv("ZION_COLLECTIVE_ALGO")
    monkeypatch.delenv("ZION_LINK_MODEL")
    assert zd._group_model(None) == ("auto", "fair")
    monkeypatch.setenv("ZION_COLLECTIVE_ALGO", "rign")
    with pytest.raises(ValueError, match=r"ZION_COLLECTIVE_ALGO / ZION_LINK_MODEL: unknown collective algorithm 'rign'"):
        zd._group_model(None)
    with pytest.raises(TypeError, match="pg_options must be zion_emu.distributed.Options, got builtins.dict"):
        zd._group_model({"algorithm": "ring"})


def test_the_old_spellings_of_the_link_model_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.warns(DeprecationWarning, match=r"Options\(mode=\.\.\.\) is deprecated; use link_model="):
        options = zd.Options(algorithm="ring", mode="unaware")
    assert options == zd.Options(algorithm="ring", link_model="unaware")
    with pytest.raises(TypeError, match="both link_model and its deprecated name mode"):
        zd.Options(link_model="fair", mode="astra")
    # ZION_COLLECTIVE_MODE counts only while ZION_LINK_MODEL is unset (or
    # says the same), and an error names the variable the value came from.
    monkeypatch.delenv("ZION_LINK_MODEL", raising=False)
    monkeypatch.setenv("ZION_COLLECTIVE_MODE", "astra")
    assert zd._group_model(None) == ("auto", "astra")
    monkeypatch.setenv("ZION_LINK_MODEL", "astra")
    assert zd._group_model(None) == ("auto", "astra")  # both, agreeing
    # Both, disagreeing: neither wins silently.
    monkeypatch.setenv("ZION_LINK_MODEL", "unaware")
    with pytest.raises(ValueError, match=r"ZION_LINK_MODEL='unaware' and its deprecated name "
                                         r"ZION_COLLECTIVE_MODE='astra' disagree; unset ZION_COLLECTIVE_MODE"):
        zd._group_model(None)
    with pytest.raises(ValueError, match="disagree"):
        zd.Options().resolved()
    monkeypatch.delenv("ZION_LINK_MODEL")
    monkeypatch.setenv("ZION_COLLECTIVE_MODE", "psychic")
    with pytest.raises(ValueError, match=r"ZION_COLLECTIVE_ALGO / ZION_COLLECTIVE_MODE: unknown link model 'psychic'"):
        zd._group_model(None)


def _options_worker(rank: int, nprocs: int, store: str) -> None:
    gloo = _init(rank, nprocs, store)
    clock = _Clock(rank, nprocs, gloo)
    devices = list(range(nprocs))
    nbytes = 1 << 20
    ring = dist.new_group(devices, backend="zion", pg_options=zd.Options(algorithm="ring", link_model="unaware"))
    assert zd.group_model(ring) == {"algorithm": "ring", "link_model": "unaware"}
    assert zd.group_model() == {"algorithm": "auto", "link_model": "fair"}  # the default group keeps its own

    z = torch.ones(nbytes // F32, device="zion")
    dist.all_reduce(z)
    auto = _last()
    z = torch.ones(nbytes // F32, device="zion")
    dist.all_reduce(z, group=ring)
    rec = _last(ring)
    assert torch.equal(z.cpu(), torch.full((nbytes // F32,), float(nprocs)))
    assert rec["algorithm"] == "ring" and rec["devices"] == devices
    assert rec["time"] == pytest.approx(sim.collective_time(clock.platform, "all_reduce", nbytes, devices, "ring", "unaware"),
                                        rel=1e-9)
    # zion's fully connected fabric: auto picks direct for a 1 MiB all_reduce, which beats the ring.
    assert auto["algorithm"] != "ring" and auto["time"] < rec["time"]

    # A pg_options of another backend's type is refused when the group is made, on every rank.
    with pytest.raises(TypeError, match="pg_options must be zion_emu.distributed.Options"):
        dist.new_group(devices, backend="zion", pg_options={"algorithm": "ring"})
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_group_with_ring_options_prices_its_collectives_as_the_ring(tmp_path):
    _spawn(_options_worker, 4, tmp_path)


def _split_worker(rank: int, nprocs: int, store: str) -> None:
    # The pattern PyTorch recommends: a device bound at init, then a 2-D mesh,
    # whose groups DeviceMesh makes with split_group.
    from torch.distributed.device_mesh import init_device_mesh

    torch.zion.set_device(rank)
    dist.init_process_group("zion", init_method=f"file://{store}", rank=rank, world_size=nprocs,
                            device_id=torch.device("zion", rank), pg_options=zd.Options(algorithm="ring"))
    platform = zion_emu.current_platform()
    mesh = init_device_mesh("zion", (2, nprocs // 2), mesh_dim_names=("dp", "tp"))
    nbytes = 1 << 16
    for dim, members in (("tp", [rank - rank % 2, rank - rank % 2 + 1]), ("dp", [rank % 2, rank % 2 + 2])):
        group = mesh.get_group(dim)
        assert dist.get_process_group_ranks(group) == members
        assert zd.group_model(group) == {"algorithm": "ring", "link_model": "fair"}  # the parent's
        z = torch.full((nbytes // F32,), float(rank), device="zion")
        dist.all_reduce(z, group=group)
        assert torch.equal(z.cpu(), torch.full((nbytes // F32,), float(sum(members))))
        rec = _last(group)
        assert rec["devices"] == members and rec["algorithm"] == "ring"
        assert rec["time"] == pytest.approx(sim.collective_time(platform, "all_reduce", nbytes, members, "ring"), rel=1e-9)
    # split_group itself: a rank in none of the splits gets None, as with NCCL.
    evens = dist.split_group(split_ranks=[[0, 2]])
    assert (evens is None) == (rank % 2 == 1)
    if evens is not None:
        z = torch.ones(4, device="zion")
        dist.all_reduce(z, group=evens)
        assert torch.equal(z.cpu(), torch.full((4,), 2.0)) and _last(evens)["devices"] == [0, 2]
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_two_dimensional_device_mesh_splits_the_group_with_the_parents_model(tmp_path):
    _spawn(_split_worker, 4, tmp_path)
