"""`python -m zion_emu run`: the launcher, the report and the trace.

zion preset numbers used below: socket 0 -> PCIe switch 0 is Gen3 x16
(12 GB/s), switch -> OAM 0 is Gen4 x16 (24 GB/s); the OAMs are fully
connected; launch overhead 5 us.
"""

import gc
import json
import os
import re
import signal
import subprocess
import textwrap
import time

import numpy as np
import pytest

from processes import PYTHON, REPO, alive, child_env, finish, run, started, torchrun, zion_emu_cli
from zion_emu import report as rep
from zion_emu.__main__ import main
from zion_emu.cli import CliError
from zion_emu.cli import run as launcher
from zion_emu.cli.sweep import split_values, variants

TRAIN = """
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 1)).to("zion")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(32, 64).pin_memory()
y = torch.randn(32, 1).pin_memory()
for step in range({steps}):
    xb, yb = x.to("zion"), y.to("zion")
    loss = torch.nn.functional.mse_loss(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print("final loss", loss.item())
"""


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def test_union_length_merges_overlaps_by_hand():
    starts = np.array([0.0, 1.0, 5.0, 6.0, 10.0])
    ends = np.array([2.0, 3.0, 7.0, 6.5, 10.0])
    # [0,3) + [5,7) + an empty one = 5
    assert rep.union_length(starts, ends) == 5.0
    assert rep.union_length(np.array([]), np.array([])) == 0.0


def test_breakdown_splits_wall_time_by_hand():
    spans = {
        "start": np.array([0.0, 1.0, 3.0, 5.0]),
        "end": np.array([2.0, 4.0, 3.5, 6.0]),
        "activity": np.array([rep.COMPUTE, rep.COMMUNICATION, rep.COPY, rep.COPY]),
        "device": np.array([0, 0, 0, 0]),
    }
    b = rep.breakdown(spans, device=0, wall=10.0)
    # compute [0,2); comm [1,4): 1 s overlapped, 2 s exposed; copies [3,3.5) hidden under comm, [5,6) exposed
    assert b == rep.Breakdown(compute_s=2.0, communication_exposed_s=2.0, communication_overlapped_s=1.0,
                              copies_exposed_s=1.0, host_s=5.0)
    assert b.compute_s + b.communication_exposed_s + b.copies_exposed_s + b.host_s == 10.0

    # Compute [0.1, 0.2) and communication [0.3, 0.5): in floats, union - compute is 2.8e-17 more than the
    # communication alone, and the report printed "communication, overlapped -0.0 us".
    apart = {"start": np.array([0.1, 0.3]), "end": np.array([0.2, 0.5]),
             "activity": np.array([rep.COMPUTE, rep.COMMUNICATION]), "device": np.array([0, 0])}
    assert rep.breakdown(apart, device=0, wall=1.0).communication_overlapped_s == 0.0


