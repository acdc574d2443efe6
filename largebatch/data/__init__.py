"""Input pipelines: the embedded synthetic data set, samplers and the torchvision folder loader.

``build_loaders`` (in :mod:`largebatch.data.folder`) yields ``(images, labels)`` batches and
counts unreadable files in ``loader.skipped``; see that module for the contract.
"""

from largebatch.data.folder import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    DataError,
    RobustImageFolder,
    SkipCountingLoader,
    build_loaders,
    build_train_transform,
    build_val_transform,
)
from largebatch.data.samplers import ExactShardSampler, ShardedSampler
from largebatch.data.synthetic import default_dataset_root, ensure_synthetic, make_synthetic_imagenet

__all__ = [
    "IMAGENET_DEFAULT_MEAN",
    "IMAGENET_DEFAULT_STD",
    "DataError",
    "ExactShardSampler",
    "RobustImageFolder",
    "ShardedSampler",
    "SkipCountingLoader",
    "build_loaders",
    "build_train_transform",
    "build_val_transform",
    "default_dataset_root",
    "ensure_synthetic",
    "make_synthetic_imagenet",
]
