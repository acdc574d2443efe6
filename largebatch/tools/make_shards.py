"""``largebatch-make-shards ROOT OUT --shard-size N``: pack a checked data set into WebDataset shards.

The layout of the shards and why: :mod:`largebatch.data.shards`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Sequence

from largebatch.data.shards import REENCODE_KINDS, make_shards
from largebatch.errors import DataError
from largebatch.tools.args import OneLineArgumentParser

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """``largebatch-make-shards ROOT OUT --shard-size N``: pack a checked data set."""
    parser = OneLineArgumentParser(prog="largebatch-make-shards",
                                   description="Pack a checked ImageFolder tree into WebDataset tar "
                                               "shards for DALI's webdataset reader.")
    parser.add_argument("root", help="data root (checked with largebatch-check-data)")
    parser.add_argument("out", help="output folder (gets train/ and val/)")
    parser.add_argument("--shard-size", type=int, required=True, help="samples per tar file")
    parser.add_argument("--splits", default="train,val")
    parser.add_argument("--seed", type=int, default=0, help="seed of the stored train order")
    parser.add_argument("--reencode", action="store_true",
                        help=f"re-encode {', '.join(REENCODE_KINDS)} files as RGB JPEG")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    if args.shard_size < 1:
        parser.error(f"--shard-size must be >= 1, got {args.shard_size}")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    try:
        metas = make_shards(args.root, args.out, shard_size=args.shard_size,
                            splits=[s for s in args.splits.split(",") if s], seed=args.seed,
                            reencode=args.reencode, workers=args.workers)
    except (DataError, OSError) as err:
        parser.error(str(err))
    for split, meta in metas.items():
        print(f"{split}: {meta['num_samples']} samples in {len(meta['shards'])} shard(s) of up to "
              f"{meta['shard_size']} at {Path(args.out, split)}"
              + (f" ({meta['reencoded']} re-encoded as RGB JPEG)" if meta["reencoded"] else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
