"""benchmarks/gpu_campaign.py, the one device call that runs on a GPU machine: its CPU rehearsal
runs the one device call's phases in the same order at toy size (so the campaign cannot rot between
GPU runs), the whole visit fits its device time with the headline rows first, its pins are the
tested environment's, its DALI parts survive the trip, and a phase cut at its budget is killed,
keeps the rows it finished and the campaign goes on."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "gpu_campaign.py"


@pytest.fixture(scope="module")
def campaign() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_campaign", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_campaign"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def _pin(spec: str) -> tuple[str, str]:
    name, version = spec.split("==")
    return name, version


def test_pins_are_the_versions_this_environment_is_tested_with(campaign: ModuleType) -> None:
    """The wheels carried to the GPU machine are the ones the suite runs with here."""
    for spec in (*campaign.BASE_WHEELS, *campaign.SDIST_WHEELS, *campaign.DALI_WHEELS):
        name, version = _pin(spec)
        assert importlib.metadata.version(name) == version, f"{spec}: this venv has {importlib.metadata.version(name)}"
    dali_needs = {re.split(r"[<>=~!\[; ]", r)[0].lower() for r in importlib.metadata.requires("nvidia-dali-cuda130")}
    carried = {_pin(s)[0].lower() for s in campaign.DALI_WHEELS}
    on_the_machine = {"six", "packaging", "numpy"}  # the machine's image has them (device KINDS.md)
    assert dali_needs <= carried | on_the_machine, dali_needs - carried - on_the_machine


def _tree_mib() -> float:
    """The working tree a device call carries: tracked and untracked files git does not ignore."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                           check=True).stdout.decode().split("\0")
    return sum((REPO / n).stat().st_size for n in names if n and (REPO / n).is_file()) / 2**20


def test_the_whole_visit_fits_fifteen_minutes_of_device_time(campaign: ModuleType) -> None:
    """One call: its phases sum within the call's limit (<= 9 minutes, the install included), and
    the visit (the machine's start + the call + carrying the tree and the wheels) within 13 minutes."""
    assert campaign.CALL_LIMIT_S <= 540
    assert campaign.plan_s() <= campaign.CALL_LIMIT_S - campaign.CALL_MARGIN_S, campaign.plan_s()
    assert _tree_mib() <= campaign.TREE_MIB, f"the tree is {_tree_mib():.1f} MiB: raise TREE_MIB and check the visit"
    carried = campaign.carried_mib()
    assert carried <= campaign.CARRY_MIB
    assert campaign.visit_s(carried) <= campaign.VISIT_LIMIT_S <= 13 * 60, campaign.plan_table(carried)
    assert campaign.PART_MIB + 4 <= campaign.CARRY_MIB  # a DALI part, the manifest and the working tree


def test_the_docstring_and_the_plan_printout_state_the_plan_the_campaign_runs(campaign: ModuleType,
                                                                            capsys: pytest.CaptureFixture) -> None:
    """The module docstring and ``plan`` name each phase with its budget, the call's total and the visit's
    (benchmarks/README.md's copy: test_the_readme_table_is_the_plan)."""
    doc = " ".join(campaign.__doc__.split())
    assert campaign.main(["plan"]) == 0
    printed = capsys.readouterr().out
    for phase in campaign.PLAN:
        assert f"{phase.name} {phase.gpu_s:.0f}" in doc, phase.name
        assert f"| {phase.name} | {phase.gpu_s:.0f} |" in printed, phase.name
    total, visit = f"{campaign.plan_s():.0f}", f"{campaign.visit_s(campaign.carried_mib()):.0f}"
    assert f"{total} s together" in doc and f"**{total}**" in printed
    assert f"~{visit} s" in doc and f"= {visit} s" in printed
    assert f"{campaign.CALL_LIMIT_S} s" in doc and "--part" not in doc


