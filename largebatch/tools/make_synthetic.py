"""``largebatch-make-synthetic``: write the embedded data set (:mod:`largebatch.data.synthetic`) and say where.

Exit codes: 0 written (or already there), 2 a bad flag (one line naming it), 74 the set could not
be written (one line with the errno), as ``largebatch.errors`` numbers them for a run."""

from __future__ import annotations

import os
import sys
from typing import Sequence

from largebatch.defaults import (
    DEFAULT_CLASSES,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_TRAIN_PER_CLASS,
    DEFAULT_VAL_PER_CLASS,
)
from largebatch.data.synthetic import check_args, ensure_synthetic, read_manifest
from largebatch.errors import EXIT_IO_ERROR
from largebatch.tools.args import OneLineArgumentParser

__all__ = ["main"]

FLAGS = {"num_classes": "--classes", "train_per_class": "--train-per-class", "val_per_class": "--val-per-class",
         "image_size": "--image-size", "seed": "--seed"}


def main(argv: Sequence[str] | None = None) -> int:
    """``largebatch-make-synthetic``: write the generated data set and say where."""
    parser = OneLineArgumentParser(
        prog="largebatch-make-synthetic",
        description="The embedded default data set: a generated ImageNet-style tree of real JPEG files.")
    parser.add_argument("--root", default=None,
                        help="target folder (default: the cache, $LARGEBATCH_CACHE or ~/.cache/largebatch)")
    parser.add_argument("--classes", type=int, default=DEFAULT_CLASSES)
    parser.add_argument("--train-per-class", type=int, default=DEFAULT_TRAIN_PER_CLASS)
    parser.add_argument("--val-per-class", type=int, default=DEFAULT_VAL_PER_CLASS)
    parser.add_argument("--image-size", type=int, default=DEFAULT_IMAGE_SIZE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1))
    args = parser.parse_args(argv)
    try:
        check_args(args.classes, args.train_per_class, args.val_per_class, args.image_size, args.seed,
                   names=FLAGS)
        if args.workers < 0:
            raise ValueError(f"--workers must be >= 0, got {args.workers}")
        root = ensure_synthetic(
            args.root, num_classes=args.classes, train_per_class=args.train_per_class,
            val_per_class=args.val_per_class, image_size=args.image_size, seed=args.seed,
            workers=args.workers,
        )
    except ValueError as err:
        parser.error(str(err))
    except OSError as err:  # no permission to write there, a full disk: exit 74, as a run's failed writes
        parser.exit(EXIT_IO_ERROR, f"{parser.prog}: error: cannot write the data set: {err}\n")
    counts = read_manifest(root)["counts"]
    print(f"synthetic ImageNet at {root}: {args.classes} classes, "
          f"{counts['train']} train + {counts['val']} val files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
