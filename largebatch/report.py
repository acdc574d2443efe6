"""``largebatch-report RUN_DIR...``: compare runs by time to accuracy.

Reads what each run directory holds (``summary.json``, ``metrics.jsonl``,
``mlperf_log.jsonl``; a run stopped before its summary still has the other two), prints one
table line per run::

    run  status  target  time to target  best top-1  epochs  img/s  noise scale  global batch  world size

and writes four PNG plots to ``--out`` (default ``./report``): ``top1_vs_wall.png``,
``top1_vs_epoch.png``, ``lr_vs_step.png`` and ``noise_scale_vs_step.png``, one line per run.
The noise scale is the run's gradient noise scale B_simple (``diagnostics.noise_scale``;
McCandlish et al. 2018), the batch beyond which a larger one pays less and less: its column
is the run's value at the end, its plot the values over training, each run's global batch
drawn beside it as a dashed line of the same colour (stepping where a batch schedule or the
adaptive batch changed it). The global batch column lists each batch the run trained with,
in order (``32->64->128``): ``summary.json``'s ``global_batch_size_per_epoch``, else the epoch
records' ``global_batch_size``, else ``summary.json``'s ``global_batch_size``. The plots need matplotlib
(the ``report`` extra: ``pip install '/path/to/largebatch[report]'``, the clone's path);
``--no-plots`` prints the table without it.

The status column says how a run ended (:func:`run_status`): ``success`` (reached its
target), ``finished`` (ran its planned epochs or ``max_steps``; no target, or the target not
reached), ``skipped`` (it ended, but skipped at least half its steps for non-finite losses),
``preempted``, ``failed`` (an error ended it), ``stopped`` (another stop reason),
``running`` (a live run holds the run directory's lock: the numbers are its metrics so far,
not an earlier attempt's ``summary.json``), ``unfinished`` (no end was logged and its metrics
stop short of the plan in ``config.yaml``: killed) or ``unknown`` (no end logged and no plan
to compare with). A run
whose ``summary.json`` is missing is judged from ``mlperf_log.jsonl``'s ``run_stop`` and from
its metrics against ``config.yaml``.

A path that is not a run directory, or a file in it that is damaged (not UTF-8, not JSON,
JSON of the wrong shape or nested too deep to read, a value that is not a number or not a
plausible one: NaN, infinite, a top-1 outside 0-100, a negative time), gets one line on stderr
naming the file, the field and what is wrong; a damaged run keeps its row, with the status
``damaged``. The other runs are still reported (table and plots); the exit code is 2 if any
run could not be read, so a script notices.
"""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from largebatch.engine.run_dir import live_owner
from largebatch.errors import EXIT_OK, EXIT_USAGE, ReportError
from largebatch.tools.args import OneLineArgumentParser

__all__ = ["ReportError", "Run", "format_table", "load_run", "main", "run_status", "write_plots"]

RUN_FILES = ("summary.json", "metrics.jsonl", "mlperf_log.jsonl")
PLOTS = ("top1_vs_wall.png", "top1_vs_epoch.png", "lr_vs_step.png", "noise_scale_vs_step.png")


