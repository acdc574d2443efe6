"""Every paper preset in conf/experiment/ composes to what its header says, documents itself,
and runs 2 optimizer steps on the embedded data on CPU with size overrides."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from largebatch.cli import main
from largebatch.config import compose_config, to_train_config

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("*.yaml"))
REQUIRED = {
    "goyal2017_rn50_8k", "jia2018_rn50_64k", "ying2018_rn50_32k_tpu",
    "wongpanich2020_effnet_b2", "wongpanich2020_effnet_b5", "mlperf_rn50", "fastai2018_rn50_128gpu",
}
# The size overrides of a CPU try-out: tiny model, 32 px, 32-image batches, 2 steps.
SMALL = ["debug=smoke", "data=embedded", "model=resnet10t", "data.workers=0", "progress=false",
         "tensorboard=false", "backend=cpu", "max_steps=2", "global_batch_size=16",
         "data.synthetic.train_per_class=8", "data.synthetic.val_per_class=2"]


def _cfg(name: str):
    return to_train_config(compose_config([f"experiment={name}", "data.root=/data/imagenet"]))


def test_all_paper_presets_exist() -> None:
    assert REQUIRED <= set(EXPERIMENTS)


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_preset_header_names_paper_command_and_result(name: str) -> None:
    text = (Path(__file__).resolve().parents[1] / "conf" / "experiment" / f"{name}.yaml").read_text()
    header = text.split("\ndefaults:")[0]
    assert text.startswith("# @package _global_")
    assert f"experiment={name}" in header  # the command that runs it
    assert "arXiv" in header or "MLPerf" in header or "DAWNBench" in header  # a paper, or the benchmark entry
    assert "Reported" in header or "target" in header


def test_presets_carry_the_papers_numbers() -> None:
    g = _cfg("goyal2017_rn50_8k")
    assert (g.model.name, g.optimizer.name, g.global_batch_size, g.epochs) == ("resnet50", "sgd", 8192, 90)
    assert g.optimizer.lr == 0.1 and g.base_batch_size == 256 and g.lr_scaling == "linear"
    assert g.schedule.warmup_epochs == 5 and g.schedule.milestones == [30, 60, 80] and g.bn.group_size == 1
    assert g.model.zero_init_last_bn and g.label_smoothing == 0.0
    j = _cfg("jia2018_rn50_64k")
    assert (j.optimizer.name, j.precision.name, j.global_batch_size) == ("lars", "fp16", 65536)
    assert j.optimizer.exclude_bn_bias
    y = _cfg("ying2018_rn50_32k_tpu")
    assert (y.backend.name, y.precision.name, y.optimizer.name) == ("xla", "bf16", "lars")
    assert y.bn.group_size > 1 and y.label_smoothing > 0 and y.schedule.name == "poly"
    for b, size, batch in (("b2", 260, 32768), ("b5", 456, 65536)):
        w = _cfg(f"wongpanich2020_effnet_{b}")
        assert w.model.name == f"efficientnet_{b}" and w.data.image_size == size
        assert (w.optimizer.name, w.schedule.name, w.precision.name) == ("lars", "poly", "bf16")
        assert w.bn.group_size > 1 and w.global_batch_size == batch
    m = _cfg("mlperf_rn50")
    assert (m.target_top1, m.stop_at_target, m.eval_every, m.label_smoothing) == (75.9, True, 4, 0.1)
    assert m.optimizer.name == "lars" and m.schedule.name == "poly" and m.schedule.power == 2.0


@pytest.fixture(scope="module")
def data_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.mark.parametrize("name", EXPERIMENTS)
def test_preset_runs_two_steps_on_cpu(name: str, tmp_path: Path, data_cache: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(data_cache))
    args = [f"experiment={name}", *SMALL, f"run_dir={tmp_path / 'run'}"]
    if _cfg(name).precision.name in ("fp16", "bf16"):
        args.append("precision=fp32")  # fp16 autocast on CPU is very slow, bf16 slow without AMX
    if _cfg(name).batch_schedule.steps or _cfg(name).data.resolution.steps:
        args.append(f"epochs={_cfg(name).epochs}")  # its schedules name later epochs than debug=smoke's 2
    if _cfg(name).batch_schedule.steps:  # its batches (16,384, ...) are larger than the shrunk data set
        args.append("batch_schedule.steps=[]")
    assert main(args) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    preset = _cfg(name)
    assert summary["steps"] == 2 and summary["optimizer"] == preset.optimizer.name
    assert summary["lr_per_base_batch"] == preset.optimizer.lr
    assert summary["target_top1"] == preset.target_top1
