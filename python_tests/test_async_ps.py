"""Asynchronous training with parameter servers (zion_emu.async_ps): each
message priced on its route, the virtual clocks of trainers and servers
consistent, and real values (the losses of the ordered schedule's CPU replay)."""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

import pytest
import torch

import zion_emu
from zion_emu import async_ps
from processes import REPO, zion_emu_cli

EXAMPLE = REPO / "examples" / "async_ps" / "train.py"
sys.path.insert(0, str(EXAMPLE.parent))
import ps_model  # noqa: E402


def _pcie_route(platform: zion_emu.Platform) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) from an OAM on PCIe switch 0 to socket 0
    on zion, worked from the platform file: OAM -> switch on the switch's
    generation x oam_lanes, switch -> socket on its uplink generation x
    uplink_lanes; one PCIe latency per hop."""
    pcie = platform.fields["pcie"]
    sw = pcie["switches"][0]
    lane = pcie["lane_bandwidth_gb_per_s"]
    oam_link = lane[sw["generation"]] * 1e9 * sw["oam_lanes"]  # gen4 1.5 GB/s x 16 = 24 GB/s
    uplink = lane[sw["uplink_generation"]] * 1e9 * sw["uplink_lanes"]  # gen3 0.75 GB/s x 16 = 12 GB/s
    return 2 * pcie["latency_ns"] * 1e-9, min(oam_link, uplink)


def test_route_price_is_latency_plus_bytes_over_the_slowest_link() -> None:
    p = zion_emu.load_platform("zion")
    latency, bandwidth = _pcie_route(p)
    assert (latency, bandwidth) == (pytest.approx(300e-9), 12e9)
    links = async_ps.Links(p)
    trainer, server = async_ps.Place("oam", 1), async_ps.Place("socket", 0)
    leaves, arrival = links.send(trainer, server, 1.2e6, ready_s=1e-3)
    assert leaves == 1e-3
    assert arrival == pytest.approx(1e-3 + 1.2e6 / 12e9 + 300e-9, rel=1e-12)  # 100.3 us after sending
    # A second message from OAM 0 shares the link switch 0 -> socket 0 and
    # waits for the first one's last byte (FIFO), then takes its own time.
    leaves2, arrival2 = links.send(async_ps.Place("oam", 0), server, 0.6e6, ready_s=1e-3)
    assert leaves2 == pytest.approx(1e-3 + 100e-6, rel=1e-12)
    assert arrival2 == pytest.approx(1e-3 + 100e-6 + 50e-6 + 300e-9, rel=1e-12)
    # The reverse route has links of its own: the reply does not queue behind requests.
    back_leaves, _ = links.send(server, trainer, 8.0, ready_s=1e-3)
    assert back_leaves == 1e-3


def test_places_are_checked_against_the_platform() -> None:
    p = zion_emu.load_platform("zion")
    with pytest.raises(ValueError, match="socket 8 does not exist on platform 'zion' \\(8 per node: 0..7\\)"):
        async_ps.Place("socket", 8).check(p)
    with pytest.raises(ValueError, match="a place is one of oam, socket, got 'gpu'"):
        async_ps.Place("gpu", 0).check(p)
    with pytest.raises(ValueError, match="node 1 does not exist"):
        async_ps.Place("oam", 0, node=1).check(p)
    with pytest.raises(ValueError, match="schedule must be one of ordered, free, got 'lifo'"):
        async_ps.ParameterServer(0, async_ps.Place("socket", 0), {}, {}, 0.1, 2, schedule="lifo", platform=p)


def test_ordered_schedule_serves_kth_calls_in_trainer_order_whatever_comes_first() -> None:
    """Trainer 1's call arrives (for real) first; the server holds it until
    trainer 0's call of the same number was served."""
    server = async_ps.ParameterServer(0, async_ps.Place("socket", 0), {"t": torch.arange(8.0).view(4, 2)}, {},
                                      lr=1.0, trainers=2, timeout_s=20)
    order: list[int] = []

    def call(trainer: int) -> None:
        req = async_ps.Request(trainer, 0, "push", async_ps.Place("oam", trainer), 0.0,
                               rows={"t": torch.tensor([0])}, grads={"t": torch.full((1, 2), trainer + 1.0)})
        server.handle(req)
        order.append(trainer)

    try:
        late = threading.Thread(target=call, args=(1,))
        late.start()
        late.join(0.5)
        assert late.is_alive() and order == []  # waiting for trainer 0's turn
        call(0)
        late.join(10)
        assert order == [0, 1]
        # row 0 = 0 - 1 (trainer 0) - 2 (trainer 1), applied in that order (lr 1)
        assert server.tables["t"][0].tolist() == [-3.0, -2.0]
    finally:
        zion_emu.reset_clock()


