"""``--html``: the run and sweep reports as one self-contained page.

The numbers behind the charts (each iteration's breakdown, busy fractions
per time bin) are checked against closed forms worked out here. The pages
are opened in headless Chromium (Debian's ``chromium`` package; ``make
test`` installs it as root) through the DevTools protocol over a pipe: the
page must log no console error, throw no exception and request nothing from
the network, and each chart must have loaded and drawn something, checked on
a screenshot of the chart alone. A page built to break every rule shows that
the checks catch each.
"""

from __future__ import annotations

import base64
import fcntl
import io
import json
import os
import re
import select
import shutil
import subprocess
import textwrap
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest
from PIL import Image

from processes import child_env, run_python, started, zion_emu_cli
from zion_emu import report as rep
from zion_emu import report_html
from zion_emu._format import format_time
from zion_emu.breakdown import COMMUNICATION, COMPUTE, COPY, Breakdown, breakdown

CHROMIUM = "chromium"
MISSING = (f"headless Chromium ({CHROMIUM!r} on PATH) checks the HTML report in a browser: install Debian's "
           f"'chromium' package (apt-get install -y chromium; `make test` installs it as root)")


# -- the numbers behind the charts ---------------------------------------------


def spans(*rows: tuple[int, int, float, float, int]) -> dict[str, np.ndarray]:
    """(device, activity, start, end, link_classes) rows as the native timeline's columns."""
    device, activity, start, end, links = (np.array(c) for c in zip(*rows))
    return {"device": device, "activity": activity, "start": start.astype(float), "end": end.astype(float),
            "stream": np.zeros(len(rows), dtype=int), "label": np.full(len(rows), -1), "link_classes": links}


def device(d: int, busy: dict[str, float] | None = None) -> rep.DeviceSnapshot:
    return rep.DeviceSnapshot(device=d, busy_s=sum((busy or {}).values()), busy_by_activity_s=busy or {},
                              flops=0.0, bytes=0.0, copy_bytes=0.0, ops=1, guessed_ops=0, peak_hbm_bytes=1 << 20,
                              hbm_capacity_bytes=32 << 30)


def snapshot(devices: list[int], sp: dict[str, np.ndarray] | None, steps: list[float], wall: float,
             links: list[rep.LinkCounters] | None = None, labels: dict[str, tuple[float, int]] | None = None,
             busy: dict[str, float] | None = None) -> rep.RankSnapshot:
    return rep.RankSnapshot(rank=0, platform="zion", wall_s=wall, oam_tracks=8,
                            devices=[device(d, busy) for d in devices],
                            sockets=[], labels=labels or {}, links=links or [], guessed_ops={}, dropped_spans=0,
                            iterations=steps, samples_per_iteration=None, spans=sp)


# zion:0: compute [0, 2) under a copy [1, 3); compute [3.5, 4.5) across the step at 4; a collective [5, 7)
# half under compute [6, 7.5). zion:1: compute [0, 8). Steps end at 4 and 8; the run at 10.
TWO_DEVICES = spans((0, COMPUTE, 0.0, 2.0, 0), (0, COPY, 1.0, 3.0, 0b01), (0, COMPUTE, 3.5, 4.5, 0),
                    (0, COMMUNICATION, 5.0, 7.0, 0b10), (0, COMPUTE, 6.0, 7.5, 0), (1, COMPUTE, 0.0, 8.0, 0))


def test_each_iterations_breakdown_is_the_mean_over_devices_of_its_window_and_they_add_up_to_the_run():
    snap = snapshot([0, 1], TWO_DEVICES, steps=[4.0, 8.0], wall=10.0)
    got = report_html.iteration_breakdowns([snap], 10.0)
    # [0, 4): zion:0 computes [0, 2) and [3.5, 4) = 2.5, its copy is exposed over [2, 3) = 1, idle [3, 3.5) = 0.5;
    #         zion:1 computes all 4. Means: compute 3.25, copies 0.5, host 0.25.
    # [4, 8): zion:0 computes [4, 4.5) and [6, 7.5) = 2, the collective is exposed over [5, 6) = 1 and overlapped
    #         over [6, 7) = 1, idle [4.5, 5) and [7.5, 8) = 1; zion:1 computes 4. Means: 3, 0.5, 0.5, host 0.5.
    # [8, 10): both idle.
    assert [label for label, _ in got] == ["1", "2", "after"]
    assert got[0][1] == pytest.approx(Breakdown(3.25, 0.0, 0.0, 0.5, 0.25))
    assert got[1][1] == pytest.approx(Breakdown(3.0, 0.5, 0.5, 0.0, 0.5))
    assert got[2][1] == pytest.approx(Breakdown(0.0, 0.0, 0.0, 0.0, 2.0))
    run = Breakdown.mean([breakdown(TWO_DEVICES, d, 10.0) for d in (0, 1)])
    for part in (f.name for f in fields(Breakdown)):
        assert sum(getattr(b, part) for _, b in got) == pytest.approx(getattr(run, part))