@pytest.mark.slow
def test_run_reports_iterations_breakdown_links_and_writes_a_trace(tmp_path):
    script = write(tmp_path, "train.py", TRAIN.format(steps=5))
    out, trace = tmp_path / "report.json", tmp_path / "trace.json"
    r = zion_emu_cli("run", "--report", str(out), "--trace", str(trace), "--samples-per-iteration", "32", str(script))
    assert "final loss" in r.stdout and "zion-emu report" in r.stdout
    report = json.loads(out.read_text())
    assert json.loads(json.dumps(rep.RunReport.from_json(report).to_json())) == report  # the typed report reads it
    assert report["iterations"] == 5
    assert report["samples_per_s"] == pytest.approx(32 / report["iteration_s"])
    b = report["breakdown"]
    parts = b["compute_s"] + b["communication_exposed_s"] + b["copies_exposed_s"] + b["host_s"]
    assert parts == pytest.approx(report["wall_s"], rel=1e-12)
    assert b["compute_s"] > 0 and b["copies_exposed_s"] > 0
    # Each step copies x (32x64 fp32) and y (32x1) host -> zion:0 over socket 0 -> switch -> OAM 0:
    # every byte crosses one Gen3 x16 link and one Gen4 x16 link.
    links = {link["name"]: link for link in report["links"]}
    h2d = 5 * (32 * 64 + 32) * 4
    # The model's parameters went to the device once too (.to("zion") of pageable memory).
    params = (64 * 128 + 128 + 128 + 1) * 4
    total = h2d + params  # loss.item() waits for the device; it is not modeled as a transfer
    assert links["pcie_gen3_x16"]["bytes"] == pytest.approx(total)
    assert links["pcie_gen4_x16"]["bytes"] == pytest.approx(total)
    assert links["pcie_gen3_x16"]["busy_s"] == pytest.approx(total / 12e9)
    names = {op["name"] for op in report["top_ops"]}
    assert "aten::addmm" in names or "aten::mm" in names
    events = json.loads(trace.read_text())["traceEvents"]
    tracks = {e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    assert "zion:0 stream 0" in tracks and "link pcie_gen3_x16" in tracks
    spans = [e for e in events if e.get("ph") == "X"]
    assert any(e["name"] == "copy H2D" for e in spans) and any(e["cat"] == "compute" for e in spans)


def test_a_script_declares_its_samples_per_iteration_and_the_report_gives_samples_per_s(tmp_path):
    script = write(tmp_path, "train.py", "import zion_emu\nzion_emu.samples_per_iteration(16)\n" + TRAIN.format(steps=3))
    out = tmp_path / "report.json"
    zion_emu_cli("run", "--quiet-report", "--report", str(out), str(script))
    report = json.loads(out.read_text())
    assert report["iterations"] == 3 and report["samples_per_iteration"] == 16
    assert report["samples_per_s"] == pytest.approx(16 / report["iteration_s"])


def test_samples_per_iteration_is_one_function_with_two_homes_and_takes_positive_integers():
    import zion_emu
    import zion_emu.launch

    assert zion_emu.samples_per_iteration is zion_emu.launch.samples_per_iteration
    for bad in (0, -4, 1.5, True):
        with pytest.raises(ValueError, match="samples_per_iteration must be a positive integer"):
            zion_emu.samples_per_iteration(bad)


@pytest.mark.slow
@pytest.mark.multiproc
def test_two_ranks_all_reduce_traffic_adds_up_over_ranks(tmp_path):
    script = write(tmp_path, "ar.py", """
        import os, torch, torch.distributed as dist
        import zion_emu.distributed  # noqa: F401
        dist.init_process_group("zion")
        rank = dist.get_rank()
        x = torch.ones(1 << 20, device=f"zion:{int(os.environ['LOCAL_RANK'])}")  # 4 MiB
        for _ in range(3):
            dist.all_reduce(x)
        torch.zion.synchronize()
        dist.destroy_process_group()
    """)
    out = tmp_path / "report.json"
    zion_emu_cli("run", "--nproc", "2", "--set", "collectives.algorithm=ring", "--report", str(out), str(script),
                 timeout_s=240)
    report = json.loads(out.read_text())
    assert report["ranks"] == 2
    links = {link["name"]: link for link in report["links"]}
    # A ring all-reduce over n ranks sends 2(n-1)/n of the buffer from every rank, one fabric hop each:
    # n * 2(n-1)/n * 4 MiB = 8 MiB per all-reduce on 2 ranks, three of them.
    assert links["fabric"]["bytes"] == pytest.approx(3 * 2 * (4 << 20))
    top = {op["name"]: op for op in report["top_ops"]}
    assert top["all_reduce"]["count"] == 6  # three per rank
    b = report["breakdown"]
    assert b["communication_exposed_s"] > 0


def test_the_report_lists_torch_compile_graphs_that_ran_op_by_op(tmp_path):
    # A timing-only run that compiles a model said "times and memory are modeled as in real mode", while its
    # graphs ran op by op (priced as eager ops, not as real mode's fused kernels); only a warning said so.
    script = write(tmp_path, "compiled.py", """
        import torch
        model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)).to("zion")
        step = torch.compile(model)
        for _ in range(2):
            step(torch.randn(8, 16, device="zion")).sum().backward()
    """)
    out = tmp_path / "report.json"
    done = zion_emu_cli("run", "--timing-only", "--report", str(out), str(script), timeout_s=240)
    fallbacks = json.loads(out.read_text())["compile_fallbacks"]
    assert fallbacks == [{"reason": "timing-only mode: compiled kernels would run on tensors that hold no bytes",
                          "graphs": 1, "ranks": [0]}]
    assert "except torch.compile's graphs, which ran op by op (below)" in done.stdout
    assert "torch.compile graphs that ran op by op (priced as eager ops, not as fused kernels):" in done.stdout
    assert rep.RunReport.from_json(out).compile_fallbacks == fallbacks


@pytest.mark.multiproc
def test_a_rank_on_another_device_than_its_local_rank_is_refused_as_nccl_refuses_duplicate_gpus(tmp_path):
    # Without set_device every rank computed on zion:0 while its collectives were priced on OAMs 0 and 1.
    script = write(tmp_path, "no_set_device.py", """
        import os, torch, torch.distributed as dist
        import zion_emu.distributed  # noqa: F401
        dist.init_process_group("zion")
        x = torch.ones(4, device="zion")
        try:
            dist.all_reduce(x)
        except RuntimeError as e:
            print(f"rank {dist.get_rank()}: {e}".splitlines()[0])
        if dist.get_rank() == 1:
            try:
                dist.send(x, 0)
            except RuntimeError as e:
                print(f"rank 1: {e}".splitlines()[0])
        dist.destroy_process_group()
    """)
    r = zion_emu_cli("run", "--nproc", "2", "--quiet-report", str(script), timeout_s=240)
    assert ("rank 1: zion backend: all_reduce: this rank (LOCAL_RANK 1) is OAM 1 of its node, zion:1, but its "
            "tensors are on zion:0") in r.stdout
    assert "rank 0: zion backend: all_reduce failed on rank(s) 1" in r.stdout
    assert "call torch.zion.set_device(int(os.environ['LOCAL_RANK']))" in r.stdout
    assert "rank 1: zion backend: send: this rank (LOCAL_RANK 1) is OAM 1 of its node" in r.stdout


@pytest.mark.slow
@pytest.mark.multiproc
def test_a_two_rank_ddp_run_prints_no_launcher_or_ddp_warnings(tmp_path):
    script = write(tmp_path, "ddp.py", """
        import os, torch, torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        dist.init_process_group("zion")
        device = f"zion:{int(os.environ['LOCAL_RANK'])}"
        model = DDP(torch.nn.Linear(8, 1).to(device))
        model._set_ddp_runtime_logging_sample_rate(1)  # DDP times every iteration
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            opt.zero_grad()
            model(torch.ones(4, 8, device=device)).sum().backward()
            opt.step()
        dist.destroy_process_group()
    """)
    # torchrun's banner is about OMP_NUM_THREADS unset
    r = zion_emu_cli("run", "--nproc", "2", "--quiet-report", str(script), timeout_s=240,
                     env=child_env(OMP_NUM_THREADS=None))
    assert "OMP_NUM_THREADS" not in r.stderr and "Time stats" not in r.stderr, r.stderr


@pytest.mark.slow
def test_two_ranks_freeze_their_imports_collect_the_scripts_cycles_and_leave_no_temporary_files(tmp_path, capsys):
    # Before the script each rank takes torch's and zion's import-time objects out of the cyclic collector's passes
    # (its exit then takes about a second less); the script's own cyclic garbage is collected as ever. The run's
    # folder and torchrun's own (its ranks' error files, torchelastic_* by default) go when it ends.
    script = write(tmp_path, "gc_probe.py", """
        import gc, weakref
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        alive = weakref.ref(a)
        del a, b
        gc.collect()
        print("frozen", gc.get_freeze_count(), "cycle collected", alive() is None)
    """)
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    out = zion_emu_cli("run", "--nproc", "2", "--quiet-report", str(script), timeout_s=240,
                       env=child_env(TMPDIR=str(temporary))).stdout
    probes = re.findall(r"frozen (\d+) cycle collected (\w+)", out)
    assert len(probes) == 2 and all(int(frozen) > 50_000 and collected == "True" for frozen, collected in probes), out
    assert list(temporary.iterdir()) == []
    # main() run in a caller's process freezes nothing there: it would keep that process's garbage for good.
    before = gc.get_freeze_count()
    assert main(["run", "--help"]) == 0
    assert gc.get_freeze_count() == before
    capsys.readouterr()


def test_interrupted_run_still_writes_the_partial_report(tmp_path):
    script = write(tmp_path, "loop.py", """
        import os, signal, torch
        model = torch.nn.Linear(8, 8).to("zion")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(3):
            model(torch.ones(4, 8, device="zion")).sum().backward()
            opt.step()
        os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of training
        for step in range(1000):
            opt.step()
    """)
    out, trace = tmp_path / "report.json", tmp_path / "trace.json"
    r = zion_emu_cli("run", "--report", str(out), "--trace", str(trace), str(script), check=False)
    assert r.returncode == 130
    assert "partial report" in r.stderr
    report = json.loads(out.read_text())
    assert report["iterations"] == 3
    assert report["status"]["ranks"]["0"]["exit"] == "interrupted"
    assert any(e.get("name") == "aten::addmm" for e in json.loads(trace.read_text())["traceEvents"])


@pytest.mark.slow
@pytest.mark.multiproc
def test_ctrl_c_on_a_two_rank_run_writes_the_partial_report_and_trace_and_leaves_no_process(tmp_path):
    """Ctrl-C as a terminal sends it: SIGINT to the foreground process group."""
    script = write(tmp_path, "loop.py", """
        import os, pathlib, torch, torch.distributed as dist
        dist.init_process_group("zion")
        rank = dist.get_rank()
        model = torch.nn.Linear(8, 8).to(f"zion:{rank}")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10**9):
            model(torch.ones(4, 8, device=f"zion:{rank}")).sum().backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
            (pathlib.Path(os.environ["PIDS"]) / str(os.getpid())).touch()
    """)
    pids = tmp_path / "pids"
    pids.mkdir()
    out, trace = tmp_path / "report.json", tmp_path / "trace.json"
    with started([PYTHON, "-m", "zion_emu", "run", "--nproc", "2", "--report", str(out), "--trace", str(trace),
                  str(script)], env=child_env(PIDS=str(pids)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True) as proc:
        deadline = time.monotonic() + 120
        while len(list(pids.iterdir())) < 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        os.killpg(proc.pid, signal.SIGINT)
        stdout, stderr = finish(proc, 120)
        rank_pids = [int(p.name) for p in pids.iterdir()]
        assert not [pid for pid in rank_pids if alive(pid)], "rank processes are still there"
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr, stderr
    assert "rank 0 interrupted" in stderr and "rank 1 interrupted" in stderr
    assert "(partial: the run was interrupted)" in stdout
    report = json.loads(out.read_text())
    assert report["status"]["interrupted"] and report["status"]["exit_code"] == 130
    assert {k: v["exit"] for k, v in report["status"]["ranks"].items()} == {"0": "interrupted", "1": "interrupted"}
    assert report["iterations"] >= 1
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("name") == "all_reduce" for e in events)


@pytest.mark.slow
def test_run_rejects_bad_arguments_clearly(tmp_path):
    r = zion_emu_cli("run", str(tmp_path / "missing.py"), check=False)
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "folder.py").mkdir()
    r = zion_emu_cli("run", str(tmp_path / "folder.py"), check=False)
    assert r.returncode == 2 and f"script '{tmp_path / 'folder.py'}' is a directory, not a file" in r.stderr
    script = write(tmp_path, "s.py", "print('hi')\n")
    r = zion_emu_cli("run", "--nproc", "9", str(script), check=False)
    assert r.returncode == 2 and "8" in r.stderr and "--nnodes" in r.stderr
    r = zion_emu_cli("run", "--set", "fabric.no_such_field=1", str(script), check=False)
    assert r.returncode == 2 and "no_such_field" in r.stderr


