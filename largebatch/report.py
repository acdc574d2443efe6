"""``largebatch-report RUN_DIR...``: compare runs by time to accuracy.

Reads what each run directory holds (``summary.json``, ``metrics.jsonl``,
``mlperf_log.jsonl``; a run stopped before its summary still has the other two), prints one
table line per run::

    run  status  target  time to target  best top-1  epochs  img/s  global batch  world size

and writes three PNG plots to ``--out`` (default ``./report``): ``top1_vs_wall.png``,
``top1_vs_epoch.png`` and ``lr_vs_step.png``, one line per run. The plots need matplotlib
(``pip install 'largebatch[report]'``); ``--no-plots`` prints the table without it.

A path that is not a run directory, or a file that cannot be parsed, ends with one line on
stderr naming it, and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from largebatch.errors import ReportError

__all__ = ["ReportError", "Run", "format_table", "load_run", "main", "write_plots"]

RUN_FILES = ("summary.json", "metrics.jsonl", "mlperf_log.jsonl")
PLOTS = ("top1_vs_wall.png", "top1_vs_epoch.png", "lr_vs_step.png")


@dataclass
class Run:
    """What the report needs from one run directory."""

    name: str
    path: Path
    summary: dict[str, Any] = field(default_factory=dict)
    evals: list[dict[str, Any]] = field(default_factory=list)  # epoch, top1, wall_s
    train: list[dict[str, Any]] = field(default_factory=list)  # step, lr, loss, img_per_s
    status: Optional[str] = None  # mlperf run_stop status; None: no run_stop logged

    @property
    def best_top1(self) -> Optional[float]:
        if self.summary.get("best_top1") is not None:
            return float(self.summary["best_top1"])
        return max((e["top1"] for e in self.evals), default=None)

    @property
    def time_to_target_s(self) -> Optional[float]:
        if "time_to_target_s" in self.summary:
            return self.summary["time_to_target_s"]
        target = self.summary.get("target_top1")
        hit = [e["wall_s"] for e in self.evals if target is not None and e["top1"] >= target]
        return hit[0] if hit else None


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ReportError(f"{path}: line {n} is not JSON ({e.msg})") from None
    return records


def load_run(path: str | Path) -> Run:
    """Read one run directory, or raise ``ReportError`` saying why it is not one."""
    p = Path(path)
    if not p.is_dir():
        raise ReportError(f"{p} is not a directory; pass run directories (made by largebatch-train)")
    if not any((p / f).is_file() for f in RUN_FILES):
        raise ReportError(f"{p} is not a run directory: it has none of {', '.join(RUN_FILES)}")
    run = Run(name=p.resolve().name, path=p)
    if (p / "summary.json").is_file():
        try:
            run.summary = json.loads((p / "summary.json").read_text(encoding="utf-8"))
        except json.JSONDecodeError as e:
            raise ReportError(f"{p / 'summary.json'} is not JSON ({e.msg})") from None
    if (p / "metrics.jsonl").is_file():
        for r in _read_jsonl(p / "metrics.jsonl"):
            if r.get("kind") == "eval":
                run.evals.append({"epoch": r["epoch"], "top1": r["top1"], "wall_s": r.get("wall_s", r["time_s"])})
            elif r.get("kind") == "train":
                run.train.append({"step": r["step"], "lr": r["lr"], "loss": r["loss"], "img_per_s": r["img_per_s"]})
    if (p / "mlperf_log.jsonl").is_file():
        for r in _read_jsonl(p / "mlperf_log.jsonl"):
            if r.get("key") == "run_stop":
                run.status = r.get("metadata", {}).get("status")
            elif r.get("key") == "target_accuracy" and "target_top1" not in run.summary:
                run.summary["target_top1"] = round(100.0 * r["value"], 4)
    return run


def _fmt(value: Any, spec: str = "", missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def format_table(runs: Sequence[Run], *, markdown: bool = False) -> str:
    """One line per run: time to target, best top-1, epochs, img/s, global batch, world size."""
    head = ["run", "status", "target %", "time to target", "best top-1 %", "epochs", "img/s",
            "global batch", "world size"]
    rows = []
    for r in runs:
        s = r.summary
        target = s.get("target_top1")
        ttt = r.time_to_target_s
        if target is None:
            ttt_text = "no target"
        elif ttt is None:
            ttt_text = "not reached"
        else:
            ttt_text = f"{ttt:.1f} s"
        epochs = s.get("epochs", max((e["epoch"] for e in r.evals), default=None))
        rows.append([
            r.name, r.status or ("finished" if s else "no summary"), _fmt(target, "g"), ttt_text,
            _fmt(r.best_top1, ".2f"), _fmt(epochs), _fmt(s.get("img_per_s"), ".0f"),
            _fmt(s.get("global_batch_size")), _fmt(s.get("world_size")),
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
    for name, xlabel, ylabel, series in specs:
        fig, ax = plt.subplots(figsize=(6.4, 4.2))
        for r in runs:
            xs, ys = series(r)
            if xs:
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, label=r.name)
        if ylabel.startswith("val"):
            targets = {r.summary.get("target_top1") for r in runs} - {None}
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
    return paths


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="largebatch-report", description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories made by largebatch-train")
    p.add_argument("--out", type=Path, default=Path("report"), help="folder for the PNG plots (default: ./report)")
    p.add_argument("--no-plots", action="store_true", help="print the table only (no matplotlib needed)")
    p.add_argument("--markdown", action="store_true", help="print the table as markdown")
    args = p.parse_args(argv)
    try:
        if not args.no_plots:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                raise ReportError(
                    "the plots need matplotlib: pip install 'largebatch[report]' (or pass --no-plots)"
                ) from None
        runs = [load_run(r) for r in args.runs]
        print(format_table(runs, markdown=args.markdown))
        if not args.no_plots:
            paths = write_plots(runs, args.out)
            print(f"plots: {', '.join(str(x) for x in paths)}")
    except (ReportError, OSError) as e:
        print(f"largebatch-report: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
