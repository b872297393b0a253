"""Asynchronous training with parameter servers, on ``torch.distributed.rpc``.

Parameter servers hold embedding tables (sharded by row: row ``r`` lives on
server ``r % S`` at local row ``r // S``) and, optionally, dense parameters
(each whole on one server, balanced by bytes: :func:`dense_homes`), in the
DDR of a CPU socket. Trainers, on OAMs (or sockets), pull rows and parameters and push gradients with no
barrier between trainers, Hogwild-style: a server applies each push as it
serves it (plain SGD, ``param -= lr * grad``; rows through
``index_put_((ids,), grad * -lr, accumulate=True)``).

Data moves for real, through TensorPipe. Each message is priced on its route
in the platform's topology (UPI, PCIe switches, RDMA NICs and the
top-of-rack switch, or the front-end NICs), and the virtual clocks of sender
and receiver stay consistent:

- a request carries its sender's clock at sending, ``send_s`` (a trainer on
  an OAM first waits for its device: the payload must be computed);
- it occupies each link of its route for ``bytes / bandwidth`` of the
  route's slowest link, from the earliest time at or after the sender is
  ready when every link of the route is free for that long, around the
  messages placed on them before it (in the order the servers serve their
  messages: a message fills a gap between earlier-placed ones when it fits,
  else waits for the link); it arrives one route latency after its last
  byte left: ``arrival_s = start + bytes / bandwidth + latency``;
- the server serves one message at a time: it starts at
  ``max(server clock, arrival_s)``, the work (gathers, updates, copies) runs
  priced on its socket (``zion_emu.socket``), and ``finish_s`` is the
  server's clock after it;
- the reply leaves at ``finish_s`` on the reverse route, priced the same way,
  and the trainer's clock waits until ``reply_arrival_s``. So a reply never
  arrives before its request was served, nor a request before it was sent.

**Shared links.** A link is one resource for every server of a run: the
servers given one ``links_file`` (:class:`SharedLinkClocks`, a file each
appends its messages' intervals to and reads the others' from) keep one
calendar of busy intervals per link, so messages of different servers
crossing the same link (a trainer's PCIe link, a switch's uplink, a UPI
link) take turns on it, as each server's own messages do. Two messages of
``b`` bytes that reach a link of bandwidth ``B`` together take ``b / B`` and
``2 b / B``: the second waits for the first's last byte (one message at a
time per link, as ASTRA-sim's analytical backend queues them; not max-min
fair share, which would change a message already answered when a later one
arrives). Under the ordered schedule the servers take turns: every
server serves the same calls in the same order, and server ``s``'s ``n``-th
message is the ``n * S + s``-th on the shared clocks, so the modeled times
stay fixed by the script. Without a ``links_file`` a server keeps link
clocks of its own (one server alone is the same either way). Message size is
the bytes of the tensors it carries (ids, rows, gradients, parameters);
headers are not counted.

**Schedules.** Trainers call each server in turn: a server serves its
messages in the order of ``(call number, trainer)``, the trainers' k-th
calls one after another by trainer, then their (k+1)-th ("ordered", the
default). The values every trainer reads, the losses and every modeled time
are then fixed by the script alone, equal from run to run and to the same
script with CPU trainers. ``schedule="free"`` serves messages as they come
(Hogwild proper): faster on the host, but the order, and so the values and
modeled times, depend on the run.
"""

from __future__ import annotations

import bisect
import fcntl
import os
import struct
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

import torch

from zion_emu import _C
from zion_emu.platform import Platform, current_platform
from zion_emu.sockets import socket as socket_scope

SCHEDULES = ("ordered", "free")
PLACE_KINDS = ("oam", "socket")