@dataclass
class Run:
    """What the report needs from one run directory."""

    name: str
    path: Path
    summary: dict[str, Any] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)  # epoch, top1 (the one the run counts), wall_s
    train: list[dict[str, Any]] = field(default_factory=list)  # step, lr, loss (None: steps skipped), img_per_s, noise_scale
    # (step at the epoch's end, its global batch) of each epoch record that names its batch (a batch schedule's)
    epoch_batches: list[tuple[int, int]] = field(default_factory=list)
    run_stop: Optional[dict[str, Any]] = None  # mlperf run_stop metadata; None: no run_stop logged
    last_epoch: Optional[int] = None  # the highest epoch any metrics record reached
    last_step: Optional[int] = None  # the highest step any metrics record reached
    logged_target: Optional[float] = None  # mlperf target_accuracy, in percent
    planned: tuple[Optional[int], Optional[int]] = (None, None)  # config.yaml's (epochs, max_steps)
    damaged: bool = False  # a file of the run could not be read (the error line names it): nothing is shown
    running: bool = False  # a live run holds the run directory's lock: its files are still growing

    @property
    def best_top1(self) -> Optional[float]:
        if self.summary.get("best_top1") is not None:
            return float(self.summary["best_top1"])
        return max((e["top1"] for e in self.evals), default=None)

    @property
    def noise_scale_final(self) -> Optional[float]:
        """The gradient noise scale at the end: ``summary.json``'s (null there: not measured, or
        not resolved from the noise at the end), else, for a run without one, the last logged."""
        if "noise_scale_final" in self.summary:
            value = self.summary["noise_scale_final"]
            return None if value is None else float(value)
        logged = [t["noise_scale"] for t in self.train if t["noise_scale"] is not None]
        return logged[-1] if logged and math.isfinite(logged[-1]) else None

    @property
    def batches(self) -> list[int]:
        """The global batch of each epoch trained: ``summary.json``'s ``global_batch_size_per_epoch``,
        else the epoch records' (a batch schedule writes them), else its one ``global_batch_size``
        (a run from before the per-epoch list, or without a batch schedule and no summary: [])."""
        per_epoch = self.summary.get("global_batch_size_per_epoch")
        if per_epoch:
            return [int(b) for b in per_epoch]
        if self.epoch_batches:
            return [b for _, b in self.epoch_batches]
        batch = self.summary.get("global_batch_size")
        return [int(batch)] if batch is not None else []

    @property
    def batch_phases(self) -> list[int]:
        """:attr:`batches` with each run of equal batches once: ``[32, 64, 128]``."""
        return [b for i, b in enumerate(self.batches) if i == 0 or b != self.batches[i - 1]]

    @property
    def status(self) -> str:
        """How the run ended (:func:`run_status`)."""
        return run_status(self)

    @property
    def target_top1(self) -> Optional[float]:
        """The target in percent: ``summary.json``'s, else the one ``mlperf_log.jsonl`` logged."""
        if self.summary.get("target_top1") is not None:
            return float(self.summary["target_top1"])
        return self.logged_target

    @property
    def time_to_target_s(self) -> Optional[float]:
        if "time_to_target_s" in self.summary:
            return self.summary["time_to_target_s"]
        target = self.target_top1
        hit = [e["wall_s"] for e in self.evals if target is not None and e["top1"] >= target]
        return hit[0] if hit else None


DAMAGED = "restore it, or move it out of the run directory to report what the other files hold"