def test_the_call_runs_what_issue_86_asks_in_its_order(campaign: ModuleType, tmp_path: Path) -> None:
    """After what everything needs (versions, install, JPEGs): the no-sync test alone, the loader rows, the
    compiled rows, CUDA graphs, LAMB old and new, one rank under torchrun, then the tests and DALI. No
    step's own cap or minimum exceeds its phase's budget; the tests' planned groups sum within theirs."""
    names = [p.name for p in campaign.PLAN]
    assert names == ["env", "install", "data", "no-host-sync", "loader", "compiled", "cuda-graphs", "optimizer",
                     "ranks", "tests", "dali"]
    c = campaign.Campaign(out=tmp_path / "out", rehearse=False, work=tmp_path / "work")
    (tmp_path / "out").mkdir()
    for phase in campaign.PLAN:
        for step in phase.steps(c, phase.gpu_s):
            if phase.name in campaign.SPARE_PHASES and step.min_s > phase.gpu_s:
                continue  # the CLI trainings, DALI: only on the seconds earlier phases left
            assert (step.budget_s or 0) <= phase.gpu_s and step.min_s <= phase.gpu_s, step.label
            if "--budget-s" in step.argv:  # throughput.py reports its left-out rows before the phase is cut
                assert float(step.argv[step.argv.index("--budget-s") + 1]) < phase.gpu_s, phase.name
    groups = campaign.suite_groups()
    assert sum(g.budget_s for g in groups if g.budget_s is not None) <= campaign.PHASES["tests"].gpu_s
    assert all(g.test_limit_s <= (g.budget_s or g.min_s or 1e9) for g in groups)
    # the rehearsal collects the gpu unit tests from the files that mark them, not the whole
    # suite: the same selection arguments, no file the group ignores
    real, rehearsed = groups[1], campaign.rehearsal_group(groups[1])
    files = [a for i, a in enumerate(rehearsed.args) if a.endswith(".py") and rehearsed.args[i - 1] != "--ignore"]
    assert "tests" in real.args and "tests" not in rehearsed.args and set(real.args) - {"tests"} <= set(rehearsed.args)
    assert files and all((REPO / f).is_file() for f in files) and "tests/gpu/test_cuda_training.py" not in files


def _value(argv: list[str], flag: str, n: int = 1) -> list[str]:
    i = argv.index(flag)
    return argv[i + 1 : i + 1 + n]


def _steps(campaign: ModuleType, tmp_path: Path, name: str) -> list:
    c = campaign.Campaign(out=tmp_path / "out", rehearse=False, work=tmp_path / "work")
    return campaign.PHASES[name].steps(c, campaign.PHASES[name].gpu_s)