def test_no_iteration_breakdown_without_steps_or_with_dropped_spans_and_no_tail_when_the_run_ends_at_a_step():
    assert report_html.iteration_breakdowns([snapshot([0, 1], TWO_DEVICES, [], 10.0)], 10.0) == []
    dropped = snapshot([0, 1], TWO_DEVICES, [4.0, 8.0], 10.0)
    dropped.dropped_spans = 3
    assert report_html.iteration_breakdowns([dropped], 10.0) == []
    assert [k for k, _ in report_html.iteration_breakdowns([snapshot([0, 1], TWO_DEVICES, [4.0, 8.0], 8.0)], 8.0)] \
        == ["1", "2"]


def test_busy_fractions_per_time_bin():
    links = [rep.LinkCounters("pcie", 1e9, 4, 1.0, 1.0, 1), rep.LinkCounters("fabric", 1e9, 8, 1.0, 1.0, 1)]
    busy = report_html.busy_over_time([snapshot([0, 1], TWO_DEVICES, [4.0, 8.0], 10.0, links)], 10.0, bins=5)
    assert busy is not None and list(busy.edges) == [0, 2, 4, 6, 8, 10]
    # zion:0 is busy over [0, 3), [3.5, 4.5), [5, 7.5): per 2 s bin 2, 1 + 0.5, 0.5 + 1, 1.5, 0 seconds.
    assert busy.tracks["zion:0"] == pytest.approx([1.0, 0.75, 0.75, 0.75, 0.0])
    assert busy.tracks["zion:1"] == pytest.approx([1.0, 1.0, 1.0, 1.0, 0.0])
    # Compute: zion:0's [0, 2), [3.5, 4.5), [6, 7.5) cover 2, 0.5, 0.5, 1.5, 0 s of the bins, zion:1's 2, 2, 2, 2, 0.
    assert busy.by_activity["compute"] == pytest.approx([(1.0 + 1) / 2, (0.25 + 1) / 2, (0.25 + 1) / 2,
                                                         (0.75 + 1) / 2, 0.0])
    assert busy.by_activity["copy"] == pytest.approx([0.5 / 2, 0.5 / 2, 0.0, 0.0, 0.0])  # [1, 3) on one of two
    assert busy.by_activity["communication"] == pytest.approx([0.0, 0.0, 0.5 / 2, 0.5 / 2, 0.0])  # [5, 7)
    # Link bit 0 (pcie) is the copy's [1, 3), bit 1 (fabric) the collective's [5, 7).
    assert busy.links["pcie"] == pytest.approx([0.5, 0.5, 0.0, 0.0, 0.0])
    assert busy.links["fabric"] == pytest.approx([0.0, 0.0, 0.5, 0.5, 0.0])
    assert report_html.busy_over_time([snapshot([0], None, [], 10.0)], 10.0) is None


# -- opening a page in headless Chromium ---------------------------------------


@dataclass
class Chart:
    loaded: bool  # the image decoded
    ink: float  # fraction of the chart's screenshot that is not near white
    color: float  # fraction that is colored (not white, grey or black)


@dataclass
class PageCheck:
    errors: list[str] = field(default_factory=list)  # console errors, exceptions, failed loads
    requests: list[str] = field(default_factory=list)  # anything but file: and data: URLs
    charts: dict[str, Chart] = field(default_factory=dict)