def _read_text(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ReportError(f"{path} is damaged: not UTF-8 text (byte {data[e.start]:#04x} at offset "
                          f"{e.start}); {DAMAGED}") from None


def _deep_field(text: str, depth: int = 64) -> str:
    """`` under 'key'``: the field whose value nests past ``depth`` levels ("" if none is named)."""
    level, in_string, escaped = 0, False, False
    for i, ch in enumerate(text):
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            level += 1
            if level > depth:
                keys = re.findall(r'"([^"\\]{1,100})"\s*:', text[:i])
                return f" under '{keys[-1]}'" if keys else ""
        elif ch in "]}":
            level -= 1
    return ""


def _loads(text: str, where: str) -> Any:
    """``json.loads(text)``; JSON nested deeper than the decoder can follow is damage, not a bug."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ReportError(f"{where} is damaged: JSON nested too deep to read{_deep_field(text)} (what "
                          f"largebatch-train writes is 2 levels deep); {DAMAGED}") from None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for n, line in enumerate(_read_text(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = _loads(line, f"{path}: line {n}")
        except json.JSONDecodeError as e:
            raise ReportError(f"{path}: line {n} is not JSON ({e.msg}); {DAMAGED}") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}: line {n} is JSON but not an object ({type(record).__name__}); {DAMAGED}")
        records.append(record)
    return records


def _fields(path: Path, n: int, record: dict[str, Any], numbers: Sequence[str],
            optional: Sequence[str] = ()) -> dict[str, Any]:
    """``record``'s ``numbers`` (required) and ``optional`` fields, each a number (optional: or null)."""
    out = {}
    for key in (*numbers, *optional):
        value = record.get(key)
        if value is None and key in optional:
            out[key] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            what = "missing" if key not in record else f"{value!r}, not a number"
            raise ReportError(f"{path}: line {n}: '{key}' is {what}; {DAMAGED}")
        if key != "loss" and not math.isfinite(value):  # a loss may be NaN; null: every step skipped
            raise ReportError(f"{path}: line {n}: '{key}' is {value!r}, not a finite number; {DAMAGED}")
        out[key] = value
    return out


def _noise_scale(path: Path, n: int, record: dict[str, Any]) -> Optional[float]:
    """A train record's ``noise_scale``: None where the run does not measure it; nan (nothing
    averaged yet) and inf (|G|² not resolved from the noise yet) are what the run logs then,
    kept as they are and left out of the plot."""
    value = record.get("noise_scale")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ReportError(f"{path}: line {n}: 'noise_scale' is {value!r}, not a number; {DAMAGED}")
    return float(value)


def _percent(x: float) -> bool:
    return 0 <= x <= 100.5  # tests and sweeps use an unreachable target of 100.5


def _non_negative(x: float) -> bool:
    return x >= 0


def _count(x: float) -> bool:
    return x >= 0 and float(x).is_integer()


# summary.json keys the report reads, each a number or null: (plausible, what it must be)
SUMMARY_NUMBERS = {
    "best_top1": (_percent, "a percentage in 0-100"),
    "target_top1": (_percent, "a percentage in 0-100.5"),
    "time_to_target_s": (_non_negative, "a time >= 0"),
    "img_per_s": (_non_negative, "a rate >= 0"),
    "epochs": (_count, "a whole number >= 0"),
    "steps": (_count, "a whole number >= 0"),
    "global_batch_size": (_count, "a whole number >= 0"),
    "final_global_batch_size": (_count, "a whole number >= 0"),
    "world_size": (_count, "a whole number >= 0"),
    "noise_scale_final": (lambda x: True, "a number"),  # may be negative: an estimate of the noise
}


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = _loads(_read_text(path), str(path))
    except json.JSONDecodeError as e:
        raise ReportError(f"{path} is not JSON ({e.msg}); {DAMAGED}") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{path} is damaged: a JSON {type(summary).__name__}, not the object "
                          f"largebatch-train writes; {DAMAGED}")
    for key, (plausible, what) in SUMMARY_NUMBERS.items():
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise ReportError(f"{path} is damaged: '{key}' is {value!r}, not a number; {DAMAGED}")
        if value is not None and not (math.isfinite(value) and plausible(value)):
            raise ReportError(f"{path} is damaged: '{key}' is {value!r}, not {what}; {DAMAGED}")
    per_epoch = summary.get("global_batch_size_per_epoch")
    if per_epoch is not None and not (isinstance(per_epoch, list) and all(
            not isinstance(b, bool) and isinstance(b, int) and b > 0 for b in per_epoch)):
        raise ReportError(f"{path} is damaged: 'global_batch_size_per_epoch' is {per_epoch!r}, not a list of "
                          f"whole numbers > 0; {DAMAGED}")
    reason = summary.get("stop_reason")
    if reason is not None and not isinstance(reason, str):
        raise ReportError(f"{path} is damaged: 'stop_reason' is {reason!r}, not a string; {DAMAGED}")
    return summary


