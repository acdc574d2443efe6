"""GPU JPEG decode with torchvision's nvJPEG (``data.loader=nvjpeg``): no DALI needed.

Loader workers only read each file's bytes (and its label) and join a batch's bytes into one
buffer (:class:`EncodedBatch`: one shared-memory tensor per batch, pinned on a CUDA device);
the main process decodes the batch on ``device`` with ``torchvision.io.decode_jpeg(list_of_byte_tensors, device=...)``
(nvJPEG on a CUDA device, libjpeg on the CPU) and augments it there with batched tensor ops,
so the host CPUs no longer limit the input rate (Ying et al. 2018, sec. 4: the input pipeline
is what limits accelerators at large batch).

Augmentation (:mod:`largebatch.data.augment`, tensor ops) is the recipe of
:mod:`largebatch.data.pipelines.torchvision`: training takes a random-resized crop (area ``crop_scale``,
aspect ratio 3/4..4/3, torchvision's sampling rule), a horizontal flip with probability 1/2
and the ImageNet mean/std; evaluation resizes the shorter side to ``image_size /
val_crop_ratio`` and takes the centre crop. A batch's crops and flips are drawn at once from a
generator keyed by ``(seed, epoch, the batch's place among all ranks' batches)``: the batches do
not depend on the number of workers, and a run resumed mid-epoch gets the very crops the
uninterrupted run would have got.
Progressive resizing: a training batch is cut to its epoch's side
(``LoaderSpec.train_size_at``, its crop area range ``LoaderSpec.crop_scale_at``), an evaluation
batch to ``LoaderSpec.val_size_at`` the epoch its ``set_epoch`` named; the side is chosen where
the batch is assembled, from the epoch the pass was started with, so the workers (which only
read bytes) need no rebuild. The next batches are decoded in one background thread and
augmented in another (:func:`largebatch.data.background.in_background`), so the decode of batch
k + 1 overlaps the augmentation of batch k; :attr:`NvjpegLoader.stage_times` says where each
batch's time goes.

Batch contract (that of :func:`largebatch.data.pipelines.torchvision.build_loaders`, on the device):

* Iterating yields ``(images, labels)``: ``(N, 3, S, S)`` normalised images in ``dtype``
  (channels_last if asked) and int64 ``(N,)`` labels, both on ``device``.
* Each rank's part and its order are the torchvision loader's: :class:`ShardedSampler` for training,
  :class:`ExactShardSampler` (every val image once over all ranks) for evaluation.
* A file nvJPEG cannot take (not a JPEG, e.g. a PNG named ``.JPEG``; a CMYK/YCCK JPEG; no
  end-of-image marker; or one nvJPEG rejects) is decoded on the CPU instead (Pillow), named
  once in the log and counted in ``loader.cpu_decoded``.
* A file nothing can decode (empty, truncated, not an image) is skipped, named once in the
  log and counted in ``loader.skipped``; a train batch refills its slot with a readable
  image of the same batch, a val batch drops it.
"""

from __future__ import annotations

import io
import logging
import os
import warnings
import weakref
from dataclasses import dataclass, replace
from typing import Any, Generator, Iterator, NamedTuple, Optional, Sequence, cast

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_jpeg

from largebatch.data.augment import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    CropRecipe,
    augment_batch,
    augment_each,
    normalise_cast,
)
from largebatch.data.background import in_background
from largebatch.data.contract import LoaderSpec
from largebatch.data.image_folder import RobustImageFolder
from largebatch.data.images import (
    EXIF_ORIENTATION,
    check_same_classes,
    decompression_bomb_limit,
    load_rgb,
    not_a_regular_file,
    special_file,
    split_folder,
)
from largebatch.data.loader_view import LoaderView, UnreadableTally
from largebatch.data.samplers import ExactShardSampler, ShardedSampler, sample_seed
from largebatch.data.stage_times import StageTimes
from largebatch.data.worker_signals import ignoring_stop_signals
from largebatch.errors import DataError

