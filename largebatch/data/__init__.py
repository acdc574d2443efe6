"""Input pipelines: from an image folder (or the embedded set) to ``(images, labels)`` batches.

A map of the package; importing it loads no module of the package (nor torch). The embedded
set's sizes, which the config schema reads too, are in :mod:`largebatch.defaults`.

=====================  =================================================================
module                 what it holds
=====================  =================================================================
``build``              the pipeline of a run: where the data is, which loader reads it
``pipelines/``         one module per pipeline: ``torchvision``, ``nvjpeg``,
                       ``dali_files``, ``dali_shards`` (and ``dali_graph``, what the
                       two DALI readers share)
``contract``           the loader contract (``Loader``, a Protocol every loader satisfies),
                       ``LoaderSpec`` (what every builder is told), ``LoaderView``
                       (DataLoader-backed loaders), ``UnreadableTally``
``images``             listing and checking image folders (every loader and the data
                       check), decoding one file, DALI file lists
``augment``            the ImageNet augmentation: PIL transforms and tensor ops, one recipe
``samplers``           ``ShardedSampler`` (training), ``ExactShardSampler`` (evaluation)
``background``         an iterator run a few items ahead in a thread
``worker_signals``     loader workers outlive a group SIGTERM/SIGINT
``synthetic``          the embedded data set's generator
``check``              the data check: files DALI cannot decode
``shards``             an image folder packed into WebDataset tar shards
=====================  =================================================================

The command-line tools that drive ``check``, ``synthetic`` and ``shards`` live in
:mod:`largebatch.tools`. The names below are kept importable as ``from largebatch.data
import X``; each loads its module on first use (PEP 562).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> the module under largebatch.data that defines it
_EXPORTS = {
    "IMAGENET_DEFAULT_MEAN": "augment",
    "IMAGENET_DEFAULT_STD": "augment",
    "LoaderSpec": "contract",
    "DataError": "pipelines.torchvision",
    "RobustImageFolder": "pipelines.torchvision",
    "SkipCountingLoader": "pipelines.torchvision",
    "build_loaders": "pipelines.torchvision",
    "build_train_transform": "augment",
    "build_val_transform": "augment",
    "ExactShardSampler": "samplers",
    "ShardedSampler": "samplers",
    "default_dataset_root": "synthetic",
    "ensure_synthetic": "synthetic",
    "make_synthetic_imagenet": "synthetic",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f"{__name__}.{module}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