def _read_metrics(run: Run, path: Path) -> None:
    for n, r in enumerate(_read_jsonl(path), 1):
        kind = r.get("kind")
        if kind == "eval":
            f = _fields(path, n, r, ("epoch", "top1"), ("wall_s", "time_s"))
            wall = f["wall_s"] if f["wall_s"] is not None else f["time_s"]
            if wall is None:
                raise ReportError(f"{path}: line {n}: an eval record without 'wall_s' or 'time_s'; {DAMAGED}")
            if r.get("top1_of") == "ema":  # the run counts its weight EMA's top-1 (ema.target=ema)
                f["top1"] = _fields(path, n, r, ("ema_top1",), ())["ema_top1"]
            run.evals.append({"epoch": f["epoch"], "top1": f["top1"], "wall_s": wall})
        elif kind == "train":
            f = _fields(path, n, r, ("step", "lr"), ("loss", "img_per_s"))
            run.train.append({"step": f["step"], "lr": f["lr"], "loss": f["loss"], "img_per_s": f["img_per_s"],
                              "noise_scale": _noise_scale(path, n, r)})
        elif kind == "epoch" and r.get("global_batch_size") is not None:  # the epoch's batch (batch schedule)
            f = _fields(path, n, r, ("step", "global_batch_size"))
            if not (_count(f["step"]) and _count(f["global_batch_size"]) and f["global_batch_size"] > 0):
                raise ReportError(f"{path}: line {n}: 'global_batch_size' {f['global_batch_size']!r} at step "
                                  f"{f['step']!r} is not a whole number > 0; {DAMAGED}")
            run.epoch_batches.append((int(f["step"]), int(f["global_batch_size"])))
        if kind in ("train", "eval", "epoch"):
            f = _fields(path, n, r, (), ("epoch", "step"))
            if f["epoch"] is not None and kind != "train":  # a train record's epoch is the one in progress
                run.last_epoch = max(run.last_epoch or 0, int(f["epoch"]))
            if f["step"] is not None:
                run.last_step = max(run.last_step or 0, int(f["step"]))


def _read_mlperf(run: Run, path: Path) -> None:
    for n, r in enumerate(_read_jsonl(path), 1):
        if r.get("key") == "run_stop":
            meta = r.get("metadata")
            if not isinstance(meta, dict):
                raise ReportError(f"{path}: line {n}: run_stop has no metadata object; {DAMAGED}")
            if not isinstance(meta.get("stop_reason"), (str, type(None))):
                raise ReportError(f"{path}: line {n}: run_stop's 'stop_reason' is {meta['stop_reason']!r}, "
                                  f"not a string; {DAMAGED}")
            run.run_stop = meta
        elif r.get("key") == "target_accuracy":
            run.logged_target = round(100.0 * _fields(path, n, r, ("value",))["value"], 4)


def load_run(path: str | Path) -> Run:
    """Read one run directory, or raise ``ReportError`` saying why it is not one or what is damaged."""
    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"{p} is not a directory; pass run directories (made by largebatch-train)")
    if not _is_run_dir(p):
        raise ReportError(f"{p} is not a run directory: it has none of {', '.join(RUN_FILES)}")
    run = Run(name=p.resolve().name, path=p, running=live_owner(p) is not None)
    # A live run's summary.json, if any, is an earlier attempt's (it is written at the end):
    # its numbers and its end are stale; metrics.jsonl is what the live run appends to.
    if (p / "summary.json").is_file() and not run.running:
        run.summary = _read_summary(p / "summary.json")
    if (p / "metrics.jsonl").is_file():
        _read_metrics(run, p / "metrics.jsonl")
    if (p / "mlperf_log.jsonl").is_file():
        _read_mlperf(run, p / "mlperf_log.jsonl")
    if not run.summary and run.run_stop is None:  # no end logged: compare the metrics with the plan
        run.planned = _planned_end(p / "config.yaml")
    return run


def _is_run_dir(p: Path) -> bool:
    return p.is_dir() and any((p / f).is_file() for f in RUN_FILES)


def _planned_end(path: Path) -> tuple[Optional[int], Optional[int]]:
    """``(epochs, max_steps)`` from a run's ``config.yaml``; ``(None, None)`` without one."""
    if not path.is_file():
        return None, None
    import yaml

    try:
        cfg = yaml.safe_load(_read_text(path))
    except yaml.YAMLError as e:
        raise ReportError(f"{path} is not YAML ({str(e).splitlines()[0]}); {DAMAGED}") from None
    if not isinstance(cfg, dict):
        raise ReportError(f"{path} is damaged: a YAML {type(cfg).__name__}, not the run's config; {DAMAGED}")
    plan = []
    for key in ("epochs", "max_steps"):
        value = cfg.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ReportError(f"{path} is damaged: '{key}' is {value!r}, not an integer; {DAMAGED}")
        plan.append(value)
    return plan[0], plan[1]


