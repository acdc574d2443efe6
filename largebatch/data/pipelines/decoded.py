"""Training from a decoded store (``data.loader=decoded``): decode once, augment per batch.

The first run over an image folder decodes each split once into a decoded store in the cache
(:mod:`largebatch.data.decoded_store`: uint8 ``(N, 3, side, side)``, a memory-mapped file the
page cache holds in memory where it fits; ``$LARGEBATCH_CACHE/decoded-...``, or
``~/.cache/largebatch``), stating its disk cost in one log line; later runs map it. A batch is
then cut from it and augmented as a whole (:mod:`largebatch.data.batched_crop`: the
random-resized crops by ``RandomResizedCrop.get_params``'s rule for the whole batch, each
crop's antialiased uint8 resize, flip, normalise into the compute dtype), not per sample.

Stored sides (:func:`store_sides`): training at the images' own longest side (sampled),
capped at 1.5x the largest training side of the run (and never below it); evaluation at
``round(val_side / val_crop_ratio)`` of the largest evaluation side, the shorter side resized
to it and the centre square kept, so an evaluation batch is torchvision's ``Resize`` +
``CenterCrop`` of every validation image once: at the store's side a slice, at another
evaluation side (progressive resizing) the same centre box resized by ``roi_align``. Both
keep the centre square of each image (``fit="crop"``): a training crop of a 4:3 image is drawn
from its centre 3:3.

The guarantees of the other loaders hold: each rank's part and order are the sampler's
(:class:`ShardedSampler`, whole optimizer steps; :class:`ExactShardSampler`, every validation
image once over all ranks); a batch's crops and flips come from a generator keyed by ``(seed,
epoch, the batch's place among all ranks' batches of the epoch)``
(:func:`largebatch.data.samplers.sample_seed`), so a run resumed mid-epoch
(``set_epoch(e, k)``) draws the crops the uninterrupted run drew; a training batch is cut at
its epoch's side and crop area (``LoaderSpec.train_size_at``, ``crop_scale_at``), an
evaluation batch at ``val_size_at``. Files the store could not decode are named in its header:
each is logged once, counted in ``skipped``, and a class left without a readable image stops
the run, as the other loaders do.

No worker processes: a batch is a handful of tensor ops (an index into the store, the resize,
a flip, one normalising kernel), which release the GIL. They run in a background thread
(:func:`largebatch.data.background.in_background`), a batch or two ahead of the step, so the
augmentation overlaps the step instead of adding to it; with ``data.workers`` above 1 that
thread keeps ``data.workers`` batches in flight on as many threads, handed over in order (a
batch is a function of its place, so the threads change only the pace). On the CPU each of
these threads runs its operators on one intra-op thread
(:func:`~largebatch.data.background.one_intraop_thread_here`), so they never open OpenMP teams
that contend with the step's. ``data.workers`` threads also decode the images when the store is
built.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
import time
import weakref
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Generator, Iterator, NamedTuple, Optional

import torch

from largebatch.data.augment import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, CropRecipe, normalise_cast
from largebatch.data.background import in_background, one_intraop_thread_here
from largebatch.data.batched_crop import augment_same_size, resized_crops
from largebatch.data.contract import LoaderSpec
from largebatch.data.decoded_store import (
    HEADER_NAME,
    STORE_VERSION,
    DecodedStore,
    build_decoded_store,
    open_decoded_store,
    remove_stale_builds,
    size_text,
    store_bytes,
)
from largebatch.data.images import (
    SIDE_ABOVE_IMAGES,
    check_same_classes,
    largest_sampled_side,
    list_classes,
    list_split,
    split_folder,
)
from largebatch.data.loader_view import UnreadableTally
from largebatch.data.samplers import ExactShardSampler, ShardedSampler, sample_seed
from largebatch.errors import DataError, WriteError

__all__ = ["AUTO_SHARE_OF_FREE", "TRAIN_SIDE_CAP", "AutoChoice", "DecodedLoader", "PlannedStore", "StoreSides",
           "auto_choice", "build_decoded_loaders", "cache_free_space", "cache_write_problem", "decoded_cache_root",
           "ensure_decoded_stores", "planned_stores", "rebuild_fix", "size_text", "store_sides"]

log = logging.getLogger(__name__)

# The training store's side is at most this times the largest training side: crops of up to
# (1 / 1.5)**2 = 44% of the image are enlarged or kept, larger ones shrunk by at most 1.5x, where
# roi_align's one sample per output pixel still reads every other input pixel or more. The
# default run's 48 px images train at 32 px: stored at 48, what the torchvision loader crops from.
TRAIN_SIDE_CAP = 1.5


class StoreSides(NamedTuple):
    """The stored side of each split, pixels."""

    train: int
    val: int


def store_sides(root: str | os.PathLike, spec: LoaderSpec) -> StoreSides:
    """The sides the stores of ``root`` are decoded at for ``spec`` (module docstring)."""
    largest_train = spec.largest_train_size()
    cap = math.ceil(TRAIN_SIDE_CAP * largest_train)
    images = largest_sampled_side(Path(root) / "train")
    train = max(largest_train, cap if images is None else min(images, cap))
    largest_val = max(spec.val_size_at(0), largest_train if spec.eval_follows_train else 0)
    return StoreSides(train, round(largest_val / spec.val_crop_ratio))


def decoded_cache_root() -> Path:
    """Where decoded stores are kept: ``$LARGEBATCH_CACHE``, else ``~/.cache/largebatch``."""
    return Path(os.environ.get("LARGEBATCH_CACHE") or os.path.join("~", ".cache", "largebatch")).expanduser()


def _store_folder(cache: Path, root: str, split: str, side: int) -> Path:
    """One folder per (source folder, split, side, format): another side is another store."""
    key = json.dumps([root, split, side, "crop", STORE_VERSION])
    return cache / f"decoded-{hashlib.sha256(key.encode()).hexdigest()[:12]}-{split}-{side}px"


def _open_or_build(root: str, split: str, side: int, folder: Path, workers: int,
                   check_source: bool = True) -> tuple[DecodedStore, bool]:
    """The store of ``root/split`` in ``folder`` (built there first if absent); True if built now.
    ``check_source``: refuse a store whose source's files changed since it was built (a listing),
    or whose data differ from their checksums (a sample: ``open_decoded_store(verify="sample")``)."""
    fix = rebuild_fix(folder)
    if not (folder / HEADER_NAME).is_file():
        try:
            return build_decoded_store(root, folder, split, side=side, workers=workers), True
        except (DataError, OSError, WriteError):
            if not (folder / HEADER_NAME).is_file():  # not another rank's store that just landed
                raise
    return open_decoded_store(folder, source=root if check_source else None, side=side, fix=fix,
                              verify="sample" if check_source else "none"), False


def rebuild_fix(folder: Path, overrides: Optional[str] = None) -> str:
    """What to do with a store that is refused: delete it and build it again, by the command that
    builds it (with the run's ``overrides`` where they are known)."""
    command = f"largebatch-make-decoded {overrides}" if overrides else "largebatch-make-decoded with the run's overrides"
    return f"delete it and rebuild it: rm -r {folder} && {command} (or the run rebuilds it on first use)"


class PlannedStore(NamedTuple):
    """One split's store as a run of ``spec`` would read it: where, how large, whether built."""

    split: str
    side: int
    count: int  # images: a built store's own count, else the split's image files (undecodable ones are left out)
    bytes: int
    folder: Path
    built: bool


def planned_stores(root: str | os.PathLike, spec: LoaderSpec, *, cache: Optional[Path] = None) -> list[PlannedStore]:
    """The train and val stores a run of ``spec`` reads from ``root``, without building them:
    their sides, image counts, bytes on disk and folders in ``cache`` (:func:`decoded_cache_root`).
    A split whose store is built is not listed: its count is the store's (every run after the
    first plans from the headers; listing ImageNet's 1.28M files again is seconds to minutes)."""
    root = str(Path(root).expanduser().absolute())
    cache = decoded_cache_root() if cache is None else cache
    planned = []
    for split, side in zip(("train", "val"), store_sides(root, spec)):
        folder = _store_folder(cache, root, split, side)
        built = (folder / HEADER_NAME).is_file()
        count = _stored_count(folder) if built else None
        if count is None:
            count = len(list_split(root, split)[1])
        planned.append(PlannedStore(split, side, count, store_bytes(count, side), folder, built))
    return planned


def _stored_count(folder: Path) -> Optional[int]:
    """The image count in the header of the store in ``folder``; None where it cannot be read (the
    store is then refused when opened, naming the folder to delete)."""
    try:
        return int(json.loads((folder / HEADER_NAME).read_text(encoding="utf-8"))["count"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def cache_free_space(cache: Path) -> tuple[Path, int]:
    """The nearest existing folder of ``cache`` (it may not exist yet) and its disk's free bytes."""
    existing = next((p for p in (cache, *cache.parents) if p.exists()), Path("/"))
    return existing, shutil.disk_usage(existing).free


def cache_write_problem(folder: Path) -> Optional[str]:
    """Why a store cannot be written in ``folder`` (``[Errno 30 EROFS] Read-only file system``),
    or None where it can: a file is created there and removed (permissions, a read-only mount,
    a network file system's rules: only a write tells)."""
    try:
        with tempfile.TemporaryFile(dir=folder):
            return None
    except OSError as err:
        code = err.errno
        return f"[Errno {code} {errno.errorcode.get(code, '?') if code is not None else '?'}] {err.strerror or err}"


# data.loader=auto builds decoded stores only where they take at most this share of the cache's
# free space: a run's checkpoints and logs, and the user's other files, often share that disk, and
# a store that nearly filled it would fail their next write (ImageNet's training images stored at
# 336 px are ~434 GB). data.loader=decoded builds them whatever they take.
AUTO_SHARE_OF_FREE = 0.5


class AutoChoice(NamedTuple):
    """``data.loader=auto``'s answer on a CPU host: read from the decoded stores or not, and why."""

    decoded: bool
    note: str


def auto_choice(root: str | os.PathLike, spec: LoaderSpec, *, cache: Optional[Path] = None) -> AutoChoice:
    """Whether ``data.loader=auto`` reads ``root`` from decoded stores: where they are built
    already, or the cache can be written and their bytes to build are at most
    :data:`AUTO_SHARE_OF_FREE` of its free space (the fastest CPU input: no JPEG decode after the first run, each batch augmented
    whole; ``benchmarks/README.md``). The note says which, with the sizes, for the run's log."""
    cache = decoded_cache_root() if cache is None else cache
    planned = planned_stores(root, spec, cache=cache)
    to_build = sum(store.bytes for store in planned if not store.built)
    every = size_text(sum(store.bytes for store in planned))
    if not to_build:
        return AutoChoice(True, f"data.loader=auto: reading with the decoded store ({every} in {cache}, built by an "
                                "earlier run), the fastest input on a CPU host")
    images = largest_sampled_side(Path(root) / "train")
    side = max(store.side for store in planned)
    if images is not None and side > SIDE_ABOVE_IMAGES * images:
        return AutoChoice(False, f"data.loader=auto: not the decoded store: it would hold the images at {side} px, "
                                 f"{side / images:.1f}x their longest side ({images} px, sampled), "
                                 f"{size_text(to_build)} of upscaled copies; data.loader=decoded builds it anyway")
    remove_stale_builds(cache)  # a killed build's folder holds space the sizes below count
    where, free = cache_free_space(cache)
    problem = cache_write_problem(where)
    if problem is not None:
        return AutoChoice(False, f"data.loader=auto: not the decoded store: its {size_text(to_build)} cannot be "
                                 f"written to {where} ({problem}); set LARGEBATCH_CACHE to a writable folder with "
                                 "room for it to read with it")
    if to_build <= AUTO_SHARE_OF_FREE * free:
        return AutoChoice(True, f"data.loader=auto: reading with the decoded store, the fastest input on a CPU host: "
                                f"the images are decoded once into {size_text(to_build)} of the {size_text(free)} "
                                f"free in {where}")
    return AutoChoice(False, f"data.loader=auto: not the decoded store: it would take {size_text(to_build)} of the "
                             f"{size_text(free)} free in {where} (auto takes at most half); set LARGEBATCH_CACHE to a "
                             f"folder with room for it, or data.loader=decoded to build it anyway")


def ensure_decoded_stores(root: str | os.PathLike, spec: LoaderSpec, *, cache: Optional[Path] = None,
                          announce: bool = True, check_source: bool = True) -> dict[str, DecodedStore]:
    """The train and val stores of ``root`` for ``spec`` in ``cache`` (:func:`decoded_cache_root`),
    built there on first use; with ``announce``, one log line with their sides and disk cost.
    With ``check_source``, a store whose source changed since is refused in one line naming the
    folder to delete (the check lists the split); without, where another process of this host has
    just checked the same store."""
    root = str(Path(root).expanduser().absolute())
    train_dir, val_dir = split_folder(root, "train"), split_folder(root, "val")
    check_same_classes(train_dir, list_classes(train_dir)[0], val_dir, list_classes(val_dir)[0])
    cache = decoded_cache_root() if cache is None else cache
    sides = store_sides(root, spec)
    started = time.monotonic()
    stores, built = {}, []
    for split, side in zip(("train", "val"), sides):
        folder = _store_folder(cache, root, split, side)
        stores[split], made = _open_or_build(root, split, side, folder, max(1, spec.workers), check_source)
        if made:
            built.append(split)
    if announce:
        cost = " + ".join(f"{len(s):,} {k} images at {s.side} px ({size_text(store_bytes(len(s), s.side))})"
                          for k, s in stores.items())
        how = (f"decoded {', '.join(built)} once in {time.monotonic() - started:.1f} s" if built
               else "decoded by an earlier run")
        log.info("decoded store: %s on disk in %s (%s)", cost, cache, how)
    return stores


class DecodedLoader:
    """Batches cut from a :class:`DecodedStore` and augmented as a whole (module docstring).

    ``train``: random-resized crops and flips, whole batches (:class:`ShardedSampler`); else
    the evaluation centre crops (:class:`ExactShardSampler`, the last batch short, maybe none).
    """

    def __init__(self, store: DecodedStore, spec: LoaderSpec, *, train: bool, prefetch_batches: int = 2) -> None:
        self.store, self.train = store, train
        self.seed, self.rank, self.world_size = spec.seed, spec.rank, spec.world_size
        self.device, self.dtype, self.channels_last = spec.device, spec.dtype, spec.channels_last
        self.recipe = CropRecipe(spec.image_size, crop_scale=spec.crop_scale, val_crop_ratio=spec.val_crop_ratio)
        self._train_size_at, self._val_size_at, self._crop_scale_at = (
            spec.train_size_at, spec.val_size_at, spec.crop_scale_at)
        self.prefetch_batches = prefetch_batches
        self.threads = max(1, spec.workers)  # batches augmented at once
        self.batch_size = spec.batch_size if train else spec.val_batch
        self.sampler: ShardedSampler | ExactShardSampler = (
            ShardedSampler(len(store), rank=spec.rank, world_size=spec.world_size, batch_size=spec.step_samples,
                           seed=spec.seed) if train else
            ExactShardSampler(len(store), rank=spec.rank, world_size=spec.world_size))
        self.epoch = 0
        self._tally = _skipped_tally(store, require_every_class=train)
        self._active: Optional[weakref.ref[Generator[tuple[torch.Tensor, torch.Tensor], None, None]]] = None

    @property
    def evaluation(self) -> bool:
        return not self.train

    @property
    def skipped(self) -> int:
        """Files of the split the store could not decode (named in its header, logged once)."""
        return len(self._tally)

    @property
    def total_samples(self) -> int:
        return len(self.store) + len(self._tally)  # the split's files, as the other loaders count them

    def __len__(self) -> int:
        """Batches of a whole epoch on this rank (a skip does not change it)."""
        samples = self.sampler.part_len if isinstance(self.sampler, ShardedSampler) else len(self.sampler)
        return samples // self.batch_size if self.train else -(-samples // self.batch_size)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use epoch ``epoch``'s order, crops and side; skip its first ``skip_batches`` batches."""
        if not 0 <= skip_batches <= len(self):
            raise ValueError(f"skip_batches must be in 0..{len(self)}, got {skip_batches}")
        if skip_batches and not self.train:
            raise ValueError("an evaluation loader reads every image: skip_batches must be 0")
        self.epoch = epoch
        if isinstance(self.sampler, ShardedSampler):
            self.sampler.set_epoch(epoch)
            self.sampler.set_start(skip_batches * self.batch_size)

    def close(self) -> None:
        """End the pass under way (its background thread); a later pass starts afresh."""
        active = self._active() if self._active is not None else None
        if active is not None:
            active.close()
        self._active = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self.close()  # one pass at a time: a new pass ends the one before
        epoch, rows = self.epoch, list(self.sampler)
        first = self.sampler.start_index // self.batch_size if isinstance(self.sampler, ShardedSampler) else 0
        count = len(rows) // self.batch_size if self.train else -(-len(rows) // self.batch_size)

        def batches() -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
            if self.prefetch_batches > 0 and self.device.type == "cpu":  # in a background thread
                one_intraop_thread_here()
            if self.threads == 1:
                for k in range(count):
                    yield self.batch(rows[k * self.batch_size : (k + 1) * self.batch_size], epoch, first + k)
                return
            with ThreadPoolExecutor(self.threads, thread_name_prefix="decoded-augment",
                                    initializer=one_intraop_thread_here) as pool:
                pending: deque[Future] = deque()
                try:
                    for k in range(count):
                        pending.append(pool.submit(self.batch, rows[k * self.batch_size : (k + 1) * self.batch_size],
                                                   epoch, first + k))
                        if len(pending) == self.threads:
                            yield pending.popleft().result()
                    while pending:
                        yield pending.popleft().result()
                finally:  # a pass closed early: the batches not started are dropped
                    for future in pending:
                        future.cancel()

        active = (batches() if self.prefetch_batches <= 0 else
                  in_background(batches, self.prefetch_batches, device=self.device, name="decoded-augment"))
        self._active = weakref.ref(active)  # weak: a pass its consumer dropped closes at once
        return active

    def batch(self, rows: list[int], epoch: int, number: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``number`` (from 0) of this rank's epoch ``epoch``: the store's ``rows``, augmented."""
        images, labels = self.store.batch(rows)
        images = images.to(self.device)
        if self.train:
            recipe = replace(self.recipe, size=self._train_size_at(epoch), crop_scale=self._crop_scale_at(epoch))
            # keyed by the batch's place among all ranks' batches of the epoch: no two draw alike
            generator = torch.Generator().manual_seed(sample_seed(self.seed, epoch, number * self.world_size
                                                                  + self.rank))
            out = augment_same_size(images, recipe, generator=generator, mean=IMAGENET_DEFAULT_MEAN,
                                    std=IMAGENET_DEFAULT_STD, dtype=self.dtype, channels_last=self.channels_last)
        else:
            out = normalise_cast(self._centre(images, self._val_size_at(epoch)), IMAGENET_DEFAULT_MEAN,
                                 IMAGENET_DEFAULT_STD, self.dtype, self.channels_last)
        return out, labels.to(self.device)

    def _centre(self, images: torch.Tensor, side: int) -> torch.Tensor:
        """torchvision's ``Resize(round(side / ratio))`` + ``CenterCrop(side)`` of images stored as
        the centre square of their shorter side resized to the store's side: float32, 0..255."""
        stored = images.shape[-1]
        if round(side / self.recipe.val_crop_ratio) == stored:  # the store's own side: a slice
            top = int(round((stored - side) / 2.0))
            return images[..., top : top + side, top : top + side].to(torch.float32)
        crop = stored * side / round(side / self.recipe.val_crop_ratio)  # the same fraction of the image
        corner = (stored - crop) / 2
        boxes = torch.tensor([[corner, corner, crop, crop]]).expand(len(images), 4)
        return resized_crops(images, boxes, side)


def _skipped_tally(store: DecodedStore, *, require_every_class: bool) -> UnreadableTally:
    """The files the store left out, each logged once and counted; a training class left
    without one readable image raises (:class:`UnreadableTally`'s rule)."""
    header = store.header
    classes = list(header["classes"])
    # paths relative to the data root: <split>/<class>/<file>
    skipped = [(path, classes.index(Path(path).parts[1])) for path in header["skipped"]]
    source = header["source"]
    tally = UnreadableTally(classes, [*store.labels.tolist(), *(t for _, t in skipped)],
                            os.path.join(source, header["split"]),
                            require_every_class=require_every_class)
    for k, (path, target) in enumerate(skipped):
        log.warning("skipping unreadable image %s: the decoded store could not decode it",
                    os.path.join(source, path))
        tally.add(len(store) + k, target)
    return tally


def build_decoded_loaders(root: str | os.PathLike, spec: LoaderSpec, *, cache: Optional[Path] = None,
                          prefetch_batches: int = 2, stores: Optional[dict[str, DecodedStore]] = None,
                          check_source: bool = True) -> tuple[DecodedLoader, DecodedLoader, int]:
    """This rank's ``(train_loader, val_loader, num_classes)`` over the decoded stores of ``root``
    (:func:`ensure_decoded_stores`: built in ``cache`` on first use, logged by the caller).

    Args:
        root: an ImageFolder tree with ``train/`` and ``val/``.
        spec: sizes, this rank's place, ``device`` (where batches are augmented), ``dtype``
            and ``channels_last`` of the images yielded; ``workers``: decoding threads when
            a store is built, and batches augmented at once (at least 1).
        cache: the folder of the stores; None: :func:`decoded_cache_root`.
        prefetch_batches: batches augmented ahead in a background thread (0: in the
            consumer's thread when it asks for the batch).
        stores: the ``train`` and ``val`` stores as :func:`ensure_decoded_stores` returned them
            for ``root`` and ``spec``, not opened again (opening one checks its source's files
            against the store: a listing of the split); None: opened here.
        check_source: where the stores are opened here, refuse one whose source's files changed
            since it was built (:func:`ensure_decoded_stores`); False where another process of
            this host has just checked the same stores (a run's ranks after their node's first).
    """
    if stores is None:
        stores = ensure_decoded_stores(root, spec, cache=cache, announce=False, check_source=check_source)
    train = DecodedLoader(stores["train"], spec, train=True, prefetch_batches=prefetch_batches)
    val = DecodedLoader(stores["val"], spec, train=False, prefetch_batches=prefetch_batches)
    return train, val, len(stores["train"].header["classes"])
