"""An MLPerf-style event log: ``mlperf_log.jsonl``, one JSON event a line.

The format follows the MLCommons logging library (``mlperf_logging.mllog``): each event has
``namespace``, ``time_ms`` (Unix epoch, milliseconds), ``event_type`` (``INTERVAL_START``,
``INTERVAL_END`` or ``POINT_IN_TIME``), ``key``, ``value`` and ``metadata``; MLPerf writes
each after a ``:::MLLOG `` prefix, here the lines are plain JSON so any JSONL reader parses
them. Events, in order::

    run_start                        INTERVAL_START  before the first step
    <hyperparameters>                POINT_IN_TIME   global_batch_size, opt_name, ... (once)
    epoch_start   {epoch_num}        INTERVAL_START  1-based
    global_batch_size {epoch_num}    POINT_IN_TIME   a batch schedule's new batch, at each change
    epoch_stop    {epoch_num}        INTERVAL_END
    eval_accuracy {epoch_num}        POINT_IN_TIME   value: top-1 as a fraction (MLPerf's unit)
    ...
    run_stop      {status, ...}      INTERVAL_END    status: success | aborted

``status`` is ``success`` when the run reached ``target_top1`` (MLPerf's definition), or,
with no target set, when it finished without an error; otherwise ``aborted``. The
``run_stop`` metadata also carries the time to target, best top-1 and the stop reason.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from largebatch.engine.loop import Hook
from largebatch.engine.run_files import AppendLog, record_failure

__all__ = ["MLPerfLogHook", "run_status"]

INTERVAL_START = "INTERVAL_START"
INTERVAL_END = "INTERVAL_END"
POINT_IN_TIME = "POINT_IN_TIME"


def run_status(*, target_top1: Optional[float], time_to_target_s: Optional[float], failed: bool) -> str:
    """MLPerf's run status: ``success`` iff the target was reached (no target: no error)."""
    if target_top1 is not None:
        return "success" if time_to_target_s is not None else "aborted"
    return "aborted" if failed else "success"


class MLPerfLogHook(Hook):
    """Writes the MLPerf-style event log of a run (rank 0 only: add it only there).

    Args:
        path: the JSONL file, opened for appending (a resumed run adds a second run_start).
        target_top1: the run's target, in percent (None: no target).
        params: hyperparameters logged once after ``run_start`` as POINT_IN_TIME events.
        top1_of: ``raw`` or ``ema`` (the weight EMA's): the accuracy ``eval_accuracy`` logs,
            the one the time to target uses.
    """

    def __init__(self, path: str | os.PathLike, *, target_top1: Optional[float] = None,
                 params: Optional[Mapping[str, Any]] = None, top1_of: str = "raw") -> None:
        self.path = Path(path)
        self.target_top1 = target_top1
        self.prefix = "ema_" if top1_of == "ema" else ""
        self.params = dict(params or {})
        self.file = AppendLog(self.path, "the MLPerf log")
        self._batch: Optional[int] = None

    def event(self, key: str, value: Any = None, *, event_type: str = POINT_IN_TIME, **metadata: Any) -> None:
        record = {
            "namespace": "",
            "time_ms": int(time.time() * 1000),
            "event_type": event_type,
            "key": key,
            "value": value,
            "metadata": metadata,
        }
        record_failure(self.trainer, self.file.write_line(json.dumps(record)))

    def before_train(self) -> None:
        self.event("run_start", event_type=INTERVAL_START)
        for key, value in self.params.items():
            self.event(key, value)
        if self.target_top1 is not None:
            self.event("target_accuracy", self.target_top1 / 100.0)

    def before_epoch(self) -> None:
        t = self.trainer
        self.event("epoch_start", event_type=INTERVAL_START, epoch_num=t.state.epoch + 1)
        if t.settings.batch_schedule is not None:  # batch-size control: each change (and a resumed run's first)
            batch = t.global_batch_size
            if batch != self._batch and (self._batch is not None or batch != self.params.get("global_batch_size")):
                self.event("global_batch_size", batch, epoch_num=t.state.epoch + 1, lr=t.current_lr())
            self._batch = batch

    def after_epoch(self) -> None:
        self.event("epoch_stop", event_type=INTERVAL_END, epoch_num=self.trainer.state.epoch)

    def after_eval(self, metrics: dict[str, float]) -> None:
        p = self.prefix
        self.event("eval_accuracy", round(metrics[p + "top1"] / 100.0, 6), epoch_num=metrics.get("epoch"),
                   top5=round(metrics[p + "top5"] / 100.0, 6), wall_s=metrics.get("wall_s"))

    def after_train(self) -> None:
        t = self.trainer
        s = t.state
        failed = sys.exc_info()[0] is not None  # after_train runs in the loop's `finally`
        status = run_status(target_top1=self.target_top1, time_to_target_s=s.time_to_target_s, failed=failed)
        self.event(
            "run_stop", event_type=INTERVAL_END, status=status,
            time_to_target_s=s.time_to_target_s, best_top1=s.best_top1 / 100.0 if s.evals else None,
            epochs=s.epoch, steps=s.step, wall_s=round(s.elapsed_s, 3), stop_reason=t.stop_reason,
            error=repr(sys.exc_info()[1]) if failed else None,
        )
        record_failure(t, self.file.close())
