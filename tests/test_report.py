"""largebatch-report: the comparison table and PNG plots from two short runs, and bad input."""

from __future__ import annotations

from pathlib import Path

import pytest

from largebatch.cli import main as train
from largebatch.report import Run, format_table, load_run, main

TINY = ["debug=smoke", "progress=false", "model=resnet10t", "data.workers=0", "tensorboard=false",
        "data.synthetic.train_per_class=8", "data.synthetic.val_per_class=2"]
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    root = tmp_path_factory.mktemp("runs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LARGEBATCH_CACHE", str(root / "cache"))
        a, b = root / "small_batch", root / "large_batch"
        assert train([*TINY, "epochs=2", "global_batch_size=8", "target_top1=0", f"run_dir={a}"]) == 0
        assert train([*TINY, "epochs=2", "global_batch_size=16", "optimizer=lars", "target_top1=100.5",
                      f"run_dir={b}"]) == 0
    return [a, b]


def test_report_prints_the_table_and_writes_three_pngs(two_runs: list[Path], tmp_path: Path,
                                                      capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plots"
    assert main([*map(str, two_runs), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert "time to target" in lines[0] and "global batch" in lines[0] and "world size" in lines[0]
    small = next(ln for ln in lines if ln.startswith("small_batch"))
    large = next(ln for ln in lines if ln.startswith("large_batch"))
    assert " s " in small + " " and "success" in small  # reached target 0 at the first evaluation
    assert "not reached" in large and "aborted" in large
    assert small.split()[-2:] == ["8", "1"] and large.split()[-2:] == ["16", "1"]  # batch, world size
    for name in ("top1_vs_wall.png", "top1_vs_epoch.png", "lr_vs_step.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name


def test_loaded_run_matches_its_files(two_runs: list[Path]) -> None:
    run = load_run(two_runs[0])
    assert [e["epoch"] for e in run.evals] == [1, 2]
    assert run.time_to_target_s == run.evals[0]["wall_s"]
    # the logged lr of each train record (cosine ends at exactly 0 on the last step)
    assert run.train and all(t["lr"] >= 0 for t in run.train) and run.train[0]["lr"] > 0
    assert run.status == "success"


def test_markdown_table_from_records_alone() -> None:
    runs = [
        Run("a", Path("a"), summary={"target_top1": 75.9, "time_to_target_s": 3600.0, "best_top1": 76.1,
                                      "epochs": 90, "img_per_s": 2300.4, "global_batch_size": 8192, "world_size": 256}),
        Run("b", Path("b"), evals=[{"epoch": 1, "top1": 40.0, "wall_s": 5.0}]),  # killed before its summary
    ]
    table = format_table(runs, markdown=True).splitlines()
    assert table[2] == "| a | finished | 75.9 | 3600.0 s | 76.10 | 90 | 2300 | 8192 | 256 |"
    assert table[3] == "| b | no summary | - | no target | 40.00 | 1 | - | - | - |"


@pytest.mark.parametrize("kind", ["empty_dir", "missing", "file", "bad_json"])
def test_bad_input_is_one_line_and_exit_2(kind: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    path = tmp_path / "x"
    if kind == "empty_dir":
        path.mkdir()
    elif kind == "file":
        path.write_text("hello")
    elif kind == "bad_json":
        path.mkdir()
        (path / "metrics.jsonl").write_text('{"kind": "eval"\n')
    assert main([str(path), "--no-plots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("largebatch-report: error:") and "\n" not in err and str(path) in err