@dataclass(frozen=True)
class Place:
    """Where a trainer or server runs: an OAM or a CPU socket of a node."""

    kind: str  # "oam" or "socket"
    index: int
    node: int = 0

    def check(self, platform: Platform) -> "Place":
        if self.kind not in PLACE_KINDS:
            raise ValueError(f"a place is one of {', '.join(PLACE_KINDS)}, got '{self.kind}'")
        count = platform.devices_per_node if self.kind == "oam" else platform.native.sockets_per_node
        if not 0 <= self.index < count:
            raise ValueError(f"{self.kind} {self.index} does not exist on platform '{platform.name}' "
                             f"({count} per node: 0..{count - 1})")
        if not 0 <= self.node < platform.nodes:
            raise ValueError(f"node {self.node} does not exist on platform '{platform.name}' "
                             f"({platform.nodes} nodes: 0..{platform.nodes - 1})")
        return self

    def __str__(self) -> str:
        return f"n{self.node}.{self.kind}{self.index}"


@dataclass(frozen=True)
class Route:
    latency_s: float
    bandwidth_bytes_per_s: float
    links: tuple[int, ...]


class Calendar:
    """When one link is busy: disjoint ``[start, end)`` intervals, in order."""

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.ends: list[float] = []

    def conflict(self, t: float, tx: float) -> float | None:
        """The end of the interval that ``[t, t + tx)`` would overlap (a
        zero-length message: that ``t`` falls inside), or None if it fits."""
        j = bisect.bisect_right(self.ends, t)  # the first interval ending after t
        if j < len(self.starts) and (self.starts[j] < t + tx or (tx == 0 and self.starts[j] <= t)):
            return self.ends[j]
        return None

    def occupy(self, t: float, tx: float) -> None:
        if tx <= 0:
            return
        j = bisect.bisect_left(self.starts, t)
        self.starts.insert(j, t)
        self.ends.insert(j, t + tx)
        if j + 1 < len(self.starts) and self.starts[j + 1] == self.ends[j]:  # touches the next: one interval
            self.ends[j] = self.ends.pop(j + 1)
            self.starts.pop(j + 1)
        if j > 0 and self.ends[j - 1] == self.starts[j]:
            self.ends[j - 1] = self.ends.pop(j)
            self.starts.pop(j)


def earliest_start(calendars: Sequence[Calendar], ready_s: float, tx_s: float) -> float:
    """The earliest time at or after ``ready_s`` when every calendar is free
    for ``tx_s`` (a message fills a gap between messages placed before it)."""
    t = ready_s
    moved = True
    while moved:
        moved = False
        for c in calendars:
            end = c.conflict(t, tx_s)
            if end is not None:
                t, moved = end, True
    return t


