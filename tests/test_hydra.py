"""Hydra the way its users use it: --cfg, --help, hydra.run.dir / hydra.sweep.dir, multirun
(one run directory per job, a summary table), and the submitit launcher's local executor."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import yaml

from largebatch.cli import main
from largebatch.multirun import summary_table

CONF = Path(__file__).resolve().parents[1] / "conf"
# Two evaluated epochs' worth of nothing: 4 classes x 32 images, 1 epoch of 4 steps.
TINY = ["debug=smoke", "progress=false", "tensorboard=false", "epochs=1", "data.workers=0", "backend=cpu"]


@pytest.fixture()
def cache(cache: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """tests/conftest.py's, and the working directory in it."""
    monkeypatch.chdir(cache)  # Hydra's defaults must not write into the repository
    return cache


def _one_line_error(capsys: pytest.CaptureFixture) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err, err
    return err


def test_cfg_job_prints_the_composed_config_and_runs_nothing(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--cfg", "job", "optimizer=lars", "global_batch_size=1024", f"output_root={cache / 'runs'}"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg["optimizer"]["name"] == "lars" and cfg["optimizer"]["trust_coefficient"] == 0.001
    assert cfg["global_batch_size"] == 1024 and "hydra" not in cfg
    assert not (cache / "runs").exists()


def test_cfg_hydra_shows_the_sweep_dir_setting(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--cfg", "hydra", "hydra.sweep.dir=/somewhere/sweep", "-p", "hydra.sweep"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["dir"] == "/somewhere/sweep"


def test_cfg_with_a_mistyped_key_is_one_line(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--cfg", "job", "optimizer.lrr=1"]) == 2
    assert "did you mean 'optimizer.lr'" in _one_line_error(capsys)


def test_help_lists_every_config_group_and_its_options(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: largebatch-train" in out and "--cfg" in out and "--multirun" in out
    groups = sorted(p.name for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "__pycache__"))
    for group in groups:
        options = ", ".join(sorted(f.stem for f in (CONF / group).glob("*.yaml")))
        assert f"{group}: {options}" in out, group
    assert re.search(r"hydra/launcher: .*basic", out)


def test_a_bad_flag_is_one_line_and_exit_2(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--no-such-flag"]) == 2
    assert "--no-such-flag" in _one_line_error(capsys)
    assert main(["--config-name", "other"]) == 2
    assert "--config-name" in _one_line_error(capsys)


def test_hydra_run_dir_is_the_run_directory(cache: Path) -> None:
    run = cache / "my_run"
    assert main([*TINY, f"hydra.run.dir={run}", f"output_root={cache / 'runs'}"]) == 0
    assert json.loads((run / "summary.json").read_text())["run_dir"] == str(run.resolve())
    assert not (cache / "runs").exists()


@pytest.mark.parametrize(
    "override,pattern",
    [("hydra.sweep.dir=/x", "add -m"), ("hydra/launcher=basic", "add -m"), ("hydra.job.chdir=true", "hydra.job.chdir")],
)
def test_single_run_refuses_hydra_settings_it_would_ignore(
    cache: Path, capsys: pytest.CaptureFixture, override: str, pattern: str
) -> None:
    assert main([*TINY, override]) == 2
    assert pattern in _one_line_error(capsys)


def test_multirun_refuses_one_run_dir_for_all_jobs(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["-m", *TINY, f"run_dir={cache / 'r'}", "optimizer=sgd,lars"]) == 2
    assert "hydra.sweep.dir" in _one_line_error(capsys)


def test_run_dir_set_twice_is_refused(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main([*TINY, f"run_dir={cache / 'a'}", f"hydra.run.dir={cache / 'b'}"]) == 2
    assert "set the run directory once" in _one_line_error(capsys)


def test_multirun_is_refused_under_torchrun(cache: Path, capsys: pytest.CaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")  # every rank would start the whole sweep
    assert main(["-m", *TINY, "optimizer=sgd,lars"]) == 2
    assert "torchrun" in _one_line_error(capsys)


def test_multirun_with_a_wrong_type_is_one_line(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["-m", *TINY, f"hydra.sweep.dir={cache / 'sweep'}", "epochs=1,many"]) == 2
    assert "epochs" in _one_line_error(capsys)


@pytest.mark.parametrize(("sweep", "says"), [
    ("seed=range(0,2,0)", "seed=range(0,2,0): range() arg 3 must not be zero; a sweep is a list"),
    ("seed=range(2,0)", "seed=range(2,0) sweeps no value: range(start, stop[, step]) counts from start up to stop"),
])
def test_a_sweep_of_no_value_is_one_line(cache: Path, capsys: pytest.CaptureFixture, sweep: str, says: str) -> None:
    """Hydra's sweeper raised a bare ValueError (a traceback) for a zero step and ran no job,
    exit 0, for an empty range."""
    assert main(["-m", *TINY, f"hydra.sweep.dir={cache / 'sweep'}", sweep]) == 2
    assert says in _one_line_error(capsys)
    assert not (cache / "sweep").exists()


def test_several_values_without_m_say_to_add_it(cache: Path, capsys: pytest.CaptureFixture) -> None:
    """Hydra's fix was on the lines after the first, which the one line left out."""
    assert main([*TINY, "optimizer=sgd,lars"]) == 2
    assert ("optimizer=sgd,lars lists several values, which sweeps them: add -m to run a job for each "
            "(largebatch-train -m ... optimizer=sgd,lars)") in _one_line_error(capsys)


def test_flags_may_follow_the_overrides(cache: Path, capsys: pytest.CaptureFixture) -> None:
    """As in most commands; Hydra's parser called every override after a flag unrecognized."""
    from largebatch.config.command_line import parse_command_line

    opts = parse_command_line(["debug=smoke", "-m", "seed=0,1", "--cfg", "job", "epochs=3"])
    assert opts.multirun and opts.cfg == "job" and opts.overrides == ["debug=smoke", "seed=0,1", "epochs=3"]
    assert main([*TINY, "--cfg", "job", "epochs=3"]) == 0
    assert yaml.safe_load(capsys.readouterr().out)["epochs"] == 3


def _table_rows(out: str) -> dict[str, list[str]]:
    """The summary table's job lines, by job number."""
    lines = out[out.index("largebatch: 2 job(s)"):].splitlines()[2:4]
    return {line.split()[0]: line.split() for line in lines}


def test_multirun_one_run_dir_per_job_and_a_summary(cache: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = cache / "sweep"
    code = main(["-m", *TINY, f"hydra.sweep.dir={sweep}", "optimizer=sgd,lars"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = _table_rows(out)
    assert f"2 job(s) in {sweep}" in out and "all with debug=smoke" in out
    for job, optimizer in (("0", "sgd"), ("1", "lars")):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert summary["optimizer"] == optimizer and summary["run_dir"] == str((sweep / job).resolve())
        assert (sweep / job / ".hydra" / "overrides.yaml").exists() and (sweep / job / "checkpoints").is_dir()
        assert rows[job][1] == f"optimizer={optimizer}"
        assert float(rows[job][2]) == pytest.approx(summary["best_top1"], abs=0.005)
        assert rows[job][-1] == "0"


def test_multirun_job_errors_are_rows_and_the_exit_code(cache: Path, capsys: pytest.CaptureFixture) -> None:
    sweep = cache / "sweep"
    code = main(["-m", *TINY, f"hydra.sweep.dir={sweep}", "accumulation_steps=4", "global_batch_size=32,30"])
    captured = capsys.readouterr()
    assert code == 2
    rows = _table_rows(captured.out)
    assert rows["0"][1] == "global_batch_size=32" and rows["0"][5] == "0"
    assert rows["1"][1] == "global_batch_size=30" and rows["1"][5] == "2" and "not divisible" in " ".join(rows["1"])
    assert "job 1 (" in captured.err and "not divisible" in captured.err
    assert (sweep / "0" / "summary.json").exists()


def test_a_continued_sweep_refuses_a_job_whose_folder_holds_another_jobs_run(
    cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """Issue 43 case 1: `-m seed=1,0 resume=auto` on a `seed=0,1` sweep continued seed 0's run as
    job 0 labelled seed=1 (and rewrote its .hydra record); now those jobs end with exit 2 naming
    both overrides and the folder of their own run, their folders are left as they were, and a
    job that matches its folder (or is new) runs."""
    sweep = cache / "sweep"
    assert main(["-m", *TINY, "max_steps=1", f"hydra.sweep.dir={sweep}", "seed=0,1"]) == 0
    record = {job: (sweep / job / ".hydra" / "overrides.yaml").read_bytes() for job in ("0", "1")}
    summaries = {job: (sweep / job / "summary.json").read_bytes() for job in ("0", "1")}
    capsys.readouterr()
    assert main(["-m", *TINY, "max_steps=2", "resume=auto", f"hydra.sweep.dir={sweep}", "seed=1,0,2"]) == 2
    out, err = capsys.readouterr()
    assert f"{sweep}/0 holds the run of seed=0, not seed=1 (its own run is in {sweep.resolve()}/1)" in err, err
    assert f"{sweep}/1 holds the run of seed=1, not seed=0 (its own run is in {sweep.resolve()}/0)" in err, err
    rows = {line.split()[0]: line.split() for line in out[out.index("largebatch: 3 job(s)"):].splitlines()[2:5]}
    assert (rows["0"][5], rows["1"][5], rows["2"][5]) == ("2", "2", "0"), rows
    for job in ("0", "1"):  # nothing of the refused jobs was written
        assert (sweep / job / ".hydra" / "overrides.yaml").read_bytes() == record[job]
        assert (sweep / job / "summary.json").read_bytes() == summaries[job]
    assert json.loads((sweep / "2" / "summary.json").read_text())["steps"] == 2
    # the same order continues both
    assert main(["-m", *TINY, "max_steps=2", "resume=auto", f"hydra.sweep.dir={sweep}", "seed=0,1"]) == 0
    assert [json.loads((sweep / j / "summary.json").read_text())["steps"] for j in ("0", "1")] == [2, 2]


def test_multirun_default_sweep_dir_is_under_output_root(cache: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["-m", *TINY, "max_steps=1", f"output_root={cache / 'out'}", "seed=0,1"]) == 0
    sweeps = list((cache / "out").glob("multirun-*"))
    assert len(sweeps) == 1 and sorted(p.name for p in sweeps[0].iterdir() if p.is_dir()) == ["0", "1"]


def test_summary_table_names_what_each_job_changes() -> None:
    rows = [
        dict(job=0, overrides="a=1 b=2", exit_code=0, best_top1=91.234, time_to_target_s=12.0, wall_time_s=30.0, error=None),
        dict(job=1, overrides="a=1 b=3", exit_code=3, best_top1=None, time_to_target_s=None, wall_time_s=4.0,
             error="loss is nan"),
    ]
    table = summary_table(rows, "/s").splitlines()
    assert table[0] == "largebatch: 2 job(s) in /s, all with a=1"
    assert table[2].split() == ["0", "b=2", "91.23", "12.0", "30.0", "0"]
    assert table[3].split() == ["1", "b=3", "-", "-", "4.0", "3", "loss", "is", "nan"]


def test_submitit_local_launcher_runs_the_jobs_in_subprocesses(cache: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm/dev extra is not installed")
    sweep = cache / "sweep"
    code = main(["-m", "hydra/launcher=submitit_local", *TINY, f"hydra.sweep.dir={sweep}", "optimizer=sgd,lars"])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = _table_rows(out)
    pids = set()
    for job in ("0", "1"):
        summary = json.loads((sweep / job / "summary.json").read_text())
        assert float(rows[job][2]) == pytest.approx(summary["best_top1"], abs=0.005)
        # each job ran in a submitit worker process, not in this one
        logs = list((sweep / ".submitit").glob("*/*_0_log.out"))
        assert logs
        pids |= {p.parent.name for p in logs}
    assert len(pids) == 2 and str(os.getpid()) not in pids


def test_slurm_example_composes_onto_the_submitit_slurm_launcher(cache: Path, capsys: pytest.CaptureFixture) -> None:
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the slurm/dev extra is not installed")
    assert main(["--cfg", "hydra", "hydra/launcher=slurm", "hydra.launcher.partition=gpu", "-p", "hydra.launcher"]) == 0
    launcher = yaml.safe_load(capsys.readouterr().out)
    assert launcher["_target_"].endswith("SlurmLauncher") and launcher["partition"] == "gpu"
    assert launcher["tasks_per_node"] == launcher["gpus_per_node"]
