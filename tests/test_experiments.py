"""Every paper preset in conf/experiment/ composes to what its header says, documents itself,
and runs 2 optimizer steps on the embedded data on CPU shrunk by the README's command."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from largebatch.cli import main
from largebatch.config import compose_config, to_train_config
from tests.docs_text import README

EXPERIMENTS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "experiment").glob("*.yaml"))
REQUIRED = {
    "goyal2017_rn50_8k", "jia2018_rn50_64k", "ying2018_rn50_32k_tpu",
    "wongpanich2020_effnet_b2", "wongpanich2020_effnet_b5", "mlperf_rn50", "fastai2018_rn50_128gpu",
    "mikami2018_rn50_68k",
}


def _readme_shrink() -> list[str]:
    """The overrides of the README's "shrink a preset" command (its ```bash block with
    ``experiment=`` and ``debug=smoke``), less its ``experiment=``: one set for every preset."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    command = next(b for b in blocks if "largebatch-train experiment=" in b and "debug=smoke" in b)
    words = shlex.split(command.replace("\\\n", " "))
    start = next(i for i, w in enumerate(words) if w.endswith("largebatch-train")) + 1
    return [w for w in words[start:] if not w.startswith("experiment=")]


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
    """The README's command as printed, whatever the preset's phases (issue 68: the fast.ai
    preset's batch and resolution phases outlived debug=smoke's 2 epochs and it stopped, exit 2)."""
    monkeypatch.setenv("LARGEBATCH_CACHE", str(data_cache))
    shrink = _readme_shrink()
    assert {"debug=smoke", "data=embedded", "max_steps=2"} <= set(shrink), shrink
    assert main([f"experiment={name}", *shrink, "tensorboard=false", f"run_dir={tmp_path / 'run'}"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    preset = _cfg(name)
    assert summary["steps"] == 2 and summary["optimizer"] == preset.optimizer.name
    assert summary["lr_per_base_batch"] == preset.optimizer.lr
    assert summary["target_top1"] == preset.target_top1


def test_smoke_drops_the_phases_only_it_outlives(capsys: pytest.CaptureFixture) -> None:
    """debug=smoke drops a preset's batch and resolution phases; without it, a run shorter than
    its phases is still refused (one line, exit 2), and a phase given on the command line wins."""
    smoke = to_train_config(compose_config(["experiment=fastai2018_rn50_128gpu", "data=embedded", "debug=smoke"]))
    assert smoke.epochs == 2 and smoke.batch_schedule.steps == [] and smoke.data.resolution.steps == []
    assert smoke.optimizer.lr == _cfg("fastai2018_rn50_128gpu").optimizer.lr  # the recipe itself stays
    assert main(["experiment=fastai2018_rn50_128gpu", "data=embedded", "epochs=2", "--cfg", "job"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("largebatch: error: ") and err.count("\n") == 1, err
    kept = to_train_config(compose_config(["experiment=fastai2018_rn50_128gpu", "data=embedded", "debug=smoke",
                                           "data.resolution.schedule=steps", "data.resolution.steps=[[0,32],[1,48]]"]))
    assert kept.data.resolution.steps == [[0, 32], [1, 48]]