__all__ = [
    "EncodedBatch",
    "EncodedImageFolder",
    "EncodedSample",
    "NvjpegLoader",
    "build_nvjpeg_loaders",
    "collate_encoded",
    "cpu_decode_reason",
    "decode_images",
    "jpeg_frame",
]

logger = logging.getLogger(__name__)

# SOFn markers (frame headers); C4 (DHT), C8 (JPG) and CC (DAC) share the range but are not.
_SOF_MARKERS = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
_UNREADABLE = (OSError, ValueError, SyntaxError, Image.DecompressionBombError)


# ---------------------------------------------------------------------------------------
# what the workers do: read bytes, route the files nvJPEG cannot take to Pillow


def jpeg_frame(data: bytes) -> Optional[tuple[int, int, int]]:
    """``(height, width, components)`` from a JPEG's frame header, or None if there is none."""
    i, n = 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker == 0x01 or 0xD0 <= marker <= 0xD8:  # markers without a length
            i += 2
            continue
        if marker == 0xDA:  # scan data before any frame header: not a valid JPEG
            return None
        if marker in _SOF_MARKERS:
            if i + 10 > n:
                return None
            height = int.from_bytes(data[i + 5 : i + 7], "big")
            width = int.from_bytes(data[i + 7 : i + 9], "big")
            return height, width, data[i + 9]
        i += 2 + int.from_bytes(data[i + 2 : i + 4], "big")
    return None


def jpeg_exif_orientation(data: bytes) -> int:
    """The EXIF orientation (1-8) in a JPEG's APP1 segment; 1 when there is none or it is damaged."""
    i, n = 2, len(data)
    while i + 4 <= n and data[i] == 0xFF:
        marker = data[i + 1]
        if marker == 0xFF or marker == 0x01 or 0xD0 <= marker <= 0xD8:
            i += 1 if marker == 0xFF else 2
            continue
        if marker == 0xDA or marker in _SOF_MARKERS:  # EXIF comes before the frame and the scan
            return 1
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if marker == 0xE1 and data[i + 4 : i + 10] == b"Exif\x00\x00":
            return _tiff_orientation(data[i + 10 : i + 2 + length])
        i += 2 + length
    return 1


def _tiff_orientation(tiff: bytes) -> int:
    order = {b"II": "little", b"MM": "big"}.get(tiff[:2])
    if order is None or len(tiff) < 8:
        return 1
    ifd = int.from_bytes(tiff[4:8], order)  # type: ignore[arg-type]
    if ifd + 2 > len(tiff):
        return 1
    for k in range(int.from_bytes(tiff[ifd : ifd + 2], order)):  # type: ignore[arg-type]
        entry = ifd + 2 + 12 * k
        if entry + 12 > len(tiff):
            return 1
        if int.from_bytes(tiff[entry : entry + 2], order) == EXIF_ORIENTATION:  # type: ignore[arg-type]
            value = int.from_bytes(tiff[entry + 8 : entry + 10], order)  # type: ignore[arg-type]
            return value if 1 <= value <= 8 else 1
    return 1


def cpu_decode_reason(data: bytes) -> Optional[str]:
    """Why a file goes to the CPU decoder instead of nvJPEG; None when nvJPEG takes it.

    Decided from the bytes alone (cheap, in the worker): nvJPEG decodes baseline and
    progressive YCbCr/grayscale JPEGs; ImageNet also holds a PNG and CMYK JPEGs named
    ``.JPEG``, and a truncated file has no end-of-image marker. nvJPEG ignores an EXIF
    orientation, which DALI and the torchvision loader apply: such a file goes to Pillow too,
    so every loader shows it upright.
    """
    if not data.startswith(b"\xff\xd8\xff"):
        return "PNG data, not a JPEG" if data.startswith(b"\x89PNG") else "not a JPEG"
    if not data.rstrip(b"\x00\r\n ").endswith(b"\xff\xd9"):
        return "no JPEG end-of-image marker (truncated, or data after the image)"
    frame = jpeg_frame(data)
    if frame is None:
        return "no JPEG frame header"
    if frame[2] == 4:
        return "CMYK/YCCK JPEG"
    orientation = jpeg_exif_orientation(data)
    if orientation != 1:  # nvJPEG ignores it; Pillow turns the image as DALI and the torchvision loader do
        return f"EXIF orientation {orientation}"
    return None


