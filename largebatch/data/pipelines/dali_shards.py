"""``data.shards=DIR``: packed WebDataset shards read by DALI's ``fn.readers.webdataset``.

Written by ``largebatch-make-shards`` (:mod:`largebatch.data.shards`). Each epoch the archive
order is permuted (seed + epoch, the same on every rank), DALI splits the concatenated samples
into ``world_size`` contiguous, disjoint parts, one per rank (what DALI's ``shard_id``/
``num_shards`` arguments name), and a shuffle buffer mixes samples inside a rank's part. The pipeline is rebuilt per epoch (so any epoch can
be started), and ``skip_batches`` reads and drops batches. Decode and augmentation:
:mod:`largebatch.data.pipelines.dali_graph`. Progressive resizing costs nothing more here: the
training pipeline, built per epoch anyway, is built with that epoch's crop side as a constant
(``LoaderSpec.train_size_at``) and crop area range (``LoaderSpec.crop_scale_at``); evaluation
crops ``LoaderSpec.val_size_at`` the epoch its ``set_epoch`` named (a pipeline per evaluation side).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import torch

from largebatch.data.contract import LoaderSpec
from largebatch.data.images import check_same_classes
from largebatch.data.pipelines.dali_graph import (
    DEFAULT_HW_DECODER_LOAD,
    DaliPipeline,
    _SHARD_IMAGE_EXT,
    _aug_seed,
    _check_common,
    _dali,
    _to_batch,
    _train_images,
    _val_images,
    dali_device_id,
)
from largebatch.errors import DataError, TooFewSamplesError

__all__ = ["DaliShardLoader", "build_dali_shard_loaders", "read_shard_meta"]


# ---------------------------------------------------------------------------------------
# packed shards: DALI's webdataset reader owns the order inside an epoch


def _rank_part_bounds(n: int, rank: int, world_size: int) -> tuple[int, int]:
    """Samples ``[begin, end)`` DALI's readers give rank ``rank``'s part of ``world_size``
    (DALI's ``shard_id=rank`` of ``num_shards=world_size``)."""
    return n * rank // world_size, n * (rank + 1) // world_size


class DaliShardLoader:
    """A DALI ``readers.webdataset`` pipeline over packed shards (see the module docstring).

    Same interface as :class:`DaliLoader`. Training: ``len()`` = ``(N // world) //
    batch_size`` on every rank (equal step counts even when the ranks' parts differ by one);
    the pipeline is rebuilt per epoch with that epoch's archive order and shuffle seed.
    Evaluation: the archives in stored order, this rank's part read once, padded
    samples dropped (``LastBatchPolicy.PARTIAL``).
    """

    def __init__(
        self,
        tars: Sequence[str],
        indexes: Sequence[str],
        num_samples: int,
        spec: LoaderSpec,
        *,
        train: bool,
        pipeline: DaliPipeline,
    ) -> None:
        """``tars`` and their DALI ``indexes`` hold ``num_samples`` samples; ``spec`` gives the
        batch (``batch_size``, or ``val_batch`` for evaluation), this rank's place, the seed and
        the training shuffle buffer."""
        self.tars, self.indexes = list(tars), list(indexes)
        self.total = num_samples
        self.train = train
        self.batch_size = spec.batch_size if train else spec.val_batch
        self.step_samples = spec.step_samples  # a training part is whole optimizer steps
        self.rank, self.world_size, self.seed = spec.rank, spec.world_size, spec.seed
        self.layout = pipeline.layout
        self.device_id = pipeline.device_id
        self.epoch = 0
        self.skip_batches = 0
        self.skipped = 0  # never grows (see DaliLoader.skipped)
        self._graph = pipeline.graph
        self._side_at = pipeline.side_at
        self._phase_at = pipeline.phase_at
        self._workers = max(1, pipeline.workers)
        self._depth = pipeline.prefetch_queue_depth
        self._buffer = spec.shuffle_buffer
        self._iterator: Any = None
        self._iterator_phase: Any = None  # evaluation: the phase (side) its pipeline crops to
        self._pending = 0

    @property
    def evaluation(self) -> bool:
        return not self.train

    @property
    def total_samples(self) -> int:
        return self.total

    @property
    def num_samples(self) -> int:
        if self.train:
            per_rank = self.total // self.world_size
            return per_rank - per_rank % self.step_samples
        begin, end = _rank_part_bounds(self.total, self.rank, self.world_size)
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
        side = None if self._side_at is None else self._side_at(self.epoch)  # fixed in this epoch's graph
        phase = self._phase_at(self.epoch)
        reader_args: dict[str, Any] = dict(
            paths=[self.tars[i] for i in order], index_paths=[self.indexes[i] for i in order],
            ext=[_SHARD_IMAGE_EXT, "lbl"], dtypes=[dali.types.UINT8, dali.types.INT64],
            missing_component_behavior="error",
            # DALI's names for a rank's part (not our packed shards): part ``rank`` of ``world_size``
            num_shards=self.world_size, shard_id=self.rank, stick_to_shard=True, name="reader",
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
            images = self._graph(encoded, gpu, side, phase)
            if gpu:  # the labels follow the images to the GPU
                labels = labels.gpu()  # gpu-only
            return images, labels

        policy = LastBatchPolicy.DROP if self.train else LastBatchPolicy.PARTIAL
        return DALIGenericIterator(pipeline(), ["images", "labels"], reader_name="reader",
                                   last_batch_policy=policy, prepare_first_batch=False)

    def close(self) -> None:
        """Release the pipeline (its threads and buffers); the next pass builds a new one."""
        self._iterator = None

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        total, skip = len(self), self.skip_batches
        self.skip_batches = 0
        if total - skip <= 0:
            return
        reuse = (not self.train and self._iterator is not None and self._pending == 0
                 and self._iterator_phase == self._phase_at(self.epoch))
        if reuse:
            self._iterator.reset()  # validation: same order every time, keep the pipeline
        else:
            self._iterator = None  # free the old pipeline's threads and buffers first
            self._iterator = self._build()
            self._iterator_phase = self._phase_at(self.epoch)
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
    spec: LoaderSpec,
    *,
    dtype: torch.dtype = torch.float32,
    hw_decoder_load: float = DEFAULT_HW_DECODER_LOAD,
    prefetch_queue_depth: int = 2,
) -> tuple[DaliShardLoader, DaliShardLoader, int]:
    """Like :func:`build_dali_loaders`, reading the packed shards ``shards/{train,val}/*.tar``
    of ``largebatch-make-shards``; ``spec.shuffle_buffer`` samples are mixed inside a rank's part."""
    _check_common(spec, dtype)
    layout, batch_size, world_size = spec.layout, spec.batch_size, spec.world_size
    metas = {split: read_shard_meta(shards, split) for split in ("train", "val")}
    check_same_classes(os.path.join(shards, "train"), metas["train"]["classes"],
                       os.path.join(shards, "val"), metas["val"]["classes"])
    loaders = []
    num_classes = 0
    for split in ("train", "val"):
        meta = metas[split]
        folder = Path(shards) / split
        tars = [str(folder / s["tar"]) for s in meta["shards"]]
        indexes = [str(folder / s["index"]) for s in meta["shards"]]
        missing = [p for p in tars + indexes if not os.path.isfile(p)]
        if missing:
            raise DataError(f"packed shard {missing[0]} is missing ({len(missing)} file(s)): "
                            f"re-run largebatch-make-shards")
        train = split == "train"
        num_classes = max(num_classes, len(meta["classes"]))

        def graph(encoded: Any, gpu: bool, side: Any, phase: Any, train: bool = train) -> Any:
            if train:  # phase: the epoch's crop area range
                return _train_images(encoded, gpu=gpu, image_size=side, crop_scale=phase,
                                     layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)
            return _val_images(encoded, gpu=gpu, image_size=phase, val_crop_ratio=spec.val_crop_ratio,
                               layout=layout, dtype=dtype, hw_decoder_load=hw_decoder_load)

        pipeline = DaliPipeline(graph, spec.workers, dali_device_id(spec), layout, prefetch_queue_depth,
                                spec.train_size_at if train else None,
                                spec.crop_scale_at if train else spec.val_size_at)
        loaders.append(DaliShardLoader(tars, indexes, int(meta["num_samples"]), spec, train=train, pipeline=pipeline))
    if loaders[0].num_samples == 0:
        raise TooFewSamplesError(f"{loaders[0].total} packed samples on {world_size} ranks give no full "
                                 f"batch of {batch_size} per rank; lower the batch size", num_samples=loaders[0].total)
    return loaders[0], loaders[1], num_classes
