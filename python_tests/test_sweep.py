"""``zion-emu sweep`` over the launch: --vary (ranks, script arguments, named
values in braces), ':::' commands side by side, the limit of each row and
the best marked; and zion_emu.throughput, which the rows of asynchronous
runs take their samples/s from."""

from __future__ import annotations

import argparse
import json
import re
import textwrap
from pathlib import Path

import pytest

from zion_emu import report as rep
from zion_emu.__main__ import main
from zion_emu.report_text import format_text
from zion_emu.cli import CliError
from zion_emu.cli import sweep
from processes import REPO, zion_emu_cli

ASYNC = REPO / "examples" / "async_ps" / "train.py"

# A data-parallel step on each rank: an all-reduce of the gradients, then SGD.
SYNC = """
import argparse, os, torch, torch.distributed as dist
import zion_emu, zion_emu.distributed  # noqa: F401
p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
steps = p.parse_args().steps
dist.init_process_group("zion")
zion_emu.samples_per_iteration(16)
model = torch.nn.Linear(256, 256).to(f"zion:{int(os.environ['LOCAL_RANK'])}")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(steps):
    model(torch.randn(16, 256, device=model.weight.device)).square().mean().backward()
    for q in model.parameters():
        dist.all_reduce(q.grad)
    opt.step()
dist.destroy_process_group()
"""


def _args(*argv: str) -> argparse.Namespace:
    from zion_emu.__main__ import _parser

    return _parser().parse_args(["sweep", *argv])


def test_vary_keys_and_values_are_checked_naming_what_is_allowed() -> None:
    with pytest.raises(CliError, match="unknown key 'oam.x'; a key is nproc, world-size, ranks, "
                                       "samples-per-iteration, arg:--FLAG"):
        sweep.parse_axes(["oam.x=1,2"])
    with pytest.raises(CliError, match="--vary nproc: 'two' is not an integer \\(--nproc takes integers"):
        sweep.parse_axes(["nproc=1,two"])
    with pytest.raises(CliError, match="--vary T: '1.5' is not an integer \\(the name T takes integers"):
        sweep.parse_axes(["T=1,1.5"])
    with pytest.raises(CliError, match="'nproc' is swept twice"):
        sweep.parse_axes(["nproc=1", "nproc=2"])
    with pytest.raises(CliError, match="--vary 'nproc' is not KEY=VALUE"):
        sweep.parse_axes(["nproc"])
    with pytest.raises(CliError, match="--vary arg:--x=1,: an empty value in the list"):
        sweep.parse_axes(["arg:--x=1,"])
    with pytest.raises(CliError, match="'world_size' names a launch option; write --vary world-size="):
        sweep.parse_axes(["world_size=2"])
    axes = sweep.parse_axes(["nproc=2,3", "arg:--servers=1,4", "T=1,2"])
    assert [a.kind for a in axes] == ["launch", "arg", "name"]
    assert len(sweep.launch_combinations(axes)) == 8
    # A value holding a comma is quoted (it was split in two, and '0,8' kept its quotes).
    (ranks,) = sweep.parse_axes(["ranks='0,8',\"0-15\",3"])
    assert ranks.values == ["0,8", "0-15", "3"]


def test_braces_take_integer_arithmetic_on_swept_names_and_leave_json_alone() -> None:
    used: set[str] = set()
    assert sweep.fill("{T+S}", {"T": 3, "S": 2}, used) == "5" and used == {"T", "S"}
    assert sweep.fill("--batch={256*T}", {"T": 3}, set()) == "--batch=768"
    assert sweep.fill("{(T+1)//2}-{T%2}", {"T": 3}, set()) == "2-1"
    assert sweep.fill('{"a": 1}', {"T": 3}, set()) == '{"a": 1}'  # not an expression of names
    with pytest.raises(CliError, match="\\{X\\+1\\} names X, which is not swept; the swept names are T"):
        sweep.fill("{X+1}", {"T": 1}, set())
    with pytest.raises(CliError, match="divides by zero"):
        sweep.fill("{1//T}", {"T": 0}, set())


