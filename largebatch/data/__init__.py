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
                       ``LoaderSpec`` (what every builder is told); a leaf
``loader_view``        what DataLoader-backed loaders share (torchvision, nvjpeg):
                       ``LoaderView``, ``UnreadableTally`` (unreadable files, once each)
``images``             listing and checking image folders (every loader and the data
                       check), decoding one file, DALI file lists
``image_folder``       an image folder as a data set (``RobustImageFolder``): unreadable
                       files skipped, augmentation seeded per sample, per-epoch sides
``augment``            the ImageNet augmentation: PIL transforms and tensor ops, one recipe
``batched_crop``       the training augmentation of same-size images a batch at a time
                       (batch-drawn boxes), torchvision's crop distribution
``decoded_store``      an image folder decoded once to uint8 at one side, in memory or
                       memory-mapped on disk
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

from typing import TYPE_CHECKING

from largebatch.lazy import lazy_exports

if TYPE_CHECKING:  # the names, as static tools and readers see them ("X as X": a re-export)
    from largebatch.data.augment import IMAGENET_DEFAULT_MEAN as IMAGENET_DEFAULT_MEAN
    from largebatch.data.augment import IMAGENET_DEFAULT_STD as IMAGENET_DEFAULT_STD
    from largebatch.data.augment import build_train_transform as build_train_transform
    from largebatch.data.augment import build_val_transform as build_val_transform
    from largebatch.data.contract import LoaderSpec as LoaderSpec
    from largebatch.data.pipelines.torchvision import DataError as DataError
    from largebatch.data.image_folder import RobustImageFolder as RobustImageFolder
    from largebatch.data.pipelines.torchvision import SkipCountingLoader as SkipCountingLoader
    from largebatch.data.pipelines.torchvision import build_loaders as build_loaders
    from largebatch.data.samplers import ExactShardSampler as ExactShardSampler
    from largebatch.data.samplers import ShardedSampler as ShardedSampler
    from largebatch.data.synthetic import default_dataset_root as default_dataset_root
    from largebatch.data.synthetic import ensure_synthetic as ensure_synthetic
    from largebatch.data.synthetic import make_synthetic_imagenet as make_synthetic_imagenet

# name -> the module under largebatch.data that defines it (the imports above, for run time)
__all__, __getattr__, __dir__ = lazy_exports(__name__, {
    "IMAGENET_DEFAULT_MEAN": "augment",
    "IMAGENET_DEFAULT_STD": "augment",
    "LoaderSpec": "contract",
    "DataError": "pipelines.torchvision",
    "RobustImageFolder": "image_folder",
    "SkipCountingLoader": "pipelines.torchvision",
    "build_loaders": "pipelines.torchvision",
    "build_train_transform": "augment",
    "build_val_transform": "augment",
    "ExactShardSampler": "samplers",
    "ShardedSampler": "samplers",
    "default_dataset_root": "synthetic",
    "ensure_synthetic": "synthetic",
    "make_synthetic_imagenet": "synthetic",
})
