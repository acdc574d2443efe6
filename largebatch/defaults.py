"""Values the config and the library share, written once: the ground under both.

The config schema and checks (``largebatch.config``) are data about a run and must stay light
(``import largebatch.config`` loads no torch); the library (the data generator, the loaders,
``torch.compile`` wrapping) needs the same values. Both read them here, so the config imports
nothing above the ground. This module imports only ``largebatch.errors``.

* The embedded data set's sizes: the generator's defaults (:mod:`largebatch.data.synthetic`,
  ``largebatch-make-synthetic``) and the schema's ``SyntheticDataConfig``, so the command with no
  flags and a data preset without a ``synthetic`` block make the same set.
  ``conf/data/embedded.yaml`` writes the same values for its reader; ``tests/test_config.py``
  keeps the two equal. resnet10t at 32 px reaches 91.7-93.5% best val top-1 on this set over
  seeds 0-2 in fp32 and bf16 (docs/getting-started.md, "What it does").
* ``SHUFFLE_BUFFER``: samples DALI's webdataset reader mixes inside a rank's part of packed
  shards (``data.shuffle_buffer``, ``LoaderSpec.shuffle_buffer``).
* ``LOG_EVERY``, ``MAX_SKIPPED_STEPS``: the training loop's defaults
  (:class:`largebatch.engine.loop.StepSettings`) and the schema's.
* The crop defaults of the augmentation recipe (:mod:`largebatch.data.augment`), which
  ``LoaderSpec`` (:mod:`largebatch.data.contract`) takes as its own: ``TRAIN_CROP_SCALE``
  (``data.crop_scale``), ``VAL_CROP_RATIO`` (``data.val_crop_ratio``) and its check; and the
  recipe's fixed ``TRAIN_CROP_RATIO`` and ``TRAIN_FLIP``, which the batched crop drawing
  (:mod:`largebatch.data.crop_boxes`) defaults to below the augmentation module.
* The ``model.compile`` vocabulary: the modes of ``torch.compile`` and their config aliases,
  checked at compose time (``largebatch.config.checks``) and applied by
  :mod:`largebatch.engine.compile`.
"""

from __future__ import annotations

from typing import Any

from largebatch.errors import UsageError

__all__ = [
    "COMPILE_MODES",
    "CUDA_GRAPH_MODES",
    "DEFAULT_CLASSES",
    "DEFAULT_IMAGE_SIZE",
    "DEFAULT_TRAIN_PER_CLASS",
    "DEFAULT_VAL_PER_CLASS",
    "LOG_EVERY",
    "MAX_CLASSES",
    "MAX_IMAGE_SIZE",
    "MAX_SKIPPED_STEPS",
    "MIN_IMAGE_SIZE",
    "SHUFFLE_BUFFER",
    "TRAIN_CROP_RATIO",
    "TRAIN_CROP_SCALE",
    "TRAIN_FLIP",
    "VAL_CROP_RATIO",
    "check_val_crop_ratio",
    "parse_compile_mode",
]

# the embedded data set
DEFAULT_CLASSES = 10
DEFAULT_TRAIN_PER_CLASS = 520  # 5,200 train images
DEFAULT_VAL_PER_CLASS = 100  # 1,000 val images: one image is 0.1 point of top-1
DEFAULT_IMAGE_SIZE = 48  # generated JPEG side, pixels
# what the generator can make: 10 x 10 (shape family, colour family) classes, sides of 16-1024
# pixels; the config's range checks and the generator's own read them here
MAX_CLASSES = 100
MIN_IMAGE_SIZE, MAX_IMAGE_SIZE = 16, 1024

SHUFFLE_BUFFER = 4096

# the augmentation's crops (timm's and torchvision's defaults)
TRAIN_CROP_SCALE = (0.08, 1.0)  # area fraction of a training crop (data.crop_scale's default)
TRAIN_CROP_RATIO = (3 / 4, 4 / 3)  # aspect ratio of a training crop (RandomResizedCrop's default)
TRAIN_FLIP = 0.5  # probability of a training crop's horizontal flip (RandomHorizontalFlip's default)
VAL_CROP_RATIO = 0.875  # evaluation: centre crop of the image resized to image_size / 0.875


def check_val_crop_ratio(value: float) -> float:
    """``value`` if it is a valid evaluation crop ratio, in (0, 1]; else one-line ``UsageError``."""
    if not 0 < value <= 1:
        raise UsageError(f"the evaluation crop ratio (data.val_crop_ratio) must be in (0, 1], got {value}")
    return value

# the training loop: log_every and max_skipped_steps of the schema, and the
# defaults of largebatch.engine.loop.StepSettings for callers without a config
LOG_EVERY = 20  # optimizer steps between loss read-backs / log lines
MAX_SKIPPED_STEPS = 10  # with non_finite=skip: skipped steps before giving up

# model.compile
COMPILE_MODES = ("none", "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune")
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")  # their compiled step replays CUDA graphs
_ALIASES = {"false": "none", "true": "default"}


def parse_compile_mode(value: Any) -> str:
    """The canonical compile mode of a config value (``true``/``false`` mean default/none)."""
    text = str(value).strip().lower()
    mode = _ALIASES.get(text, text)
    if mode not in COMPILE_MODES:
        raise UsageError(f"model.compile={value!r} is not a compile mode; use one of "
                         f"{', '.join(COMPILE_MODES)} (or true/false)")
    return mode