def test_each_phase_runs_the_command_line_the_gpu_needs(campaign: ModuleType, tmp_path: Path) -> None:
    """Each phase's command on the GPU machine, argument by argument: the JPEG set holds a row's steps in
    one epoch, the no-sync test runs alone with its output kept, the loader rows have no model, one
    compiled model sees synthetic data first, CUDA graphs, LAMB's old layout, one rank under torchrun."""
    (data,) = _steps(campaign, tmp_path, "data")
    files, distinct, classes = (int(_value(data.argv, f)[0]) for f in ("--files", "--distinct", "--classes"))
    per_class = -(-files // classes)
    assert (files, distinct) == (20480, 6144) and per_class * classes // 256 >= 80
    assert -(-distinct // classes) * classes <= 7000  # written as the 6,144-file phase wrote them (its 30 s)
    (alone,) = _steps(campaign, tmp_path, "no-host-sync")
    assert alone.keep_output and alone.argv[1:3] == ["-m", "pytest"]
    assert [a for a in alone.argv if a.startswith("tests")] == ["tests/test_no_host_sync.py"] and "gpu" not in alone.argv
    (loader,) = _steps(campaign, tmp_path, "loader")
    assert loader.argv[1].endswith("throughput.py") and "--no-train-rows" in loader.argv
    assert "--no-loader-rows" not in loader.argv
    assert _value(loader.argv, "--data", 2) == ["nvjpeg-serial", "nvjpeg"] and "--no-decode" in loader.argv
    for name, datas, mode, min_s in (("compiled", ["synthetic", "nvjpeg-serial", "nvjpeg"], "default", 60),
                                     ("cuda-graphs", ["synthetic", "nvjpeg"], "reduce-overhead", 60)):
        (train,) = _steps(campaign, tmp_path, name)
        assert train.argv[1].endswith("throughput.py") and "--no-loader-rows" in train.argv and train.min_s >= min_s
        assert _value(train.argv, "--data", len(datas) + 1) == [*datas, "--compile"]
        assert _value(train.argv, "--compile") == [mode] and not train.env
    for step in (loader, train):
        assert _value(step.argv, "--model") == ["resnet50"] and _value(step.argv, "--batch") == ["256"]
        assert _value(step.argv, "--precisions") == ["bf16"] and _value(step.argv, "--layouts") == ["NHWC"]
        assert int(_value(step.argv, "--warmup")[0]) + int(_value(step.argv, "--steps")[0]) < 80
    (opt,) = _steps(campaign, tmp_path, "optimizer")
    assert opt.argv[1].endswith("optimizer_step.py") and _value(opt.argv, "--device") == ["cuda"]
    (ranks,) = _steps(campaign, tmp_path, "ranks")
    assert ranks.argv[0].endswith("launch/torchrun.sh") and ranks.env["NPROC_PER_NODE"] == "1"
    assert {"backend=cuda", "comm=hierarchical", "bn=global"} <= set(ranks.argv)


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("rehearse", [False, True], ids=["device-call", "rehearsal"])
def test_every_command_line_parses_and_names_what_the_checkout_has(campaign: ModuleType, tmp_path: Path,
                                                                   rehearse: bool) -> None:
    """What the rehearsal no longer runs is still checked here, for the GPU's command lines and the
    rehearsal's: each benchmark's arguments parse with that script's own parser, every script, test
    file and test a step names exists, and the ranks phase's overrides compose (a mistyped group or
    key fails). A step the rehearsal does not run says why."""
    from largebatch.config import compose_config, to_train_config

    parsers = {"throughput.py": _script("throughput").argument_parser(),
               "optimizer_step.py": _script("optimizer_step").argument_parser()}
    c = campaign.Campaign(out=tmp_path / "out", rehearse=rehearse, work=tmp_path / "work")
    (tmp_path / "out").mkdir()
    scripts = set()
    for phase in campaign.PLAN:
        for step in phase.steps(c, phase.rehearse_s if rehearse else phase.gpu_s):
            assert campaign.missing_files(step.argv) == [], step.label
            assert (step.not_rehearsed == "" or rehearse) and "\n" not in step.not_rehearsed, step.label
            name = Path(step.argv[1]).name if len(step.argv) > 1 else ""
            if name in parsers:
                parsers[name].parse_args(step.argv[2:])  # SystemExit (2) on an argument it does not take
                scripts.add(name)
            if step.argv[0].endswith("launch/torchrun.sh"):
                overrides = [a for a in step.argv[1:] if a != "--dry-run"]
                cfg = to_train_config(compose_config(overrides))
                assert (cfg.backend.name, cfg.comm.algorithm) == ("cpu" if rehearse else "cuda", "hierarchical")
    assert scripts == set(parsers)
    # the check itself: a renamed test or a moved script is named
    assert campaign.missing_files(["tests/gpu/test_nvjpeg_gpu.py::test_renamed", f"{REPO}/benchmarks/moved.py",
                                   "tests/test_no_host_sync.py", "/tmp/elsewhere"]) == [
        "tests/gpu/test_nvjpeg_gpu.py::test_renamed", f"{REPO}/benchmarks/moved.py"]


def test_the_readme_table_is_the_plan(campaign: ModuleType) -> None:
    """benchmarks/README.md's "What it runs" lists PLAN's phases in order with their GPU budgets, the
    call's total and the visit's arithmetic (887da4b changed the plan and left the old table there)."""
    text = (REPO / "benchmarks" / "README.md").read_text()
    section = text.split("#### What it runs", 1)[1].split("\n#", 1)[0]
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| phase")]
    assert [(r[0], r[1]) for r in rows[:-1]] == [(p.name, f"{p.gpu_s:.0f}") for p in campaign.PLAN]
    assert rows[-1][:2] == ["**the call**", f"**{campaign.plan_s():.0f}**"]
    visit = " ".join(section.split())
    assert f"{campaign.CALL_LIMIT_S} s" in visit and f"~{campaign.visit_s(campaign.carried_mib()):.0f} s" in visit
    assert f"{campaign.START_ALLOWANCE_S} s" in visit


def test_the_optimizer_table_times_lamb_on_its_old_layout_beside_the_new(monkeypatch: pytest.MonkeyPatch) -> None:
    """optimizer_step.py's 'LAMB e1b6366 layout' row is our LAMB taking its per-tensor bias corrections
    every step (the layout issue 86 measured at 2.15x), the 'largebatch LAMB' row one per group."""
    spec = importlib.util.spec_from_file_location("optimizer_step", REPO / "benchmarks" / "optimizer_step.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    from largebatch.optim import lamb as lamb_module

    seen: list[bool] = []
    real = lamb_module._bias_corrections
    monkeypatch.setattr(lamb_module, "_bias_corrections", lambda *a: (seen.append(a[-1]), real(*a))[1])
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    for name, equal in (("largebatch LAMB", True), ("LAMB e1b6366 layout", False)):
        family, build = bench.CANDIDATES[name]
        opt = build(bench.param_groups(model, 0.01), True)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        seen.clear()
        opt.step()
        opt.step()
        assert family == "lamb" and isinstance(opt, bench.LAMB) and seen and set(seen) == {equal}, (name, seen)


def test_a_step_that_cannot_finish_in_what_is_left_is_not_started(
    campaign: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    big = campaign.Step("a compile that needs a minute", ["sleep", "60"], min_s=60)
    quick = campaign.Step("echo", ["echo", "| train | a row | 1 |"])
    monkeypatch.setattr(campaign, "PHASES", {"p": campaign.Phase("p", 5, 5, lambda c, _: [big, quick], "rows")})
    t0 = time.monotonic()
    rc = campaign.run(campaign.Campaign(out=tmp_path / "out", rehearse=False, work=tmp_path / "work"), ["p"])
    summary = (tmp_path / "out" / "campaign.md").read_text()
    assert rc == 0 and time.monotonic() - t0 < 10
    assert "not started: a compile that needs a minute" in summary and "needs 60 s" in summary
    assert "## rows" in summary and "| train | a row | 1 |" in summary


def test_a_step_that_keeps_its_output_has_every_line_in_the_summary(
    campaign: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The no-sync test's phase: all it printed, not only table rows, in campaign.md and on stdout."""
    talk = campaign.Step("pytest alone", ["sh", "-c", "echo 'FAILED test_x - RuntimeError: sync'; echo '1 failed'"],
                         keep_output=True)
    monkeypatch.setattr(campaign, "PHASES", {"p": campaign.Phase("p", 5, 5, lambda c, _: [talk], "alone")})
    rc = campaign.run(campaign.Campaign(out=tmp_path / "out", rehearse=True, work=tmp_path / "work"), ["p"])
    summary = (tmp_path / "out" / "campaign.md").read_text()
    assert rc == 0 and "## alone\n\n```\n$ sh -c echo" in summary
    assert "\nFAILED test_x - RuntimeError: sync\n1 failed\n```" in summary


def test_dali_parts_are_staged_one_call_at_a_time_and_checked(campaign: ModuleType, tmp_path: Path) -> None:
    wheels = []
    for i, size in enumerate((5000, 12000, 300)):
        wheel = tmp_path / f"pkg{i}-1.0-py3-none-any.whl"
        wheel.write_bytes(os.urandom(size))
        wheels.append(wheel)
    carried = tmp_path / "carried"
    manifest = campaign.split_bundle(wheels, carried, part_bytes=4096)
    parts = sorted(carried.glob("part-*"))
    assert len(parts) == len(manifest["parts"]) >= 4 and all(p.stat().st_size <= 4096 for p in parts)
    stage, into = tmp_path / "stage", tmp_path / "unpacked"
    # each call carries the manifest and one part; the machine keeps what earlier calls brought
    for i, part in enumerate(parts):
        one = tmp_path / f"call{i}"
        one.mkdir()
        (one / "manifest.json").write_bytes((carried / "manifest.json").read_bytes())
        (one / part.name).write_bytes(part.read_bytes())
        assert campaign.stage_parts(one, stage) == (i + 1, len(parts))
        if i < len(parts) - 1:
            assert campaign.join_bundle(stage, into) is None  # not every part yet
    joined = campaign.join_bundle(stage, into)
    assert [p.name for p in joined] == sorted(w.name for w in wheels)
    assert all(p.read_bytes() == w.read_bytes() for p, w in zip(joined, sorted(wheels)))
    # a part damaged in transfer is refused, in one line
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "manifest.json").write_bytes((carried / "manifest.json").read_bytes())
    (bad / parts[0].name).write_bytes(b"x" + parts[0].read_bytes()[1:])
    with pytest.raises(SystemExit, match="does not match its manifest"):
        campaign.stage_parts(bad, stage)


def test_a_phase_cut_at_its_budget_is_killed_and_the_campaign_goes_on(
    campaign: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pid_file = tmp_path / "child.pid"
    slow = campaign.Step("a step that outlives its phase",
                         ["sh", "-c", f"sleep 60 & echo $! > {pid_file}; wait"])
    quick = campaign.Step("echo", ["echo", "largebatch: best val top-1 12.50% (epoch 1)"])
    phases = {"slow": campaign.Phase("slow", 2, 2, lambda c, _: [slow, quick]),
              "next": campaign.Phase("next", 5, 5, lambda c, _: [quick])}
    monkeypatch.setattr(campaign, "PHASES", phases)
    t0 = time.monotonic()
    rc = campaign.run(campaign.Campaign(out=tmp_path / "out", rehearse=True, work=tmp_path / "work"), ["slow", "next"])
    assert rc == 1 and time.monotonic() - t0 < 30
    summary = (tmp_path / "out" / "campaign.md").read_text()
    assert "| slow | 2 | cut at budget |" in summary and "not started: echo" in summary
    assert "| next | 5 | ok |" in summary and "- largebatch: best val top-1 12.50% (epoch 1)" in summary
    child = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # the step's whole process group went with it
        for _ in range(50):
            os.kill(child, 0)
            time.sleep(0.1)


KILLED_DRIVER = """
import sys
from pathlib import Path
sys.path.insert(0, {bench!r})
import gpu_campaign as g
row = g.Step("a finished row", ["echo", "| train | resnet50 synthetic bf16 | 3,977 |"])
hang = g.Step("a compile that hangs", ["sleep", "60"])
g.PHASES = {{"train-eager": g.Phase("train-eager", 100, 100, lambda c, _: [row, hang], "headline")}}
g.run(g.Campaign(out=Path({out!r}), rehearse=True, work=Path({work!r})), ["train-eager"])
"""


def test_a_call_killed_mid_phase_keeps_the_rows_it_finished(tmp_path: Path) -> None:
    """The device call's own limit SIGKILLs the campaign inside a phase: the row measured before
    the kill is already in campaign.md and was printed."""
    out = tmp_path / "out"
    code = KILLED_DRIVER.format(bench=str(SCRIPT.parent), out=str(out), work=str(tmp_path / "work"))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        for _ in range(200):
            if (out / "campaign.md").exists() and "3,977" in (out / "campaign.md").read_text():
                break
            time.sleep(0.1)
    finally:
        os.killpg(proc.pid, 9)
        printed = proc.communicate()[0]
    summary = (out / "campaign.md").read_text()
    assert "## headline" in summary and "| train | resnet50 synthetic bf16 | 3,977 |" in summary
    assert "| train | resnet50 synthetic bf16 | 3,977 |" in printed


DEMO_TESTS = """
import time

def test_quick():
    pass

def test_broken():
    assert 1 == 2, "one is not two"

def test_slow():
    time.sleep(60)

def test_after():
    pass
"""


def _tests_phase(campaign: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, budget_s: float,
                 test_limit_s: float) -> tuple[int, str]:
    """The campaign's tests phase (real pytest calls with the campaign's plugin) over a file of four tests."""
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "test_demo.py").write_text(DEMO_TESTS)
    # test ids relative to the demo folder (a clone under /tmp made them tmp-relative otherwise)
    group = campaign.SuiteGroup("demo group", (f"--rootdir={tmp_path / 'demo'}", str(tmp_path / "demo" / "test_demo.py")),
                                budget_s, test_limit_s)
    phases = {"tests": campaign.Phase("tests", budget_s, budget_s,
                                      lambda c, _: [campaign.group_step(c, group, c.out / campaign.TEST_RESULTS)])}
    monkeypatch.setattr(campaign, "PHASES", phases)
    rc = campaign.run(campaign.Campaign(out=tmp_path / "out", rehearse=True, work=tmp_path / "work"), ["tests"])
    return rc, (tmp_path / "out" / "campaign.md").read_text()


def test_a_tests_phase_cut_mid_way_still_reports_what_ran(
    campaign: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pytest is SIGKILLed in test_slow (no JUnit XML, no summary line): campaign.md still lists
    the tests that ended before the cut, names the test the cut came in and those never started."""
    t0 = time.monotonic()
    rc, summary = _tests_phase(campaign, tmp_path, monkeypatch, budget_s=8, test_limit_s=0)
    assert rc == 1 and time.monotonic() - t0 < 30
    assert "| tests | 8 | cut at budget |" in summary and "cut: demo group" in summary
    assert "- demo group: 1 failed, 1 passed; cut during test_demo.py::test_slow; 1 never started" in summary
    assert "  - passed: test_demo.py::test_quick" in summary
    assert "  - failed: test_demo.py::test_broken: AssertionError: one is not two" in summary
    assert "  - never started: test_demo.py::test_after" in summary


def test_a_test_over_the_per_test_limit_fails_and_the_group_goes_on(
    campaign: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rc, summary = _tests_phase(campaign, tmp_path, monkeypatch, budget_s=60, test_limit_s=2)
    assert rc == 1 and "| tests | 60 | failed: demo group (exit 1) |" in summary
    assert "- demo group: 2 failed, 2 passed\n" in summary
    assert "  - failed: test_demo.py::test_slow: over the campaign's per-test limit of 2 s" in summary
    assert "  - passed: test_demo.py::test_after" in summary


@pytest.mark.slow
def test_the_rehearsal_runs_every_phase_on_the_cpu(campaign: ModuleType, tmp_path: Path) -> None:
    """The one call, in the GPU's phase order, at toy size (under a minute, issue 86 item 6): the
    versions; the wheels download, build and install offline; the DALI pins resolve; the JPEGs; the
    loader rows (no model); the optimizer step with LAMB's old layout; torchrun's command for one
    rank; the gpu unit tests collect (and skip here). The no-sync test alone, the compiled rows, the
    optimizer suite and the CLI trainings are logged with why not here; CUDA graphs and DALI skip."""
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run([sys.executable, str(SCRIPT), "run", "--rehearse", "--out", str(out), "--work", str(work)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")})
    summary = (out / "campaign.md").read_text()
    assert proc.returncode == 0, summary + (out / "campaign.log").read_text()[-4000:]
    status = {"cuda-graphs": "skipped", "dali": "skipped", "no-host-sync": "not rehearsed", "compiled": "not rehearsed"}
    for phase in campaign.PLAN:  # the one call's phases, in the GPU's order
        assert f"| {phase.name} | {phase.rehearse_s:.0f} | {status.get(phase.name, 'ok')} |" in summary, phase.name
    phase_table = summary.split("\n## ")[0]  # the rows of the phases, before each phase's own rows
    assert [line.split("|")[1].strip() for line in phase_table.splitlines() if line.startswith("| ") and
            line.split("|")[1].strip() in campaign.PHASES] == [p.name for p in campaign.PLAN]
    assert "CPU rehearsal" in summary and "no CUDA device" in summary
    # each step not run here: its command in the log, the reason in one line
    log = (out / "campaign.log").read_text()
    not_run = re.findall(r"^\$ (.*)\n\[gpu_campaign: not run in the rehearsal: .+\]$", log, re.MULTILINE)
    assert len(not_run) == 5 and sum("tests/test_no_host_sync.py" in line for line in not_run) == 1
    assert sum("--no-loader-rows" in line for line in not_run) == 1 and "launch/torchrun.sh --dry-run" in log
    # the wheels: the carried set fits one call and installs offline into a target
    wheels = sorted(p.name.split("-")[0].lower() for p in (work / "wheels").glob("*.whl"))
    assert wheels == ["antlr4_python3_runtime", "hydra_core", "omegaconf"]
    assert sum(p.stat().st_size for p in (work / "wheels").glob("*.whl")) < 8 * 2**20
    report = json.loads((work / "dali-resolve.json").read_text())
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert resolved == {_pin(s)[0].lower(): _pin(s)[1] for s in campaign.DALI_WHEELS}
    assert (work / "prefix" / "bin" / "largebatch-train").exists()
    # the tests: the gpu unit tests, from the files that mark them, every one recorded (skipped here),
    # the no-sync test's among them; none of the CLI trainings
    records = [json.loads(line) for line in (out / "tests.jsonl").read_text().splitlines()]
    collected = {r["group"]: r["tests"] for r in records if r["event"] == "collected"}
    assert list(collected) == ["gpu unit tests"] and len(collected["gpu unit tests"]) >= 10
    gpu = collected["gpu unit tests"]
    assert any(t.startswith("tests/test_no_host_sync.py::") for t in gpu)
    assert not any("test_compiled_training" in t or "test_cuda_training.py" in t for t in gpu)
    results = {r["test"]: r["outcome"] for r in records if r["event"] == "result"}
    assert sorted(results) == sorted(gpu) and set(results.values()) == {"skipped"}
    # the loader rows (no model), no train row
    table = (out / "throughput.md").read_text()
    for row in ("loader | nvjpeg-serial fp32 NHWC, no model", "loader | nvjpeg fp32 NHWC, no model"):
        assert f"| {row}" in table, row
    assert "| train |" not in table and "| decode |" not in table
    # the optimizer step alone, with its peers and LAMB's old layout from the same run
    for name in ("torch SGD", "largebatch LARS", "torch AdamW", "largebatch LAMB", "LAMB e1b6366 layout", "timm Lars"):
        assert f"| {name} | " in table
    assert "largebatch LAMB     / LAMB e1b6366 layout" in summary
