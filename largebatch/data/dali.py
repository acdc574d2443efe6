"""The NVIDIA DALI input pipeline: ImageFolder trees, file lists or packed shards to batches.

Same augmentation as the torchvision path (:mod:`largebatch.data.folder`), done by DALI:
training decodes a random crop (area ``crop_scale`` of the image, aspect ratio 3/4..4/3,
ten tries, as ``RandomResizedCrop``; fused decode-and-crop as in Ying et al. 2018), resizes
it to ``image_size`` (bilinear, antialiased), flips it with probability 1/2 and normalises
with the ImageNet mean/std; evaluation resizes the shorter side to ``image_size /
val_crop_ratio`` and takes the centre crop. With ``device_id=None`` everything runs on the
CPU (libjpeg-turbo); with a GPU the decode is ``mixed`` (nvJPEG, and the A100/H100 hardware
JPEG decoder for ``hw_decoder_load`` of the images) and the rest runs on the GPU.

Order of the samples (files and file lists). A DALI reader owns its order, so a resumed run
could neither pick an epoch nor skip batches without decoding them. Here the order is ours:
each batch's file paths come from a small Python callback (``fn.external_source``), drawn
from :class:`ShardedSampler` (training: one permutation per epoch, seeded by ``seed +
epoch``, rank ``r`` of ``w`` takes ``perm[r::w]``, trimmed to whole batches, the same as the
torchvision path) or :class:`ExactShardSampler` (evaluation: contiguous blocks, every image
once, the last batch short). DALI then reads the files (``fn.io.file.read``, in its thread
pool) and decodes them. So ranks are disjoint every epoch, the order changes every epoch,
``set_epoch(e, skip_batches=k)`` costs nothing, and both paths feed a rank the same images.
Validation needs no padding: the last batch is simply shorter, so nothing is counted twice.

Overlap: DALI runs in its own threads (and CUDA streams) with ``prefetch_queue_depth``
batches (default 2) in flight, so the next batch is being read, decoded and augmented while
the model trains on the current one.

Packed shards (:func:`build_dali_shard_loaders`): WebDataset tar files written by
``largebatch-make-shards`` (:mod:`largebatch.data.shards`), read by ``fn.readers.webdataset``.
Each epoch the archive order is permuted (seed + epoch, the same on every rank), DALI splits
the concatenated samples into ``world_size`` contiguous, disjoint shards, and a shuffle
buffer mixes samples inside a rank's shard. The pipeline is rebuilt per epoch (so any epoch
can be started), and ``skip_batches`` reads and drops batches.

Batches are ``(images, labels)``: images float32/float16, shape ``(N, 3, H, W)``; with
``layout="NHWC"`` the same shape in ``torch.channels_last`` memory (what a channels-last
model wants, no copy). Labels are int64 ``(N,)``. Both are on the pipeline's device.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

from largebatch.data.augment import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    TRAIN_CROP_RATIO,
    TRAIN_CROP_SCALE,
    VAL_CROP_RATIO,
)
from largebatch.data.images import list_split, read_file_list
from largebatch.data.samplers import ExactShardSampler, ShardedSampler
from largebatch.errors import DataError, UsageError

__all__ = [
    "DEFAULT_HW_DECODER_LOAD",
    "DaliLoader",
    "DaliShardLoader",
    "build_dali_loaders",
    "build_dali_shard_loaders",
    "dali_available",
    "decode_random_crop",
    "require_dali",
]

TRAIN_ASPECT_RATIO = TRAIN_CROP_RATIO  # the name tests and older callers use
# Share of JPEGs sent to the hardware decoder (A100/H100 NVJPG engines); the rest go to the
# CUDA nvJPEG decoder. NVIDIA's ResNet-50 example uses 0.65 on A100; see the benchmark.
DEFAULT_HW_DECODER_LOAD = 0.65
# Scratch space of the mixed decoder, preallocated so it does not grow batch by batch
# (the values of NVIDIA's ResNet-50 DALI example).
_DEVICE_MEMORY_PADDING = 211_025_920
_HOST_MEMORY_PADDING = 140_544_512
_SHARD_IMAGE_EXT = "jpg;jpeg;png;bmp;tif;tiff;webp"


def dali_available() -> bool:
    """True if ``nvidia.dali`` and its PyTorch plugin import (``pip install largebatch[dali]``)."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def require_dali() -> None:
    """Raise :class:`DataError` naming the fix when DALI cannot be imported."""
    if not dali_available():
        raise DataError("data.loader=dali needs NVIDIA DALI: pip install 'largebatch[dali]' "
                        "(nvidia-dali-cuda130), or use data.loader=torchvision")


