"""What a checkpoint holds has one home (``largebatch.engine.checkpoint_format``), and a
checkpoint of the format before it (format 1, no ``format`` key) still resumes, exactly.

The format-1 file is written by the code of :data:`FORMAT_1_COMMIT` (the last main that wrote
format 1), taken from this repository's history and run in a subprocess.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch

from largebatch.engine.checkpoint import checkpoint_name, list_checkpoints, load_checkpoint
from largebatch.engine.checkpoint_format import ADDED_KEYS, FORMAT, RunCheckpoint, RunIdentity
from largebatch.errors import CheckpointError
from tests.smoke import EXACT, smoke

REPO = Path(__file__).resolve().parents[1]
FORMAT_1_COMMIT = "1e2a6df"  # main before the format had a module and a number (issue 46)

# tests/test_resume.py's exact resume (warmup + cosine, momentum SGD: the schedule, optimizer and
# RNG states all matter), with a checkpoint every 2 of its 8 steps
RUN = smoke("checkpoint.every_steps=2", base=EXACT)


def _record(**changes: object) -> RunCheckpoint:
    parts = dict(model={"w": torch.ones(2)}, optimizer={"state": {}}, scheduler={"last_epoch": 3}, scaler=None,
                 train_state={"step": 3}, rng={"torch": torch.zeros(2, dtype=torch.uint8)}, world_size=2,
                 global_batch_size=8, accumulation_steps=1, steps_per_epoch=4,
                 identity=RunIdentity(model_name="resnet10t", config={"optimizer": {"name": "lars"}},
                                      resolved={"num_classes": 10}))
    return RunCheckpoint(**{**parts, **changes})


def test_the_record_goes_to_a_plain_dict_and_back() -> None:
    record = _record(ema={"w": torch.zeros(2)})
    state = record.to_state()
    assert state["format"] == 2 and state["model_name"] == "resnet10t" and "ema" in state
    back = RunCheckpoint.from_state(state, "x.pt")
    assert back.identity == record.identity and back.steps_per_epoch == 4 and torch.equal(back.ema["w"], torch.zeros(2))
    assert back.identity.optimizer_name == "lars" and back.identity.num_classes == 10
    assert "ema" not in _record().to_state()  # no EMA: no key (as format 1 wrote it)


def test_the_noise_scale_averages_are_an_optional_part() -> None:
    """Written where the run measured the noise scale; a file without them (older, or a run
    without the measurement) reads as before, with ``noise_scale`` None, and is not incomplete."""
    from largebatch.diagnostics import GradientNoiseScale

    tracker = GradientNoiseScale(0.9)
    tracker.update(torch.tensor(4.0), 8, torch.tensor(1.0), 16)
    state = _record(noise_scale=tracker.state_dict()).to_state()
    back = RunCheckpoint.from_state(state, "x.pt")
    resumed = GradientNoiseScale(0.9)
    resumed.load_state_dict(back.noise_scale)
    assert resumed.updates == 1 and torch.equal(resumed.noise_scale(), tracker.noise_scale())
    older = RunCheckpoint.from_state(_record().to_state(), "old.pt")
    assert "noise_scale" not in _record().to_state() and older.noise_scale is None and not older.missing_parts()


def test_format_1_and_weights_only_files_read_and_say_what_is_missing() -> None:
    old = {k: v for k, v in _record().to_state().items() if k != "format"}
    assert RunCheckpoint.from_state(old, "old.pt").format == 1
    weights = RunCheckpoint.from_state({"model": {"w": torch.ones(1)}}, "w.pt")
    assert weights.missing_parts() == ["optimizer", "scheduler", "train_state", "rng"]
    assert weights.identity == RunIdentity()


def test_a_newer_format_is_refused_in_one_line() -> None:
    with pytest.raises(CheckpointError) as err:
        RunCheckpoint.from_state({**_record().to_state(), "format": FORMAT + 1, "version": "9.0"}, "new.pt")
    msg = str(err.value)
    assert "\n" not in msg and f"format {FORMAT + 1}" in msg and "9.0" in msg and "new.pt" in msg


def _format_1_tree(tmp: Path) -> Path:
    """The package as FORMAT_1_COMMIT had it, importable from ``tmp`` (its config tree inside)."""
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (a git checkout) to run the format-1 code")
    archive = tmp / "old.tar"
    done = subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), FORMAT_1_COMMIT, "largebatch", "conf"],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"commit {FORMAT_1_COMMIT} is not in this clone's history (shallow?): {done.stderr.strip()}")
    tree = tmp / "old"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    (tree / "conf").rename(tree / "largebatch" / "conf")  # setup.py installs conf/ as largebatch.conf
    return tree


def _train(code: Path, *overrides: str) -> None:
    """``python -m largebatch.train`` with the package of ``code``, one thread (same arithmetic in both)."""
    env = {**os.environ, "PYTHONPATH": str(code), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "largebatch.train", *overrides], cwd=code.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


def test_a_format_1_checkpoint_of_the_previous_main_resumes_exactly(tmp_path: Path) -> None:
    """The previous main trains 8 steps (checkpoints every 2); this code resumes its step-4
    checkpoint and ends with the same weights, bit for bit, as its step-8 checkpoint."""
    tree = _format_1_tree(tmp_path)
    old_run = tmp_path / "old-run"
    _train(tree, *RUN, f"run_dir={old_run}")
    written = {p.name: load_checkpoint(p) for p in list_checkpoints(old_run / "checkpoints")}
    step4 = old_run / "checkpoints" / checkpoint_name(1, 4)
    assert "format" not in written[step4.name], "the previous main should write format 1"

    run = tmp_path / "run"
    # this code, in the same kind of process, reading as the previous main did (its default loader)
    _train(REPO, *RUN, "data.loader=torchvision", f"run_dir={run}", f"resume={step4}")
    resumed = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    straight = written[checkpoint_name(2, 8)]
    assert resumed["format"] == 2 and resumed["train_state"]["step"] == 8
    assert resumed["model"].keys() == straight["model"].keys()
    for key, value in straight["model"].items():
        assert torch.equal(resumed["model"][key], value), key


# -- keys added since format 2, and the features an older reader must refuse ---------------------

PREVIOUS_MAIN = "6a5bd1e"  # main before format 3: it reads formats 1-2


def _schema_keys() -> dict[str, object]:
    import dataclasses
    import typing

    from largebatch.config.schema import TrainConfig

    out: dict[str, object] = {}

    def walk(cls: type, prefix: str) -> None:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            if dataclasses.is_dataclass(hints[f.name]):
                walk(hints[f.name], f"{prefix}{f.name}.")
            else:
                default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
                out[prefix + f.name] = getattr(default, "value", default)

    walk(TrainConfig, "")
    return out


def test_every_config_key_is_of_format_2_or_declared_with_its_absent_value() -> None:
    """A feature that adds a config key declares it in ADDED_KEYS (its value when absent, and the
    feature an older reader must know), or this fails."""
    format2 = set((REPO / "tests" / "fixtures" / "format2_config_keys.txt").read_text().split())
    keys = {f"config.{k}": v for k, v in _schema_keys().items()}
    added = {k: a for k, a in ADDED_KEYS.items() if k.startswith("config.")}
    undeclared = sorted(k for k in keys if k.removeprefix("config.") not in format2 and k not in added)
    assert undeclared == [], f"declare these in largebatch.engine.checkpoint_format.ADDED_KEYS: {undeclared}"
    assert sorted(k for k in added if k not in keys) == []  # no stale entry
    # what a run did before the key existed is the schema's default (the key's off state)
    assert {k: a.absent for k, a in added.items()} == {k: keys[k] for k in added}


def test_each_added_key_names_the_commit_that_added_it_in_the_order_added() -> None:
    """``since``: a commit after format 2 (ccb132e) whose change adds a line naming the key, and
    the table lists the commits oldest first by commit time (tests/test_resume_compat.py resumes a checkpoint
    from before each)."""
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (a git checkout)")

    def git(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)

    commits = list(dict.fromkeys(a.since for a in ADDED_KEYS.values()))
    if git("cat-file", "-e", f"{commits[-1]}^{{commit}}").returncode:
        pytest.skip(f"commit {commits[-1]} is not in this clone's history (shallow?)")
    for commit in commits:  # merged branches: ordered by commit time, not by ancestry
        assert git("merge-base", "--is-ancestor", "ccb132e", commit).returncode == 0, commit
    times = [int(git("show", "-s", "--format=%ct", c).stdout) for c in commits]
    assert times == sorted(times), dict(zip(commits, times))
    diffs = {c: git("show", "--format=", c, "--", "largebatch").stdout for c in commits}
    for key, added in ADDED_KEYS.items():
        leaf = key.rsplit(".", 1)[-1]
        assert any(line.startswith("+") and leaf in line for line in diffs[added.since].splitlines()), (key, added.since)
    grouped = [a.since for a in ADDED_KEYS.values()]
    assert grouped == sorted(grouped, key=commits.index)  # one run of entries per commit


def test_a_run_that_uses_a_feature_writes_format_3_naming_it() -> None:
    plain = _record().to_state()
    assert plain["format"] == 2 and "features" not in plain  # every reader since format 2 reads it
    config = {"batch_schedule": {"steps": [[1, 16]], "adaptive": {"enabled": False}},
              "data": {"resolution": {"schedule": "steps", "steps": [[0, 16], [1, 24]]}}}
    state = _record(identity=RunIdentity(model_name="resnet10t", config=config)).to_state()
    assert state["format"] == 3 and state["features"] == ["batch_schedule", "progressive_resizing"]
    assert RunCheckpoint.from_state(state, "ok.pt").format == 3


def test_a_feature_this_reader_does_not_know_is_refused_in_one_line() -> None:
    state = {**_record().to_state(), "format": 3, "features": ["batch_schedule", "time_travel"], "version": "9.0"}
    with pytest.raises(CheckpointError) as err:
        RunCheckpoint.from_state(state, "new.pt")
    msg = str(err.value)
    assert "\n" not in msg and "time_travel" in msg and "batch_schedule" not in msg and "9.0" in msg


def test_the_previous_main_refuses_a_checkpoint_that_uses_a_batch_schedule(tmp_path: Path) -> None:
    """The reader of the commit before format 3 (no batch-schedule key) used to train on as another run."""
    if not (REPO / ".git").exists():
        pytest.skip("needs the repository's history (a git checkout)")
    archive = tmp_path / "old.tar"
    done = subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), PREVIOUS_MAIN, "largebatch"],
                          capture_output=True, text=True)
    if done.returncode:
        pytest.skip(f"commit {PREVIOUS_MAIN} is not in this clone's history (shallow?): {done.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "old", filter="data")
    config = {"batch_schedule": {"steps": [[1, 16]]}}
    torch.save(_record(identity=RunIdentity(model_name="resnet10t", config=config)).to_state(), tmp_path / "c.pt")
    read = ("import sys, torch\nfrom largebatch.engine.checkpoint_format import RunCheckpoint\n"
            "from largebatch.errors import CheckpointError\n"
            "try:\n    RunCheckpoint.from_state(torch.load(sys.argv[1], weights_only=True), sys.argv[1])\n"
            "except CheckpointError as e:\n    print(e); sys.exit(2)\n")
    old = subprocess.run([sys.executable, "-c", read, str(tmp_path / "c.pt")], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(tmp_path / "old")}, cwd=tmp_path, timeout=120)
    assert old.returncode == 2, old.stdout + old.stderr
    assert "has format 3" in old.stdout and "reads formats 1-2" in old.stdout


def test_a_checkpoint_from_before_a_key_changes_nothing_on_resume() -> None:
    from largebatch.engine.resume import check_same_run, schedule_changes

    before = {"schedule": {"name": "cosine"}, "data": {"image_size": 32}}
    now = {"schedule": {"name": "cosine", "points": []}, "batch_schedule": {"steps": [], "via": "accumulation"},
           "data": {"image_size": 32, "resolution": {"schedule": "none", "steps": [], "eval_size": None}}}
    assert schedule_changes(before, now) == []  # was: "schedule.points None -> []"
    check_same_run(before, now, Path("c.pt"))  # no error
    with pytest.raises(CheckpointError, match="batch_schedule.steps"):
        check_same_run(before, {**now, "batch_schedule": {"steps": [[1, 16]]}}, Path("c.pt"))


# A real run of this code with every feature that adds a key on (EMA, noise scale, batch
# schedule, progressive resizing, a piecewise lr): 2 steps, one checkpoint.
FEATURES_ON = ("ema.enabled=true", "batch_schedule.steps=[[1,16]]", "data.resolution.schedule=steps",
               "data.resolution.steps=[[0,16],[1,24]]", "schedule=piecewise", "schedule.points=[[0,1.0],[1,0.1]]",
               "max_steps=2", "checkpoint.every_steps=2")


@pytest.fixture(scope="module")
def feature_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from largebatch.cli import main

    run = tmp_path_factory.mktemp("features") / "run"
    assert main(smoke(*FEATURES_ON, f"run_dir={run}", base=EXACT)) == 0
    return run


def _undeclared(tree: dict[str, object], known: set[str], prefix: str = "") -> list[str]:
    """The paths of ``tree`` (nested dicts) neither in ``known`` nor under a path in it."""
    out: list[str] = []
    for key, value in tree.items():
        path = prefix + str(key)
        if path in known:
            if isinstance(value, dict) and path in ("train_state", "rng", "config"):
                out += _undeclared(value, known, path + ".")
        elif isinstance(value, dict) and value:
            out += _undeclared(value, known, path + ".")
        else:
            out.append(path)
    return out


def test_every_key_a_checkpoint_holds_is_of_format_2_or_declared(feature_run: Path) -> None:
    """A feature that adds a key to the record (a part, a train_state or rng entry, a config
    key) declares it in ADDED_KEYS, or this fails: an older reader would skip it silently."""
    fixtures = REPO / "tests" / "fixtures"
    format2 = {line for line in (fixtures / "format2_record_keys.txt").read_text().split("\n")
               if line and not line.startswith("#")}
    format2 |= {f"config.{k}" for k in (fixtures / "format2_config_keys.txt").read_text().split()}
    state = load_checkpoint(list_checkpoints(feature_run / "checkpoints")[-1])
    assert state["format"] == 3 and state["features"] == ["batch_schedule", "piecewise_schedule",
                                                           "progressive_resizing"]
    assert {"ema", "noise_scale"} <= state.keys()  # the optional parts are there to be checked
    known = format2 | set(ADDED_KEYS) | {"features"}  # format 3's own key
    undeclared = _undeclared({k: v for k, v in state.items() if k != "resolved"}, known)
    assert undeclared == [], f"declare these in largebatch.engine.checkpoint_format.ADDED_KEYS: {undeclared}"


def test_a_checkpoint_that_uses_an_unknown_feature_is_refused_at_resume_in_one_line(
        feature_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """What a requeued job on an older image meets: exit 2, one line naming the feature and the
    version that wrote the file, and the run directory as it was."""
    import shutil

    from largebatch.cli import main
    from largebatch.engine.checkpoint import save_checkpoint

    run = tmp_path / "run"
    shutil.copytree(feature_run, run)
    newest = list_checkpoints(run / "checkpoints")[-1]
    state = load_checkpoint(newest)
    save_checkpoint({**state, "features": [*state["features"], "time_travel"], "version": "9.0"},
                    newest.parent, newest.name)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(smoke(*FEATURES_ON, f"run_dir={run}", "resume=auto", "max_steps=null", base=EXACT)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "time_travel" in err[0] and "9.0" in err[0] and "batch_schedule" not in err[0], err
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    log = run / "train.log"  # the refused attempt is logged after the run's lines
    assert after.pop(log).startswith(before.pop(log)) and after == before


@pytest.mark.parametrize("key", [k for k in ADDED_KEYS if k.startswith("config.")])
def test_a_checkpoint_from_before_each_added_key_resumes_as_the_run_without_it(key: str, feature_run: Path) -> None:
    """A run without the feature is the run from before the key: the checkpoint's config with
    the key taken out fits, and reads back as this run's config (with its lr schedule)."""
    from largebatch.engine.checkpoint_format import with_absent_keys
    from largebatch.engine.resume import check_same_run, schedule_changes

    now = load_checkpoint(list_checkpoints(feature_run / "checkpoints")[-1])["config"]
    for other, added in ADDED_KEYS.items():  # this version's run with every added key off
        if other.startswith("config."):
            *parents, last = other.removeprefix("config.").split(".")
            node = now
            for part in parents:
                node = node[part]
            node[last] = added.absent
    before = json.loads(json.dumps(now))
    *parents, last = key.removeprefix("config.").split(".")
    node = before
    for part in parents:
        node = node[part]
    del node[last]
    assert with_absent_keys(before, now) == now
    assert schedule_changes(before, now) == []
    check_same_run(before, now, Path("before.pt"))  # no error
