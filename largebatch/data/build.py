"""The input pipeline of a run: where the data is, and which loader reads it.

``resolve_data_root`` finds the image folder (``root``, or the embedded synthetic set, made by
rank 0 on first use). ``build_run_loaders`` picks the pipeline and builds this rank's train and
val loaders:

* ``loader="torchvision"``: the torchvision ``DataLoader`` (:mod:`largebatch.data.pipelines.torchvision`);
* ``loader="dali"``: NVIDIA DALI over the clean file lists of ``largebatch-check-data``
  (DALI cannot skip a bad file, so an unchecked set is an error naming the command);
* ``loader="nvjpeg"``: workers read file bytes; torchvision's nvJPEG decodes and the batch is
  augmented on ``device`` (:mod:`largebatch.data.pipelines.nvjpeg`; on a CPU device it decodes there);
* ``loader="auto"``: DALI where it is installed and the set is checked, else nvjpeg on a CUDA
  device and torchvision elsewhere, with a log line saying why;
* ``shards=DIR``: DALI's webdataset reader over ``largebatch-make-shards`` output.

Rank 0 decides between DALI and torchvision and tells the others, so every rank reads with the
same pipeline. Everything is plain keyword arguments: no config object.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, NamedTuple, Optional, Sequence

from largebatch.errors import DataError

__all__ = ["DaliDecision", "build_run_loaders", "dali_decision", "ensure_checked", "resolve_data_root"]

log = logging.getLogger(__name__)


class DaliDecision(NamedTuple):
    """Rank 0's answer to "read with DALI?", sent to every rank."""

    use_dali: bool
    file_lists: Optional[dict[str, str]] = None  # split -> clean file list of the data check
    error: Optional[str] = None  # data.loader=dali cannot work: the message
    note: Optional[str] = None  # data.loader=auto fell back to torchvision: why


def resolve_data_root(
    root: Optional[str], *, synthetic: Mapping[str, int], loader: str, workers: int, backend: Any
) -> Path:
    """``root``, or the embedded synthetic set made by rank 0 (every rank gets its path).

    Args:
        root: an ImageFolder tree with ``train/`` and ``val/``; None: the embedded set.
        synthetic: the embedded set's ``ensure_synthetic`` arguments (``num_classes``,
            ``train_per_class``, ``val_per_class``, ``image_size``, ``seed``).
        loader: ``torchvision``, ``nvjpeg``, ``dali`` or ``auto``. For ``dali`` and ``auto``
            rank 0 also runs the data check on the embedded set, so DALI reads it out of the box.
        workers: processes that generate (and check) the images.
        backend: the run's backend (``is_main``, ``barrier``).
    """
    if root:
        return Path(root).expanduser()
    from largebatch.data.synthetic import ensure_synthetic

    made: Optional[Path] = None
    if backend.is_main:
        made = ensure_synthetic(workers=max(1, workers), **synthetic)
        if loader in ("dali", "auto"):
            ensure_checked(made, workers=max(1, workers))
    backend.barrier()
    return ensure_synthetic(**synthetic) if made is None else made


def ensure_checked(root: Path, *, workers: int) -> None:
    """Run the data check on ``root`` unless an up-to-date one is on disk."""
    from largebatch.data.check import SPLITS, check_dataset, require_checked

    try:
        for split in SPLITS:
            require_checked(root, split)
    except DataError:
        report = check_dataset(root, workers=workers)
        log.info("checked %s for DALI: %d file(s) left out (%s)", root, len(report.fatal), report.report_path)


def dali_decision(requested: str, root: Path, fallback: str = "torchvision") -> DaliDecision:
    """Whether ``loader=requested`` (``dali`` or ``auto``) reads ``root`` with DALI.

    ``dali`` on an unchecked (or changed) set is an error naming ``largebatch-check-data``;
    ``auto`` then reads with ``fallback`` (nvjpeg on CUDA, else torchvision) and says why.
    """
    from largebatch.data.check import SPLITS, require_checked
    from largebatch.data.pipelines.dali_graph import dali_available, require_dali

    if not dali_available():
        if requested == "dali":
            try:
                require_dali()
            except DataError as err:
                return DaliDecision(False, error=str(err))
        return DaliDecision(False, note=f"data.loader=auto: NVIDIA DALI is not installed, reading with {fallback}")
    if not root.is_dir():  # the loader builders name the missing folder
        return DaliDecision(requested == "dali")
    try:
        lists = {split: str(require_checked(root, split)) for split in SPLITS}
    except DataError as err:
        if requested == "dali":
            return DaliDecision(False, error=f"{err} (or set data.loader=torchvision)")
        return DaliDecision(False, note=f"data.loader=auto: reading with {fallback}, not DALI: {err}")
    return DaliDecision(True, file_lists=lists)


