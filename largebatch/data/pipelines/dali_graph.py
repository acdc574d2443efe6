"""What both DALI pipelines share: availability, the decode / crop / normalise graph, helpers.

The augmentation is the recipe of :mod:`largebatch.data.augment`, done by DALI's operators:
training decodes a random crop (area ``crop_scale`` of the image, aspect ratio 3/4..4/3, ten
tries, as ``RandomResizedCrop``; fused decode-and-crop as in Ying et al. 2018), resizes it to
``image_size`` (bilinear, antialiased), flips it with probability ``TRAIN_FLIP`` and normalises with the
ImageNet mean/std; evaluation resizes the shorter side to ``image_size / val_crop_ratio`` and
takes the centre crop. With ``device_id=None`` everything runs on the CPU (libjpeg-turbo);
with a GPU the decode is ``mixed`` (nvJPEG, and the A100/H100 hardware JPEG decoder for
``hw_decoder_load`` of the images) and the rest runs on the GPU.

The two readers: :mod:`largebatch.data.pipelines.dali_files` (image folders or the data
check's file lists, in the order of our samplers) and
:mod:`largebatch.data.pipelines.dali_shards` (packed WebDataset shards).

Batches are ``(images, labels)``: images float32/float16, shape ``(N, 3, H, W)``; with
``layout="NHWC"`` the same shape in ``torch.channels_last`` memory (what a channels-last
model wants, no copy). Labels are int64 ``(N,)``. Both are on the pipeline's device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch

from largebatch.data.augment import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    TRAIN_CROP_RATIO,
    TRAIN_CROP_SCALE,
    TRAIN_FLIP,
)
from largebatch.data.background import cuda_device_index
from largebatch.data.contract import LoaderSpec
from largebatch.errors import DataError, UsageError

__all__ = [
    "DEFAULT_HW_DECODER_LOAD",
    "DaliPipeline",
    "TRAIN_ASPECT_RATIO",
    "dali_available",
    "dali_device_id",
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


@dataclass(frozen=True)
class DaliPipeline:
    """How a DALI loader builds and runs its pipeline, the same for both readers:
    ``graph(encoded, gpu, side, phase)`` adds the decode / augment operators to the files read, ``workers``
    CPU threads, ``device_id`` its GPU (None: everything on the CPU), ``layout`` of the batches
    (``NCHW`` or ``NHWC``), ``prefetch_queue_depth`` batches prepared ahead of the one in use.

    ``side_at`` (training) is the crop side of each epoch (``LoaderSpec.train_size_at``:
    progressive resizing, or ``image_size`` every epoch); the loader hands the epoch's side to
    ``graph`` as ``side``, a constant or a per-sample DALI argument input (see the readers).
    None (evaluation): ``side`` is None and the graph crops to its own constant side.

    ``phase_at`` gives the graph's constants of each epoch (``phase``): training's crop area range
    (``LoaderSpec.crop_scale_at``; DALI's ``random_area`` takes no per-sample input), evaluation's
    side (``LoaderSpec.val_size_at``). They change only between phases (``data.resolution``), and a
    loader rebuilds its pipeline for an epoch whose phase differs from the one it was built with."""

    graph: Callable[[Any, bool, Any, Any], Any]
    workers: int
    device_id: Optional[int]
    layout: str
    prefetch_queue_depth: int = 2
    side_at: Optional[Callable[[int], int]] = None
    phase_at: Callable[[int], Any] = lambda epoch: None


def dali_device_id(spec: LoaderSpec) -> Optional[int]:
    """DALI's GPU (mixed decode) for ``spec.device``, the current one for ``"cuda"`` without an
    index; None: decode on the CPU."""
    if not spec.on_gpu:
        return None
    return cuda_device_index(spec.device)  # gpu-only


def dali_available() -> bool:
    """True if ``nvidia.dali`` and its PyTorch plugin import (the ``dali`` extra:
    ``pip install '/path/to/largebatch[dali]'``, the clone's path)."""
    try:
        import nvidia.dali  # noqa: F401
        import nvidia.dali.plugin.pytorch  # noqa: F401
    except (ImportError, OSError):
        return False
    return True


def require_dali() -> None:
    """Raise :class:`DataError` naming the fix when DALI cannot be imported."""
    if not dali_available():
        raise DataError("data.loader=dali needs NVIDIA DALI: pip install '/path/to/largebatch[dali]' (your clone) "
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
        kwargs.update(device="mixed", hw_decoder_load=hw_decoder_load,  # gpu-only
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


def _train_images(encoded: Any, *, gpu: bool, image_size: Any, crop_scale: Sequence[float],
                  layout: str, dtype: torch.dtype, hw_decoder_load: float) -> Any:
    """``image_size``: the crop side, an int or a per-sample float argument input (``fn.resize``
    takes either for ``resize_x``/``resize_y``; the pixels are the same bits)."""
    fn, types = _dali().fn, _dali().types
    images = decode_random_crop(encoded, gpu=gpu, crop_scale=crop_scale,
                                hw_decoder_load=hw_decoder_load)
    images = fn.resize(images, resize_x=image_size, resize_y=image_size,
                       interp_type=types.INTERP_LINEAR, antialias=True)
    return _normalize(images, layout=layout, dtype=dtype,
                      mirror=fn.random.coin_flip(probability=TRAIN_FLIP))


def _val_images(encoded: Any, *, gpu: bool, image_size: int, val_crop_ratio: float,
                layout: str, dtype: torch.dtype, hw_decoder_load: float) -> Any:
    fn, types = _dali().fn, _dali().types
    kwargs: dict[str, Any] = dict(device="cpu", output_type=types.RGB)
    if gpu:
        kwargs.update(device="mixed", hw_decoder_load=hw_decoder_load)  # gpu-only
    images = fn.decoders.image(encoded, **kwargs)
    images = fn.resize(images, resize_shorter=round(image_size / val_crop_ratio),
                       interp_type=types.INTERP_LINEAR, antialias=True)
    return _normalize(images, layout=layout, dtype=dtype, crop=image_size)


# ---------------------------------------------------------------------------------------
# helpers of both readers


def _check_common(spec: LoaderSpec, dtype: torch.dtype) -> None:
    image_size, batch_size, workers, rank, world_size = (
        spec.image_size, spec.batch_size, spec.workers, spec.rank, spec.world_size)
    if image_size < 8:
        raise UsageError(f"image_size must be >= 8 pixels, got {image_size}")
    if batch_size < 1:
        raise UsageError(f"batch_size must be >= 1, got {batch_size}")
    if workers < 0:
        raise UsageError(f"workers must be >= 0, got {workers}")
    if dtype not in (torch.float32, torch.float16):
        raise ValueError(f"dtype must be torch.float32 or torch.float16 (DALI has no bfloat16 "
                         f"output; cast on the device), got {dtype}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got rank {rank} of {world_size}")


def _aug_seed(seed: int, rank: int, epoch: int = 0) -> int:
    """Seed of a rank's augmentation stream: ranks and epochs draw different crops."""
    return int(np.random.SeedSequence([seed, rank, epoch]).generate_state(1)[0] & 0x7FFFFFFF)


def _decode_error(err: BaseException, data_root: str | None) -> DataError | MemoryError:
    """One line for a DALI pipeline failure (a file that changed after the data check), or, for a
    failed allocation (``std::bad_alloc``, CUDA out of memory), a ``MemoryError``: the step or
    the evaluation reading the batch reports it as out of memory (exit 4), not as a broken file."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if "bad_alloc" in str(err) or "out of memory" in str(err).lower():
        op = next((ln.rstrip(",") for ln in lines if ln.startswith("Error in")), "")
        return MemoryError(f"DALI could not allocate memory{f' ({op})' if op else ''}")
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