class SharedLinkClocks:
    """The busy intervals of every link, shared by the parameter servers of
    a run through a file: a header ``[turn, records]`` and then one record
    ``(link, start, end, bytes)`` per link a message occupied, all float64.
    Each server keeps the calendars in memory and, on its turn, reads the
    records the others appended since (:meth:`turn`). ``busy_s`` and
    ``bytes`` of :meth:`totals` sum every server's messages.

    The first server creates the file (``create=True``) before any trainer
    can send; the others open it on first use."""

    _HEADER, _RECORD = 16, 32

    def __init__(self, path: str | os.PathLike, links: int, servers: int, server: int, create: bool = False,
                 timeout_s: float = 120.0) -> None:
        if servers < 1 or not 0 <= server < servers:
            raise ValueError(f"shared link clocks: server {server} of {servers} servers (allowed: 0..{servers - 1})")
        self.path, self.links, self.servers, self.server = os.fspath(path), links, servers, server
        self.timeout_s = timeout_s
        self.calendars = [Calendar() for _ in range(links)]
        self.busy_s = [0.0] * links
        self.bytes = [0.0] * links
        self._file: int | None = None
        self._read = 0  # records read so far
        self._mine: list[tuple[float, float, float, float]] = []  # appended at the end of this turn
        if create:
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(struct.pack("<2d", 0.0, 0.0))  # turn 0, no records
            os.replace(tmp, self.path)  # whole, or not there at all

    def _fd(self) -> int:
        if self._file is None:
            try:
                self._file = os.open(self.path, os.O_RDWR)
            except FileNotFoundError:
                raise RuntimeError(f"parameter server {self.server}: the shared link clocks {self.path} do not exist; "
                                   "the first server creates them (create=True) before rpc.init_rpc") from None
        return self._file

    def _header(self) -> tuple[float, int]:
        turn, records = struct.unpack("<2d", os.pread(self._fd(), self._HEADER, 0))
        return turn, int(records)

    def _sync(self) -> None:
        """Reads the records appended since the last turn into the calendars."""
        _, records = self._header()
        if records > self._read:
            raw = os.pread(self._fd(), (records - self._read) * self._RECORD, self._HEADER + self._read * self._RECORD)
            for link, start, end, nbytes in struct.iter_unpack("<4d", raw):
                self._apply(int(link), start, end - start, nbytes)
            self._read = records

    def _apply(self, link: int, start: float, tx: float, nbytes: float) -> None:
        if not 0 <= link < self.links:
            raise RuntimeError(f"shared link clocks {self.path}: a record of link {link}, but the platform has "
                               f"{self.links} links (a file of another platform?)")
        self.calendars[link].occupy(start, tx)
        self.busy_s[link] += tx
        self.bytes[link] += nbytes

    @contextmanager
    def turn(self, served: int, ordered: bool) -> Iterator[None]:
        """The shared clocks, for this server's message number ``served``
        (0, 1, ...): under the ordered schedule it first waits until the
        other servers have had theirs (slot ``served * S + server``); under
        the free one, only until no other server is using them."""
        fd = self._fd()
        slot = served * self.servers + self.server
        deadline = time.monotonic() + self.timeout_s
        pause = 20e-6
        while ordered and (turn := self._header()[0]) != slot:
            if turn > slot:
                raise RuntimeError(f"parameter server {self.server}: its message {served} came after the shared link "
                                   f"clocks moved past its turn (every server must serve the same calls)")
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"parameter server {self.server}: waited {self.timeout_s:g} s for its turn on the shared links "
                    f"(message {served}); server {int(turn) % self.servers} has not served its message "
                    f"{int(turn) // self.servers}")
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)  # a turn usually comes within one message's service
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            self._sync()
            yield
        finally:
            turn, records = self._header()
            if self._mine:
                os.pwrite(fd, b"".join(struct.pack("<4d", *r) for r in self._mine),
                          self._HEADER + records * self._RECORD)
            os.pwrite(fd, struct.pack("<2d", turn + 1, float(records + len(self._mine))), 0)
            self._read = records + len(self._mine)
            self._mine.clear()
            fcntl.flock(fd, fcntl.LOCK_UN)

    def occupy(self, link: int, start_s: float, tx_s: float, nbytes: float) -> None:
        """Marks ``link`` busy for ``[start_s, start_s + tx_s)``; the others see it after this turn."""
        self._apply(link, start_s, tx_s, nbytes)
        self._mine.append((float(link), start_s, start_s + tx_s, nbytes))

    def totals(self) -> tuple[list[float], list[float]]:
        """(busy seconds, bytes) per link over every server's messages."""
        if self._file is not None or os.path.exists(self.path):
            fcntl.flock(self._fd(), fcntl.LOCK_EX)
            try:
                self._sync()
            finally:
                fcntl.flock(self._fd(), fcntl.LOCK_UN)
        return list(self.busy_s), list(self.bytes)

    def close(self) -> None:
        if self._file is not None:
            os.close(self._file)
            self._file = None


def links_file_for_run() -> str:
    """Where the servers of this run share their link clocks: the run's
    folder under ``zion-emu run``, else the temporary folder, named by the
    rendezvous address (unique to a torchrun job on a host)."""
    run_dir = os.environ.get("ZION_RUN_DIR")
    if run_dir:
        return os.path.join(run_dir, "ps_links.bin")
    import tempfile

    where = f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '0')}"
    return os.path.join(tempfile.gettempdir(), f"zion-ps-links-{where}.bin")


