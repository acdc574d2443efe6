"""``largebatch-make-decoded [--plan | --check] [key=value ...]``: build the decoded stores a run will read.

``data.loader=decoded`` decodes each split once into a store in the cache
(:mod:`largebatch.data.pipelines.decoded`), on the run's first start, by rank 0, while the other
ranks wait. This command does it before the run: on the node that will train (the store lives
in ``$LARGEBATCH_CACHE`` there, else ``~/.cache/largebatch``), outside a job's time limit, or
to read its disk cost first with ``--plan``, which builds nothing. It takes the run's own
overrides, because the stored sides follow the run's sides (``data.image_size``, a resolution
schedule, ``data.resolution.eval_size``, ``data.val_crop_ratio``); a run with other sides
builds other stores.

    largebatch-make-decoded --plan data.root=/data/imagenet data.image_size=128
    largebatch-make-decoded data.root=/data/imagenet data.image_size=128 data.workers=16
    largebatch-train data.root=/data/imagenet data.image_size=128 data.loader=decoded

``--check`` reads each built store whole and every file of the data set, and compares them with
the checksums written with the store (each opening by a run checks a sample of both):

    largebatch-make-decoded --check data.root=/data/imagenet data.image_size=128

Exit codes are the training command's (:mod:`largebatch.errors`): 2 for a bad override or data
folder, or a store that ``--check`` (or a run) finds corrupted or out of date, with the command
that rebuilds it; 74 when the cache cannot be written or has no room for a store.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from largebatch.tools.args import OneLineArgumentParser

if TYPE_CHECKING:
    from largebatch.data.pipelines.decoded import PlannedStore

__all__ = ["main"]


def _describe(store: PlannedStore, note: str) -> str:
    from largebatch.data.pipelines.decoded import size_text

    return f"{store.split}: {store.count:,} images at {store.side} px, {size_text(store.bytes)} in {store.folder} ({note})"


def _plan(planned: list[PlannedStore], cache: Path) -> int:
    from largebatch.data.pipelines.decoded import cache_free_space, cache_write_problem, size_text

    for store in planned:
        print(_describe(store, "built" if store.built else "to build"))
    to_build = sum(s.bytes for s in planned if not s.built)
    existing, free = cache_free_space(cache)
    problem = cache_write_problem(existing) if to_build else None
    fits = ("fits" if to_build <= free else "does NOT fit: free space, lower the sides, or set LARGEBATCH_CACHE")
    if problem is not None:
        fits = f"CANNOT be written there: {problem}; set LARGEBATCH_CACHE to a writable folder"
    print(f"to build: {size_text(to_build)}; {existing} has {size_text(free)} free ({fits})")
    return 0


def _check(planned: list[PlannedStore], root: Path, overrides: Sequence[str]) -> int:
    from largebatch.data.decoded_store import open_decoded_store
    from largebatch.data.pipelines.decoded import rebuild_fix

    for store in planned:
        if not store.built:
            print(_describe(store, "not built"))
            continue
        started = time.monotonic()
        open_decoded_store(store.folder, source=root, side=store.side, verify="full",
                           fix=rebuild_fix(store.folder, shlex.join(overrides)))
        print(_describe(store, f"checked: its data, labels and every source file, in {time.monotonic() - started:.1f} s"))
    return 0


def _make(overrides: Sequence[str], plan_only: bool, check: bool = False) -> int:
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.config import compose_config, to_train_config
    from largebatch.config.command_line import single_run_overrides
    from largebatch.data.build import make_decoded_stores
    from largebatch.data.pipelines.decoded import decoded_cache_root, planned_stores
    from largebatch.parts.data import data_root_of, loader_spec

    cfg = to_train_config(compose_config(single_run_overrides(list(overrides))))
    backend = TorchDistributedBackend("cpu")  # one process: rank 0 of 1, no process group
    root = data_root_of(cfg, backend, loader="decoded")
    spec = loader_spec(cfg, batch_size=1)
    cache = decoded_cache_root()
    planned = planned_stores(root, spec, cache=cache)
    if plan_only:
        return _plan(planned, cache)
    if check:
        return _check(planned, root, overrides)
    started = time.monotonic()
    make_decoded_stores(root, spec, announce=False)
    took = f"built in {time.monotonic() - started:.1f} s"
    for store in planned:
        print(_describe(store, "built by an earlier run" if store.built else took))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``largebatch-make-decoded [--plan | --check] [key=value ...]``: build (or plan, or check) the decoded stores."""
    from largebatch.errors import error_line, exit_code

    parser = OneLineArgumentParser(
        prog="largebatch-make-decoded",
        description="Decode a data set's train and val images once into the stores that a run with "
                    "data.loader=decoded and the same overrides reads.")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--plan", action="store_true",
                        help="print each store's side, image count, size and folder, and the free space; build nothing")
    only.add_argument("--check", action="store_true",
                        help="read each built store and every source file, and compare them with the checksums "
                             "written with the store (a read of the store and of the data set); build nothing")
    parser.add_argument("overrides", nargs="*", help="the run's overrides (data=..., data.root=..., data.image_size=...)")
    args = parser.parse_args(argv)
    try:
        return _make(args.overrides, args.plan, args.check)
    except (Exception, KeyboardInterrupt) as err:  # noqa: BLE001  (one line; an unknown one is a bug and raises)
        code = exit_code(err)
        if code is None:
            raise
        print(f"largebatch-make-decoded: {error_line(err).removeprefix('largebatch: ')}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