def _dali() -> Any:
    require_dali()
    import nvidia.dali

    return nvidia.dali


# ---------------------------------------------------------------------------------------
# graph pieces (called inside a DALI pipeline definition)


def decode_random_crop(
    encoded: Any,
    *,
    gpu: bool,
    crop_scale: Sequence[float] = TRAIN_CROP_SCALE,
    crop_ratio: Sequence[float] = TRAIN_CROP_RATIO,
    hw_decoder_load: float = DEFAULT_HW_DECODER_LOAD,
) -> Any:
    """Decode a random crop of each encoded image, as torchvision's RandomResizedCrop picks it.

    Area fraction uniform in ``crop_scale``, aspect ratio (w/h) log-uniform in ``crop_ratio``,
    ten tries, then a fallback to the whole image clamped to the ratio range. The decoder
    decodes only the crop's region where it can (libjpeg-turbo / nvJPEG ROI decode).
    """
    fn, types = _dali().fn, _dali().types
    kwargs: dict[str, Any] = dict(
        output_type=types.RGB,
        random_area=[float(crop_scale[0]), float(crop_scale[1])],
        random_aspect_ratio=[float(crop_ratio[0]), float(crop_ratio[1])],
        num_attempts=10,
    )
    if gpu:
        kwargs.update(device="mixed", hw_decoder_load=hw_decoder_load,
                      device_memory_padding=_DEVICE_MEMORY_PADDING,
                      host_memory_padding=_HOST_MEMORY_PADDING)
    else:
        kwargs["device"] = "cpu"
    return fn.decoders.image_random_crop(encoded, **kwargs)


def _normalize(images: Any, *, layout: str, dtype: torch.dtype, mirror: Any = None,
               crop: int | None = None) -> Any:
    fn, types = _dali().fn, _dali().types
    kwargs: dict[str, Any] = dict(
        dtype=types.FLOAT16 if dtype == torch.float16 else types.FLOAT,
        output_layout="CHW" if layout == "NCHW" else "HWC",
        mean=[255 * m for m in IMAGENET_DEFAULT_MEAN],
        std=[255 * s for s in IMAGENET_DEFAULT_STD],
    )
    if mirror is not None:
        kwargs["mirror"] = mirror
    if crop is not None:
        kwargs.update(crop=(crop, crop), crop_pos_x=0.5, crop_pos_y=0.5)
    return fn.crop_mirror_normalize(images, **kwargs)


def _train_images(encoded: Any, *, gpu: bool, image_size: int, crop_scale: Sequence[float],
                  layout: str, dtype: torch.dtype, hw_decoder_load: float) -> Any:
    fn, types = _dali().fn, _dali().types
    images = decode_random_crop(encoded, gpu=gpu, crop_scale=crop_scale,
                                hw_decoder_load=hw_decoder_load)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size,
                       interp_type=types.INTERP_LINEAR, antialias=True)
    return _normalize(images, layout=layout, dtype=dtype,
                      mirror=fn.random.coin_flip(probability=0.5))


def _val_images(encoded: Any, *, gpu: bool, image_size: int, val_crop_ratio: float,
                layout: str, dtype: torch.dtype, hw_decoder_load: float) -> Any:
    fn, types = _dali().fn, _dali().types
    kwargs: dict[str, Any] = dict(device="cpu", output_type=types.RGB)
    if gpu:
        kwargs.update(device="mixed", hw_decoder_load=hw_decoder_load)
    images = fn.decoders.image(encoded, **kwargs)
    images = fn.resize(images, resize_shorter=round(image_size / val_crop_ratio),
                       interp_type=types.INTERP_LINEAR, antialias=True)
    return _normalize(images, layout=layout, dtype=dtype, crop=image_size)