class Links:
    """The topology's links as resources for the messages one server sends
    and receives: when each link is busy (a :class:`Calendar` per link), and
    what it carried. With ``shared`` clocks the calendars hold every
    server's messages (:class:`SharedLinkClocks`); ``busy_s`` and ``bytes``
    stay this server's own."""

    def __init__(self, platform: Platform, shared: SharedLinkClocks | None = None) -> None:
        from zion_emu import sim

        self.platform = platform
        self.topology = sim.build_topology(platform.native)
        self.link_table = self.topology.links
        n = len(self.link_table)
        if shared is not None and shared.links != n:
            raise ValueError(f"shared link clocks for {shared.links} links, but platform '{platform.name}' has {n}")
        self.shared = shared
        self.calendars = shared.calendars if shared is not None else [Calendar() for _ in range(n)]
        self.busy_s = [0.0] * n
        self.bytes = [0.0] * n
        self._routes: dict[tuple[Place, Place], Route] = {}

    def close(self) -> None:
        """Closes the shared clocks' file, if any."""
        if self.shared is not None:
            self.shared.close()

    def route(self, src: Place, dst: Place) -> Route:
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            a = self.topology.find(src.kind, src.node, src.index)
            b = self.topology.find(dst.kind, dst.node, dst.index)
            d = self.topology.route(a, b)
            links = tuple(sorted({link for path in d["paths"] for link in path}))
            r = Route(d["latency_s"], d["bandwidth_bytes_per_s"], links)
            self._routes[key] = r
        return r

    def send(self, src: Place, dst: Place, nbytes: float, ready_s: float) -> tuple[float, float]:
        """(first byte leaves, message arrives) for ``nbytes`` sent when ready
        at ``ready_s``: it leaves at the earliest time every link of the route
        is free for the whole transfer, and marks them busy meanwhile."""
        if src == dst:
            return ready_s, ready_s
        r = self.route(src, dst)
        tx = nbytes / r.bandwidth_bytes_per_s
        start = earliest_start([self.calendars[link] for link in r.links], ready_s, tx)
        for link in r.links:
            self.busy_s[link] += tx
            self.bytes[link] += nbytes
            if self.shared is not None:
                self.shared.occupy(link, start, tx, nbytes)
            else:
                self.calendars[link].occupy(start, tx)
        return start, start + tx + r.latency_s

    def by_class(self, elapsed_s: float, every_server: bool = False) -> list[dict[str, Any]]:
        """Per link class: bytes, busy seconds summed over links, and the
        busiest link's name and utilization over ``elapsed_s``; this
        server's messages, or with ``every_server`` (shared clocks) those
        of every server."""
        busy, nbytes = self.shared.totals() if every_server and self.shared is not None else (self.busy_s, self.bytes)
        out: dict[str, dict[str, Any]] = {}
        for i, link in enumerate(self.link_table):
            c = out.setdefault(link["link_class"], {"link_class": link["link_class"], "bytes": 0.0, "busy_s": 0.0,
                                                     "busiest_link": "", "busiest_utilization": 0.0})
            c["bytes"] += nbytes[i]
            c["busy_s"] += busy[i]
            util = busy[i] / elapsed_s if elapsed_s > 0 else 0.0
            if busy[i] > 0 and util >= c["busiest_utilization"]:
                c["busiest_utilization"] = util
                c["busiest_link"] = f"{link['src_name']}>{link['dst_name']}"
        return [c for c in out.values() if c["bytes"] > 0]


def _nbytes(tensors: Sequence[torch.Tensor]) -> float:
    return float(sum(t.numel() * t.element_size() for t in tensors))


@dataclass
class Request:
    trainer: int
    seq: int  # this trainer's call number at this server
    kind: str  # "pull", "push" or "done"
    src: Place
    send_s: float
    rows: dict[str, torch.Tensor] = field(default_factory=dict)  # table -> local ids
    grads: dict[str, torch.Tensor] = field(default_factory=dict)  # table -> gradient rows (push)
    dense: dict[str, torch.Tensor | None] = field(default_factory=dict)  # name -> gradient (push) or None (pull)
    summary: dict[str, Any] = field(default_factory=dict)  # what a trainer reports with done()

    def nbytes(self) -> float:
        return _nbytes([*self.rows.values(), *self.grads.values(), *(g for g in self.dense.values() if g is not None)])


@dataclass
class RpcRecord:
    """One message and its reply, in modeled seconds."""

    trainer: int
    server: int
    seq: int
    kind: str
    request_bytes: float
    reply_bytes: float
    send_s: float  # the trainer was ready to send
    request_leaves_s: float  # its first byte left (links free)
    arrival_s: float
    start_s: float  # the server started serving it
    finish_s: float
    reply_leaves_s: float
    reply_arrival_s: float


