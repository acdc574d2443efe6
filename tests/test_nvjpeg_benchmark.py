"""benchmarks/throughput.py runs end to end on the CPU (a smoke run: the numbers mean nothing
here; the GPU table is made on a GPU machine with the command in benchmarks/README.md)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "throughput.py"


def test_throughput_script_prints_one_row_per_decoder_and_configuration(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = importlib.util.spec_from_file_location("throughput", SCRIPT)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "throughput", bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)  # type: ignore[union-attr]
    assert bench.main(["--device", "cpu", "--make-data", str(tmp_path / "jpegs"), "--files", "24", "--classes", "3",
                       "--model", "resnet10t", "--image-size", "32", "--batch", "4", "--steps", "2", "--warmup", "1",
                       "--precisions", "fp32", "--compile", "none", "--workers", "1",
                       "--data", "synthetic", "torchvision", "nvjpeg"]) == 0
    out = capsys.readouterr().out
    assert "wrote 27 JPEGs" in out and "command: python" in out and "torch " in out
    rows = re.findall(r"^\| (decode|train) \| ([^|]+) \| ([\d,]+) \|", out, flags=re.M)
    configs = [name for _, name, _ in rows]
    assert [k for k, _, _ in rows] == ["decode"] * 3 + ["train"] * 3
    assert any("synthetic" in c for c in configs) and any("torchvision" in c for c in configs)
    assert any("nvjpeg" in c for c in configs)
    assert all(int(ips.replace(",", "")) > 0 for _, _, ips in rows)
    assert sorted(p.stat().st_size > 0 for p in (tmp_path / "jpegs").rglob("*.JPEG")) == [True] * 27
