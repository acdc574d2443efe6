"""The sizes of the embedded data set, written once and importing nothing.

The generator (:mod:`largebatch.data.synthetic`) takes them as its defaults and the config
schema (``SyntheticDataConfig``) as its own, so ``largebatch-make-synthetic`` with no flags and
a data preset without a ``synthetic`` block make the same set. This module imports nothing, so
the schema reads it without loading numpy, Pillow or torch. ``conf/data/embedded.yaml`` writes
the same values for its reader; ``tests/test_config.py`` keeps the two equal.

resnet10t at 32 px reaches 91.7-93.5% best val top-1 on this set over seeds 0-2 in fp32 and
bf16 (docs/getting-started.md, "What it does").
"""

__all__ = ["DEFAULT_CLASSES", "DEFAULT_IMAGE_SIZE", "DEFAULT_TRAIN_PER_CLASS", "DEFAULT_VAL_PER_CLASS"]

DEFAULT_CLASSES = 10
DEFAULT_TRAIN_PER_CLASS = 520  # 5,200 train images
DEFAULT_VAL_PER_CLASS = 100  # 1,000 val images: one image is 0.1 point of top-1
DEFAULT_IMAGE_SIZE = 48  # generated JPEG side, pixels
