"""A run file rank 0 cannot write, under ``launch/torchrun.sh`` (2 gloo ranks): both ranks
stop after the same step (no rank waits forever in a collective), the step is checkpointed,
and the script exits 74 with rank 0's line naming the file."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

from largebatch.engine.checkpoint import checkpoint_step, list_checkpoints
from tests.test_run_file_writes import _file_on_tiny_fs, mounts  # noqa: F401  (the fixture)
from tests.smoke import smoke

LAUNCH = Path(__file__).resolve().parents[2] / "launch"

ARGS = smoke(
    "backend=cpu", "data.synthetic.train_per_class=16",
    "epochs=2", "log_every=1", "precision=fp32",  # 8 steps per epoch: 16 steps
)


def test_a_full_disk_under_metrics_stops_both_ranks_with_a_checkpoint_and_exit_74(
    tmp_path: Path, mounts: list[Path]  # noqa: F811
) -> None:
    run = tmp_path / "run"
    path = _file_on_tiny_fs(tmp_path, run, "metrics.jsonl", mounts, free_pages=1, pad=3900)
    env = {**os.environ, "TORCHRUN": str(Path(sys.executable).with_name("torchrun")), "NPROC_PER_NODE": "2",
           "OMP_NUM_THREADS": "1", "LARGEBATCH_CACHE": str(tmp_path / "cache")}
    env.pop("LB_DRY_RUN", None)
    proc = subprocess.run(["bash", str(LAUNCH / "torchrun.sh"), *ARGS, f"run_dir={run}"], env=env,
                          capture_output=True, text=True, timeout=300)
    out, err = proc.stdout, proc.stderr
    assert proc.returncode == 74, (out[-3000:], err[-3000:])
    assert f"largebatch: error: cannot write the metrics file {path}: [Errno {errno.ENOSPC} ENOSPC]" in err, err[-3000:]
    saved = list_checkpoints(run / "checkpoints")
    summary = json.loads((run / "summary.json").read_text())
    assert saved and summary["steps"] == checkpoint_step(saved[-1]) < 16, (saved, summary)
    assert summary["stop_reason"] == "a file of the run could not be written"
    assert "Traceback" not in out