def _place(busy: dict, links: list, ready: float, tx: float) -> float:
    """The rule, by hand: the first of the ready time and the ends of the
    intervals already placed on ``links`` at which every one of them is free
    for ``tx`` (a zero-length message: not inside an interval); then those
    links are busy for [start, start + tx)."""
    def overlaps(a: float, b: float, c: float) -> bool:
        return a <= c < b if tx == 0 else a < c + tx and b > c

    candidates = sorted({ready, *(b for link in links for _, b in busy.get(link, []) if b >= ready)})
    start = next(c for c in candidates if not any(overlaps(a, b, c) for link in links for a, b in busy.get(link, [])))
    for link in links:
        if tx > 0:
            busy.setdefault(link, []).append((start, start + tx))
    return start


def _run(tmp_path: Path, name: str, *args: str) -> list[dict]:
    out = tmp_path / name
    zion_emu_cli("run", "--nproc", "3", "--quiet-report", str(EXAMPLE), "--servers", "1", "--shape", "tiny",
                 "--steps", "3", "--timeout", "60", "--out", str(out), *args, timeout_s=240)
    return [json.loads((out / f"trainer{t}.json").read_text()) for t in (0, 1)]


def _replay_losses(steps: int) -> list[list[float]]:
    """The ordered schedule in one process on the CPU: at each step every
    trainer pulls (the k-th calls are pulls: nobody has pushed yet), then the
    pushes are applied, trainer 0's first, as the server applies them."""
    shape = ps_model.SHAPES["tiny"]
    tables = ps_model.init_tables(shape, 0)
    dense = {n: p.detach().clone() for n, p in ps_model.init_dense(shape, 0).named_parameters()}
    names = ps_model.table_names(shape)
    losses: list[list[float]] = [[], []]
    for step in range(steps):
        pushes = []
        for t in (0, 1):
            m = ps_model.init_dense(shape, 0)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(dense[n])
            b = ps_model.batch(shape, 0, t, step)
            pairs = [ps_model.unique_rows(ids) for ids in b.ids]
            rows = [tables[name].index_select(0, u).requires_grad_() for name, (u, _) in zip(names, pairs)]
            loss = ps_model.loss_of(m, rows, [inv for _, inv in pairs], b.x, b.y)
            loss.backward()
            losses[t].append(loss.item())
            pushes.append(([(u, r.grad) for (u, _), r in zip(pairs, rows)],
                           {n: p.grad for n, p in m.named_parameters()}))
        for row_grads, dense_grads in pushes:
            for name, (u, g) in zip(names, row_grads):
                tables[name].index_put_((u,), g.mul(-shape.lr), accumulate=True)
            for n, g in dense_grads.items():
                dense[n].add_(g, alpha=-shape.lr)
    return losses