def test_script_arguments_are_replaced_in_either_spelling_or_added() -> None:
    assert sweep.set_script_arg(["--servers", "1", "--x"], "--servers", "4") == ["--servers", "4", "--x"]
    assert sweep.set_script_arg(["--servers=1"], "--servers", "4") == ["--servers=4"]
    assert sweep.set_script_arg(["--shape", "tiny"], "--servers", "4") == ["--shape", "tiny", "--servers", "4"]


def test_each_command_after_the_separator_has_its_options_over_the_sweeps(tmp_path: Path) -> None:
    args = _args("--vary", "T=1,2", "--world-size", "{T+1}", "a/train.py", "--servers", "1", ":::",
                 "--timing-only", "--world-size", "{T}", "b/dlrm.py", "--batch", "{256*T}")
    first, second = sweep.commands_of(args)
    assert (first.script, first.script_args, first.timing_only) == ("a/train.py", ["--servers", "1"], False)
    assert (second.script, second.script_args, second.timing_only) == ("b/dlrm.py", ["--batch", "{256*T}"], True)
    assert sweep.command_labels([first, second]) == ["a/train.py", "b/dlrm.py"]
    combo = sweep.launch_combinations(sweep.parse_axes(["T=2"]))[0]
    used: set[str] = set()
    one = sweep.instantiate(second, combo, used)
    assert (one.world_size, one.script_args, used) == (2, ["--batch", "512"], {"T"})
    assert sweep.instantiate(first, combo, used).world_size == 3
    with pytest.raises(CliError, match="an empty command after ':::'"):
        sweep.commands_of(_args("a.py", ":::"))
    with pytest.raises(CliError, match="--world-size 'x' is not an integer"):
        sweep.instantiate(sweep.commands_of(_args("--world-size", "x", "a.py"))[0], [], set())