def run_status(run: Run) -> str:
    """How the run ended: success, finished, skipped, preempted, failed, stopped, unfinished or unknown
    (or ``damaged``: a file of it could not be read; ``running``: a live run holds its lock).

    The end is what ``summary.json`` or ``run_stop`` (in ``mlperf_log.jsonl``) says; a run
    with neither is ``finished`` when its metrics reached the ``epochs`` or ``max_steps`` of
    its ``config.yaml``, else ``unfinished``, or ``unknown`` without a config to compare with.
    MLPerf's own ``aborted`` (target not reached) is not used: the target columns say it.
    """
    if run.damaged:
        return "damaged"
    if run.running:
        return "running"
    stop = run.run_stop or {}
    if stop.get("error"):
        return "failed"
    ended = bool(run.summary) or run.run_stop is not None
    reason = run.summary.get("stop_reason", stop.get("stop_reason"))
    if isinstance(reason, str) and reason.startswith("preempted"):
        return "preempted"
    if run.target_top1 is not None and run.time_to_target_s is not None:
        return "success"
    if ended:
        if _mostly_skipped(run.summary):
            return "skipped"
        # the loop ends without a stop reason only after its last epoch
        return "finished" if reason is None or reason.startswith("max_steps") else "stopped"
    epochs, max_steps = run.planned
    if epochs is None and max_steps is None:
        return "unknown"
    if (epochs is not None and (run.last_epoch or 0) >= epochs) or (
            max_steps is not None and (run.last_step or 0) >= max_steps):
        return "finished"
    return "unfinished"


def _mostly_skipped(summary: dict[str, Any]) -> bool:
    """``summary.json`` says the run skipped (non-finite losses, ``non_finite=skip``) at least
    half of its steps: whatever its end, its numbers say little about its recipe."""
    skipped, steps = summary.get("skipped_steps"), summary.get("steps")
    numbers = all(isinstance(v, int) and not isinstance(v, bool) for v in (skipped, steps))
    return numbers and steps > 0 and 2 * skipped >= steps


def _fmt(value: Any, spec: str = "", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_table(runs: Sequence[Run], *, markdown: bool = False) -> str:
    """One line per run: time to target, best top-1, epochs, img/s, global batch (each batch the
    run trained with, in order: ``32->64->128`` under a batch schedule), world size."""
    head = ["run", "status", "target %", "time to target", "best top-1 %", "epochs", "img/s",
            "noise scale", "global batch", "world size"]
    rows = []
    for r in runs:
        s = r.summary
        target = r.target_top1
        ttt = r.time_to_target_s
        if target is None:
            ttt_text = "no target"
        elif ttt is None:
            ttt_text = "not reached"
        else:
            ttt_text = f"{ttt:.1f} s"
        epochs = s.get("epochs", max((e["epoch"] for e in r.evals), default=r.last_epoch))
        rows.append([
            r.name, r.status, _fmt(target, "g"), ttt_text,
            _fmt(r.best_top1, ".2f"), _fmt(epochs), _fmt(s.get("img_per_s"), ".0f"),
            _fmt(r.noise_scale_final, ".0f"), "->".join(map(str, r.batch_phases)) or "-", _fmt(s.get("world_size")),
        ])
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines)
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i == 0 else f"{{:>{w}}}" for i, w in enumerate(widths))
    return "\n".join([fmt.format(*head), fmt.format(*("-" * w for w in widths))] + [fmt.format(*row) for row in rows])