def _pil_decode(data: bytes) -> torch.Tensor:
    """Decode any image Pillow reads to an RGB uint8 ``(3, H, W)`` tensor (raises if unreadable)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # EXIF / decompression warnings
        image = load_rgb(io.BytesIO(data))  # type: ignore[arg-type]  # Image.open takes files
    return torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8).view(
        image.height, image.width, 3).permute(2, 0, 1).contiguous()


class EncodedSample(NamedTuple):
    """One file as a worker hands it over.

    ``payload`` is the file's bytes (uint8, 1-D) for nvJPEG, or the decoded RGB image
    (uint8, ``(3, H, W)``) when ``cpu_reason`` says why the CPU decoded it; ``error`` names
    why the file is unreadable (then ``payload`` is None). ``dataset_index`` is the sample's
    index in the dataset (not ``index``: a NamedTuple field of that name hides ``tuple.index``).
    """

    dataset_index: int
    label: int
    path: str
    payload: Optional[torch.Tensor]
    cpu_reason: Optional[str] = None
    error: Optional[str] = None


class EncodedImageFolder(Dataset):
    """``(path, label)`` samples read as :class:`EncodedSample`: bytes, no decode on the host.

    ``classes`` and ``root`` are those of the ImageFolder the samples come from (the
    unreadable-class rule names them); ``targets`` are the samples' labels.
    """

    def __init__(self, samples: Sequence[tuple[str, int]], classes: Sequence[str] = (), root: str = "") -> None:
        self.samples = list(samples)
        self.targets = [label for _, label in self.samples]
        self.classes = list(classes) or [str(c) for c in range(max(self.targets, default=-1) + 1)]
        self.root = root

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> EncodedSample:
        path, label = self.samples[index]
        special = special_file(path)
        if special is not None:  # a FIFO: open() would wait forever
            return EncodedSample(index, label, path, None, error=str(not_a_regular_file(path, special)))
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError as err:
            return EncodedSample(index, label, path, None, error=str(err))
        if not data:
            return EncodedSample(index, label, path, None, error="empty file")
        frame = jpeg_frame(data) if data.startswith(b"\xff\xd8\xff") else None
        limit = decompression_bomb_limit()
        if frame is not None and limit is not None and frame[0] * frame[1] > limit:
            # Pillow (the torchvision loader) refuses it at open; nvJPEG would decode it all
            return EncodedSample(index, label, path, None,
                                 error=f"its header says {frame[1]}x{frame[0]} = {frame[0] * frame[1]} pixels, "
                                       f"over Pillow's decompression-bomb limit of {limit}")
        reason = cpu_decode_reason(data)
        if reason is None:
            return EncodedSample(index, label, path, torch.frombuffer(bytearray(data), dtype=torch.uint8))
        try:
            return EncodedSample(index, label, path, _pil_decode(data), cpu_reason=reason)
        except _UNREADABLE as err:
            return EncodedSample(index, label, path, None, error=f"{reason}; Pillow: {err}")


@dataclass
class EncodedBatch:
    """One batch as a worker hands it over: every nvJPEG-bound file's bytes in one buffer.

    Sending one shared-memory tensor per file costs a file descriptor and a pickle round trip
    each (256 per batch); here a batch is one ``data`` buffer, its ``labels`` and the rare
    CPU-decoded images. ``samples`` keeps each file's metadata in batch order (a payload
    left in ``data`` is None there); file ``k`` of ``on_device`` is
    ``data[offsets[k] : offsets[k + 1]]``. The DataLoader's ``pin_memory`` pins it
    (:meth:`pin_memory`): nvJPEG then reads the bytes from pinned memory and the labels are
    copied with ``non_blocking``.
    """

    data: torch.Tensor
    offsets: list[int]
    on_device: list[int]
    labels: torch.Tensor
    samples: list[EncodedSample]

    def __len__(self) -> int:
        return len(self.samples)

    def encoded(self) -> list[torch.Tensor]:
        """The byte tensors of the files in ``on_device`` (views of ``data``)."""
        return [self.data[a:b] for a, b in zip(self.offsets, self.offsets[1:])]

    def pin_memory(self) -> "EncodedBatch":
        samples = [s if s.payload is None else s._replace(payload=s.payload.pin_memory()) for s in self.samples]
        return EncodedBatch(self.data.pin_memory(), self.offsets, self.on_device, self.labels.pin_memory(), samples)


def collate_encoded(samples: list[EncodedSample]) -> EncodedBatch:
    """Join a batch's encoded files into one :class:`EncodedBatch` (in the worker)."""
    encoded = [(k, s.payload) for k, s in enumerate(samples) if s.payload is not None and s.cpu_reason is None]
    on_device = [k for k, _ in encoded]
    offsets = [0]
    for _, payload in encoded:
        offsets.append(offsets[-1] + payload.numel())
    data = torch.empty(offsets[-1], dtype=torch.uint8)
    for (_, payload), a, b in zip(encoded, offsets, offsets[1:]):
        data[a:b] = payload
    kept = set(on_device)
    return EncodedBatch(data, offsets, on_device, torch.tensor([s.label for s in samples], dtype=torch.int64),
                        [s._replace(payload=None) if k in kept else s for k, s in enumerate(samples)])


