"""``data.loader`` in the training CLI: DALI on the embedded data learns like torchvision; an
unchecked set is refused (dali) or read with torchvision (auto); a resumed epoch skips the
batches already trained on, with either loader; the data tools are installed commands."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

pytest.importorskip("nvidia.dali")

from largebatch.cli import main  # noqa: E402
from largebatch.data.check import check_dataset  # noqa: E402
from largebatch.data.contract import LoaderSpec  # noqa: E402
from largebatch.data.pipelines.dali_files import build_dali_loaders  # noqa: E402
from largebatch.data.pipelines.torchvision import build_loaders  # noqa: E402
from largebatch.data.synthetic import make_synthetic_imagenet  # noqa: E402

TINY = ["debug=smoke", "progress=false", "tensorboard=false", "model=resnet10t", "data.workers=0"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A user ImageFolder tree (2 classes x 8 train, 2 val), not checked."""
    return make_synthetic_imagenet(tmp_path_factory.mktemp("cli_dali") / "set", num_classes=2,
                                   train_per_class=8, val_per_class=2, image_size=24)


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


# The embedded set shrunk to 2 classes of 64 train images (vertical vs horizontal stripes,
# random colours, clutter and noise): 4 epochs of 4 steps. Best val top-1 (64 images, chance
# 50%) measured with seeds 0/1/2: torchvision 90.6/87.5/85.9%, DALI 90.6/87.5/79.7%; about
# 10-30 s per run on a shared 2-core CPU.
LEARN = [*TINY, "data.synthetic.classes=2", "data.synthetic.train_per_class=64",
         "data.synthetic.val_per_class=32", "data.image_size=24", "epochs=4", "optimizer.lr=0.4",
         "schedule.warmup_epochs=1", "precision=fp32", "checkpoint.every_epochs=0"]
FLOOR = 70.0  # val top-1 (%) both pipelines must reach: far above chance
BAND = 15.0  # at most this many points of val top-1 between the two pipelines


def test_dali_run_reaches_the_accuracy_band_of_torchvision(cache: Path) -> None:
    top1 = {}
    for loader in ("torchvision", "dali"):
        run = cache / f"run-{loader}"
        assert main([*LEARN, f"data.loader={loader}", f"run_dir={run}"]) == 0
        log = (run / "train.log").read_text()
        assert f"input pipeline: {'DALI' if loader == 'dali' else 'torchvision'}" in log
        summary = _summary(run)
        assert summary["steps"] == 16 and summary["num_classes"] == 2
        top1[loader] = summary["best_top1"]
    # The embedded set was checked on the fly for the DALI run (no largebatch-check-data).
    assert "checked " in (cache / "run-dali" / "train.log").read_text()
    assert min(top1.values()) >= FLOOR, top1
    assert abs(top1["dali"] - top1["torchvision"]) <= BAND, top1


def test_dali_on_an_unchecked_folder_exits_2_naming_the_check(
    cache: Path, folder: Path, capsys: pytest.CaptureFixture
) -> None:
    code = main([*TINY, f"data.root={folder}", "data.loader=dali", "global_batch_size=8",
                 f"output_root={cache / 'runs'}"])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("largebatch: error:") and "\n" not in err and "Traceback" not in err
    assert f"largebatch-check-data {folder}" in err and "data.loader=torchvision" in err