def write_plots(runs: Sequence[Run], out: Path) -> list[Path]:
    """Top-1 vs wall time, top-1 vs epoch and lr vs step, one line per run; PNG files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    specs = [
        (PLOTS[0], "training wall time (s)", "val top-1 (%)", lambda r: ([e["wall_s"] for e in r.evals], [e["top1"] for e in r.evals])),
        (PLOTS[1], "epoch", "val top-1 (%)", lambda r: ([e["epoch"] for e in r.evals], [e["top1"] for e in r.evals])),
        (PLOTS[2], "optimizer step", "learning rate", lambda r: ([t["step"] for t in r.train], [t["lr"] for t in r.train])),
    ]
    paths = []
    for name, xlabel, ylabel, series in specs[:3]:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for r in runs:
            xs, ys = series(r)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=r.name)
        if ylabel.startswith("val"):
            targets = {r.target_top1 for r in runs} - {None}
            for t in sorted(targets):
                ax.axhline(t, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if any(series(r)[0] for r in runs):
            ax.legend(fontsize="small")
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        paths.append(out / name)
    paths.append(_noise_scale_plot(runs, out / PLOTS[3], plt))
    return paths


def _noise_scale_plot(runs: Sequence[Run], path: Path, plt: Any) -> Path:
    """B_simple against the step (log scale: it grows by orders of magnitude as the loss falls),
    each run's global batch a dashed line of its colour: where the line lies far below the
    curve, a larger batch would still pay; far above, the steps it saves shrink."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    drawn = False
    for r in runs:
        pts = [(t["step"], t["noise_scale"]) for t in r.train
               if t["noise_scale"] is not None and math.isfinite(t["noise_scale"]) and t["noise_scale"] > 0]
        if not pts:
            continue
        line, = ax.plot(*zip(*pts), marker="o" if len(pts) < 30 else None, label=f"{r.name}: noise scale")
        _batch_line(ax, r, color=line.get_color())
        drawn = True
    if drawn:
        ax.set_yscale("log")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no run measured the gradient noise scale\n(diagnostics.noise_scale)",
                ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("gradient noise scale B_simple (images)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _batch_line(ax: Any, run: Run, *, color: str) -> None:
    """The run's global batch against the step, dashed: flat for one batch, else a step at each
    epoch end where the batch changed (epoch records' steps; a last epoch stopped inside it runs
    on to the last logged step)."""
    phases, batches = run.batch_phases, run.batches
    label = f"{run.name}: global batch {'->'.join(map(str, phases))}"
    if len(phases) == 1:
        ax.axhline(phases[0], color=color, linestyle="--", linewidth=0.9, label=label)
        return
    if not phases or not run.epoch_batches:
        return
    xs, ys, start = [], [], 0
    for end, batch in run.epoch_batches:
        xs += [start, end]
        ys += [batch, batch]
        start = end
    last = run.last_step or start
    if len(batches) > len(run.epoch_batches) and last > start:
        xs += [start, last]
        ys += [batches[len(run.epoch_batches)]] * 2
    ax.plot(xs, ys, color=color, linestyle="--", linewidth=0.9, label=label)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = OneLineArgumentParser(prog="largebatch-report", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories made by largebatch-train")
    p.add_argument("--out", type=Path, default=Path("report"), help="folder for the PNG plots (default: ./report)")
    p.add_argument("--no-plots", action="store_true", help="print the table only (no matplotlib needed)")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = p.parse_args(argv)
    failed = False
    try:
        if not args.no_plots:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ReportError(
                    "the plots need matplotlib: pip install '/path/to/largebatch[report]' (your clone; or pass --no-plots)"
                ) from None
        runs = []
        for path in args.runs:  # a damaged run is named and marked; the others are still reported
            try:
                runs.append(load_run(path))
            except (ReportError, OSError) as e:
                print(f"largebatch-report: error: {e}", file=sys.stderr, flush=True)
                failed = True
                if _is_run_dir(Path(path)):
                    runs.append(Run(name=Path(path).resolve().name, path=Path(path), damaged=True))
        if runs:
            print(format_table(runs, markdown=args.markdown), flush=True)
        if runs and not args.no_plots:
            paths = write_plots(runs, args.out)
            print(f"plots: {', '.join(str(x) for x in paths)}")
    except (ReportError, OSError) as e:
        print(f"largebatch-report: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_USAGE if failed else EXIT_OK

if __name__ == "__main__":
    sys.exit(main())