@dataclass
class Reply:
    rows: dict[str, torch.Tensor]
    dense: dict[str, torch.Tensor]
    record: RpcRecord


class ParameterServer:
    """One parameter server: its shard of each table and its dense
    parameters, on socket ``place.index`` of node ``place.node``.

    ``links_file``: the file where the run's ``servers`` servers share their
    link clocks (:class:`SharedLinkClocks`; server 0 creates it, so
    construct it before ``rpc.init_rpc``); None keeps clocks of its own."""

    def __init__(self, index: int, place: Place, tables: dict[str, torch.Tensor], dense: dict[str, torch.Tensor],
                 lr: float, trainers: int, schedule: str = "ordered", timeout_s: float = 120.0,
                 platform: Platform | None = None, servers: int = 1, links_file: str | os.PathLike | None = None
                 ) -> None:
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {', '.join(SCHEDULES)}, got '{schedule}'")
        if place.kind != "socket":
            raise ValueError(f"a parameter server runs on a socket, got {place}")
        if trainers < 1:
            raise ValueError(f"a parameter server needs at least one trainer, got {trainers}")
        self.platform = platform or current_platform()
        self.index, self.place, self.lr, self.trainers = index, place.check(self.platform), lr, trainers
        self.schedule, self.timeout_s = schedule, timeout_s
        if not 0 <= index < servers:
            raise ValueError(f"parameter server {index} of {servers} servers (allowed: 0..{servers - 1})")
        shared = None
        if links_file is not None:
            from zion_emu import sim

            count = len(sim.build_topology(self.platform.native).links)
            shared = SharedLinkClocks(links_file, count, servers, index, create=index == 0, timeout_s=timeout_s)
        self.links = Links(self.platform, shared)
        with socket_scope(place.index):  # the shard lives in this socket's DDR
            self.tables = {k: v.detach().clone() for k, v in tables.items()}
            self.dense = {k: v.detach().clone() for k, v in dense.items()}
        self._cv = threading.Condition()
        self._turn = (0, 0)  # (call number, trainer) served next, ordered schedule
        self._departed: set[int] = set()
        self.busy_s = 0.0
        self.served = 0
        self.first_arrival_s: float | None = None
        self.last_finish_s = 0.0
        self.trainer_summaries: dict[int, dict[str, Any]] = {}

    # -- the schedule ------------------------------------------------------
    def _advance(self) -> None:
        seq, t = self._turn
        for _ in range(self.trainers):
            t += 1
            if t == self.trainers:
                t, seq = 0, seq + 1
            if t not in self._departed:
                break
        self._turn = (seq, t)

    def _wait_turn(self, req: Request) -> None:
        deadline = time.monotonic() + self.timeout_s
        while self.schedule == "ordered" and self._turn != (req.seq, req.trainer):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(
                    f"parameter server {self.index}: trainer {req.trainer}'s call {req.seq} waited "
                    f"{self.timeout_s:g} s for its turn; the server waits for trainer {self._turn[1]}'s call "
                    f"{self._turn[0]} (every trainer must call every server the same way until it calls done())")
            self._cv.wait(left)

    def done(self) -> bool:
        with self._cv:
            return len(self._departed) == self.trainers

    def wait_done(self) -> None:
        with self._cv:
            if not self._cv.wait_for(lambda: len(self._departed) == self.trainers, timeout=self.timeout_s * 10):
                missing = sorted(set(range(self.trainers)) - self._departed)
                raise RuntimeError(f"parameter server {self.index}: trainers {missing} did not call done() in time")

    # -- serving -----------------------------------------------------------
    def handle(self, req: Request) -> Reply:
        with self._cv:
            self._wait_turn(req)
            try:
                return self._serve(req)
            finally:
                if req.kind == "done":
                    self._departed.add(req.trainer)
                if self.schedule == "ordered" and len(self._departed) < self.trainers:
                    self._advance()  # to the next trainer still running
                self._cv.notify_all()

    def _serve(self, req: Request) -> Reply:
        if self.links.shared is None:
            return self._serve_now(req)
        with self.links.shared.turn(self.served, ordered=self.schedule == "ordered"):
            return self._serve_now(req)

    def _serve_now(self, req: Request) -> Reply:
        leaves, arrival = self.links.send(req.src, self.place, req.nbytes(), req.send_s)
        _C.timeline.wait_until(arrival)
        start = _C.device.host_time()
        rows: dict[str, torch.Tensor] = {}
        dense: dict[str, torch.Tensor] = {}
        with torch.no_grad(), socket_scope(self.place.index):
            if req.kind == "pull":
                for name, ids in req.rows.items():
                    rows[name] = self._table(name).index_select(0, ids)
                for name in req.dense:
                    dense[name] = self._param(name).clone()
            elif req.kind == "push":
                for name, ids in req.rows.items():
                    # index_put_(accumulate=True)'s kernel, called directly: the
                    # socket prices each kernel, and this one as a
                    # read-modify-write of the rows it lands on (the public
                    # index_put_ would be priced as a pass over the table).
                    torch.ops.aten._index_put_impl_(self._table(name), (ids,), req.grads[name].mul(-self.lr), True)
                for name, grad in req.dense.items():
                    self._param(name).add_(grad, alpha=-self.lr)
            elif req.kind == "done":
                self.trainer_summaries[req.trainer] = dict(req.summary)
            else:
                raise ValueError(f"parameter server {self.index}: unknown request '{req.kind}' "
                                 f"(allowed: pull, push, done)")
        finish = _C.device.host_time()
        reply_bytes = _nbytes([*rows.values(), *dense.values()])
        reply_leaves, reply_arrival = self.links.send(self.place, req.src, reply_bytes, finish)
        self.busy_s += finish - start
        self.served += 1
        self.first_arrival_s = arrival if self.first_arrival_s is None else min(self.first_arrival_s, arrival)
        self.last_finish_s = max(self.last_finish_s, finish)
        record = RpcRecord(req.trainer, self.index, req.seq, req.kind, req.nbytes(), reply_bytes, req.send_s, leaves,
                           arrival, start, finish, reply_leaves, reply_arrival)
        return Reply(rows, dense, record)

    def _table(self, name: str) -> torch.Tensor:
        if name not in self.tables:
            raise KeyError(f"parameter server {self.index} has no table '{name}' (it has {sorted(self.tables)})")
        return self.tables[name]

    def _param(self, name: str) -> torch.Tensor:
        if name not in self.dense:
            raise KeyError(f"parameter server {self.index} has no dense parameter '{name}' "
                           f"(it has {sorted(self.dense)})")
        return self.dense[name]

    def stats(self) -> dict[str, Any]:
        """What this server did, in modeled seconds: served messages, busy
        time and utilization, and its links' traffic by class."""
        start = self.first_arrival_s or 0.0
        elapsed = self.last_finish_s - start
        return {"server": self.index, "place": str(self.place), "served": self.served, "busy_s": self.busy_s,
                "elapsed_s": elapsed, "utilization": self.busy_s / elapsed if elapsed > 0 else 0.0,
                "links": self.links.by_class(elapsed), "trainers": self.trainer_summaries,
                **({"shared_links": self.links.by_class(elapsed, every_server=True)}
                   if self.links.shared is not None else {})}


