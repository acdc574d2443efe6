"""benchmarks/noise_scale_overhead.py runs as documented (toy size: no timing is checked here;
its numbers are in benchmarks/README.md): one process with accumulation, 2 gloo ranks under
torchrun and the probe, each printing its table; the measured steps update the noise scale
as often as the setting says (the script refuses to print a table otherwise)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "noise_scale_overhead.py"
TOY = ["--model", "resnet10t", "--image-size", "16", "--batch", "8", "--steps", "2", "--rounds", "1",
       "--warmup", "2"]


@pytest.mark.parametrize("setting, where", [
    ([], "1 process, micro-batch (4) vs step (8)"),
    (["--ranks", "2"], "2 ranks (DDP, gloo), local vs reduced gradient"),
    (["--probe-every", "2"], "1 process, a probe every 2 steps, half batch (4) vs batch (8)"),
])
def test_the_overhead_table_prints(setting: list[str], where: str) -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *TOY, *setting], capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [ln for ln in proc.stdout.splitlines() if ln.startswith("| o")]
    assert [r.split("|")[1].strip() for r in rows] == ["off", "on"], proc.stdout
    assert float(rows[1].split("|")[3]) > 0
    assert where in proc.stdout, proc.stdout


def test_nothing_to_measure_is_one_line() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT), *TOY, "--accumulation", "1"], capture_output=True,
                          text=True, timeout=240)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines() == [
        "noise_scale_overhead: nothing to measure here (one process, no accumulation): use --accumulation 2, "
        "--ranks 2 or --probe-every N"]