# ---------------------------------------------------------------------------------------
# what the main process does: decode on the device, crop, resize, flip, normalise


def _finish_stream(device: torch.device) -> None:
    """On CUDA, wait (in this thread only) until the current stream has run all it queued.

    decode_jpeg allocates its outputs on the current stream, but nvJPEG writes them from its
    own stream, which does not wait on ours (torchvision PR 9606: corrupted outputs on an
    H100). Finishing this stream first means no kernel queued on it (the previous batch's
    augmentation, a failed decode) still uses a block the outputs are given. The wait is the
    decode thread's; the training thread keeps queueing its step meanwhile.
    """
    if device.type == "cuda":
        finished = torch.cuda.Event()  # gpu-only
        finished.record(torch.cuda.current_stream(device))  # gpu-only
        finished.synchronize()  # gpu-only


def decode_images(data: Sequence[torch.Tensor], device: torch.device) -> list[Optional[torch.Tensor]]:
    """Decode JPEG byte tensors to RGB uint8 ``(3, H, W)`` on ``device``; None where it fails.

    One batched call (nvJPEG's batched decode on CUDA); if it fails, each file is retried
    alone so that one bad file does not lose the batch.
    """
    if not data:
        return []
    device = torch.device(device)
    _finish_stream(device)
    try:
        return list(decode_jpeg(list(data), mode=ImageReadMode.RGB, device=device))
    except RuntimeError:
        pass
    out: list[Optional[torch.Tensor]] = []
    for d in data:
        _finish_stream(device)
        try:
            out.append(decode_jpeg(d, mode=ImageReadMode.RGB, device=device))
        except RuntimeError:
            out.append(None)
    return out