class Browser:
    """Headless Chromium driven over the DevTools protocol on a pipe
    (``--remote-debugging-pipe``: commands on its fd 3, replies on fd 4, each
    a JSON message ending in a NUL byte)."""

    def __init__(self, exe: str, tmp: Path, stack: Any) -> None:
        to_chrome, self._to_chrome = os.pipe()
        self._from_chrome, from_chrome = os.pipe()

        def onto_3_and_4() -> None:  # in the child, before exec; dup2'd descriptors are inheritable
            # First above 4, so that neither end is overwritten by the other's dup2.
            high = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in (to_chrome, from_chrome)]
            os.dup2(high[0], 3)
            os.dup2(high[1], 4)

        self.log = tmp / "chromium.log"
        argv = [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe",
                f"--user-data-dir={tmp / 'profile'}", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-default-apps", "--disable-extensions", "--disable-sync",
                "--host-resolver-rules=MAP * ~NOTFOUND", "about:blank"]
        # Not the sanitizer's preload (make sanitize): Chromium is not ours to check.
        env = child_env(LD_PRELOAD=None, ASAN_OPTIONS=None, UBSAN_OPTIONS=None)
        with open(self.log, "wb") as log:
            self._proc = stack.enter_context(started(argv, env=env, stdout=log, stderr=log, close_fds=False,
                                                     preexec_fn=onto_3_and_4, stdin=subprocess.DEVNULL))
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        os.close(self._to_chrome)
        os.close(self._from_chrome)

    def _message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._from_chrome], [], [], left)[0]:
                pytest.fail(f"Chromium did not answer in time; its log:\n{self.log.read_text()[-3000:]}")
            chunk = os.read(self._from_chrome, 1 << 20)
            if not chunk:
                pytest.fail(f"Chromium exited; its log:\n{self.log.read_text()[-3000:]}")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout_s: float = 30.0) -> dict[str, Any]:
        self._next_id += 1
        msg = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_chrome, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._next_id:
                if "error" in reply:
                    pytest.fail(f"Chromium: {method} failed: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, session: str, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while not any(e.get("method") == method and e.get("sessionId") == session for e in self.events):
            self.events.append(self._message(deadline))

    def check(self, path: Path, width: int = 1200, height: int = 900) -> PageCheck:
        """Opens ``path`` in a new tab; what it logged and requested, and each
        chart (``figure[id^=chart-]``, its ``img``) as loaded and screenshot."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            self.send(f"{domain}.enable", session=session)
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False}, session)
        self.events.clear()
        self.send("Page.navigate", {"url": path.resolve().as_uri()}, session)
        self.wait_for("Page.loadEventFired", session)
        found = self.send("Runtime.evaluate", {"returnByValue": True, "expression": textwrap.dedent("""
            [...document.querySelectorAll("figure[id^=chart-]")].map(f => {
                const img = f.querySelector("img"), r = img.getBoundingClientRect();
                return {id: f.id, x: r.left + scrollX, y: r.top + scrollY, width: r.width, height: r.height,
                        loaded: img.complete && img.naturalWidth > 0};
            })""")}, session)["result"]["value"]
        result = PageCheck()
        for c in found:
            shot = self.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True, "clip": {
                "x": c["x"], "y": c["y"], "width": max(c["width"], 1), "height": max(c["height"], 1), "scale": 1}},
                session)["data"]
            rgb = np.asarray(Image.open(io.BytesIO(base64.b64decode(shot))).convert("RGB")).astype(int)
            spread = rgb.max(axis=2) - rgb.min(axis=2)
            result.charts[c["id"]] = Chart(c["loaded"], float(np.mean(rgb.min(axis=2) < 200)),
                                           float(np.mean(spread > 60)))
        for e in (e for e in self.events if e.get("sessionId") == session):
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                result.errors.append(f"exception: {d.get('exception', {}).get('description', d.get('text'))}")
            elif e["method"] == "Runtime.consoleAPICalled" and p["type"] in ("error", "assert", "warning"):
                result.errors.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description")))
                                                                      for a in p["args"]))
            elif e["method"] == "Log.entryAdded" and p["entry"]["level"] in ("error", "warning"):
                result.errors.append(f"log: {p['entry']['text']} {p['entry'].get('url', '')}")
            elif e["method"] == "Network.requestWillBeSent":
                url = p["request"]["url"]
                if not url.startswith(("file:", "data:")):
                    result.requests.append(url)
        self.send("Target.closeTarget", {"targetId": target})
        return result


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One Chromium for the module's pages, started when a test first opens one."""
    from contextlib import ExitStack

    with ExitStack() as stack:
        made: list[Browser] = []

        def check(path: Path) -> PageCheck:
            if not made:
                exe = shutil.which(CHROMIUM)
                if exe is None:
                    pytest.fail(MISSING, pytrace=False)
                made.append(Browser(exe, tmp_path_factory.mktemp("chromium"), stack))
                stack.callback(made[0].close)
            return made[0].check(path)

        yield check


def external_references(page: str) -> list[str]:
    """Whatever in the HTML would load something: a script, a src, href,
    srcset, poster or action that is not a data: URI or an anchor, a CSS
    url() or @import to anything but data:."""
    found = re.findall(r"<script\b[^>]*>", page, re.I)
    attribute = r"""\b(?:src|href|srcset|poster|action)\s*=\s*(?:"([^"]*)"|'([^']*)'|([^\s>]+))"""
    for m in re.finditer(attribute, page, re.I):
        value = next(v for v in m.groups() if v is not None).strip()
        if not value.startswith(("data:", "#")):
            found.append(value)
    found += [u for u in re.findall(r"url\(\s*['\"]?([^)'\"]*)", page, re.I) if not u.strip().startswith("data:")]
    found += re.findall(r"@import[^;]*", page, re.I)
    return found


def assert_renders(check: PageCheck, charts: set[str]) -> None:
    assert check.errors == [] and check.requests == []
    assert set(check.charts) == charts
    for name, chart in check.charts.items():
        # A chart has axes, text and colored bars or lines: well over 1 % of it inked, some of it in color.
        assert chart.loaded and chart.ink > 0.01 and chart.color > 0.002, (name, chart)


def test_the_browser_checks_catch_a_broken_page(browser: Any, tmp_path: Path):
    white = io.BytesIO()
    Image.new("RGB", (300, 200), "white").save(white, format="PNG")
    page = tmp_path / "broken.html"
    page.write_text(f"""<!DOCTYPE html><html><head><link rel="stylesheet" href="https://example.com/x.css"></head>
        <body><script>undefinedFunction();</script><script>console.error("boom")</script>
        <figure id="chart-broken"><img src="data:image/png;base64,AAAA" width="300" height="200"></figure>
        <figure id="chart-blank"><img src="data:image/png;base64,{base64.b64encode(white.getvalue()).decode()}">
        </figure></body></html>""")
    assert external_references(page.read_text()) == ["<script>", "<script>", "https://example.com/x.css"]
    check = browser(page)
    assert any("undefinedFunction" in e for e in check.errors)
    assert any("boom" in e for e in check.errors)
    assert check.requests == ["https://example.com/x.css"]
    assert not check.charts["chart-broken"].loaded
    assert check.charts["chart-blank"].loaded and check.charts["chart-blank"].ink == 0.0


# -- pages of reports ----------------------------------------------------------


@dataclass
class LaterReport(rep.RunReport):
    """A report with fields this module was written without, as later reports may have."""

    simulated_ranks: int = field(default=64, kw_only=True)
    assumptions: list[str] = field(default_factory=list, kw_only=True)
    fabric_model_revision: str = field(default="r7", kw_only=True)


def test_a_page_shows_report_fields_it_does_not_know_and_keeps_to_what_a_run_without_spans_has(browser: Any,
                                                                                                tmp_path: Path):
    # One device, no spans, no steps, nothing over any link, no collectives.
    snap = snapshot([0], None, [], 2e-3, links=[rep.LinkCounters("fabric", 25e9, 56, 0.0, 0.0, 0)],
                    labels={"aten::mm": (1e-4, 3)}, busy={"compute": 1e-4})
    merged = rep.merge([snap])
    merged.mode = "timing"
    merged.placeholders = [{"site": "train.py:8", "what": "item()", "dtype": "Float", "count": 3, "ranks": [0]}]
    later = LaterReport(**{f.name: getattr(merged, f.name) for f in fields(merged)},
                        assumptions=["all-to-all at 80 % of link bandwidth <unverified>"])
    page = report_html.run_html(later, [], command="python -m zion_emu run train.py")
    for text in ("Assumptions and placeholders", "simulated_ranks", ">64<",
                 "all-to-all at 80 % of link bandwidth &lt;unverified&gt;", "train.py:8", "item()",
                 "More report fields", "fabric_model_revision", ">r7<",
                 '<td>zion:0</td><td class="num">0</td><td class="num">5.0</td>',  # busy 0.1 of 2 ms
                 "No bytes moved over any link class", "No breakdown: spans were not recorded",
                 "No spans were recorded"):
        assert text in page, text
    assert external_references(page) == [] and "http://" not in page and "https://" not in page
    path = tmp_path / "no_spans.html"
    path.write_text(page)
    assert_renders(browser(path), {"chart-devices", "chart-top-ops"})
    # A script that never used a zion device: a page, without device charts.
    empty = rep.merge([rep.RankSnapshot(0, "zion", 1e-3, 8, [], [], {}, [], {}, 0, [], None)])
    assert "<h2>Summary</h2>" in report_html.run_html(empty) and "chart-" not in report_html.run_html(empty)


TWO_DEVICE_SCRIPT = """
import torch
from torch import nn
import zion_emu

torch.manual_seed(0)
body = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).to("zion:0")
head = nn.Linear(64, 1).to("zion:1")
opt = torch.optim.SGD([*body.parameters(), *head.parameters()], lr=0.1)
zion_emu.samples_per_iteration(128)
for _ in range(4):
    loss = head(body(torch.randn(128, 64).to("zion:0")).to("zion:1")).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
def test_run_html_is_one_self_contained_page_with_every_chart(browser: Any, tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(TWO_DEVICE_SCRIPT)
    out, js = tmp_path / "report.html", tmp_path / "report.json"
    done = zion_emu_cli("run", "--quiet-report", "--html", str(out), "--report", str(js), str(script),
                        timeout_s=120)
    assert f"wrote the HTML report to {out}" in done.stderr
    page, report = out.read_text(), json.loads(js.read_text())
    assert external_references(page) == [] and "http://" not in page and "https://" not in page
    assert f"--html {out}" in page  # the command line
    # The report's figures, as the text report writes them.
    assert format_time(report["iteration_s"]) in page and "zion:1" in page and "fabric" in page
    assert "Assumptions and placeholders" not in page  # this report has none
    assert_renders(browser(out), {"chart-iterations", "chart-utilization", "chart-devices", "chart-hbm",
                                  "chart-links", "chart-top-ops"})
    # The HBM chart's series: both devices, each peak the most its series reached.
    for d in report["devices"]:
        h = d["hbm_over_time"]
        assert h["time_s"] and h["peak_bytes"] == max(h["max_bytes"]) == d["peak_hbm_bytes"] > 0


ONE_DEVICE_SCRIPT = """
import torch
from torch import nn

model = nn.Linear(32, 1).to("zion")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(64, 32).to("zion")).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


