"""``largebatch-check-data ROOT``: find the images DALI cannot decode and write the clean file lists.

What is checked and where the results go: :mod:`largebatch.data.check`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

from largebatch.data.check import KINDS, SPLITS, CheckReport, check_dataset
from largebatch.errors import DataError
from largebatch.tools.args import OneLineArgumentParser

__all__ = ["main"]


def _print_report(report: CheckReport, examples: int = 3) -> None:
    for split, s in report.splits.items():
        print(f"{split}: {s.files} image files in {s.classes} classes, {s.listed} listed in {s.file_list}")
        if s.hidden:
            print(f"{split}: skipped {len(s.hidden)} hidden folder(s), not classes: {', '.join(s.hidden)}")
    counts = report.counts()
    if counts:
        print(f"{'kind':<20} {'files':>7}  {'in list':<7}  DALI 2.4 does / what to do")
        for kind, n in sorted(counts.items(), key=lambda kv: (not KINDS[kv[0]].fatal, kv[0])):
            k = KINDS[kind]
            print(f"{kind:<20} {n:>7}  {'no' if k.fatal else 'yes':<7}  {k.what}: {k.dali}; fix: {k.fix}")
            shown = [p for p in report.problems if p.kind == kind][:examples]
            for p in shown:
                print(f"    {p.path}  ({p.detail})")
            if n > len(shown):
                print(f"    ... {n - len(shown)} more in {report.report_path}")
    bad = len(report.fatal)
    verdict = (f"{bad} file(s) DALI cannot decode were left out of the file lists"
               if bad else "every image can be decoded by DALI")
    print(f"{verdict}; report: {report.report_path} ({report.seconds:.1f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    """``largebatch-check-data ROOT``: exit 0 if all decodable, 1 if files were left out, 2 on bad input."""
    parser = OneLineArgumentParser(
        prog="largebatch-check-data",
        description="Find the images DALI cannot decode and write the clean DALI file lists.")
    parser.add_argument("root", help="data root holding train/<class>/ and val/<class>/")
    parser.add_argument("--workers", type=int, default=0, help="decoding threads (0: one per CPU)")
    parser.add_argument("--output", default=None, help="also write the JSON report to this file")
    parser.add_argument("--splits", default=",".join(SPLITS), help="comma-separated splits")
    args = parser.parse_args(argv)
    if args.workers < 0:
        parser.error(f"--workers must be >= 0, got {args.workers}")
    splits = [s for s in args.splits.split(",") if s]
    if not splits:
        parser.error("--splits is empty")
    try:
        report = check_dataset(args.root, workers=args.workers, splits=splits)
        if args.output:
            Path(args.output).write_text(json.dumps(report.to_json(), indent=1) + "\n")
    except (DataError, OSError) as err:
        parser.error(str(err))
    _print_report(report)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
