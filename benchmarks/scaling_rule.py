"""The scaling-rule study, version 3: do the large-batch papers' lr claims hold, small, on this CPU?

Claims tested (Goyal et al. 2017, arXiv 1706.02677, sec. 2.1-2.3; You et al. 2017, arXiv
1708.03888; Ying et al. 2018, arXiv 1811.06992; Jia et al. 2018, arXiv 1807.11205), at a fixed
epoch budget:
  1. the best SGD lr grows linearly with the batch ("linear scaling rule"), and the linearly
     predicted lr reaches the best accuracy;
  2. with a gradual warmup, SGD at k x the base batch loses no accuracy against the base batch;
  3. keeping the small-batch lr at a large batch loses accuracy;
  4. LARS (warmup from 0, its references' update form, its lr looked up per batch) loses none.

Design, each choice against a bias of version 2 (``git log -p`` this file):
- the lr is swept at every batch for every recipe (powers of two; a sweep whose best point is
  at an edge of its grid grows that edge), so no recipe inherits another's tuning: the
  linear rule is *tested* (is the best lr k x the base one; how does the predicted lr fare),
  not assumed;
- three splits of the embedded generator's images: train, ``val`` (picks each cell's lr: best
  mean over the sweep seeds) and ``test`` (every reported number; never used to choose);
- BN statistics over a fixed number of images (``--bn-group``, default 32 as Goyal sec. 2.3
  keeps per worker) at every batch ("ghost" BN, below): the batch does not change BN's noise;
- LARS steps as its references do (``lr_in_momentum=True``, trust 0.001, BN and bias out of
  the adaptation and decay) with a linear warmup from 0; its lr is a sweep per batch, which is
  what the references' per-batch lr tables are (tensorflow/tpu ``lars_util.py``);
- SGD with warmup is Goyal's gradual warmup: from the base batch's lr (lr x base/batch) to lr,
  over the same number of epochs as LARS's warmup; at the base batch it is plain SGD (one cell);
- a fixed epoch budget, with the base batch's convergence checked, not assumed: its chosen
  point at 2x (``--doublings 1``) or also 4x the budget, same seeds; the report gives each
  doubling's gain and calls the budget converged only where TOST puts that gain within the
  margin, on the val split (test for the record). The default setup (width 32, 48 epochs) was
  chosen after the first study by this check on the *test* split (96 epochs gain +0.63
  [+0.36, +0.89] test points: TOST within the 1-point margin, but the gain is significant and
  smaller than the 16x deficits, 0.77 to 1.95, though 82% of the smallest); on val the same rows
  gain +0.68, TOST not within the margin.
  From now on a setup is chosen on val only. The first setup studied (``--width 16 --epochs 24
  --doublings 2``, rows ``scaling_rule_width16_24ep.jsonl``) is not converged (+1.40, then
  +0.96 points per doubling).
  ``--base-only`` runs just that check for another setup (``--width``, ``--classes``,
  ``--epochs``, ...) before a whole study is spent on it: ``benchmarks/README.md`` lists the
  setups measured;
- the largest batch's convergence is checked the same way (``--largest-check``, on by
  default): each recipe's tuned point at 2x the budget, every seed, its gain on val; where it
  still gains, the deficit against the base batch is partly the budget's;
- rows record their setup (data, model, BN group, warmup); a rows file refuses rows of another;
- ``--seeds`` (default 5) per reported point: the first ``--sweep-seeds`` (2) run every lr of
  the sweep, the rest only the val-chosen lr and the lrs the rules predict (linear; none);
- reported: final test top-1 mean with 95% t-intervals; steps (and images) until the test
  top-1 first reaches the target (the base batch's mean minus the margin, evaluated every
  epoch; a column that ranks nothing: no interval, and seeds that never reach it drop out);
  Welch intervals with a Bonferroni correction over every comparison the report makes (their
  number fixed by the design, pending ones included: ``comparisons``); "worse" only where that
  interval excludes zero; "no loss" only from TOST (two one-sided tests) with the margin
  ``--margin`` (1 point); else "inconclusive". The report gives the minimal detectable effect
  at that corrected level from the rows' seed spread (``mde``), and calls a cell's best lr
  identified only where its val mean beats every other lr's by more than the 95% half-width
  of the difference (``tied_lrs``); else "not identified", with the lrs it cannot tell apart.

Data: the embedded generator (``largebatch.data.synthetic.render_image``, 10 classes) rendered
into uint8 tensors in memory (random crop and flip per step); model: a 3-layer conv net with
ghost BN defined here; the project's optimizers (``largebatch.optim``) and schedules
(``largebatch.lr``): poly decay (power 2) after warmup, weight decay 5e-4 off BN and bias,
momentum 0.9. Batches 32 to 512 (k = 1 to 16): the largest is 5% of the training set per step
(ImageNet at 64K); by that mapping (an assumption) the base batch is ~4K, k = 2 8K (0.6% per
step) and k = 8 32K: k = 2 tests 4K -> 8K, not Goyal et al.'s 256 -> 8K.
k = 2 and 8 were added after the first report (issue 47), with the same recipes and seeds.

Running (resumable: rows go to ``benchmarks/results/scaling_rule.jsonl`` as they finish; a
point already there is not trained again; parallel workers claim points with lock files):

    python benchmarks/scaling_rule.py --workers 2        # the whole study, then the report
    python benchmarks/scaling_rule.py --render           # report from the rows: .md, .png and the page
    python benchmarks/scaling_rule.py --quick            # smoke test: tiny, temp folder
    python benchmarks/scaling_rule.py --base-only --epochs 12 \
        --out benchmarks/results/scaling_rule_width32   # is a setup's base batch converged?
    python benchmarks/scaling_rule.py --render --width 16 --epochs 24 --doublings 2 \
        --batches 32 128 512 --out benchmarks/results/scaling_rule_width16_24ep   # the first setup's

The first report's points (batches 32, 128, 512) were 117 trainings, about 390 min of one core
(~3.3 h of wall time with two one-thread workers); k = 2 and 8 add about 80-90 more (their
sweeps decide), ~3.3 min of one core each.

Stop it any time (Ctrl-C); run it again to go on. The report lists the points still pending.

The study's page, ``docs/scaling-rule.md``, is rendered from the rows too (``scaling_rule_page.py``,
its prose in ``scaling_rule_page.md``), by ``--render`` or a finished run at the default ``--out``
only (the committed study; not ``--quick`` or another ``--out``). The page is committed with the
rows it shows: whenever rows are committed, run ``--render`` and commit the page with them
(``tests/test_scaling_rule_page.py`` fails on a page that is not the render of the rows files).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the study's parts and its page, siblings
import scaling_rule_page as page  # noqa: E402
import scaling_rule_study as study  # noqa: E402


def main(argv: Sequence[str] | None = None) -> int:
    args = study.parse(argv)
    if args.worker:
        return study.worker(args)
    if not args.render:
        t0 = time.perf_counter()
        code = study.run_workers(__file__, argv, args.workers)
        print(f"wall {time.perf_counter() - t0:.0f} s", flush=True)
        if code:
            return code
    rows = study.read_rows(args.out.with_suffix(".jsonl"))
    print(study.write_report(args, rows), flush=True)
    if args.page:
        print(f"page: {page.write_page(args, rows) and page.PAGE}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