@pytest.mark.slow
def test_sweep_html_compares_the_variants_and_marks_the_fastest(browser: Any, tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(ONE_DEVICE_SCRIPT)
    out, rows = tmp_path / "sweep.html", tmp_path / "sweep.json"
    zion_emu_cli("sweep", "--set", "oam.launch_overhead_ns=5000,1000", "--json", str(rows), "--html", str(out),
                 str(script), timeout_s=150)
    page, numbers = out.read_text(), json.loads(rows.read_text())
    # This script is bound by launches: a fifth of the launch overhead is the faster variant.
    fastest = min(numbers, key=lambda r: r["iteration_s"])["variant"]
    assert fastest == ["oam.launch_overhead_ns=1000"]
    winners = re.findall(r'<tr class="winner"><td>([^<]*)</td>', page)
    assert winners == ["oam.launch_overhead_ns=1000"]
    assert "oam.launch_overhead_ns=5000" in page and "Fastest: oam.launch_overhead_ns=1000" in page
    assert page.count("<details>") == 2
    assert external_references(page) == [] and "http://" not in page and "https://" not in page
    assert_renders(browser(out), {"chart-sweep-time", "chart-sweep-breakdown", "chart-sweep-hbm"})


def test_html_to_a_directory_or_a_missing_folder_is_refused_before_anything_runs(tmp_path: Path):
    script = tmp_path / "train.py"
    script.write_text(ONE_DEVICE_SCRIPT)
    done = zion_emu_cli("run", "--html", str(tmp_path), str(script), check=False, timeout_s=60)
    assert done.returncode == 2 and f"--html {tmp_path} is a directory; give a file name" in done.stderr
    missing = tmp_path / "nowhere" / "sweep.html"
    done = zion_emu_cli("sweep", "--set", "oam.launch_overhead_ns=5000,1000", "--html", str(missing), str(script),
                        check=False, timeout_s=60)
    assert done.returncode == 2 and f"folder {missing.parent} does not exist" in done.stderr
    assert "[1/2]" not in done.stdout  # no variant ran


def test_a_sweep_without_steps_in_every_variant_ranks_by_wall_time_and_marks_every_tie():
    def variant(wall: float, steps: list[float]) -> rep.RunReport:
        return rep.merge([snapshot([0], None, steps, wall, busy={"compute": wall / 2})])

    # Variant b has no steps: all are compared by wall time; a and c tie at 2 ms.
    page = report_html.sweep_html([("a", variant(2e-3, [1e-3, 1.5e-3])), ("b", variant(3e-3, [])),
                                   ("c", variant(2e-3, [1e-3, 1.2e-3]))])
    assert re.findall(r'<tr class="winner"><td>([^<]*)</td>', page) == ["a", "c"]
    assert "Fastest: a, c</strong> (2.000 ms wall time)" in page and "<th>wall time</th>" in page
    assert "1.500x" in page  # b: 3 ms / 2 ms
    assert "chart-sweep-breakdown" not in page  # no spans, no breakdowns
    with pytest.raises(ValueError, match="at least one variant"):
        report_html.sweep_html([])


# -- HBM over modeled time -----------------------------------------------------

MIB = 1 << 20
T = 2.0 ** -10  # the tick of the hand-worked script (~0.98 ms): sums of it are exact

# Allocations and frees at known modeled times, from a clock reset to zero.
HBM_SCRIPT = """
import torch
import zion_emu
from zion_emu import _C

zion_emu.reset_clock()
tick = lambda: _C.timeline.advance_host(2.0 ** -10)
tick(); a = torch.empty(MIB // 4, device="zion")      # T: 1 MiB
tick(); b = torch.empty(3 * MIB // 4, device="zion")  # 2T: 4 MiB, the peak
tick(); del a                                         # 3T: 3 MiB
tick(); c = torch.empty(MIB // 8, device="zion")      # 4T: 3.5 MiB
tick(); del b, c                                      # 5T: 0.5 MiB, then none
tick()                                                # the run ends at 6T
""".replace("MIB", str(MIB))


def test_hbm_series_steps_are_each_bins_rise_to_its_most_then_its_end_level():
    h = rep.HbmOverTime(bin_s=1e-9, start_s=0.0, start_bytes=2, time_s=[1.0, 3.0], max_bytes=[7, 9],
                        end_bytes=[5, 0], peak_bytes=9, peak_s=3.0, end_s=4.0)
    assert h.steps() == ([0.0, 1.0, 1.0, 1.0, 3.0, 3.0, 3.0, 4.0], [2, 2, 7, 5, 5, 9, 0, 0])
    empty = rep.HbmOverTime(1e-9, 0.5, 3, [], [], [], 3, 0.5, 2.0)
    assert empty.steps() == ([0.5, 2.0], [3, 3])
    # Reports written before the series was kept read as before; the series survives a round trip.
    d = rep.DeviceSnapshot(0, 0.0, {}, 0.0, 0.0, 0.0, 1, 0, 9, 32 << 30, hbm_over_time=h)
    assert rep.DeviceSnapshot.from_json(rep._json(d)) == d
    old = {k: v for k, v in rep._json(d).items() if k != "hbm_over_time"}
    assert rep.DeviceSnapshot.from_json(old).hbm_over_time is None


@pytest.mark.slow
def test_a_runs_hbm_series_is_its_allocations_and_frees_at_their_modeled_times(browser: Any, tmp_path: Path):
    script = tmp_path / "hbm.py"
    script.write_text(HBM_SCRIPT)
    out, js = tmp_path / "hbm.html", tmp_path / "hbm.json"
    zion_emu_cli("run", "--quiet-report", "--html", str(out), "--report", str(js), str(script), timeout_s=120)
    report = json.loads(js.read_text())
    assert [d["device"] for d in report["devices"]] == [0]
    h = report["devices"][0]["hbm_over_time"]
    # One bin per event time (1 ns bins), the two frees at 5T in one: 0.5 MiB after the first, none after both.
    assert h == {"bin_s": 1e-9, "start_s": 0.0, "start_bytes": 0, "time_s": [T, 2 * T, 3 * T, 4 * T, 5 * T],
                 "max_bytes": [MIB, 4 * MIB, 3 * MIB, 3 * MIB + MIB // 2, MIB // 2],
                 "end_bytes": [MIB, 4 * MIB, 3 * MIB, 3 * MIB + MIB // 2, 0],
                 "peak_bytes": 4 * MIB, "peak_s": 2 * T, "end_s": 6 * T}
    assert report["devices"][0]["peak_hbm_bytes"] == 4 * MIB and report["wall_s"] == 6 * T
    x, y = rep.HbmOverTime.from_json(h).steps()
    assert list(zip(x, y)) == [(0.0, 0), (T, 0), (T, MIB), (T, MIB), (2 * T, MIB), (2 * T, 4 * MIB),
                               (2 * T, 4 * MIB), (3 * T, 4 * MIB), (3 * T, 3 * MIB), (3 * T, 3 * MIB),
                               (4 * T, 3 * MIB), (4 * T, 3.5 * MIB), (4 * T, 3.5 * MIB), (5 * T, 3.5 * MIB),
                               (5 * T, MIB // 2), (5 * T, 0), (6 * T, 0)]
    page = out.read_text()
    assert 'id="chart-hbm"' in page and "events within" not in page  # every event its own bin
    # No op ran: no spans, no top work; the device's charts.
    assert_renders(browser(out), {"chart-devices", "chart-hbm"})


COARSE_SCRIPT = """
import json, random
import torch
import zion_emu
from zion_emu import _C

zion_emu.reset_clock()
rng = random.Random(0)
live, events, level = [], [], 0
for _ in range(3000):
    _C.timeline.advance_host(rng.choice([2.0 ** -30, 2.0 ** -20, 2.0 ** -12]))
    if live and rng.random() < 0.45:
        t = live.pop(rng.randrange(len(live)))
        level -= t.numel() * 4
        del t
    else:
        n = rng.randrange(1, 64) * 256
        live.append(torch.empty(n // 4, device="zion:2"))
        level += n
    events.append((_C.device.host_time(), level))
print(json.dumps({"events": events, "series": _C.memory.hbm_over_time(2)}))
"""


def test_a_long_hbm_series_merges_bins_keeping_each_ones_most_and_its_exact_peak():
    done = run_python(COARSE_SCRIPT, timeout_s=120)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    events, s = got["events"], got["series"]
    # 3000 events over ~0.4 s in at most 1024 bins: the width doubled from 1 ns.
    assert (rep.HbmOverTime.MAX_BINS, rep.HbmOverTime.FIRST_BIN_S) == (1024, 1e-9)
    # Past 1024 bins the width doubles until at most 512 are left: so at the final width the events fill
    # every kept bin and at most 1024, and at half of it they fill more than 512.
    def bins(width: float) -> int:
        return len({np.floor(t / width) for t, _ in events})
    assert len(s["time_s"]) == bins(s["bin_s"]) <= 1024 and bins(s["bin_s"] / 2) > 512 and s["bin_s"] > 1e-9
    assert np.log2(s["bin_s"] / 1e-9) == int(np.log2(s["bin_s"] / 1e-9))
    # The bins are the events grouped by their interval of the final width, replayed here.
    want: list[list[float]] = []
    for t, level in events:
        if want and np.floor(want[-1][0] / s["bin_s"]) == np.floor(t / s["bin_s"]):
            want[-1][1] = max(want[-1][1], level)
            want[-1][2] = level
        else:
            want.append([t, level, level])
    assert [w[0] for w in want] == s["time_s"]
    assert [w[1] for w in want] == s["max_bytes"] and [w[2] for w in want] == s["end_bytes"]
    peak = max(level for _, level in events)
    assert s["peak_bytes"] == peak == max(s["max_bytes"])
    assert s["peak_s"] == next(t for t, level in events if level == peak)
    assert s["current_bytes"] == events[-1][1]
