"""benchmarks/throughput.py runs end to end on the CPU at a tiny size, so that it cannot rot (a
smoke run: the numbers mean nothing here; the GPU table is made on a GPU machine with the
command in benchmarks/README.md), and its arithmetic is right."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput.py"
COLUMNS = ["kind", "configuration", "img/s", "MFU (measured matmul: n/a)", "MFU (spec peak: n/a)", "throughput loss",
           "data wait", "loader ms per batch: wait / decode / augment / ahead", "GPU mem peak (GiB)"]


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    spec = importlib.util.spec_from_file_location("throughput", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "throughput", module)  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def test_throughput_script_prints_every_cpu_row_and_column(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))  # the decoded store's
    assert bench.main(["--device", "cpu", "--make-data", str(tmp_path / "jpegs"), "--files", "24", "--classes", "3",
                       "--model", "resnet10t", "--image-size", "32", "--batch", "4", "--steps", "2", "--warmup", "1",
                       "--precisions", "fp32", "--compile", "none", "--workers", "1",
                       "--data", "torchvision", "nvjpeg", "nvjpeg-serial", "decoded"]) == 0
    out = capsys.readouterr().out
    assert "decoded store ready in" in out and any((tmp_path / "cache").glob("decoded-*-train-*px"))
    assert "wrote 27 JPEGs" in out and "command: python" in out and "torch " in out and "CPU (" in out
    header = next(line for line in out.splitlines() if line.startswith("| kind |"))
    assert [c.strip() for c in header.strip("|").split("|")] == COLUMNS
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if re.match(r"^\| (decode|loader|train) \|", line)]
    assert all(len(r) == len(COLUMNS) for r in rows)
    assert [r[0] for r in rows] == ["decode"] * 3 + ["loader"] * 4 + ["train"] * 5
    loader = {r[1].split()[0]: r for r in rows if r[0] == "loader"}
    assert set(loader) == {"torchvision", "nvjpeg", "nvjpeg-serial", "decoded"}
    assert all("no model" in r[1] for r in loader.values())
    train = {r[1].split()[1]: r for r in rows if r[0] == "train"}
    # synthetic added: the reference of the throughput loss
    assert list(train) == ["synthetic", "torchvision", "nvjpeg", "nvjpeg-serial", "decoded"]
    assert train["synthetic"][5] == "n/a"
    synthetic = float(train["synthetic"][2].replace(",", ""))
    assert "(1 threads)" in train["decoded"][1] and "(1 workers)" in train["nvjpeg"][1]
    for name in ("torchvision", "nvjpeg", "nvjpeg-serial", "decoded"):
        ips = float(train[name][2].replace(",", ""))
        stall = float(train[name][5].rstrip("%")) / 100
        # the printed img/s are rounded to 1 img/s and the stall to 0.1%: the stall is
        # 1 - ips/synthetic up to that rounding, |d(ips/syn)| <= 0.5/syn + 0.5 ips/syn^2
        rounding = 0.5 / synthetic + 0.5 * ips / synthetic**2 + 0.0005
        assert stall == pytest.approx(max(0.0, 1 - ips / synthetic), abs=rounding + 1e-6)
    assert all(float(r[2].replace(",", "")) > 0 for r in rows)
    # the data wait: a share of the training rows' timed steps (the synthetic one's ~0)
    assert all(0 <= float(r[6].rstrip("%")) <= 100 for r in rows if r[0] == "train")
    assert float(train["synthetic"][6].rstrip("%")) < 5 and all(r[6] == "n/a" for r in rows if r[0] != "train")
    # the nvJPEG loaders' stages per batch (wait / decode / augment / ahead), on their loader and train
    # rows (which stages a 2-step window catches depends on how far ahead the threads were: values
    # > 0 are held in tests/test_nvjpeg.py, over a whole epoch)
    for r in [loader["nvjpeg"], loader["nvjpeg-serial"], train["nvjpeg"], train["nvjpeg-serial"]]:
        assert all(float(ms) >= 0 for ms in r[7].split(" / ")) and len(r[7].split(" / ")) == 4
    assert all(r[7] == "n/a" for r in [loader["torchvision"], loader["decoded"], train["synthetic"]])
    assert sorted(p.stat().st_size > 0 for p in (tmp_path / "jpegs").rglob("*.JPEG")) == [True] * 27


def test_stall_idle_and_card_arithmetic(bench: ModuleType) -> None:
    assert bench.input_stall(750.0, 1000.0) == pytest.approx(0.25)
    assert bench.input_stall(1010.0, 1000.0) == 0.0  # noise above the ceiling is no negative stall
    assert bench.input_stall(10.0, None) is None
    assert bench.stages_text({"decode": 17.04, "augment": 5.0, "device_wait": 0.25}) == "0.2 / 17.0 / 5.0 / 0.0"
    assert bench.stages_text(None) == bench.stages_text({}) == "n/a"
    assert bench.card_variant("NVIDIA H100 80GB HBM3") == "H100 SXM"
    assert bench.card_variant("NVIDIA H100 PCIe") == "H100 PCIe"
    assert bench.card_variant("NVIDIA H100 NVL") == "H100 NVL"
    assert bench.card_variant("NVIDIA H200") == "H200 SXM"
    assert bench.card_variant("NVIDIA A100-SXM4-80GB") == "A100 SXM"
    assert bench.card_variant("NVIDIA A100 80GB PCIe") == "A100 PCIe"
    assert bench.card_variant("NVIDIA GeForce RTX 4090") is None
    assert bench.card_variant("NVIDIA GH200 480GB") is None
    assert all(bench.card_variant(v) in bench.SPEC_PEAK_TFLOPS for v in ("NVIDIA H100 80GB HBM3", "NVIDIA H200"))


def test_a_spent_budget_lists_the_rows_it_left_out(bench: ModuleType, tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    """--budget-s: rows not started once the budget is spent are named, not silently dropped; and
    --data-only writes the JPEGs and measures nothing (the campaign's data phase)."""
    jpegs = tmp_path / "jpegs"
    assert bench.main(["--device", "cpu", "--make-data", str(jpegs), "--files", "8", "--classes", "2",
                       "--distinct", "4", "--workers", "1", "--data-only"]) == 0
    out = capsys.readouterr().out
    assert "wrote 6 JPEGs" in out and "4 more train files hard-linked" in out and "| kind |" not in out
    train = sorted((jpegs / "train").rglob("*.JPEG"))
    assert len(train) == 8 and len({p.stat().st_ino for p in train}) == 4  # 4 distinct, each linked once
    assert bench.main(["--device", "cpu", "--root", str(jpegs), "--model", "resnet10t", "--image-size", "32",
                       "--batch", "2", "--steps", "1", "--warmup", "1", "--precisions", "fp32",
                       "--compile", "none", "--optimizers", "sgd", "lars", "--workers", "1", "--no-decode",
                       "--data", "synthetic", "torchvision", "--budget-s", "0"]) == 0
    out = capsys.readouterr().out
    assert not re.search(r"^\| (loader|train) \|", out, re.MULTILINE)
    left = out.split("not measured: ")[1]
    assert "loader torchvision fp32 NHWC" in left
    assert "resnet10t synthetic fp32 NHWC eager sgd (2 rows)" in left and "eager lars (2 rows)" in left


def test_no_train_rows_measures_the_loaders_alone_and_builds_no_model(
    bench: ModuleType, tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--no-train-rows (the GPU campaign's loader phase, issue 86 item 6): the loader rows of both
    nvJPEG arrangements with their stages, no train row, no model built (nor its FLOPs counted),
    and no line about synthetic rows added, since none run."""
    import timm

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("a model was built")

    monkeypatch.setattr(timm, "create_model", no_model)
    assert bench.main(["--device", "cpu", "--make-data", str(tmp_path / "jpegs"), "--files", "16", "--classes", "2",
                       "--distinct", "8", "--image-size", "32", "--batch", "4", "--steps", "2", "--warmup", "1",
                       "--precisions", "fp32", "--compile", "default", "--workers", "1", "--no-decode",
                       "--no-train-rows", "--data", "nvjpeg-serial", "nvjpeg"]) == 0
    out = capsys.readouterr().out
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if re.match(r"^\| (decode|loader|train) \|", line)]
    assert [(r[0], r[1].split()[0]) for r in rows] == [("loader", "nvjpeg-serial"), ("loader", "nvjpeg")]
    assert all("no model" in r[1] and len(r[7].split(" / ")) == 4 for r in rows)
    assert "synthetic rows added" not in out and "GFLOPs per training image" not in out
