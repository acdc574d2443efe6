"""The training CLI end to end on a tiny generated data set, and its one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from largebatch.cli import main
from largebatch.engine.batch_plan import plan_batches
from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
from largebatch.errors import UsageError
from tests.smoke import smoke

TINY = [
    "debug=smoke",
    "progress=false",
    "model=resnet10t",
    "data.workers=0",
]


def _only_run_dir(root: Path) -> Path:
    runs = [p for p in root.iterdir() if p.is_dir()]
    assert len(runs) == 1, runs
    return runs[0]


def test_two_epoch_run_writes_logs_and_a_loadable_checkpoint(cache: Path, capsys: pytest.CaptureFixture) -> None:
    out = cache / "runs"
    assert main([*TINY, "epochs=2", f"output_root={out}", "optimizer=lars"]) == 0
    run = _only_run_dir(out)
    printed = capsys.readouterr().out.strip().splitlines()
    # the run's last lines are the README's listing of the default run's, in its order (issue 88)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    listing = readme.split("evaluates every epoch on every validation image")[1].split("```")[1].strip().splitlines()
    assert [line.split(" ")[1] for line in printed[-2:]] == [line.split(" ")[1] for line in listing] == ["best", "noise"]
    events = list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert events and events[0].stat().st_size > 0
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in records if r["kind"] == "eval"] == [1, 2]
    assert {"train", "eval", "epoch"} <= {r["kind"] for r in records}
    ckpts = list_checkpoints(run / "checkpoints")
    assert ckpts, "no checkpoint written"
    state = load_checkpoint(ckpts[-1])
    assert state["train_state"]["epoch"] == 2 and state["config"]["optimizer"]["name"] == "lars"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2 and summary["best_top1"] is not None
    assert (run / "config.yaml").exists()


def test_runs_on_a_user_imagefolder(cache: Path) -> None:
    from largebatch.data.synthetic import make_synthetic_imagenet

    root = make_synthetic_imagenet(cache / "my_data", num_classes=3, train_per_class=12, val_per_class=4, image_size=36)
    out = cache / "runs"
    assert main([*TINY, "epochs=1", f"data.root={root}", f"output_root={out}", "global_batch_size=12"]) == 0
    summary = json.loads((_only_run_dir(out) / "summary.json").read_text())
    assert summary["num_classes"] == 3


def test_batch_plan() -> None:
    assert plan_batches(1024, 4, 2).per_device == 128
    with pytest.raises(UsageError, match="not divisible.*multiple of 12"):
        plan_batches(1000, 4, 3)


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["optimizer.lrr=1"], "did you mean 'optimizer.lr'"),
        (["global_batch_size=30", "accumulation_steps=4"], "not divisible"),
        (["data.root=/no/such/folder"], "does not exist"),
        (["model=resnet10t", "model.name=resnet51x"], "unknown model"),
        (["optimizer=sgd", "optimizer.betas=[0.9,0.99]"], "betas"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(cache: Path, capsys: pytest.CaptureFixture, args: list[str], pattern: str) -> None:
    code = main([*TINY, f"output_root={cache / 'runs'}", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert pattern in err


def test_an_unknown_model_name_says_how_to_list_the_choices_before_anything_is_written(
    cache: Path, capsys: pytest.CaptureFixture
) -> None:
    """Issue 54 item 6b: `model.name=resnet5000` named no choice (timm had no name containing it)
    and left a run directory holding a `.lock`."""
    run = cache / "run"
    code = main([*TINY, f"run_dir={run}", "model.name=resnet5000"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("largebatch: error: unknown model 'resnet5000'") and "\n" not in err, err
    assert "similar names: resnet50," in err and "timm.list_models('resnet*')" in err, err
    assert "set model.name= to a timm model, or choose a preset of the model= group: efficientnet_b0," in err, err
    assert "resnet10t" in err and "(model=resnet50)" in err, err
    assert not run.exists()


@pytest.mark.parametrize("args,fits", [
    (["global_batch_size=4096"], "the training data has 128 samples; the largest global batch that fits is 128"),
    (["global_batch_size=256", "accumulation_steps=4"],
     "the training data has 128 samples; the largest global batch that fits is 128"),  # whole steps only
], ids=["batch", "accumulation"])
def test_a_global_batch_larger_than_the_data_is_one_line_before_anything_is_written(
    cache: Path, capsys: pytest.CaptureFixture, args: list[str], fits: str
) -> None:
    """Issue 43 case 4: `debug=smoke global_batch_size=4096` was a ValueError traceback (exit 1)
    after the run directory and its train.log were made."""
    run = cache / "run"
    code = main([*TINY, f"run_dir={run}", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("largebatch: error: global_batch_size=") and "\n" not in err and "Traceback" not in err
    assert "rank(s)" in err and fits in err, err
    assert not run.exists()


def test_train_log_keeps_the_lines_logged_before_the_run_dir(cache: Path) -> None:
    """The data is built before the run directory exists; train.log still starts with its lines."""
    run = cache / "run"
    assert main([*TINY, f"run_dir={run}", "max_steps=1"]) == 0
    log = (run / "train.log").read_text().splitlines()
    # the embedded preset's data.loader=auto: its choice, then the decoded store's line (no data
    # check for DALI first: on the CPU backend auto reads the store)
    assert "data.loader=auto: reading with the decoded store" in log[0], log[:3]
    assert not any("for DALI" in line for line in log)
    pipeline = next(i for i, line in enumerate(log) if "input pipeline: decoded store" in line)
    assert pipeline < next(i for i, line in enumerate(log) if "global batch 32 = 32 per device" in line)


@pytest.mark.parametrize(("warmup_epochs", "warned"), [(2, True), (3, True), (1.75, False)])
def test_a_warmup_not_shorter_than_the_run_is_warned_once(
    cache: Path, capsys: pytest.CaptureFixture, warmup_epochs: float, warned: bool
) -> None:
    """8 planned steps (2 epochs x 4): a warmup of 8 steps or more never reaches the peak lr (the
    factor is 1 from step 8, the run's last is step 7); 7 steps reaches it on the last step.
    max_steps stops the run after 1 step without changing the plan the warning is about."""
    run = cache / "run"
    assert main(smoke("schedule=cosine", f"schedule.warmup_epochs={warmup_epochs}", "max_steps=1",
                      f"run_dir={run}")) == 0
    out = capsys.readouterr().out
    line = f"schedule.warmup_epochs={warmup_epochs:g} is {round(warmup_epochs * 4)} warmup steps, not fewer than the run's 8"
    assert out.count(line) == (1 if warned else 0), out
    assert ("lr never reaches its peak" in (run / "train.log").read_text()) == warned


def test_console_script_and_module_entry(cache: Path) -> None:
    env = dict(os.environ, LARGEBATCH_CACHE=str(cache / "cache"))
    proc = subprocess.run(
        [sys.executable, "-m", "largebatch.train", "epochs=many"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert proc.returncode == 2 and "epochs" in proc.stderr and "Traceback" not in proc.stderr


@pytest.fixture()
def small_data(cache: Path) -> Path:
    """A 2-class ImageFolder tree (train/ and val/) to break in different ways."""
    from largebatch.data.synthetic import make_synthetic_imagenet

    return make_synthetic_imagenet(cache / "data", num_classes=2, train_per_class=4, val_per_class=2, image_size=36)


def _break_data(root: Path, how: str) -> None:
    import shutil

    if how == "empty_class":
        for f in (root / "train" / sorted(p.name for p in (root / "train").iterdir())[0]).iterdir():
            f.unlink()
    elif how == "class_lists_differ":
        first = sorted(p.name for p in (root / "val").iterdir())[0]
        shutil.move(str(root / "val" / first), str(root / "val" / "zz_other_class"))


def _foreign_checkpoint(directory: Path, how: str) -> Path:
    from largebatch.engine.checkpoint import checkpoint_name, save_checkpoint

    if how == "other_model":
        state = {"model": {}, "model_name": "resnet18", "global_batch_size": 8}
    elif how == "incompatible_tensors":
        state = {"model": torch.nn.Linear(2, 2).state_dict()}
    elif how == "other_epoch_length":  # e.g. written at a world size that drops another tail
        state = {"model": {}, "model_name": "resnet10t", "global_batch_size": 8, "steps_per_epoch": 99}
    elif how == "other_class_count":  # the same model on a data set with more classes
        state = {"model": {}, "model_name": "resnet10t", "global_batch_size": 8, "resolved": {"num_classes": 5}}
    else:  # another global batch size
        state = {"model": {}, "model_name": "resnet10t", "global_batch_size": 64}
    return save_checkpoint(state, directory, checkpoint_name(0, 1))


@pytest.mark.parametrize(
    "args,pattern",
    [
        (["epochs=many"], "epochs=many is not an integer; set epochs= to an integer"),
        (["optimizer.lr=abc"], "optimizer.lr=abc is not a number; set optimizer.lr= to a number"),
        (["progress=maybe"], "progress=maybe is not true or false; set progress=true or progress=false"),
        (["data.crop_scale=0.5"], "data.crop_scale is a list, not a float; write it in brackets, e.g. data.crop_scale=[x,y]"),
        (["data.crop_scale=[a,b]"], "data.crop_scale[0]=a is not a number; set data.crop_scale= to a list of numbers"),
        (["model.name=[1,2]"], "model.name=[1, 2] is a list, not a string; set model.name= to one value"),
        (["non_finite=maybe"], "non_finite=maybe: expected one of [skip, stop]; set non_finite= to one of them"),
        (["epochs=${{oops}}"], "${{oops}} names no config key; write one the config has"),
        (["epochs=${{optimizer.lr}}"], "While dereferencing interpolation '${{optimizer.lr}}': Value '0.2' of type "
                                       "'float' could not be converted to Integer (full_key: epochs)"),
        (["data.root=${{oc.env:LARGEBATCH_NO_SUCH_VARIABLE}}"],
         "environment variable LARGEBATCH_NO_SUCH_VARIABLE (in ${{oc.env:LARGEBATCH_NO_SUCH_VARIABLE}}) is not set"),
        (["data.root={data}", "+break=empty_class"], "holds no image"),
        (["data.root={data}", "+break=class_lists_differ"], "class folders differ"),
        (["run_dir={cache}/a_file/run"], "cannot write the run directory"),
        (["resume={cache}/no_such.pt"], "does not exist; set resume="),
        (["resume={cache}/a_folder"], "resume={cache}/a_folder is a folder, not a checkpoint file, and holds no checkpoint"),
        (["resume={cache}/foreign", "+ckpt=other_model"],
         "resume={cache}/foreign is a folder, not a checkpoint file; to continue that run set resume=auto "
         "run_dir={cache}, or name one file, e.g. resume={cache}/foreign/"),
        (["resume={ckpt}", "+ckpt=other_model"], "was made with model resnet18, not resnet10t"),
        (["resume={ckpt}", "+ckpt=incompatible_tensors"], "does not fit model resnet10t"),
        (["resume={ckpt}", "+ckpt=other_batch"], "global_batch_size=64, not 8"),
        (["resume={ckpt}", "+ckpt=other_epoch_length"], "has 99 steps per epoch but this run has 16"),
        (["resume={ckpt}", "+ckpt=other_class_count"], "was trained on 5 classes, but this run's data set has 4"),
        (["data.root={cache}/a_file"], "data root {cache}/a_file is a file, not a folder"),
    ],
    ids=["wrong-type", "not-a-number", "not-a-bool", "not-a-list", "list-item", "list-for-a-string", "bad-choice", "no-such-interpolation", "interpolation-of-a-wrong-type", "unset-env", "empty-class", "class-lists-differ", "unwritable-run-dir",
         "missing-checkpoint", "resume-a-folder", "resume-a-checkpoints-folder", "checkpoint-other-model", "checkpoint-incompatible", "checkpoint-other-batch",
         "checkpoint-other-epoch-length", "checkpoint-other-class-count", "data-root-is-a-file"],
)
def test_more_bad_input_is_one_line_and_exit_2(
    cache: Path, small_data: Path, capsys: pytest.CaptureFixture, args: list[str], pattern: str
) -> None:
    (cache / "a_file").write_text("not a folder")
    (cache / "a_folder").mkdir(exist_ok=True)
    ckpt = cache / "ckpt"
    setup = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in args if a.startswith("+")}
    if "+break" in setup:
        _break_data(small_data, setup["+break"])
    if "+ckpt" in setup:
        ckpt = _foreign_checkpoint(cache / "foreign", setup["+ckpt"])
    overrides = [a.format(data=small_data, cache=cache, ckpt=ckpt) for a in args if not a.startswith("+")]
    code = main([*TINY, "global_batch_size=8", f"output_root={cache / 'runs'}", *overrides])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert pattern.format(cache=cache) in err, err


def test_a_bug_keeps_its_traceback(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the project's error types become "exit 2, one line": a ValueError from a bug in
    the code propagates (the old ``except ValueError`` reported it as a usage error)."""
    import largebatch.run as run_module

    def broken(*args: object, **kwargs: object) -> None:
        raise ValueError("a bug, not bad input")

    monkeypatch.setattr(run_module, "model_of", broken)
    with pytest.raises(ValueError, match="a bug"):
        main([*TINY, f"output_root={cache / 'runs'}"])


def test_library_checks_meant_for_users_are_usage_errors(cache: Path, capsys: pytest.CaptureFixture) -> None:
    """A library argument check written for the user (here LARS's momentum range) is a
    UsageError: one line, exit 2."""
    assert main([*TINY, f"output_root={cache / 'runs'}", "optimizer=lars", "optimizer.momentum=1.5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch: error:") and "momentum" in err and "\n" not in err


def test_version(capsys: pytest.CaptureFixture) -> None:
    from largebatch import __version__

    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"largebatch {__version__}"


def _train_subprocess(args: list[str], cache: Path, *, shell_tail: str = "") -> subprocess.CompletedProcess:
    """``python -m largebatch.train ARGS``; ``shell_tail`` is appended as the shell would read it."""
    env = dict(os.environ, LARGEBATCH_CACHE=str(cache / "cache"), PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    if shell_tail:
        import shlex

        command = shlex.join([sys.executable, "-m", "largebatch.train", *args]) + " " + shell_tail
        return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=300)
    return subprocess.run([sys.executable, "-m", "largebatch.train", *args], capture_output=True, text=True,
                          env=env, timeout=300)


def test_value_hydra_cannot_parse_says_how_to_quote_it_and_that_works(cache: Path) -> None:
    """`run_dir=/tmp/ü n i` unquoted, as one argv element or split by the shell: Hydra's lexer
    rejects `ü` (or `n` is no override); both errors show the same quoted form, which runs (one
    launch for both: the same command)."""
    run_dir = cache / "ü n i"
    quoted = f"""'run_dir="{run_dir}"'"""
    for split in (False, True):
        args = [f"run_dir={cache}/ü", "n", "i"] if split else [f"run_dir={run_dir}"]
        proc = _train_subprocess([*TINY, "epochs=1", "max_steps=1", *args], cache)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and "\n" not in err and "Traceback" not in err, (split, proc)
        assert err.startswith("largebatch: error:")
        assert ("override 'n' is not of the form key=value" if split else "token recognition error at: 'ü'") in err
        assert err.endswith(f": {quoted}"), err
        assert not run_dir.exists()
    # the form the errors show, pasted into a shell, runs
    proc = _train_subprocess([*TINY, "epochs=1", "max_steps=1"], cache, shell_tail=quoted)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (run_dir / "summary.json").is_file()