def _message_bytes(step: int, trainer: int) -> dict[str, tuple[float, float]]:
    """(request, reply) bytes of a pull and a push, by hand: int64 ids (8 B),
    fp32 rows and parameters (4 B)."""
    shape = ps_model.SHAPES["tiny"]
    b = ps_model.batch(shape, 0, trainer, step)
    uniq = sum(ps_model.unique_rows(ids)[0].numel() for ids in b.ids)
    params = sum(p.numel() for p in ps_model.init_dense(shape, 0).parameters())
    return {"pull": (8.0 * uniq, 4.0 * shape.dim * uniq + 4.0 * params),
            "push": (8.0 * uniq + 4.0 * shape.dim * uniq + 4.0 * params, 0.0)}


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_trainers_one_server_times_order_and_losses(tmp_path: Path) -> None:
    runs = _run(tmp_path, "zion")
    latency, bandwidth = _pcie_route(zion_emu.load_platform("zion"))

    # The server's messages in the order it served them: (call number, trainer).
    records = sorted((r for run in runs for r in run["records"]), key=lambda r: (r["seq"], r["trainer"]))
    steps = 3
    assert len(records) == 2 * (2 * steps + 1)  # a pull and a push per step, and done(), per trainer

    # Every RPC time, worked by hand: trainer t is on OAM t, under PCIe switch
    # 0, whose uplink goes to socket 0, the server. Requests share the link
    # switch 0 -> socket 0, replies socket 0 -> switch 0 (first come, first
    # served in the server's order); each takes bytes / 12 GB/s on them plus
    # 300 ns of latency.
    busy: dict[str, list] = {}
    previous_finish = 0.0
    for r in records:
        t, kind = r["trainer"], r["kind"]
        if kind != "done":
            request_bytes, reply_bytes = _message_bytes(r["seq"] // 2, t)[kind]
            assert (r["request_bytes"], r["reply_bytes"]) == (request_bytes, reply_bytes)
        up, down = [f"oam{t}>pcie0", "pcie0>socket0"], ["socket0>pcie0", f"pcie0>oam{t}"]
        leaves = _place(busy, up, r["send_s"], r["request_bytes"] / bandwidth)
        assert r["request_leaves_s"] == pytest.approx(leaves, rel=1e-12, abs=1e-15)
        assert r["arrival_s"] == pytest.approx(leaves + r["request_bytes"] / bandwidth + latency, rel=1e-12)
        # One message at a time: served when it has arrived and the last one is done.
        assert r["start_s"] == pytest.approx(max(r["arrival_s"], previous_finish), rel=1e-12)
        assert r["finish_s"] >= r["start_s"]
        previous_finish = r["finish_s"]
        back = _place(busy, down, r["finish_s"], r["reply_bytes"] / bandwidth)
        assert r["reply_leaves_s"] == pytest.approx(back, rel=1e-12)
        assert r["reply_arrival_s"] == pytest.approx(back + r["reply_bytes"] / bandwidth + latency, rel=1e-12)

    # The ordering rule: nothing arrives before it was sent, no reply before
    # its request was served; a trainer's next message leaves after the reply
    # it waited for (its pulls; pushes it does not wait for).
    for r in records:
        assert r["send_s"] <= r["request_leaves_s"] < r["arrival_s"] <= r["start_s"] <= r["finish_s"] \
            <= r["reply_leaves_s"] < r["reply_arrival_s"]
    for run in runs:
        mine = sorted(run["records"], key=lambda r: r["seq"])
        for a, b in zip(mine, mine[1:]):
            assert b["send_s"] >= a["send_s"]
            if a["kind"] == "pull":
                assert b["send_s"] >= a["reply_arrival_s"]
        assert run["end_s"] >= max(r["reply_arrival_s"] for r in mine)

    # Real values: the losses of the same schedule replayed on the CPU, bit for bit.
    assert [run["losses"] for run in runs] == _replay_losses(steps)

    # The same script with CPU trainers: the same losses.
    cpu = _run(tmp_path, "cpu", "--device", "cpu")
    assert [run["losses"] for run in cpu] == [run["losses"] for run in runs]

    # The modeled times are fixed by the schedule: a second run gives every one again.
    again = _run(tmp_path, "again")
    assert [run["records"] for run in again] == [run["records"] for run in runs]


def test_free_schedule_serves_as_messages_come() -> None:
    server = async_ps.ParameterServer(0, async_ps.Place("socket", 0), {"t": torch.zeros(4, 2)}, {}, lr=1.0,
                                      trainers=2, schedule="free", timeout_s=20)
    try:
        # Trainer 1's third call first: nothing waits for a turn.
        r = server.handle(async_ps.Request(1, 2, "pull", async_ps.Place("oam", 1), 0.0, rows={"t": torch.tensor([3])}))
        assert r.rows["t"].tolist() == [[0.0, 0.0]] and r.record.seq == 2
    finally:
        zion_emu.reset_clock()


def test_ordered_server_names_the_call_it_waits_for_instead_of_hanging() -> None:
    server = async_ps.ParameterServer(0, async_ps.Place("socket", 0), {"t": torch.zeros(4, 2)}, {}, lr=1.0,
                                      trainers=2, timeout_s=0.3)
    req = async_ps.Request(1, 0, "pull", async_ps.Place("oam", 1), 0.0, rows={"t": torch.tensor([0])})
    with pytest.raises(RuntimeError, match="trainer 1's call 0 waited 0.3 s for its turn; the server waits for "
                                           "trainer 0's call 0"):
        server.handle(req)
    with pytest.raises(KeyError, match="parameter server 0 has no table 'u'"):
        server._table("u")


def test_dense_parameters_are_balanced_by_bytes_over_the_servers() -> None:
    # Largest first to the emptiest server: a -> 0 (10, 0), b -> 1 (10, 6),
    # c -> 1 (10, 11), d -> 0 (11, 11).
    assert async_ps.dense_homes({"a": 10, "b": 6, "c": 5, "d": 1}, 2) == {"a": 0, "b": 1, "c": 1, "d": 0}
    with pytest.raises(ValueError, match="dense_homes needs at least one server, got 0"):
        async_ps.dense_homes({"a": 1}, 0)


def test_a_trainer_on_another_node_reaches_the_server_through_the_nics_and_the_switch() -> None:
    """zionex: node 1's OAM 0 -> its PCIe switch -> its RDMA NIC -> the
    top-of-rack switch -> node 0's NIC -> switch 0 -> socket 0."""
    p = zion_emu.load_platform("zionex")
    f = p.fields
    pcie, sw = f["pcie"], f["pcie"]["switches"][0]
    # Four PCIe hops, two NICs and the switch: 4 x 150 + 2 x 1000 + 600 ns = 3.2 us.
    latency = (4 * pcie["latency_ns"] + 2 * f["nic"]["latency_ns"] + f["tor_switch"]["latency_ns"]) * 1e-9
    # The slowest link: the Gen3 x16 uplink to the socket (12 GB/s), below
    # the OAM's Gen4 x16 (24 GB/s) and the 200 Gb/s NIC (25 GB/s).
    bandwidth = min(pcie["lane_bandwidth_gb_per_s"][sw["generation"]] * 1e9 * sw["oam_lanes"],
                    f["nic"]["bandwidth_gbit_per_s"] * 1e9 / 8,
                    pcie["lane_bandwidth_gb_per_s"][sw["uplink_generation"]] * 1e9 * sw["uplink_lanes"])
    assert (latency, bandwidth) == (pytest.approx(3.2e-6), 12e9)
    links = async_ps.Links(p)
    _, arrival = links.send(async_ps.Place("oam", 0, node=1), async_ps.Place("socket", 0, node=0), 1.2e6, 0.0)
    assert arrival == pytest.approx(1.2e6 / bandwidth + latency, rel=1e-12)  # 103.2 us


# -- links shared by the servers -------------------------------------------------


def _upi_route(platform: zion_emu.Platform) -> tuple[float, float]:
    """(latency s, bandwidth bytes/s) from an OAM on PCIe switch 0 to socket 2
    on zion: the PCIe route to socket 0 and one UPI hop (socket 0 -> 2, a
    direct link of the platform's UPI list), whose 20.8 GB/s is above the
    12 GB/s uplink."""
    latency, bandwidth = _pcie_route(platform)
    upi = platform.fields["upi"]
    assert [0, 2] in upi["links"]
    return latency + upi["latency_ns"] * 1e-9, min(bandwidth, upi["link_bandwidth_gb_per_s"] * 1e9)


def _shared_links(tmp_path: Path, p: zion_emu.Platform, servers: int = 2) -> list[async_ps.Links]:
    n = len(async_ps.Links(p).link_table)
    path = tmp_path / "links.bin"
    clocks = [async_ps.SharedLinkClocks(path, n, servers, s, create=s == 0, timeout_s=5) for s in range(servers)]
    return [async_ps.Links(p, c) for c in clocks]


def test_two_servers_pulls_on_a_shared_link_take_the_shared_time(tmp_path: Path) -> None:
    """Servers on sockets 0 and 2 each get a 1.2 MB request from OAM 1 at the
    same modeled time. Both routes cross OAM 1 -> switch 0 and switch 0 ->
    socket 0 (12 GB/s): the second waits for the first's last byte, so its
    last byte leaves at t + 2 b / B = 1 ms + 200 us, where alone it would
    leave at 1 ms + 100 us."""
    p = zion_emu.load_platform("zion")
    a, b = _shared_links(tmp_path, p)
    try:
        oam1 = async_ps.Place("oam", 1)
        latency0, bandwidth = _pcie_route(p)
        latency2, bandwidth2 = _upi_route(p)
        assert (latency2, bandwidth2) == (pytest.approx(370e-9), 12e9)
        nbytes, t = 1.2e6, 1e-3
        with a.shared.turn(0, ordered=True):  # server 0's first message, then server 1's
            leaves_a, arrival_a = a.send(oam1, async_ps.Place("socket", 0), nbytes, t)
        with b.shared.turn(0, ordered=True):
            leaves_b, arrival_b = b.send(oam1, async_ps.Place("socket", 2), nbytes, t)
        assert leaves_a == t and arrival_a == pytest.approx(t + nbytes / bandwidth + latency0, rel=1e-12)
        assert leaves_b == pytest.approx(t + nbytes / bandwidth, rel=1e-12)  # 1.1 ms: behind server 0's
        assert arrival_b == pytest.approx(t + 2 * nbytes / bandwidth + latency2, rel=1e-12)  # 1.2 ms + 370 ns
        # The same two requests on private clocks: each as if alone.
        alone = async_ps.Links(p)
        assert alone.send(oam1, async_ps.Place("socket", 2), nbytes, t)[0] == t
        # The shared link carried both: 2.4 MB, busy 200 us; each server counts its own 1.2 MB.
        shared_pcie = {c["link_class"]: c for c in b.by_class(400e-6, every_server=True)}
        own_pcie = {c["link_class"]: c for c in b.by_class(400e-6)}
        gen3 = shared_pcie["pcie_gen3_x16"]
        assert gen3["bytes"] == 2 * nbytes and gen3["busiest_link"] == "pcie0>socket0"
        assert gen3["busiest_utilization"] == pytest.approx(2 * nbytes / bandwidth / 400e-6, rel=1e-12)  # 50%
        assert own_pcie["pcie_gen3_x16"]["bytes"] == nbytes
    finally:
        a.close()
        b.close()


def test_a_message_fills_a_gap_between_messages_placed_before_it() -> None:
    """Switch 0 -> socket 0 (12 GB/s) busy [1.0, 1.1) ms with a 1.2 MB
    message: a 0.6 MB one (50 us) ready at 0.9 ms fits before it and leaves
    at 0.9 ms; one ready at 0.97 ms would end at 1.02 ms, inside it, so it
    waits for its end, 1.1 ms; a zero-byte one ready at 1.05 ms leaves at
    1.15 ms, after the 0.97 ms one's last byte."""
    p = zion_emu.load_platform("zion")
    links = async_ps.Links(p)
    oam, socket = async_ps.Place("oam", 0), async_ps.Place("socket", 0)
    assert links.send(oam, socket, 1.2e6, 1.0e-3)[0] == 1.0e-3
    assert links.send(async_ps.Place("oam", 1), socket, 0.6e6, 0.9e-3)[0] == 0.9e-3
    assert links.send(async_ps.Place("oam", 1), socket, 0.6e6, 0.97e-3)[0] == pytest.approx(1.1e-3, rel=1e-12)
    assert links.send(oam, socket, 0.0, 1.05e-3)[0] == pytest.approx(1.15e-3, rel=1e-12)
    gen3 = links.calendars[links.route(oam, socket).links[0]]
    # 0.9-0.95 ms, then 1.0-1.15 ms (three messages end to end: one interval)
    assert [(round(a * 1e6, 6), round(b * 1e6, 6)) for a, b in zip(gen3.starts, gen3.ends)] == \
        [(900.0, 950.0), (1000.0, 1150.0)]


def test_servers_take_turns_on_the_shared_links_in_the_ordered_schedule(tmp_path: Path) -> None:
    """Server 1's message 0 waits for server 0's message 0 (slot n * S + s),
    however the threads come; a server that never comes is named."""
    p = zion_emu.load_platform("zion")
    a, b = _shared_links(tmp_path, p)
    order: list[str] = []
    try:
        def second() -> None:
            with b.shared.turn(0, ordered=True):
                order.append("server 1")

        late = threading.Thread(target=second)
        late.start()
        late.join(0.3)
        assert late.is_alive() and order == []
        with a.shared.turn(0, ordered=True):
            order.append("server 0")
        late.join(10)
        assert order == ["server 0", "server 1"]
        b.shared.timeout_s = 0.2
        with pytest.raises(RuntimeError, match="parameter server 1: waited 0.2 s for its turn on the shared links "
                                               "\\(message 1\\); server 0 has not served its message 1"):
            with b.shared.turn(1, ordered=True):
                pass
        with b.shared.turn(1, ordered=False):  # the free schedule only takes the lock
            order.append("free")
    finally:
        a.close()
        b.close()


def test_shared_link_clocks_refuse_bad_input(tmp_path: Path) -> None:
    p = zion_emu.load_platform("zion")
    n = len(async_ps.Links(p).link_table)
    with pytest.raises(ValueError, match="server 2 of 2 servers \\(allowed: 0..1\\)"):
        async_ps.SharedLinkClocks(tmp_path / "x.bin", n, 2, 2)
    missing = async_ps.SharedLinkClocks(tmp_path / "none.bin", n, 2, 1)
    with pytest.raises(RuntimeError, match="do not exist; the first server creates them"):
        with missing.turn(0, ordered=False):
            pass
    async_ps.SharedLinkClocks(tmp_path / "small.bin", 3, 1, 0, create=True)
    with pytest.raises(ValueError, match="shared link clocks for 3 links, but platform 'zion' has"):
        async_ps.Links(p, async_ps.SharedLinkClocks(tmp_path / "small.bin", 3, 1, 0))
    with pytest.raises(ValueError, match="parameter server 2 of 2 servers"):
        async_ps.ParameterServer(2, async_ps.Place("socket", 0), {}, {}, 0.1, 1, servers=2, platform=p)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_servers_messages_queue_on_the_links_they_share(tmp_path: Path) -> None:
    """One trainer (OAM 0), servers on sockets 0 and 4: every call sends one
    message to each at the same time, and both cross OAM 0 -> switch 0.
    Replayed by hand in the servers' turn order (server 0's n-th message,
    then server 1's), each message waits for the links its route shares with
    any earlier one, of either server."""
    out = tmp_path / "two"
    zion_emu_cli("run", "--nproc", "3", "--quiet-report", str(EXAMPLE), "--servers", "2", "--shape", "tiny",
                 "--steps", "2", "--timeout", "60", "--out", str(out), timeout_s=240)
    run0 = json.loads((out / "trainer0.json").read_text())
    summary = json.loads((out / "summary.json").read_text())
    assert not (out / "trainer1.json").exists()  # ranks 1 and 2 are the servers
    p = zion_emu.load_platform("zion")
    links = async_ps.Links(p)
    trainer = async_ps.Place("oam", 0)
    servers = [async_ps.Place("socket", 0), async_ps.Place("socket", 4)]  # spread over 8 sockets
    assert [s["place"] for s in summary["server_stats"]] == ["n0.socket0", "n0.socket4"]
    records = {(r["server"], r["seq"]): r for r in run0["records"]}
    calls = max(seq for _, seq in records) + 1
    busy: dict[int, list] = {}
    shared_wait = 0
    for n in range(calls):
        for s, place in enumerate(servers):
            r = records[(s, n)]
            for src, dst, ready, leaves_key, nbytes in ((trainer, place, r["send_s"], "request_leaves_s",
                                                          r["request_bytes"]),
                                                         (place, trainer, r["finish_s"], "reply_leaves_s",
                                                          r["reply_bytes"])):
                route = links.route(src, dst)
                assert route.bandwidth_bytes_per_s == 12e9  # the Gen3 x16 uplinks on both routes
                leaves = _place(busy, list(route.links), ready, nbytes / route.bandwidth_bytes_per_s)
                shared_wait += leaves > ready
                assert r[leaves_key] == pytest.approx(leaves, rel=1e-12, abs=1e-15), (s, n, leaves_key)
    assert shared_wait > 0  # server 1's requests waited for server 0's on OAM 0 -> switch 0