def test_auto_reads_with_dali_only_once_the_set_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the decoded store has no room (a disk with 1 kB free: ``auto`` prefers the store
    on a CPU host where it fits, tests/test_decoded_loader.py), DALI once the set is checked."""
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    root = make_synthetic_imagenet(tmp_path / "set", num_classes=2, train_per_class=8,
                                   val_per_class=2, image_size=24)
    args = [*TINY, f"data.root={root}", "data.loader=auto", "global_batch_size=8", "epochs=1",
            "data.image_size=16"]
    assert main([*args, f"run_dir={tmp_path / 'before'}"]) == 0
    log = (tmp_path / "before" / "train.log").read_text()
    assert "data.loader=auto: not the decoded store: it would take" in log
    assert "data.loader=auto: reading with torchvision, not DALI" in log
    assert f"largebatch-check-data {root}" in log and "input pipeline: torchvision" in log

    assert check_dataset(root, workers=1).ok
    assert main([*args, f"run_dir={tmp_path / 'after'}"]) == 0
    log = (tmp_path / "after" / "train.log").read_text()
    assert "input pipeline: DALI, CPU decode" in log and "data.loader=auto: reading" not in log
    assert _summary(tmp_path / "after")["steps"] == 2


class _SampleRecorder(nn.Module):
    """Identity that records each image's pixel sum (a crop of the whole image, flipped or
    not, has the same sum: it names the file)."""

    def __init__(self) -> None:
        super().__init__()
        self.sums: list[float] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.sums += x.detach().float().sum(dim=(1, 2, 3)).tolist()
        return x


def _trained_sums(loader, *, epoch_step: int) -> list[float]:
    """Train one epoch of ``loader`` from ``epoch_step`` (a resumed run) with the real loop
    and DataOrderHook; the pixel sums of the images the model saw, in order."""
    from largebatch.backends import build_backend
    from largebatch.engine.hooks import DataOrderHook
    from largebatch.engine.loop import StepSettings, Trainer, TrainState

    recorder = _SampleRecorder()
    model = nn.Sequential(recorder, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(3, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    state = TrainState()
    state.epoch, state.epoch_step, state.step = 1, epoch_step, 10 + epoch_step
    trainer = Trainer(
        model=model, optimizer=optimizer, scheduler=torch.optim.lr_scheduler.ConstantLR(optimizer, 1.0),
        train_loader=loader, backend=build_backend("cpu"),
        settings=StepSettings(epochs=2, global_batch_size=4),
        hooks=[DataOrderHook()], state=state,
    )
    trainer.train()
    assert state.epoch == 2
    return recorder.sums


@pytest.mark.parametrize("pipeline", ["torchvision", "dali"])
def test_resumed_epoch_skips_the_batches_already_trained(tmp_path: Path, pipeline: str) -> None:
    root = make_synthetic_imagenet(tmp_path / "set", num_classes=2, train_per_class=8,
                                   val_per_class=2, image_size=24)
    # crop_scale (1, 1): the crop is the whole image, so each sample's sum is fixed.
    spec = LoaderSpec(image_size=16, batch_size=4, workers=0, seed=5, crop_scale=(1.0, 1.0))
    if pipeline == "dali":
        train = build_dali_loaders(root, replace(spec, workers=1))[0]
    else:
        train = build_loaders(root, spec)[0]
    assert len(train) == 4
    whole = _trained_sums(train, epoch_step=0)
    resumed = _trained_sums(train, epoch_step=3)
    assert len(whole) == 16 and len(resumed) == 4
    assert resumed == pytest.approx(whole[12:], rel=1e-5)
    assert resumed != pytest.approx(whole[:4], rel=1e-5)  # not the epoch's start again


def test_check_data_command_is_installed() -> None:
    exe = Path(sys.executable).parent / "largebatch-check-data"
    proc = subprocess.run([str(exe), "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: largebatch-check-data")


def test_training_reads_packed_shards(cache: Path, folder: Path) -> None:
    """data.shards: a run reads the WebDataset shards of largebatch-make-shards with DALI and
    evaluates every validation image once; with data.loader=torchvision it is refused."""
    from largebatch.tools.make_shards import main as make_shards_main

    check_dataset(folder, workers=1)
    shards = cache / "shards"
    assert make_shards_main([str(folder), str(shards), "--shard-size", "4", "--workers", "1"]) == 0
    run = cache / "run-shards"
    args = [*TINY, "global_batch_size=4", "epochs=1", f"data.root={folder}", f"data.shards={shards}"]
    assert main([*args, "data.loader=dali", f"run_dir={run}"]) == 0
    summary = _summary(run)
    assert summary["steps"] == 16 // 4
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [e["total"] for e in evals if e["kind"] == "eval"] == [4]
    assert "webdataset reader" in (run / "train.log").read_text()
    assert main([*args, "data.loader=torchvision", f"run_dir={cache / 'refused'}"]) == 2


def test_a_file_broken_after_the_check_stops_dali_with_one_line(
    cache: Path, folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The check's list names a file that was rewritten since (and the fingerprint is bypassed
    by reading the stale list directly): DALI's decoder error becomes one line naming the fix."""
    import shutil

    from largebatch.data.check import check_dataset
    from largebatch.data.pipelines.torchvision import DataError

    root = Path(shutil.copytree(folder, tmp_path / "set"))
    report = check_dataset(root, workers=1)
    victim = next((root / "train" / "n0001").glob("*.JPEG"))
    victim.write_bytes(b"\0" * victim.stat().st_size)
    train, _, _ = build_dali_loaders(root, LoaderSpec(image_size=16, batch_size=8, workers=1),
                                     file_list={"train": report.splits["train"].file_list})
    train.set_epoch(0)
    with pytest.raises(DataError) as exc:
        for _ in train:
            pass
    message = str(exc.value)
    assert "\n" not in message and f"run largebatch-check-data {root} again" in message