# The server of this process, for the functions RPC runs on it.
_server: ParameterServer | None = None


def _handle(req: Request) -> Reply:
    if _server is None:
        raise RuntimeError("this RPC worker is not a parameter server (start one with async_ps.serve)")
    return _server.handle(req)


def _stats() -> dict[str, Any]:
    if _server is None:
        raise RuntimeError("this RPC worker is not a parameter server")
    _server.wait_done()
    return _server.stats()


def install(server: ParameterServer) -> None:
    """Makes ``server`` the one this process's RPC worker serves; call it
    before ``rpc.init_rpc``, so that no trainer's message finds none."""
    global _server
    _server = server


def serve() -> dict[str, Any]:
    """Serves the trainers' messages (RPC's threads call in) until every
    trainer has called :meth:`Trainer.done`; returns :meth:`ParameterServer.stats`."""
    if _server is None:
        raise RuntimeError("no parameter server installed in this process (async_ps.install)")
    _server.wait_done()
    return _server.stats()


def server_stats(server_name: str) -> dict[str, Any]:
    """The stats of the parameter server running as RPC worker ``server_name``."""
    import torch.distributed.rpc as rpc

    return rpc.rpc_sync(server_name, _stats)


class _Pending:
    """Replies of one call to several servers."""

    def __init__(self, trainer: "Trainer", futures: list[Any]) -> None:
        self.trainer, self.futures, self.replies = trainer, futures, None

    def wait(self) -> list[Reply]:
        if self.replies is None:
            self.replies = [f.wait() for f in self.futures]
            self.trainer.records.extend(r.record for r in self.replies)
            _C.timeline.wait_until(max(r.record.reply_arrival_s for r in self.replies))
        return self.replies