# ---------------------------------------------------------------------------------------
# sample lists


def _check_common(image_size: int, batch_size: int, workers: int, layout: str,
                  dtype: torch.dtype, rank: int, world_size: int) -> None:
    if image_size < 8:
        raise UsageError(f"image_size must be >= 8 pixels, got {image_size}")
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")
    if workers < 0:
        raise UsageError(f"workers must be >= 0, got {workers}")
    if layout not in ("NCHW", "NHWC"):
        raise ValueError(f"layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"dtype must be torch.float32 or torch.float16 (DALI has no bfloat16 "
                         f"output; cast on the device), got {dtype}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got rank {rank} of {world_size}")


def _aug_seed(seed: int, rank: int, epoch: int = 0) -> int:
    """Seed of a rank's augmentation stream: ranks and epochs draw different crops."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1)[0] & 0x7FFFFFFF)


def _decode_error(err: BaseException, data_root: str | None) -> DataError:
    """One line for a DALI pipeline failure (a file that changed after the data check)."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    op = next((ln.rstrip(",") for ln in lines if ln.startswith("Error in")), "")
    after = lines.index("encountered:") + 1 if "encountered:" in lines else len(lines)
    reason = lines[after] if after < len(lines) else (lines[-1] if lines else type(err).__name__)
    detail = f"{op}: {reason}" if op else reason
    where = data_root or "the data set"
    return DataError(
        f"DALI could not read or decode an image of {where} ({detail[:200]}); a file changed "
        f"or broke after the data check: run largebatch-check-data {where} again (or read with "
        f"data.loader=torchvision, which skips unreadable files)"
    )


def _to_batch(out: dict[str, torch.Tensor], layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    images = out["images"]
    if layout == "NHWC":
        images = images.permute(0, 3, 1, 2)  # NCHW shape, channels_last memory: no copy
    labels = out["labels"].reshape(-1).to(torch.int64)
    return images, labels


# ---------------------------------------------------------------------------------------
# files and file lists: the order comes from our samplers


class _BatchSource:
    """``fn.external_source`` callback: batch ``i`` of the current epoch as (paths, labels)."""

    def __init__(self, paths: Sequence[str], labels: np.ndarray) -> None:
        self.paths = paths
        self.labels = labels
        self.batches: list[list[int]] = []

    def __call__(self, info: Any) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if info.iteration >= len(self.batches):
            raise StopIteration
        idx = self.batches[info.iteration]
        return ([np.frombuffer(self.paths[i].encode(), dtype=np.uint8) for i in idx],
                [np.asarray(self.labels[i], dtype=np.int64) for i in idx])


class DaliLoader:
    """A DALI pipeline over a list of files, in the order of a largebatch sampler.

    Iterating yields ``(images, labels)`` for the current epoch; ``len()`` is the number of
    batches of a whole epoch for this rank; ``set_epoch(epoch, skip_batches)`` picks the
    epoch's shuffle and skips its first batches (resume), for the next iteration only.
    Build it with :func:`build_dali_loaders`.
    """

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int],
        *,
        sampler: ShardedSampler | ExactShardSampler,
        batch_size: int,
        drop_last: bool,
        graph: Callable[[Any, bool], Any],
        workers: int,
        device_id: int | None,
        seed: int,
        layout: str,
        prefetch_queue_depth: int = 2,
        data_root: str | None = None,
    ) -> None:
        self.sampler = sampler
        self.data_root = data_root
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.layout = layout
        self.device_id = device_id
        self.epoch = 0
        self.skip_batches = 0
        self.skipped = 0  # never grows: DALI cannot skip a file, the data check left them out
        self._source = _BatchSource(paths, np.asarray(labels, dtype=np.int64))
        self._graph = graph
        self._workers = max(1, workers)
        self._seed = seed
        self._depth = prefetch_queue_depth
        self._iterator: Any = None
        self._pending = 0  # batches DALI still holds for the epoch being read (-1: none begun)

    @property
    def num_samples(self) -> int:
        """Samples this rank reads in a whole epoch."""
        if isinstance(self.sampler, ShardedSampler):
            return self.sampler.shard_len  # already whole batches
        return len(self.sampler)

    def __len__(self) -> int:
        n = self.num_samples
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use epoch ``epoch``'s order and skip its first ``skip_batches`` batches."""
        if not 0 <= skip_batches <= len(self):
            raise ValueError(f"skip_batches must be in 0..{len(self)}, got {skip_batches}")
        self.epoch = epoch
        self.skip_batches = skip_batches
        self.sampler.set_epoch(epoch)

    def epoch_batches(self) -> list[list[int]]:
        """Sample indices of each batch still to come in the current epoch."""
        shard = self.sampler.shard() if isinstance(self.sampler, ShardedSampler) else list(self.sampler)
        batches = [shard[i : i + self.batch_size] for i in range(0, len(shard), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches[self.skip_batches :]

    def _build(self) -> Any:
        dali = _dali()
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        gpu = self.device_id is not None
        source = self._source

        @dali.pipeline_def(batch_size=self.batch_size, num_threads=self._workers,
                           device_id=self.device_id, seed=self._seed,
                           prefetch_queue_depth=self._depth)
        def pipeline() -> tuple[Any, Any]:
            names, labels = dali.fn.external_source(source=source, num_outputs=2, batch=True,
                                                    batch_info=True)
            images = self._graph(dali.fn.io.file.read(names), gpu)
            return images, labels.gpu() if gpu else labels

        # The epoch ends when the source raises StopIteration; nothing is scheduled before
        # the first next(), so the first epoch's order is the one set_epoch chose.
        return DALIGenericIterator(pipeline(), ["images", "labels"],
                                   last_batch_policy=LastBatchPolicy.PARTIAL,
                                   prepare_first_batch=False)

    def _start_epoch(self, batches: list[list[int]]) -> Any:
        if self._iterator is not None and self._pending > 0:
            self._iterator = None  # the last epoch was left half read: DALI cannot rewind
        if self._iterator is None:
            self._source.batches = batches
            self._iterator = self._build()
        else:  # the last epoch was read to its end: finish it, then restart the pipeline
            try:
                next(self._iterator)
            except StopIteration:
                pass
            self._source.batches = batches
            self._iterator.reset()
        self._pending = len(batches)
        return self._iterator

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        batches = self.epoch_batches()
        self.skip_batches = 0  # a resume skip applies once
        if not batches:
            return
        iterator = self._start_epoch(batches)
        for _ in range(len(batches)):
            try:
                out = next(iterator)[0]
            except RuntimeError as err:
                self._iterator = None  # a failed pipeline cannot go on
                raise _decode_error(err, self.data_root) from None
            self._pending -= 1
            yield _to_batch(out, self.layout)


def _file_samples(root: str, split: str, file_list: str | os.PathLike | None
                  ) -> tuple[list[str], list[int], int | None]:
    """Paths, labels and (for a tree) the class count of one split."""
    if file_list is None:
        classes, paths, labels = list_split(root, split)
        return paths, labels, len(classes)
    if not os.path.isfile(file_list):
        raise DataError(f"file list {file_list} does not exist: run largebatch-check-data {root}")
    paths, labels = read_file_list(file_list, root)
    split_dir = os.path.join(root, split)
    if split == "train" and os.path.isdir(split_dir):  # the other loaders' rule, at build time here
        classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
        missing = sorted(set(range(len(classes))) - set(labels))
        if missing:
            name = classes[missing[0]]
            raise DataError(
                f"class {name!r} has no readable training image: the data check left every file "
                f"of {os.path.join(split_dir, name)} out of {file_list} (its report names them); "
                f"replace them or remove the class folder from train/ and val/"
            )
    return paths, labels, None


def _class_count(root: str) -> int | None:
    train = os.path.join(root, "train")
    if not os.path.isdir(train):
        return None
    return sum(1 for e in os.scandir(train) if e.is_dir())


def build_dali_loaders(
    root: str | os.PathLike,
    *,
    image_size: int,
    batch_size: int,
    workers: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    crop_scale: Sequence[float] = TRAIN_CROP_SCALE,
    val_crop_ratio: float = VAL_CROP_RATIO,
    device_id: int | None = None,
    layout: str = "NCHW",
    dtype: torch.dtype = torch.float32,
    file_list: str | os.PathLike | Mapping[str, str | os.PathLike] | None = None,
    val_batch_size: int | None = None,
    hw_decoder_load: float = DEFAULT_HW_DECODER_LOAD,
    prefetch_queue_depth: int = 2,
) -> tuple[DaliLoader, DaliLoader, int]:
    """DALI train and val loaders of ``root/train`` and ``root/val`` for one rank.

    Args:
        root: folder holding ``train/<class>/`` and ``val/<class>/`` (ImageFolder layout).
        image_size: side of the training crop and of the val centre crop, pixels.
        batch_size: per-device batch size.
        workers: DALI CPU threads of each pipeline.
        rank, world_size: this rank's place (training shard ``perm[rank::world_size]`` of
            whole batches; val: a contiguous block, every image counted once over all ranks).
        seed: seed of the shard permutation (``seed + epoch``) and of the augmentation.
        crop_scale: random crop area range (fraction of the image).
        val_crop_ratio: val centre crop / resized shorter side.
        device_id: local GPU for ``mixed`` decode and GPU augmentation; None: CPU only.
        layout: "NCHW", or "NHWC" (NCHW-shaped tensors in channels_last memory).
        dtype: torch.float32 or torch.float16 images.
        file_list: the clean file list(s) of ``largebatch-check-data`` (paths relative to
            ``root``): one path (train) or ``{"train": ..., "val": ...}``; a split without
            one is listed from its folder.
        val_batch_size: per-device val batch (default ``batch_size``).
        hw_decoder_load: share of JPEGs for the GPU's hardware decoder (mixed decode only).
        prefetch_queue_depth: batches DALI prepares ahead of the one being trained on.

    Returns ``(train_loader, val_loader, num_classes)``.
    """
    _check_common(image_size, batch_size, workers, layout, dtype, rank, world_size)
    if not 0 < val_crop_ratio <= 1:
        raise UsageError(f"val_crop_ratio must be in (0, 1], got {val_crop_ratio}")
    root = os.fspath(root)
    if not os.path.isdir(root):
        raise DataError(f"data root {root} does not exist: set data.root to a folder holding "
                        f"train/ and val/")
    lists = dict(file_list) if isinstance(file_list, Mapping) else {"train": file_list}
    train_paths, train_labels, n_train = _file_samples(root, "train", lists.get("train"))
    val_paths, val_labels, n_val = _file_samples(root, "val", lists.get("val"))
    num_classes = n_train or _class_count(root) or (max(train_labels, default=-1) + 1)
    if n_val is not None and n_val != num_classes:
        raise DataError(f"train and val of {root} have {num_classes} and {n_val} class folders: "
                        f"both splits need the same class folders")
    if not train_paths:
        raise DataError(f"{root}/train holds no image")

    def train_graph(encoded: Any, gpu: bool) -> Any:
        return _train_images(encoded, gpu=gpu, image_size=image_size, crop_scale=crop_scale,
                             layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)

    def val_graph(encoded: Any, gpu: bool) -> Any:
        return _val_images(encoded, gpu=gpu, image_size=image_size, val_crop_ratio=val_crop_ratio,
                           layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)

    common = dict(workers=workers, device_id=device_id, layout=layout,
                  prefetch_queue_depth=prefetch_queue_depth, data_root=root)
    train = DaliLoader(
        train_paths, train_labels, batch_size=batch_size, drop_last=True, graph=train_graph,
        sampler=ShardedSampler(len(train_paths), rank=rank, world_size=world_size,
                               batch_size=batch_size, seed=seed),
        seed=_aug_seed(seed, rank), **common,
    )
    val = DaliLoader(
        val_paths, val_labels, batch_size=val_batch_size or batch_size, drop_last=False,
        graph=val_graph, sampler=ExactShardSampler(len(val_paths), rank=rank, world_size=world_size),
        seed=_aug_seed(seed, rank), **common,
    )
    return train, val, num_classes


# ---------------------------------------------------------------------------------------
# packed shards: DALI's webdataset reader owns the order inside an epoch


def _dali_shard_bounds(n: int, shard_id: int, num_shards: int) -> tuple[int, int]:
    """Samples ``[begin, end)`` DALI's readers give shard ``shard_id`` of ``num_shards``."""
    return n * shard_id // num_shards, n * (shard_id + 1) // num_shards


class DaliShardLoader:
    """A DALI ``readers.webdataset`` pipeline over packed shards (see the module docstring).

    Same interface as :class:`DaliLoader`. Training: ``len()`` = ``(N // world) //
    batch_size`` on every rank (equal step counts even when DALI's shards differ by one);
    the pipeline is rebuilt per epoch with that epoch's archive order and shuffle seed.
    Evaluation: the archives in stored order, this rank's DALI shard read once, padded
    samples dropped (``LastBatchPolicy.PARTIAL``).
    """

    def __init__(
        self,
        tars: Sequence[str],
        indexes: Sequence[str],
        num_samples: int,
        *,
        train: bool,
        batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
        graph: Callable[[Any, bool], Any],
        workers: int,
        device_id: int | None,
        layout: str,
        prefetch_queue_depth: int = 2,
        shuffle_buffer: int = 4096,
    ) -> None:
        self.tars, self.indexes = list(tars), list(indexes)
        self.total = num_samples
        self.train = train
        self.batch_size = batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.layout = layout
        self.device_id = device_id
        self.epoch = 0
        self.skip_batches = 0
        self.skipped = 0  # never grows (see DaliLoader.skipped)
        self._graph = graph
        self._workers = max(1, workers)
        self._depth = prefetch_queue_depth
        self._buffer = shuffle_buffer
        self._iterator: Any = None
        self._iterator_epoch: int | None = None
        self._pending = 0

    @property
    def num_samples(self) -> int:
        if self.train:
            per_rank = self.total // self.world_size
            return per_rank - per_rank % self.batch_size
        begin, end = _dali_shard_bounds(self.total, self.rank, self.world_size)
        return end - begin

    def __len__(self) -> int:
        return self.num_samples // self.batch_size if self.train else -(-self.num_samples // self.batch_size)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use epoch ``epoch``'s archive order; drop its first ``skip_batches`` batches."""
        if not 0 <= skip_batches <= len(self):
            raise ValueError(f"skip_batches must be in 0..{len(self)}, got {skip_batches}")
        self.epoch = epoch
        self.skip_batches = skip_batches if self.train else 0

    def archive_order(self, epoch: int) -> list[int]:
        """The epoch's order of the archives (the same permutation on every rank)."""
        if not self.train:
            return list(range(len(self.tars)))
        gen = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(len(self.tars), generator=gen).tolist()

    def _build(self) -> Any:
        dali = _dali()
        from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

        gpu = self.device_id is not None
        order = self.archive_order(self.epoch)
        reader_args: dict[str, Any] = dict(
            paths=[self.tars[i] for i in order], index_paths=[self.indexes[i] for i in order],
            ext=[_SHARD_IMAGE_EXT, "lbl"], dtypes=[dali.types.UINT8, dali.types.INT64],
            missing_component_behavior="error", num_shards=self.world_size,
            shard_id=self.rank, stick_to_shard=True, name="reader",
        )
        if self.train:
            reader_args.update(random_shuffle=True, initial_fill=max(1, self._buffer))
        else:
            reader_args.update(pad_last_batch=True)

        @dali.pipeline_def(batch_size=self.batch_size, num_threads=self._workers,
                           device_id=self.device_id,
                           seed=_aug_seed(self.seed, self.rank, self.epoch if self.train else 0),
                           prefetch_queue_depth=self._depth)
        def pipeline() -> tuple[Any, Any]:
            encoded, labels = dali.fn.readers.webdataset(**reader_args)
            images = self._graph(encoded, gpu)
            return images, labels.gpu() if gpu else labels

        policy = LastBatchPolicy.DROP if self.train else LastBatchPolicy.PARTIAL
        return DALIGenericIterator(pipeline(), ["images", "labels"], reader_name="reader",
                                   last_batch_policy=policy, prepare_first_batch=False)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        total, skip = len(self), self.skip_batches
        self.skip_batches = 0
        if total - skip <= 0:
            return
        reuse = (not self.train and self._iterator is not None and self._pending == 0
                 and self._iterator_epoch == self.epoch)
        if reuse:
            self._iterator.reset()  # validation: same order every time, keep the pipeline
        else:
            self._iterator = None  # free the old pipeline's threads and buffers first
            self._iterator = self._build()
            self._iterator_epoch = self.epoch
        self._pending = total
        for k in range(total):
            out = next(self._iterator)[0]
            self._pending -= 1
            if k >= skip:
                yield _to_batch(out, self.layout)
        if not self.train:  # read to the end so the next reset() starts a clean epoch
            for _ in self._iterator:
                pass


def read_shard_meta(shards: str | os.PathLike, split: str) -> dict[str, Any]:
    """The ``meta.json`` of ``shards/split`` written by ``largebatch-make-shards``."""
    path = Path(shards) / split / "meta.json"
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise DataError(f"{path} does not exist: make packed shards with "
                        f"largebatch-make-shards ROOT {shards}") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON ({err}): re-run largebatch-make-shards") from None
    return meta


def build_dali_shard_loaders(
    shards: str | os.PathLike,
    *,
    image_size: int,
    batch_size: int,
    workers: int,
    rank: int = 0,
    world_size: int = 1,
    seed: int = 0,
    crop_scale: Sequence[float] = TRAIN_CROP_SCALE,
    val_crop_ratio: float = VAL_CROP_RATIO,
    device_id: int | None = None,
    layout: str = "NCHW",
    dtype: torch.dtype = torch.float32,
    val_batch_size: int | None = None,
    hw_decoder_load: float = DEFAULT_HW_DECODER_LOAD,
    prefetch_queue_depth: int = 2,
    shuffle_buffer: int = 4096,
) -> tuple[DaliShardLoader, DaliShardLoader, int]:
    """Like :func:`build_dali_loaders`, reading ``shards/{train,val}/*.tar`` of
    ``largebatch-make-shards``; ``shuffle_buffer`` samples are mixed inside a rank's shard."""
    _check_common(image_size, batch_size, workers, layout, dtype, rank, world_size)
    loaders = []
    num_classes = 0
    for split in ("train", "val"):
        meta = read_shard_meta(shards, split)
        folder = Path(shards) / split
        tars = [str(folder / s["tar"]) for s in meta["shards"]]
        indexes = [str(folder / s["index"]) for s in meta["shards"]]
        missing = [p for p in tars + indexes if not os.path.isfile(p)]
        if missing:
            raise DataError(f"packed shard {missing[0]} is missing ({len(missing)} file(s)): "
                            f"re-run largebatch-make-shards")
        train = split == "train"
        num_classes = max(num_classes, len(meta["classes"]))

        def graph(encoded: Any, gpu: bool, train: bool = train) -> Any:
            if train:
                return _train_images(encoded, gpu=gpu, image_size=image_size, crop_scale=crop_scale,
                                     layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)
            return _val_images(encoded, gpu=gpu, image_size=image_size, val_crop_ratio=val_crop_ratio,
                               layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)

        loaders.append(DaliShardLoader(
            tars, indexes, int(meta["num_samples"]), train=train,
            batch_size=batch_size if train else (val_batch_size or batch_size), rank=rank,
            world_size=world_size, seed=seed, graph=graph, workers=workers, device_id=device_id,
            layout=layout, prefetch_queue_depth=prefetch_queue_depth, shuffle_buffer=shuffle_buffer,
        ))
    if loaders[0].num_samples == 0:
        raise DataError(f"{loaders[0].total} packed samples on {world_size} ranks give no full "
                        f"batch of {batch_size} per rank; lower the batch size")
    return loaders[0], loaders[1], num_classes