def _agree_on_dali(requested: str, root: Path, backend: Any, fallback: str) -> DaliDecision:
    """Rank 0 decides; every rank gets the decision (file lists found on its own disk)."""
    decision = dali_decision(requested, root, fallback) if backend.is_main else DaliDecision(False)
    decision = DaliDecision(*backend.broadcast_object(tuple(decision)))
    if decision.error:
        raise DataError(decision.error)
    if decision.note and backend.is_main:
        log.info("%s", decision.note)
    lists = decision.file_lists
    if lists and not all(Path(p).is_file() for p in lists.values()):
        # rank 0's lists live on a disk this node does not see: find this node's own
        from largebatch.data.check import require_checked

        lists = {split: str(require_checked(root, split)) for split in lists}
    return decision._replace(file_lists=lists)


def build_run_loaders(
    root: Path,
    *,
    loader: str,
    shards: Optional[str],
    backend: Any,
    image_size: int,
    batch_size: int,
    workers: int,
    seed: int,
    crop_scale: Sequence[float],
    val_crop_ratio: float,
    pin_memory: bool = False,
    dali_device_id: Optional[int] = None,
    layout: str = "NCHW",
    device: Any = None,
    dtype: Any = None,
    gpu_decode: bool = False,
) -> tuple[Any, Any, int]:
    """This rank's ``(train_loader, val_loader, num_classes)``.

    Args:
        root: the image folder (:func:`resolve_data_root`).
        loader: ``torchvision``, ``dali`` or ``auto`` (see the module docstring).
        shards: a ``largebatch-make-shards`` folder, read by DALI instead of ``root``; or None.
        backend: the run's backend (rank, world size, ``broadcast_object``).
        image_size, batch_size, workers, seed, crop_scale, val_crop_ratio: as for
            :func:`largebatch.data.pipelines.torchvision.build_loaders` (``batch_size`` is per device).
        pin_memory: pin host batches (torchvision loader; worth it for a CUDA device).
        dali_device_id: DALI's GPU for mixed (GPU) decode; None: CPU decode.
        layout: the output layout, ``NCHW`` or ``NHWC`` (channels-last models), for DALI and nvjpeg.
        device: the ``torch.device`` nvjpeg decodes and augments on (None: the CPU).
        dtype: the compute dtype nvjpeg yields images in (None: float32).
        gpu_decode: ``device`` is a GPU with nvJPEG: ``auto`` falls back to nvjpeg, not torchvision.
    """
    common = dict(
        image_size=image_size, batch_size=batch_size, workers=workers, rank=backend.rank,
        world_size=backend.world_size, seed=seed, crop_scale=tuple(crop_scale), val_crop_ratio=val_crop_ratio,
    )
    decode = "mixed (GPU)" if dali_device_id is not None else "CPU"
    if shards:
        from largebatch.data.pipelines.dali_graph import require_dali
        from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders

        if loader in ("torchvision", "nvjpeg"):
            raise DataError(
                f"data.shards={shards} is read by DALI only; set data.loader=dali (or auto), "
                f"or drop data.shards to read data.root's files with torchvision"
            )
        require_dali()
        train, val, num_classes = build_dali_shard_loaders(shards, device_id=dali_device_id, layout=layout, **common)
        if backend.is_main:
            log.info("input pipeline: DALI webdataset reader over the shards in %s, %s decode, %s",
                     shards, decode, layout)
        return train, val, num_classes
    fallback = "nvjpeg" if loader == "nvjpeg" or (loader == "auto" and gpu_decode) else "torchvision"
    decision = DaliDecision(False) if loader in ("torchvision", "nvjpeg") else _agree_on_dali(
        loader, root, backend, fallback)
    if not decision.use_dali and fallback == "nvjpeg":
        return _nvjpeg_loaders(root, device=device, dtype=dtype, layout=layout, pin_memory=pin_memory,
                               is_main=backend.is_main, **common)
    if not decision.use_dali:
        from largebatch.data.pipelines.torchvision import build_loaders

        if backend.is_main:
            log.info("input pipeline: torchvision DataLoader, %d worker(s) per rank", workers)
        return build_loaders(root, pin_memory=pin_memory, **common)
    from largebatch.data.pipelines.dali_files import build_dali_loaders

    train, val, num_classes = build_dali_loaders(
        root, device_id=dali_device_id, layout=layout, file_list=decision.file_lists, **common
    )
    if backend.is_main:
        log.info(
            "input pipeline: DALI, %s decode, %d thread(s), %s; %d train / %d val files from the "
            "data check's lists", decode, max(1, workers), layout, train.sampler.dataset_len, val.sampler.dataset_len,
        )
    return train, val, num_classes


def _nvjpeg_loaders(root: Path, *, device: Any, dtype: Any, layout: str, pin_memory: bool, is_main: bool,
                    **common: Any) -> tuple[Any, Any, int]:
    """Loaders that decode with torchvision's nvJPEG on ``device`` (on the CPU where it is a CPU)."""
    import torch

    from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders

    device = torch.device("cpu") if device is None else device
    train, val, num_classes = build_nvjpeg_loaders(
        root, device=device, dtype=dtype or torch.float32, channels_last=layout == "NHWC",
        pin_memory=pin_memory, **common,
    )
    if is_main:
        log.info("input pipeline: nvjpeg, %s decode and augmentation on %s, %d file-reading worker(s) per rank, %s",
                 "CPU" if device.type == "cpu" else "nvJPEG (GPU)", device, common["workers"], layout)
    return train, val, num_classes