class NvjpegLoader(LoaderView):
    """Batches decoded and augmented on ``device``; see the module docstring for the contract.

    ``len()``, ``sampler``, ``dataset`` and ``batch_size`` are those of the underlying
    DataLoader (which yields :class:`EncodedBatch` es); ``set_epoch(epoch,
    skip_batches)`` selects the epoch's shuffle and augmentation and skips batches (resume).
    """

    def __init__(self, loader: DataLoader, spec: LoaderSpec, *, train: bool, prefetch_batches: int = 2,
                 overlap: bool = True) -> None:
        self.loader = loader
        self.prefetch_batches = prefetch_batches
        self.train = train
        self.device = spec.device
        self.seed = spec.seed
        # the crop geometry the tensor path draws (at image_size; each batch's side: side_at())
        self.recipe = CropRecipe(spec.image_size, crop_scale=spec.crop_scale, val_crop_ratio=spec.val_crop_ratio)
        self._train_size_at = spec.train_size_at
        self._val_size_at = spec.val_size_at
        self._crop_scale_at = spec.crop_scale_at
        self.dtype = spec.dtype
        self.channels_last = spec.channels_last
        self.epoch = 0
        dataset = cast(EncodedImageFolder, loader.dataset)  # what build_nvjpeg_loaders gives it
        # unreadable files skipped by this process since the loader was built, each once
        self._unreadable = UnreadableTally(dataset.classes, dataset.targets, dataset.root,
                                           require_every_class=train)
        self._cpu_decoded: set[int] = set()
        self._reported: set[str] = set()
        self._active: Optional[weakref.ref[Generator[tuple[torch.Tensor, torch.Tensor], None, None]]] = None
        self.rank, self.world_size = spec.rank, spec.world_size
        self.first_batch = 0  # the number of this pass's first batch (set_epoch's skip)
        self.overlap = overlap
        self.stage_times = StageTimes()  # where each batch's time goes (benchmarks read it)

    @property
    def skipped(self) -> int:
        """Distinct unreadable files met by this process (each counted once, over all epochs)."""
        return len(self._unreadable)

    @property
    def cpu_decoded(self) -> int:
        """Distinct files decoded on the CPU because nvJPEG could not take them."""
        return len(self._cpu_decoded)

    def set_epoch(self, epoch: int, skip_batches: int = 0) -> None:
        """Use epoch ``epoch``'s shuffle, crops and side; skip its first ``skip_batches`` batches."""
        self.epoch = epoch
        self.first_batch = skip_batches
        super().set_epoch(epoch, skip_batches)

    def side_at(self, epoch: int) -> int:
        """The crop side of the batches of epoch ``epoch``: the schedule's for training, the
        evaluation side after training epoch ``epoch`` for evaluation (pixels)."""
        return self._train_size_at(epoch) if self.train else self._val_size_at(epoch)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """This epoch's batches. A new pass ends the previous one first: with persistent
        workers both would share one DataLoader iterator (and the old pass's thread could
        still be reading from it).

        With ``prefetch_batches`` > 0 and ``overlap`` (the default), two threads: one decodes
        batch k + 1 (on a CUDA stream nothing else uses) while the other augments batch k (on a
        stream of its own) and hands it to the consumer; each hand-over is an event the next
        stream waits on, no host wait. Without ``overlap``, one thread decodes and augments
        each batch in turn (the arrangement the benchmarks compare against)."""
        previous = self._active() if self._active is not None else None
        if previous is not None:
            previous.close()
        epoch, first = self.epoch, self.first_batch

        def decoded() -> Generator[tuple[int, EncodedBatch, list[tuple[int, int, torch.Tensor]]], None, None]:
            for number, batch in enumerate(self._loader_pass(), start=first):
                yield number, batch, self._decode(batch)

        def batches(source: Iterator[tuple[int, EncodedBatch, list[tuple[int, int, torch.Tensor]]]]
                    ) -> Generator[tuple[torch.Tensor, torch.Tensor], None, None]:
            try:
                for number, batch, good in source:
                    with self.stage_times.timing("augment"):
                        out = self._augment(batch, good, epoch, number)
                    if out is not None:
                        yield out
            finally:
                getattr(source, "close", lambda: None)()  # a decode thread ends with the pass

        device, depth, times = self.device, self.prefetch_batches, self.stage_times
        if depth <= 0:
            active = batches(decoded())
        elif self.overlap:
            active = in_background(
                lambda: batches(in_background(decoded, 1, device=device, name="nvjpeg-decode", times=None)),
                depth, device=device, name="nvjpeg-augment", times=times)
        else:
            active = in_background(lambda: batches(decoded()), depth, device=device, name="nvjpeg-decode",
                                   times=times)
        # weak: a pass its consumer dropped must close (and stop its thread) at once
        self._active = weakref.ref(active)
        return active

    # -- one batch -----------------------------------------------------------------------
    def _report(self, path: str, message: str, *args: Any) -> None:
        if path not in self._reported:
            self._reported.add(path)
            logger.warning(message, path, *args)

    def _decode(self, batch: EncodedBatch) -> list[tuple[int, int, torch.Tensor]]:
        """``(position in the batch, dataset index, image on the device)`` of each readable sample."""
        encoded = batch.encoded()
        with self.stage_times.timing("device_wait"):
            _finish_stream(self.device)  # decode_images finishes it again: then nothing is left to wait for
        with self.stage_times.timing("decode"):
            decoded = dict(zip(batch.on_device, decode_images(encoded, self.device)))
        payloads = dict(zip(batch.on_device, encoded))
        out = []
        for k, s in enumerate(batch.samples):
            image = decoded.get(k) if s.cpu_reason is None else s.payload
            reason, error = s.cpu_reason, s.error
            if error is None and image is None:  # nvJPEG refused a file that looked like a JPEG
                reason = f"decode_jpeg on {self.device} failed on it"
                try:
                    image = _pil_decode(payloads[k].numpy().tobytes())
                except _UNREADABLE as err:
                    error = f"{reason}; Pillow: {err}"
            if error is not None:
                self._report(s.path, "skipping unreadable image %s: %s", error)
                self._unreadable.add(s.dataset_index, s.label)  # raises for a class left without images
                continue
            assert image is not None  # a sample without an error has a payload or a decoded image
            if reason is not None:
                self._report(s.path, "decoding %s on the CPU: %s", reason)
                self._cpu_decoded.add(s.dataset_index)
                if self.device.type == "cuda" and not image.is_pinned():
                    image = image.pin_memory()  # else the copy below waits for the device  # gpu-only
                image = image.to(self.device, non_blocking=True)
            out.append((k, s.dataset_index, image))
        return out

    def assemble(self, batch: EncodedBatch, epoch: int, number: int = 0) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Decode and augment one batch of the loader, batch ``number`` of this rank's epoch
        ``epoch``; None for a val batch left empty."""
        return self._augment(batch, self._decode(batch), epoch, number)

    def _augment(self, batch: EncodedBatch, good: list[tuple[int, int, torch.Tensor]], epoch: int,
                 number: int) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
        """Augment one decoded batch (``good``: :meth:`_decode`'s), batch ``number`` of this rank's
        epoch ``epoch``; None for a val batch left empty."""
        if not good:
            if self.train:
                raise DataError(f"all {len(batch)} images of a training batch are unreadable: "
                                f"check the data set (the log names each file)")
            return None
        if self.train and len(good) < len(batch):  # keep the batch size: refill cyclically
            good += [good[i % len(good)] for i in range(len(batch) - len(good))]
        # Batched on accelerators (a few large kernels instead of ~5 per image); image by image
        # on the CPU, where the batched path's dense resize matrices measured 1.1-21x slower
        # (benchmarks/augment.py, benchmarks/README.md). Both give the same crops.
        augment = augment_each if self.device.type == "cpu" else augment_batch
        side, scale = self.side_at(epoch), self._crop_scale_at(epoch)
        recipe = self.recipe if (side, scale) == (self.recipe.size, self.recipe.crop_scale) else replace(
            self.recipe, size=side, crop_scale=scale)
        # keyed by the batch's place among all ranks' batches of the epoch (as the decoded loader's):
        # the crops depend on no worker count or stop, and no two ranks draw alike
        generator = torch.Generator().manual_seed(sample_seed(self.seed, epoch, number * self.world_size + self.rank))
        images = augment([image for _, _, image in good], recipe, train=self.train, generator=generator)
        images = normalise_cast(images, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, self.dtype, self.channels_last)
        positions = [k for k, _, _ in good]
        labels = batch.labels
        if positions != list(range(len(batch))):  # a file skipped or a slot refilled
            labels = torch.tensor([batch.samples[k].label for k in positions], dtype=torch.int64)
        if self.device.type != "cpu" and not labels.is_pinned():
            labels = labels.pin_memory()  # so that the copy below is asynchronous  # gpu-only
        labels = labels.to(self.device, non_blocking=True)
        return images, labels


def build_nvjpeg_loaders(
    root: str | os.PathLike, spec: LoaderSpec, *, prefetch_batches: int = 2, overlap: bool = True
) -> tuple[NvjpegLoader, NvjpegLoader, int]:
    """Train and val loaders of ``root/train`` and ``root/val`` decoding on ``spec.device``.

    As :func:`largebatch.data.pipelines.torchvision.build_loaders`, and:

    Args:
        spec: also ``device`` (where to decode and augment: a CUDA device, nvJPEG; the CPU,
            libjpeg, for tests, slower than the torchvision loader's worker decode), ``dtype``
            (of the images yielded: the compute dtype, bf16/fp16 halve the copy) and
            ``channels_last`` (NHWC-strided images, the layout of a channels_last model).
        prefetch_batches: batches decoded and augmented ahead in background threads (0: decode
            and augment in the consumer's thread when it asks for the batch).
        overlap: decode batch k + 1 in one thread while another augments batch k (default);
            False: one thread does both in turn.

    ``spec.workers`` DataLoader processes per rank read the files (and decode on the CPU the
    few nvJPEG cannot) and join each batch's bytes into one :class:`EncodedBatch`, each worker
    two batches ahead, pinned on a CUDA device. With the ``prefetch_batches`` the decode
    thread holds, at least 2 batches are ready ahead of the step. Returns
    ``(train_loader, val_loader, num_classes)``.
    """
    root = os.fspath(root)
    train_set = RobustImageFolder(split_folder(root, "train"))
    val_set = RobustImageFolder(split_folder(root, "val"))
    check_same_classes(train_set.root, train_set.classes, val_set.root, val_set.classes)
    rank, world_size, batch_size, workers = spec.rank, spec.world_size, spec.batch_size, spec.workers
    common: dict[str, Any] = dict(num_workers=workers, pin_memory=spec.pin_memory,
                                  persistent_workers=workers > 0, collate_fn=collate_encoded)
    if workers > 0:
        # Workers outlive a SIGTERM/SIGINT sent to the whole job until this process has saved.
        common.update(prefetch_factor=2, worker_init_fn=ignoring_stop_signals())
    train = DataLoader(
        EncodedImageFolder(train_set.samples, train_set.classes, train_set.root), batch_size=batch_size,
        drop_last=True,
        sampler=ShardedSampler(len(train_set), rank=rank, world_size=world_size, batch_size=spec.step_samples,
                               seed=spec.seed),
        **common,
    )
    val = DataLoader(
        EncodedImageFolder(val_set.samples, val_set.classes, val_set.root),
        batch_size=spec.val_batch, drop_last=False,
        sampler=ExactShardSampler(len(val_set), rank=rank, world_size=world_size), **common,
    )
    return (NvjpegLoader(train, spec, train=True, prefetch_batches=prefetch_batches, overlap=overlap),
            NvjpegLoader(val, spec, train=False, prefetch_batches=prefetch_batches, overlap=overlap),
            len(train_set.classes))