def test_bad_sweeps_stop_before_anything_runs(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    for argv, message in (
        (["--vary", "T=1,2", str(script)], "--vary T is used nowhere: put {T} in a launch option"),
        (["--vary", "colour=red", str(script)], "'red' is not an integer (the name colour takes integers"),
        (["--vary", "bogus.key=1", str(script)], "unknown key 'bogus.key'; a key is nproc, world-size"),
        (["--nproc", "{N}", str(script)], "{N} names N, which is not swept"),
    ):
        done = zion_emu_cli("sweep", *argv, check=False, timeout_s=60)
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "[1/" not in done.stdout  # nothing ran



@pytest.mark.parametrize(("argv", "message"), [
    (["--vary", "nproc=1,0"], "variant nproc=0: --nproc must be at least 1, got 0; nothing ran"),
    (["--vary", "nproc=1,9"], "variant nproc=9: --nproc 9 is more ranks than platform 'zion' has devices per node "
                              "(8)"),
    (["--set", "fabric.topology=ring,triangle"], "variant fabric.topology=triangle: platform 'zion': field "
                                                 "'fabric.topology' is \"triangle\" (string); allowed: "),
    (["--set", "fabric.link_bandwidth_gb_per_s=25,-1"], "variant fabric.link_bandwidth_gb_per_s=-1: platform "
                                                        "'zion': field 'fabric.link_bandwidth_gb_per_s' must be > "
                                                        "0, got -1"),
    (["--plot", "rows.xyz"], "unknown image format 'xyz'; use one of "),
    (["--report", "r.json"], "argument --report: a sweep writes no report or trace of its own: --json OUT.json "
                             "writes its rows and --html OUT.html every variant's report"),
    (["--trace", "t.json"], "run it alone with `zion-emu run --trace OUT.json`"),
    (["--json", "s.py"], "--json s.py is the same file as the script s.py, which it would overwrite"),
    (["--html", "rows.json"], "--html rows.json is the same file as --json rows.json"),
    (["--plot", "gone/rows.png"], "--plot gone/rows.png: folder "),
    (["--html", "."], "--html . is a directory; give a file name"),
], ids=["nproc-0", "nproc-over-devices", "topology", "bandwidth", "plot-format", "report", "trace", "json-over-script",
        "html-over-json", "no-folder", "directory"])
def test_a_bad_variant_or_output_is_refused_before_any_variant_runs(
        argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A bad value listed after a good one (which must not run first), or a
    file a sweep does not write, is refused; the --json file keeps what it had."""
    monkeypatch.chdir(tmp_path)
    Path("s.py").write_text("print('ran')\n")
    Path("rows.json").write_text('"what the user had"')
    assert main(["sweep", "--platform", "zion", "--json", "rows.json", *argv, "s.py"]) == 2
    out, err = capsys.readouterr()
    assert message in err and "[1/" not in out, err
    assert Path("rows.json").read_text() == '"what the user had"'


def test_a_variant_that_fails_keeps_the_rows_that_finished(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs stand in for `zion-emu run`; the one of --fail 1 exits 3 (with a
    partial report). First in the sweep, nothing finished and --json keeps
    what it had; second, the first row is shown and written, the third
    variant does not run, and the sweep exits 3."""
    ran = []

    def execute(one: argparse.Namespace, stdout: object = None) -> tuple[rep.RunReport, int]:
        ran.append(one.script_args)
        return rep.merge([_snap(0)]), 3 if one.script_args == ["--fail", "1"] else 0

    monkeypatch.setattr(sweep, "execute", execute)
    script = tmp_path / "s.py"
    script.write_text("")
    rows_file = tmp_path / "rows.json"
    rows_file.write_text('"what the user had"')
    assert main(["sweep", "--json", str(rows_file), "--vary", "arg:--fail=1,0", str(script)]) == 3
    out, err = capsys.readouterr()
    assert ran == [["--fail", "1"]] and "variant" not in out
    assert "error: variant arg:--fail=1 failed with exit code 3 (its errors are above" in err
    assert "none of the 2 variants finished, so nothing was written" in err
    assert rows_file.read_text() == '"what the user had"'
    ran.clear()
    assert main(["sweep", "--json", str(rows_file), "--vary", "arg:--fail=0,1,2", str(script)]) == 3
    out, err = capsys.readouterr()
    assert ran == [["--fail", "0"], ["--fail", "1"]] and "* arg:--fail=0" in out
    assert "error: variant arg:--fail=1 failed with exit code 3" in err
    assert "the table above has the 1 of 3 variants that finished" in err
    assert [r["variant"] for r in json.loads(rows_file.read_text())] == [["arg:--fail=0"]]

def test_an_output_that_cannot_be_written_leaves_the_others_written(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # The first failed write stopped the sweep with exit 2, and none of the files was written.
    monkeypatch.setattr(sweep, "execute", lambda one, stdout=None: (rep.merge([_snap(0)]), 0))
    script = tmp_path / "s.py"
    script.write_text("")
    (tmp_path / "ro").mkdir()
    rows_file, page = tmp_path / "ro" / "rows.json", tmp_path / "page.html"
    monkeypatch.setattr(sweep.json, "dump", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "Permission denied")))
    assert main(["sweep", "--json", str(rows_file), "--html", str(page), "--vary", "arg:--x=1,2", str(script)]) == 1
    out, err = capsys.readouterr()
    assert f"error: could not write the table as JSON to {rows_file}: Permission denied" in err
    assert f"wrote the HTML report to {page}" in err and page.read_text().startswith("<!DOCTYPE html>")


def _snap(rank: int, throughput: dict | None = None, samples: int | None = None) -> rep.RankSnapshot:
    return rep.RankSnapshot(rank, "zion", 1e-3, 8, [], [], {}, [], {}, 0, [0.0, 2e-4, 4e-4], samples,
                            throughput=throughput)


def test_declared_throughputs_add_up_over_the_ranks_that_declared() -> None:
    # Trainers 0 and 1 declare 512 and 256 samples over [1, 5] ms and [2, 9] ms:
    # 768 samples in 8 ms = 96,000 samples/s; the higher-utilization limit wins.
    r = rep.merge([_snap(0, {"samples": 512, "start_s": 1e-3, "end_s": 5e-3, "limit": "server 0",
                             "limit_utilization": 0.5}),
                   _snap(1, {"samples": 256, "start_s": 2e-3, "end_s": 9e-3, "limit": "link a>b",
                             "limit_utilization": 0.75}),
                   _snap(2)])
    t = r.throughput
    assert (t.samples, t.ranks, t.limit, t.limit_utilization) == (768, [0, 1], "link a>b", 0.75)
    assert t.modeled_s == pytest.approx(8e-3) and r.samples_per_s == pytest.approx(96_000)
    assert rep.RunReport.from_json(json.loads(json.dumps(r.to_json()))).throughput == t
    text = format_text(r)
    assert "throughput             96,000 samples/s (modeled: 768 samples in" in text
    assert "measured by rank 0, 1)" in text and "limited by             link a>b (75.0% busy)" in text
    # The declared throughput wins over samples per iteration.
    r = rep.merge([_snap(0, {"samples": 100, "start_s": 0.0, "end_s": 1e-3}, samples=16), _snap(1, samples=16)])
    assert r.samples_per_iteration == 32 and r.samples_per_s == pytest.approx(100 / 1e-3)
    assert r.throughput.limit is None and "limited by" not in format_text(r)
    r = rep.merge([_snap(0, samples=16), _snap(1, samples=16)])
    assert r.throughput is None and r.samples_per_s == pytest.approx(32 / 2e-4)


def test_throughput_refuses_bad_declarations() -> None:
    import zion_emu

    with pytest.raises(ValueError, match="samples must be a positive integer, got 0"):
        zion_emu.throughput(0, 0.0, 1.0)
    with pytest.raises(ValueError, match="end_s \\(1.0\\) must be after start_s \\(2.0\\)"):
        zion_emu.throughput(8, 2.0, 1.0)
    with pytest.raises(ValueError, match="limit_utilization needs the limit it measures"):
        zion_emu.throughput(8, 0.0, 1.0, limit_utilization=0.5)


def test_the_best_row_is_the_most_samples_per_s_else_the_least_time() -> None:
    def row(sps: float | None, it: float | None) -> sweep.Variant:
        r = rep.merge([_snap(0)])
        r.samples_per_s, r.iteration_s = sps, it
        return sweep.Variant([f"x={sps}"], r)

    rows = [row(10.0, 3.0), row(30.0, 1.0), row(20.0, 2.0)]
    sweep.mark_best(rows)
    assert [r.best for r in rows] == [False, True, False]
    rows = [row(None, 3.0), row(30.0, 2.0), row(None, 1.0)]
    sweep.mark_best(rows)
    assert [r.best for r in rows] == [False, False, True]
    assert "* the best: least time per iteration" in sweep.table(rows)


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_sweep_over_ranks_and_arguments_equals_the_single_runs(tmp_path: Path) -> None:
    """Async (1 server) and sync side by side for 2 and 3 ranks: four rows,
    each equal to `zion-emu run` of the same command; the async rows take
    samples/s and the limit from what the first server declared."""
    sync = tmp_path / "sync.py"
    sync.write_text(textwrap.dedent(SYNC))
    rows_file = tmp_path / "rows.json"
    done = zion_emu_cli("sweep", "--vary", "nproc=2,3", "--vary", "arg:--steps=2", "--json", str(rows_file),
                        str(ASYNC), "--servers", "1", "--shape", "tiny", "--steps", "9", "--timeout", "60",
                        ":::", str(sync), timeout_s=400)
    rows = json.loads(rows_file.read_text())
    mine = f"{tmp_path.name}/sync.py"
    assert [(r["variant"], r["command"]) for r in rows] == [
        (["nproc=2", "arg:--steps=2"], "async_ps/train.py"), (["nproc=2", "arg:--steps=2"], mine),
        (["nproc=3", "arg:--steps=2"], "async_ps/train.py"), (["nproc=3", "arg:--steps=2"], mine)]
    assert sum(r["best"] for r in rows) == 1
    assert max(rows, key=lambda r: r["samples_per_s"])["best"]
    assert "* " in done.stdout and "samples/s" in done.stdout

    def single(nproc: int, *command: str) -> dict:
        out = tmp_path / f"single{nproc}-{Path(command[0]).name}.json"
        zion_emu_cli("run", "--nproc", str(nproc), "--quiet-report", "--report", str(out), *command, timeout_s=240)
        return json.loads(out.read_text())

    for i, nproc in enumerate((2, 3)):
        a = single(nproc, str(ASYNC), "--servers", "1", "--shape", "tiny", "--steps", "2", "--timeout", "60")
        s = single(nproc, str(sync), "--steps", "2")
        async_row, sync_row = rows[2 * i], rows[2 * i + 1]
        # Async: the first server's measured throughput, samples = trainers x steps x 8.
        assert a["throughput"]["samples"] == (nproc - 1) * 2 * 8 and a["throughput"]["ranks"] == [nproc - 1]
        assert async_row["samples_per_s"] == a["samples_per_s"] == a["throughput"]["samples_per_s"]
        assert async_row["limit"] == a["throughput"]["limit"] and async_row["limit"]
        assert async_row["limit_utilization"] == a["throughput"]["limit_utilization"]
        # Sync: 16 samples per rank per optimizer step.
        assert s["samples_per_iteration"] == 16 * nproc
        assert sync_row["samples_per_s"] == s["samples_per_s"] and sync_row["iteration_s"] == s["iteration_s"]
        assert sync_row["limit"]  # the report's busiest device or link class
    # Async throughput grows with the trainers: 2 trainers > 1.
    assert rows[2]["samples_per_s"] > rows[0]["samples_per_s"]


def test_a_command_that_does_not_use_a_swept_name_runs_once_per_value_it_uses(tmp_path: Path) -> None:
    """T=1,2 x S=1,2 over two commands: the first uses T and S (four runs),
    the second only T (two). A script that only records its arguments."""
    script = tmp_path / "args.py"
    script.write_text(textwrap.dedent("""
        import os, sys
        with open(os.path.join(os.path.dirname(__file__), "calls.txt"), "a") as f:
            f.write(" ".join(sys.argv[1:]) + "\\n")
    """))
    rows_file = tmp_path / "rows.json"
    zion_emu_cli("sweep", "--vary", "T=1,2", "--vary", "S=1,2", "--json", str(rows_file), str(script), "a{T}",
                 "b{S}", ":::", str(script), "c{10*T}", timeout_s=120)
    rows = json.loads(rows_file.read_text())
    assert [r["variant"] for r in rows] == [["T=1", "S=1"], ["T=1"], ["T=1", "S=2"], ["T=2", "S=1"], ["T=2"],
                                            ["T=2", "S=2"]]
    assert (tmp_path / "calls.txt").read_text().split("\n")[:-1] == ["a1 b1", "c10", "a1 b2", "a2 b1", "c20",
                                                                     "a2 b2"]


def test_the_sweep_page_marks_the_most_samples_per_s_and_shows_each_limit() -> None:
    from zion_emu import report_html

    fast = rep.merge([_snap(0, {"samples": 512, "start_s": 0.0, "end_s": 1e-3, "limit": "server 0 busy",
                                "limit_utilization": 0.5})])  # 512,000 samples/s
    slow = rep.merge([_snap(0, samples=16)])  # 16 per 0.2 ms iteration: 80,000 samples/s
    page = report_html.sweep_html([("async", fast), ("sync", slow)])
    assert re.findall(r'<tr class="winner"><td>([^<]*)</td>', page) == ["async"]
    assert "Best: async</strong> (512,000 samples/s)" in page and "server 0 busy (50.0%)" in page
    assert "6.400x" in page  # 512,000 / 80,000