class Started(Exception):
    """The ranks would have started: every check passed."""


def _refusal(monkeypatch, capsys, *argv):
    """`zion-emu run ARGV` in this process, which must refuse before any rank
    starts; returns its one line on stderr."""
    def start(*_args, **_kwargs):
        raise Started

    monkeypatch.setattr(launcher, "start", start)
    assert main(["run", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zion-emu: error: "), err
    return err


@pytest.mark.parametrize("args, problem", [
    (["--report", "s.py"], "--report s.py is the same file as the script s.py"),
    (["--report", "same.json", "--trace", "same.json"], "--trace same.json is the same file as --report same.json"),
    (["--html", "link.py"], "--html link.py is the same file as the script s.py"),  # a symbolic link to it
    (["--plot", "hard.png"], "--plot hard.png is the same file as the script s.py"),  # a hard link to it
    (["--platform", "p.json", "--report", "p.json"], "--report p.json is the same file as --platform p.json"),
    # the file the platform file builds on (it was overwritten, breaking the platform file)
    (["--platform", "child.json", "--report", "p.json"],
     '--report p.json is the same file as the "base" of --platform p.json'),
])
def test_an_output_over_the_script_another_output_or_the_platform_file_is_refused_before_it_starts(
        tmp_path, monkeypatch, capsys, args, problem):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("print('never runs')\n")
    (tmp_path / "p.json").write_text('{"base": "zion"}')
    (tmp_path / "child.json").write_text('{"base": "p.json"}')
    (tmp_path / "link.py").symlink_to("s.py")
    os.link(tmp_path / "s.py", tmp_path / "hard.png")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    err = _refusal(monkeypatch, capsys, *args, "s.py")
    assert problem in err and "give " in err, err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_output_in_a_folder_that_does_not_exist_is_refused_before_it_starts(tmp_path, monkeypatch, capsys):
    """Found only after the run, it would lose the run's result."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("print('never runs')\n")
    err = _refusal(monkeypatch, capsys, "--report", "gone/r.json", "s.py")
    assert f"--report gone/r.json: folder {tmp_path / 'gone'} does not exist" in err, err


def test_an_output_over_the_zion_platform_file_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("print('never runs')\n")
    (tmp_path / "p.json").write_text('{"base": "zion"}')
    monkeypatch.setenv("ZION_PLATFORM", "p.json")
    assert "--trace p.json is the same file as $ZION_PLATFORM p.json" in _refusal(
        monkeypatch, capsys, "--trace", "p.json", "s.py")
    assert (tmp_path / "p.json").read_text() == '{"base": "zion"}'


@pytest.mark.parametrize("args, problem", [
    (["--nnodes", "0"], "--nnodes must be at least 1, got 0"),
    (["--nnodes", "abc"], "--nnodes: invalid int value: 'abc'"),
    (["--nnodes", "2:1"], "--nnodes: invalid int value: '2:1'"),
    (["--nnodes", "2", "--node-rank", "5", "--master-port", "29500"],
     "--node-rank 5 is not a node of --nnodes 2: give 0..1"),
    (["--node-rank", "-1"], "--node-rank -1 is not a node of --nnodes 1"),
    (["--nnodes", "3", "--set", "nodes=2"],
     r"--nnodes 3 needs 3 node\(s\), but platform 'zionex' has 2.*--set nodes=3"),
    (["--nnodes", "2"], "--nnodes 2 needs --master-port"),  # each node would pick a port of its own
    (["--master-port", "70000"], "--master-port must be a port number 1..65535, got 70000"),
])
def test_bad_node_options_are_refused_before_torchrun_waits_for_nodes(tmp_path, monkeypatch, capsys, args, problem):
    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    err = _refusal(monkeypatch, capsys, "--platform", "zionex", *args, str(script))
    assert re.search(problem, err), err


def test_a_bad_plot_format_is_refused_before_it_starts_and_nothing_is_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("print('never runs')\n")
    err = _refusal(monkeypatch, capsys, "--plot", "keep.xyz", "--html", "keep.html", "s.py")
    assert "unknown image format 'xyz'; use one of" in err and "png" in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.py"]


def test_one_node_of_a_multi_node_run_passes_the_checks_and_tells_torchrun_its_place(tmp_path, monkeypatch):
    script = tmp_path / "s.py"
    script.write_text("print('never runs')\n")
    commands = []

    def start(args, run_dir, stdout=None, world=None):
        commands.append(launcher.command(args, run_dir, world))
        raise Started

    monkeypatch.setattr(launcher, "start", start)
    with pytest.raises(Started):
        main(["run", "--platform", "zionex", "--nnodes", "16", "--node-rank", "15", "--master-port", "29511",
              "--report", str(tmp_path / "r.json"), "--plot", str(tmp_path / "u.png"), str(script)])
    assert {"--nnodes=16", "--node-rank=15", "--master-port=29511"} <= set(commands[0])


def test_sweep_values_split_at_top_level_commas():
    assert split_values("ring,fully_connected") == ["ring", "fully_connected"]
    assert split_values("[0,1],[2,3]") == ["[0,1]", "[2,3]"]
    assert variants(["a=1,2", "b=x,y"]) == [["a=1", "b=x"], ["a=1", "b=y"], ["a=2", "b=x"], ["a=2", "b=y"]]


def test_a_field_swept_twice_or_also_fixed_is_refused():
    # Both were merged into one row labelled with both values, run with the last.
    with pytest.raises(CliError, match=r"'a' is swept twice; give all its values in one --set a=V1,V2,..."):
        variants(["a=1", "a=2"])
    with pytest.raises(CliError, match=r"'a' is swept and also fixed by --fix"):
        variants(["a=1,2"], ["a=3"])


@pytest.mark.slow
@pytest.mark.multiproc
def test_sweep_compares_fabric_topologies(tmp_path):
    script = write(tmp_path, "ar.py", """
        import os, torch, torch.distributed as dist
        import zion_emu.distributed  # noqa: F401
        dist.init_process_group("zion")
        model = torch.nn.Linear(1024, 1024).to(f"zion:{int(os.environ['LOCAL_RANK'])}")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(4):
            for p in model.parameters():
                p.grad = torch.ones_like(p)
                dist.all_reduce(p.grad)
            opt.step()
        dist.destroy_process_group()
    """)
    out = tmp_path / "rows.json"
    r = zion_emu_cli("sweep", "--nproc", "4", "--set", "fabric.topology=fully_connected,ring", "--json", str(out),
                     str(script), timeout_s=300)
    assert "fabric.topology=ring" in r.stdout and "ms/iter" in r.stdout
    rows = json.loads(out.read_text())
    assert [row["variant"] for row in rows] == [["fabric.topology=fully_connected"], ["fabric.topology=ring"]]
    # On a ring, 4 ranks' all-reduces cross more hops than on a fully connected fabric.
    assert rows[1]["iteration_s"] > rows[0]["iteration_s"]


def _losses(text):
    return [line.split("loss=")[1].split()[0] for line in text.splitlines() if line.startswith("iter=")]


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, pytest.param(2, marks=pytest.mark.multiproc)])
def test_a_script_written_for_cuda_runs_unmodified_under_cuda_compat(nproc):
    script = str(REPO / "examples" / "cuda_dlrm_reference_style.py")
    args = ["--num-batches", "3", "--mini-batch-size", "16"]
    zion = zion_emu_cli("run", "--nproc", str(nproc), "--cuda-compat", script, "--use-gpu", *args, timeout_s=300)
    cpu = run([PYTHON, script, *args] if nproc == 1 else torchrun(2, script, *args), timeout_s=300, check=True)
    assert _losses(zion.stdout) == _losses(cpu.stdout) and len(_losses(cpu.stdout)) == 3
    remapped = zion.stdout.split("--cuda-compat remapped: ")[1]
    for name in ("Module.cuda", "torch.cuda.is_available", "torch.cuda.synchronize", "torch.device('cuda')"):
        assert f"{name} x" in remapped, remapped
    if nproc == 2:
        assert "init_process_group(backend='nccl') x" in remapped, remapped


@pytest.mark.slow
def test_virtual_clock_makes_the_scripts_own_timing_modeled(tmp_path):
    script = write(tmp_path, "timed.py", """
        import time, torch
        a, b = torch.randn(1024, 2048, device="zion"), torch.randn(2048, 512, device="zion")
        torch.zion.synchronize()
        t0 = time.perf_counter()
        c = a @ b
        torch.zion.synchronize()
        print("elapsed", repr(time.perf_counter() - t0))
    """)
    r = zion_emu_cli("run", "--virtual-clock", "--quiet-report", str(script))
    elapsed = float(r.stdout.split("elapsed")[1].split()[0])
    # zion preset: 15 TFLOP/s fp32 x matmul efficiency 0.6, 5 us launch
    assert elapsed == pytest.approx(2 * 1024 * 2048 * 512 / (15e12 * 0.6) + 5e-6, rel=1e-9)


@pytest.mark.slow
def test_a_script_that_sets_another_platform_than_the_runs_is_warned(tmp_path):
    script = write(tmp_path, "s.py", """
        import sys, zion_emu
        zion_emu.set_platform(sys.argv[1])
        print("platform", zion_emu.current_platform().name)
    """)
    same = zion_emu_cli("run", "--platform", "zion", str(script), "zion")
    assert "platform zion" in same.stdout and "set_platform replaces" not in same.stderr
    other = zion_emu_cli("run", "--platform", "zion", "--set", "fabric.link_bandwidth_gb_per_s=50", str(script), "zion")
    assert "platform zion" in other.stdout
    assert ("set_platform replaces the platform `zion-emu run` chose ('zion', from its --platform and --set) with "
            "'zion'") in other.stderr


def test_a_script_that_sets_its_platform_keeps_the_reports_breakdown_and_trace(tmp_path):
    # The new platform's timeline recorded no spans: the report lost "where the time goes" and the trace
    # had no stream events.
    import json

    script = write(tmp_path, "s.py", """
        import torch, zion_emu
        zion_emu.set_platform("hgx-a100")
        a = torch.ones(512, 512, device="zion")
        for _ in range(3):
            (a @ a).sum().item()
    """)
    trace, report = tmp_path / "t.json", tmp_path / "r.json"
    r = zion_emu_cli("run", "--trace", str(trace), "--report", str(report), str(script))
    assert "where the time goes" in r.stdout
    data = json.loads(report.read_text())
    assert data["platform"] == "hgx-a100" and data["breakdown"] is not None
    assert data["breakdown"]["compute_s"] > 0
    events = json.loads(trace.read_text())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(1 for e in events if e.get("ph") == "X" and "mm" in e.get("name", "")) >= 3


@pytest.mark.slow
def test_output_files_are_written_when_the_reader_of_stdout_has_gone(tmp_path):
    # `zion-emu run ... | head -2`: the report's print met a closed pipe, and
    # the command returned 0 before writing its files.
    script = write(tmp_path, "s.py", """
        import torch
        x = torch.ones(3, device="zion")
        print((x * 2).sum().item())
    """)
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    argv = [PYTHON, "-m", "zion_emu", "run", "--report", str(out), "--html", str(html), str(script)]
    with started(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                 env=child_env(PYTHONUNBUFFERED="1")) as proc:
        assert proc.stdout.readline()  # the script's line
        proc.stdout.close()  # as `head -1` exits
        _, err = finish(proc, 120)
    assert proc.returncode == 0, err
    assert json.loads(out.read_text())["iterations"] == 0
    assert html.read_text().startswith("<!DOCTYPE html>")
    assert "Traceback" not in err



@pytest.mark.slow
@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_run_started_with_stdout_or_stderr_closed_writes_its_report_and_exits_0(tmp_path, closed):
    # `zion-emu run ... >&-`: flushing the closed stdout before forking
    # torchrun's agent raised AttributeError on None; with stderr closed,
    # the "wrote the report" line raised EBADF and the run exited 1.
    script = write(tmp_path, "s.py", """
        import torch
        print((torch.ones(3, device="zion") * 2).sum().item())
    """)
    out = tmp_path / "r.json"
    redirect = ">&-" if closed == "stdout" else "2>&-"
    argv = ["bash", "-c", f'exec "$@" {redirect}', "bash",
            PYTHON, "-m", "zion_emu", "run", "--nproc", "2", "--report", str(out), str(script)]
    with started(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        printed, err = finish(proc, 120)
    assert proc.returncode == 0, err
    assert json.loads(out.read_text())["ranks"] == 2
    if closed == "stdout":
        assert "Traceback" not in err and "zion-emu: wrote the report" in err
    else:
        assert "== zion-emu report" in printed

def test_a_scripts_own_options_are_never_read_as_abbreviations_of_runs(tmp_path):
    # `--n 2` was "ambiguous option: --n could match --nproc, --nnodes, --node-rank".
    script = write(tmp_path, "s.py", """
        import sys
        print("argv", sys.argv[1:])
    """)
    done = zion_emu_cli("run", str(script), "--n", "2", "--s", "1", "--h")
    assert "argv ['--n', '2', '--s', '1', '--h']" in done.stdout
    sweep = zion_emu_cli("sweep", "--set", "oam.launch_overhead_ns=5000", str(script), "--n", "2")
    assert "oam.launch_overhead_ns=5000" in sweep.stdout  # its one variant ran (the script's output is not shown)


@pytest.mark.slow
def test_sigterm_to_run_writes_the_partial_report_and_leaves_nothing_behind(tmp_path):
    # `kill PID` or a scheduler's stop: run died at once, with no report, and
    # left its run folder (platform and options files) in $TMPDIR.
    script = write(tmp_path, "loop.py", """
        import os, pathlib, torch
        model = torch.nn.Linear(8, 8).to("zion")
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(10**9):
            model(torch.ones(4, 8, device="zion")).sum().backward()
            opt.step()
            (pathlib.Path(os.environ["PIDS"]) / str(os.getpid())).touch()
    """)
    pids, tmp = tmp_path / "pids", tmp_path / "tmp"
    pids.mkdir()
    tmp.mkdir()
    out = tmp_path / "report.json"
    with started([PYTHON, "-m", "zion_emu", "run", "--report", str(out), str(script)],
                 env=child_env(PIDS=str(pids), TMPDIR=str(tmp)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                 text=True) as proc:
        deadline = time.monotonic() + 120
        while not list(pids.iterdir()) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()
        os.kill(proc.pid, signal.SIGTERM)  # the run's own process, not its group
        stdout, stderr = finish(proc, 120)
        assert not [p for p in pids.iterdir() if alive(int(p.name))], "the rank is still there"
    assert proc.returncode == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr, stderr
    report = json.loads(out.read_text())
    assert report["status"]["interrupted"] and report["status"]["exit_code"] == 143
    assert report["iterations"] >= 1
    assert not list(tmp.glob("zion-run-*"))


def test_a_script_that_fails_before_running_anything_modeled_prints_no_report_of_zeros(tmp_path):
    # A script's own argument error was followed by "modeled wall time 0.0 us ... spans were not recorded".
    early = write(tmp_path, "early.py", """
        import sys
        sys.exit(2)
    """)
    r = zion_emu_cli("run", str(early), check=False)
    assert r.returncode == 2, r.stderr
    assert "zion-emu: the script exited with code 2 before anything ran on the modeled platform" in r.stderr
    assert "zion-emu report" not in r.stdout
    late = write(tmp_path, "late.py", """
        import sys, torch
        (torch.ones(4, device="zion") * 2).sum().item()
        sys.exit(2)
    """)
    r = zion_emu_cli("run", str(late), check=False)
    assert r.returncode == 2 and "== zion-emu report: platform zion, 1 rank(s) ==" in r.stdout, r.stderr


@pytest.mark.slow
@pytest.mark.multiproc
def test_when_one_rank_fails_the_others_report_and_the_run_exits_with_its_code(tmp_path):
    # torchrun stops the other ranks with SIGTERM: rank 0 died without a report
    # (the header said 1 rank, nothing said which was missing), the exit code
    # was 1 and torchrun's ChildFailedError traceback was printed.
    script = write(tmp_path, "fails.py", """
        import sys, time, torch, torch.distributed as dist
        dist.init_process_group("zion")
        rank = dist.get_rank()
        x = torch.ones(4, device=f"zion:{rank}")
        dist.all_reduce(x)
        if rank == 1:
            sys.exit(3)
        for _ in range(600):
            time.sleep(0.05)
            (x * 2).sum()
    """)
    out = tmp_path / "report.json"
    r = zion_emu_cli("run", "--nproc", "2", "--report", str(out), str(script), check=False)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "ChildFailedError" not in r.stderr, r.stderr
    assert "zion-emu: rank 1 failed with exit code 3" in r.stderr
    assert "rank 0 stopped by SIGTERM" in r.stderr
    ranks = json.loads(out.read_text())["status"]["ranks"]
    assert ranks == {"0": {"exit": "terminated", "code": 143}, "1": {"exit": "sys.exit", "code": 3}}
    assert "platform zion, 2 rank(s)" in r.stdout
