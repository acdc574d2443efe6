"""``data.loader=dali`` over files: ImageFolder trees or the data check's file lists.

Order of the samples. A DALI reader owns its order, so a resumed run could neither pick an
epoch nor skip batches without decoding them. Here the order is ours: each batch's file paths
come from a small Python callback (``fn.external_source``), drawn from
:class:`ShardedSampler` (training: one permutation per epoch, seeded by ``seed + epoch``, rank
``r`` of ``w`` takes the part ``perm[r::w]``, trimmed to whole batches, the same as the torchvision
path) or :class:`ExactShardSampler` (evaluation: contiguous blocks, every image once, the last
batch short). DALI then reads the files (``fn.io.file.read``, in its thread pool) and decodes
them (:mod:`largebatch.data.pipelines.dali_graph`). So ranks are disjoint every epoch, the
order changes every epoch, ``set_epoch(e, skip_batches=k)`` costs nothing, and both paths feed
a rank the same images. Validation needs no padding: the last batch is simply shorter, so
nothing is counted twice.

Overlap: DALI runs in its own threads (and CUDA streams) with ``prefetch_queue_depth``
batches (default 2) in flight, so the next batch is being read, decoded and augmented while
the model trains on the current one.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterator, Mapping, NamedTuple, Optional, Sequence

import numpy as np
import torch

from largebatch.data.contract import LoaderSpec
from largebatch.data.images import (
    check_split_classes,
    list_classes,
    list_split,
    not_a_folder,
    read_file_list,
    special_file,
)
from largebatch.data.pipelines.dali_graph import (
    DEFAULT_HW_DECODER_LOAD,
    DaliPipeline,
    _aug_seed,
    _check_common,
    _dali,
    _decode_error,
    _to_batch,
    _train_images,
    _val_images,
    dali_device_id,
)
from largebatch.data.samplers import ExactShardSampler, ShardedSampler
from largebatch.errors import DataError

__all__ = ["DaliLoader", "build_dali_loaders"]


# ---------------------------------------------------------------------------------------
# files and file lists: the order comes from our samplers


class _BatchSource:
    """``fn.external_source`` callback: batch ``i`` of the current epoch as (paths, labels),
    and each sample's crop side (the epoch's) when ``side`` is set (training)."""

    def __init__(self, paths: Sequence[str], labels: np.ndarray) -> None:
        self.paths = paths
        self.labels = labels
        self.batches: list[list[int]] = []
        self.side: Optional[int] = None

    def __call__(self, info: Any) -> tuple[list[np.ndarray], ...]:
        if info.iteration >= len(self.batches):
            raise StopIteration
        idx = self.batches[info.iteration]
        out = ([np.frombuffer(self.paths[i].encode(), dtype=np.uint8) for i in idx],
               [np.asarray(self.labels[i], dtype=np.int64) for i in idx])
        if self.side is None:
            return out
        return (*out, [np.asarray(self.side, dtype=np.float32)] * len(idx))


class DaliLoader:
    """A DALI pipeline over a list of files, in the order of a largebatch sampler.

    Iterating yields ``(images, labels)`` for the current epoch; ``len()`` is the number of
    batches of a whole epoch for this rank; ``set_epoch(epoch, skip_batches)`` picks the
    epoch's shuffle and skips its first batches (resume), for the next iteration only.
    Build it with :func:`build_dali_loaders`.

    Progressive resizing: a training batch's crop side (``pipeline.side_at(epoch)``) comes
    from the same callback as its files, one value per sample, and is DALI's ``fn.resize``
    argument input. DALI 2.4's ``resize_x``/``resize_y`` accept a per-sample argument input
    (tried: the same bits as the constant), so one pipeline serves every side: no pipeline
    per side to build, hold and close, and the augmentation's random stream runs on across
    epochs as it does without a schedule. The side follows ``set_epoch``, so a resume inside
    an epoch reads that epoch's side. The graph's constants (``pipeline.phase_at(epoch)``: the
    training crop's area range, the evaluation side) change only between phases: an epoch of
    another phase rebuilds the pipeline (seeded as the first).
    """

    def __init__(
        self,
        paths: Sequence[str],
        labels: Sequence[int],
        *,
        sampler: ShardedSampler | ExactShardSampler,
        batch_size: int,
        drop_last: bool,
        pipeline: DaliPipeline,
        seed: int,
        data_root: str | None = None,
    ) -> None:
        self.sampler = sampler
        self.data_root = data_root
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.layout = pipeline.layout
        self.device_id = pipeline.device_id
        self.epoch = 0
        self.skip_batches = 0
        self.skipped = 0  # never grows: DALI cannot skip a file, the data check left them out
        self._source = _BatchSource(paths, np.asarray(labels, dtype=np.int64))
        self._graph = pipeline.graph
        self._side_at = pipeline.side_at
        self._phase_at = pipeline.phase_at
        self._phase: Any = None  # the phase the pipeline was built for
        self._workers = max(1, pipeline.workers)
        self._seed = seed
        self._depth = pipeline.prefetch_queue_depth
        self._iterator: Any = None
        self._pending = 0  # batches DALI still holds for the epoch being read (-1: none begun)

    @property
    def evaluation(self) -> bool:
        """Read with the exact sampler: every sample once over the ranks (the loader contract)."""
        return isinstance(self.sampler, ExactShardSampler)

    @property
    def total_samples(self) -> int:
        return self.sampler.dataset_len

    @property
    def num_samples(self) -> int:
        """Samples this rank reads in a whole epoch."""
        if isinstance(self.sampler, ShardedSampler):
            return self.sampler.part_len  # already whole batches
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
        part = self.sampler.part() if isinstance(self.sampler, ShardedSampler) else list(self.sampler)
        batches = [part[i : i + self.batch_size] for i in range(0, len(part), self.batch_size)]
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
            outputs = dali.fn.external_source(source=source, num_outputs=2 if self._side_at is None else 3,
                                              batch=True, batch_info=True)
            names, labels, side = outputs if self._side_at is not None else (*outputs, None)
            images = self._graph(dali.fn.io.file.read(names), gpu, side, self._phase)
            if gpu:  # the labels follow the images to the GPU
                labels = labels.gpu()  # gpu-only
            return images, labels

        # The epoch ends when the source raises StopIteration; nothing is scheduled before
        # the first next(), so the first epoch's order is the one set_epoch chose.
        return DALIGenericIterator(pipeline(), ["images", "labels"],
                                   last_batch_policy=LastBatchPolicy.PARTIAL,
                                   prepare_first_batch=False)

    def _start_epoch(self, batches: list[list[int]]) -> Any:
        if self._iterator is not None and self._pending > 0:
            self._iterator = None  # the last epoch was left half read: DALI cannot rewind
        if self._iterator is not None:  # the last epoch was read to its end: finish it, then restart
            try:
                next(self._iterator)
            except StopIteration:
                pass
        self._source.batches = batches
        self._source.side = None if self._side_at is None else self._side_at(self.epoch)
        phase = self._phase_at(self.epoch)
        if phase != self._phase:  # the graph's constants change: a pipeline of this phase
            self._iterator, self._phase = None, phase
        if self._iterator is None:
            self._iterator = self._build()
        else:
            self._iterator.reset()
        self._pending = len(batches)
        return self._iterator

    def close(self) -> None:
        """Release the pipeline (its threads and buffers); the next pass builds a new one."""
        self._iterator = None

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
        special = [(p, what) for p in paths if (what := special_file(p)) is not None]
        if special:  # DALI cannot skip a file, and its reader would wait on a FIFO forever
            (path, what), n = special[0], len(special)
            raise DataError(f"{path} is {what}, not an image file ({n} such file(s) in {split}/): move it "
                            f"out of {root}, or pass the data check's lists (largebatch-check-data {root})")
        return paths, labels, len(classes)
    if not os.path.isfile(file_list):
        raise DataError(f"file list {file_list} does not exist: run largebatch-check-data {root}")
    paths, labels = read_file_list(file_list, root)
    split_dir = os.path.join(root, split)
    if split == "train" and os.path.isdir(split_dir):  # the other loaders' rule, at build time here
        classes, _ = list_classes(split_dir)
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
    return len(list_classes(train)[0])


def build_dali_loaders(
    root: str | os.PathLike,
    spec: LoaderSpec,
    *,
    dtype: torch.dtype = torch.float32,
    file_list: str | os.PathLike | Mapping[str, str | os.PathLike] | None = None,
    hw_decoder_load: float = DEFAULT_HW_DECODER_LOAD,
    prefetch_queue_depth: int = 2,
) -> tuple[DaliLoader, DaliLoader, int]:
    """DALI train and val loaders of ``root/train`` and ``root/val`` for one rank.

    Args:
        root: folder holding ``train/<class>/`` and ``val/<class>/`` (ImageFolder layout).
        spec: sizes, this rank's place and the device (:class:`LoaderSpec`): ``spec.workers``
            DALI CPU threads per pipeline; training reads this rank's part
            ``perm[rank::world_size]`` of whole batches (``perm`` seeded by ``seed + epoch``),
            val a contiguous block (every image counted once over all ranks); a CUDA
            ``spec.device`` decodes ``mixed`` and augments on that GPU, the CPU on the CPU;
            ``spec.channels_last`` yields NCHW-shaped tensors in channels_last memory.
        dtype: torch.float32 or torch.float16 images (DALI has no bfloat16 output).
        file_list: the clean file list(s) of ``largebatch-check-data`` (paths relative to
            ``root``): one path (train) or ``{"train": ..., "val": ...}``; a split without
            one is listed from its folder.
        hw_decoder_load: share of JPEGs for the GPU's hardware decoder (mixed decode only).
        prefetch_queue_depth: batches DALI prepares ahead of the one being trained on.

    Returns ``(train_loader, val_loader, num_classes)``.
    """
    _check_common(spec, dtype)
    root = os.fspath(root)
    samples = _split_samples(root, file_list)
    train_pipeline, val_pipeline = _pipelines(spec, dtype, hw_decoder_load, prefetch_queue_depth)
    seed = _aug_seed(spec.seed, spec.rank)
    train = DaliLoader(
        samples.train_paths, samples.train_labels, batch_size=spec.batch_size, drop_last=True, pipeline=train_pipeline,
        sampler=ShardedSampler(len(samples.train_paths), rank=spec.rank, world_size=spec.world_size,
                               batch_size=spec.step_samples, seed=spec.seed),
        seed=seed, data_root=root,
    )
    val = DaliLoader(
        samples.val_paths, samples.val_labels, batch_size=spec.val_batch, drop_last=False, pipeline=val_pipeline,
        sampler=ExactShardSampler(len(samples.val_paths), rank=spec.rank, world_size=spec.world_size),
        seed=seed, data_root=root,
    )
    return train, val, samples.num_classes


class _SplitSamples(NamedTuple):
    """The files and labels of both splits, and the number of classes."""

    train_paths: list[str]
    train_labels: list[int]
    val_paths: list[str]
    val_labels: list[int]
    num_classes: int


def _split_samples(root: str, file_list: str | os.PathLike | Mapping[str, str | os.PathLike] | None) -> _SplitSamples:
    """Both splits' files and labels, from the data check's lists where given, else from the
    folders; the class count from the train folder (or the labels)."""
    if not os.path.isdir(root):
        raise DataError(f"data root {root} {not_a_folder(root)}: set data.root to a folder holding "
                        f"train/ and val/")
    check_split_classes(root)  # the lists' labels are only one split's
    lists = dict(file_list) if isinstance(file_list, Mapping) else {"train": file_list}
    train_paths, train_labels, n_train = _file_samples(root, "train", lists.get("train"))
    val_paths, val_labels, _ = _file_samples(root, "val", lists.get("val"))
    num_classes = n_train or _class_count(root) or (max(train_labels, default=-1) + 1)
    if not train_paths:
        raise DataError(f"{root}/train holds no image")
    return _SplitSamples(train_paths, train_labels, val_paths, val_labels, num_classes)


def _pipelines(spec: LoaderSpec, dtype: torch.dtype, hw_decoder_load: float,
               prefetch_queue_depth: int) -> tuple[DaliPipeline, DaliPipeline]:
    """The training pipeline (random crop per phase and side) and the evaluation one (resize and
    centre crop at the evaluation side), on ``spec``'s device and threads."""
    layout = spec.layout

    def train_graph(encoded: Any, gpu: bool, side: Any, crop_scale: tuple[float, float]) -> Any:
        return _train_images(encoded, gpu=gpu, image_size=side, crop_scale=crop_scale,
                             layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)

    def val_graph(encoded: Any, gpu: bool, side: Any, val_size: int) -> Any:
        return _val_images(encoded, gpu=gpu, image_size=val_size, val_crop_ratio=spec.val_crop_ratio,
                           layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)

    def pipeline(graph: Callable[[Any, bool, Any, Any], Any], phase_at: Callable[[int], Any],
                 side_at: Callable[[int], int] | None = None) -> DaliPipeline:
        return DaliPipeline(graph, spec.workers, dali_device_id(spec), layout, prefetch_queue_depth, side_at,
                            phase_at)

    return pipeline(train_graph, spec.crop_scale_at, spec.train_size_at), pipeline(val_graph, spec.val_size_at)