class Trainer:
    """The trainer side: pulls rows and parameters from the servers (RPC
    workers ``servers``, in order: server ``s`` holds rows ``r % S == s``)
    and pushes gradients. ``dense_homes`` says which server holds each dense
    parameter (:func:`dense_homes`). Tensors it returns live on ``device``."""

    def __init__(self, index: int, place: Place, servers: Sequence[str], device: torch.device | str,
                 dense_homes: dict[str, int] | None = None, timeout_s: float = 120.0) -> None:
        if not servers:
            raise ValueError("a trainer needs at least one parameter server")
        self.index, self.place, self.servers = index, place, list(servers)
        self.device = torch.device(device)
        self.timeout_s = timeout_s
        self.dense_server = dict(dense_homes or {})
        for name, home in self.dense_server.items():
            if not 0 <= home < len(self.servers):
                raise ValueError(f"trainer {index}: dense parameter '{name}' on server {home}, but the servers "
                                 f"are 0..{len(self.servers) - 1}")
        self._seq = [0] * len(self.servers)
        self._pushes: list[_Pending] = []
        self.records: list[RpcRecord] = []

    # -- the trainer's clock and payloads ----------------------------------
    def ready_s(self) -> float:
        """The trainer's clock once its device has computed what it sends."""
        if self.device.type == "zion":
            torch.zion.synchronize(self.device)
        return _C.device.host_time()

    def _host(self, t: torch.Tensor) -> torch.Tensor:
        """A CPU copy of ``t`` to send: on zion its bytes are read in place,
        the route to the server prices their move."""
        t = t.detach()
        if t.device.type == "zion":
            t = _C.device.cpu_alias(t)
        return t.contiguous().clone()

    def _place_on_device(self, cpu: torch.Tensor) -> torch.Tensor:
        """``cpu``'s values in a tensor on the trainer's device, written where
        the message landed (the route priced the move)."""
        if self.device.type != "zion":
            return cpu.to(self.device)
        out = torch.empty(cpu.shape, dtype=cpu.dtype, device=self.device)
        _C.device.cpu_alias(out).copy_(cpu)
        return out

    def _write(self, target: torch.Tensor, cpu: torch.Tensor) -> None:
        if target.shape != cpu.shape:
            raise ValueError(f"trainer {self.index}: a pulled parameter of shape {tuple(cpu.shape)} does not fit "
                             f"the tensor of shape {tuple(target.shape)} given for it")
        with torch.no_grad():
            (_C.device.cpu_alias(target) if target.device.type == "zion" else target).copy_(cpu)

    def _call(self, server: int, kind: str, send_s: float, **parts: Any) -> Any:
        import torch.distributed.rpc as rpc

        req = Request(self.index, self._seq[server], kind, self.place, send_s, **parts)
        self._seq[server] += 1
        return rpc.rpc_async(self.servers[server], _handle, args=(req,), timeout=self.timeout_s)

    def _shard(self, ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per server: (positions in ``ids``, local row ids)."""
        ids = self._host(ids).to(torch.int64)
        n = len(self.servers)
        out = []
        for s in range(n):
            pos = (ids % n == s).nonzero().flatten()
            out.append((pos, ids.index_select(0, pos) // n))
        return out

    # -- the calls -----------------------------------------------------------
    def pull(self, rows: dict[str, torch.Tensor] | None = None,
             dense: Sequence[str] | dict[str, torch.Tensor] = ()
             ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Rows ``ids`` of each table (1-D global row ids; returns
        ``len(ids) x dim``) and the dense parameters named, from every server,
        one message each; waits for the replies. ``dense`` as
        ``{name: tensor}`` writes each parameter into that tensor (of the
        trainer's device, in place, where the message lands)."""
        rows = rows or {}
        send_s = self.ready_s()
        shards = {name: self._shard(ids) for name, ids in rows.items()}
        futures = []
        for s in range(len(self.servers)):
            part_rows = {name: shards[name][s][1] for name in rows}
            part_dense = {name: None for name in dense if self._dense_home(name) == s}
            futures.append(self._call(s, "pull", send_s, rows=part_rows, dense=part_dense))
        replies = _Pending(self, futures).wait()
        out_rows = {}
        for name, ids in rows.items():
            first = replies[0].rows[name]
            full = torch.empty((ids.numel(), *first.shape[1:]), dtype=first.dtype)
            for s, reply in enumerate(replies):
                full.index_copy_(0, shards[name][s][0], reply.rows[name])
            out_rows[name] = self._place_on_device(full)
        out_dense = {}
        for r in replies:
            for name, value in r.dense.items():
                if isinstance(dense, dict):
                    self._write(dense[name], value)
                    out_dense[name] = dense[name]
                else:
                    out_dense[name] = self._place_on_device(value)
        return out_rows, out_dense

    def push(self, rows: dict[str, tuple[torch.Tensor, torch.Tensor]] | None = None,
             dense: dict[str, torch.Tensor] | None = None) -> _Pending:
        """Gradients of table rows (``{table: (ids, grads)}``, ids as given
        to :meth:`pull`) and of dense parameters, one message per server.
        Returns at once (the trainer goes on computing, as in Hogwild);
        :meth:`done` waits for every push; ``.wait()`` waits for this one."""
        rows, dense = rows or {}, dense or {}
        send_s = self.ready_s()
        shards = {name: self._shard(ids) for name, (ids, _) in rows.items()}
        grads = {name: self._host(g) for name, (_, g) in rows.items()}
        futures = []
        for s in range(len(self.servers)):
            part_rows = {name: shards[name][s][1] for name in rows}
            part_grads = {name: grads[name].index_select(0, shards[name][s][0]) for name in rows}
            part_dense = {name: self._host(g) for name, g in dense.items() if self._dense_home(name) == s}
            futures.append(self._call(s, "push", send_s, rows=part_rows, grads=part_grads, dense=part_dense))
        pending = _Pending(self, futures)
        self._pushes.append(pending)
        return pending

    def done(self, summary: dict[str, Any] | None = None) -> None:
        """Waits for every push, then tells every server this trainer is
        finished (the ordered schedule then skips it); ``summary`` goes to
        the servers' stats."""
        for p in self._pushes:
            p.wait()
        self._pushes.clear()
        send_s = self.ready_s()
        futures = [self._call(s, "done", send_s, summary=summary or {}) for s in range(len(self.servers))]
        _Pending(self, futures).wait()

    def _dense_home(self, name: str) -> int:
        if name not in self.dense_server:
            raise KeyError(f"trainer {self.index}: '{name}' is not a dense parameter on the servers "
                           f"(they hold {sorted(self.dense_server)})")
        return self.dense_server[name]

    def records_as_dicts(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self.records]


def dense_homes(sizes: dict[str, int], servers: int) -> dict[str, int]:
    """A server for each dense parameter (``{name: bytes}``), balanced by
    bytes: largest first, each to the server holding the fewest bytes so far
    (ties to the lower index)."""
    if servers < 1:
        raise ValueError(f"dense_homes needs at least one server, got {servers}")
    held = [0] * servers
    homes = {}
    for name in sorted(sizes, key=lambda n: (-sizes[n], n)):
        home = min(range(servers), key=lambda s: (held[s], s))
        homes[name] = home
        held[home] += sizes[name]
    return homes


def row_shard(table: torch.Tensor, server: int, servers: int) -> torch.Tensor:
    """Server ``server``'s rows of ``table``: global rows ``r % servers == server``."""
    return table[server::servers]
