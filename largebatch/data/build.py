"""The input pipeline of a run: where the data is, and which loader reads it.

``resolve_data_root`` finds the image folder (``root``, or the embedded synthetic set, made by
rank 0 on first use; a cache it cannot write there is one line, exit 74). ``build_run_loaders`` picks the pipeline and builds this rank's train and
val loaders:

* ``loader="torchvision"``: the torchvision ``DataLoader`` (:mod:`largebatch.data.pipelines.torchvision`);
* ``loader="dali"``: NVIDIA DALI over the clean file lists of ``largebatch-check-data``
  (DALI cannot skip a bad file, so an unchecked set is an error naming the command);
* ``loader="nvjpeg"``: workers read file bytes; torchvision's nvJPEG decodes and the batch is
  augmented on ``device`` (:mod:`largebatch.data.pipelines.nvjpeg`; on a CPU device it decodes there);
* ``loader="decoded"``: each split decoded once into a store in the cache, batches cut and
  augmented as a whole (:mod:`largebatch.data.pipelines.decoded`);
* ``loader="auto"``: on the CPU backend the decoded store where it is built or fits in half the
  cache's free space (the fastest CPU input); else DALI where it is installed and the set is
  checked, else nvjpeg on a CUDA device and torchvision elsewhere, with a log line saying why;
* ``shards=DIR``: DALI's webdataset reader over ``largebatch-make-shards`` output.

Rank 0 decides between the decoded store, DALI and torchvision and tells the others, so every
rank reads with the same pipeline. What every pipeline is told comes as one :class:`LoaderSpec` (built once by
``run._data``); no config object.
"""

from __future__ import annotations

import errno as errno_codes
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Mapping, NamedTuple, Optional

from largebatch.data.images import SIDE_ABOVE_IMAGES
from largebatch.errors import DataError, UsageError, WriteError

if TYPE_CHECKING:
    from largebatch.backends.base import Backend
    from largebatch.data.contract import Loader, LoaderSpec
    from largebatch.data.decoded_store import DecodedStore

__all__ = ["SIDE_ABOVE_IMAGES", "DaliDecision", "build_run_loaders", "cache_write_error", "dali_decision",
           "ensure_checked", "make_decoded_stores", "pipeline_of", "resolve_data_root", "warn_side_above_images"]

log = logging.getLogger(__name__)


class DaliDecision(NamedTuple):
    """Rank 0's answer to "read with DALI?", sent to every rank."""

    use_dali: bool
    file_lists: Optional[dict[str, str]] = None  # split -> clean file list of the data check
    error: Optional[str] = None  # data.loader=dali cannot work: the message
    note: Optional[str] = None  # data.loader=auto fell back to torchvision: why


def resolve_data_root(
    root: Optional[str], *, synthetic: Mapping[str, int], loader: str, workers: int, backend: Backend
) -> Path:
    """``root``, or the embedded synthetic set made by rank 0 (every rank gets its path).

    Args:
        root: an ImageFolder tree with ``train/`` and ``val/``; None: the embedded set.
        synthetic: the embedded set's ``ensure_synthetic`` arguments (``num_classes``,
            ``train_per_class``, ``val_per_class``, ``image_size``, ``seed``).
        loader: ``torchvision``, ``nvjpeg``, ``dali``, ``decoded`` or ``auto``. For ``dali``, and
            ``auto`` off the CPU backend, rank 0 also runs the data check on the embedded set, so
            DALI reads it out of the box (``auto`` on the CPU backend reads the decoded store).
        workers: processes that generate (and check) the images.
        backend: the run's backend (``is_main``, ``barrier``).

    Raises :class:`WriteError` (exit 74) when rank 0 cannot write the embedded set into its
    cache folder (:func:`cache_write_error`).
    """
    if root:
        return Path(root).expanduser()
    from largebatch.data.synthetic import default_dataset_root, ensure_synthetic

    made: Optional[Path] = None
    if backend.is_main:
        try:
            made = ensure_synthetic(workers=max(1, workers), **synthetic)
        except OSError as err:  # the cache is read-only, under a file, full, not ours: one line, exit 74
            raise cache_write_error(err, default_dataset_root(**synthetic)) from None
        if loader == "dali" or (loader == "auto" and backend.name != "cpu"):
            ensure_checked(made, workers=max(1, workers))
    backend.barrier()
    return ensure_synthetic(**synthetic) if made is None else made


def cache_write_error(err: OSError, root: Path) -> WriteError:
    """The one line for an embedded data set that cannot be written to ``root`` (its cache folder):
    the folder, where it comes from (``LARGEBATCH_CACHE`` or the default), the errno and the fix."""
    code = err.errno
    name = errno_codes.errorcode.get(code, "?") if code is not None else "?"
    cache = os.environ.get("LARGEBATCH_CACHE")
    where = f"LARGEBATCH_CACHE={cache}" if cache else "the default cache ~/.cache/largebatch"
    detail = ""
    if code == errno_codes.ENOTDIR:  # name the file that stands where a folder must be
        blocker = next((p for p in root.parents if p.exists()), None)
        if blocker is not None and not blocker.is_dir():
            detail = f" ({blocker} is a file)"
    return WriteError(
        f"cannot write the embedded data set to {root} ({where}): [Errno {code} {name}] "
        f"{err.strerror or err}{detail}; set LARGEBATCH_CACHE to a writable folder, or data.root= to "
        f"an image folder with train/ and val/",
        path=root, errno=code,
    )


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


def _agree_on_dali(requested: str, root: Path, backend: Backend, fallback: str) -> DaliDecision:
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


def _agree_on_decoded(root: Path, spec: LoaderSpec, backend: Backend) -> bool:
    """``data.loader=auto`` on the CPU backend: rank 0 decides whether every rank reads from the
    decoded stores (:func:`~largebatch.data.pipelines.decoded.auto_choice`) and logs why. Not where
    ``rect_val`` needs the torchvision loader, nor on a folder the loaders will refuse (their
    builders name what is wrong with it)."""
    decided: tuple[bool, Optional[str]] = (False, None)
    if backend.is_main and not spec.rect_val and root.is_dir():
        from largebatch.data.pipelines.decoded import auto_choice

        try:
            decided = auto_choice(root, spec)
        except DataError:  # no train/ or val/, no images: the loader built next says so
            pass
    use, note = backend.broadcast_object(decided)
    if note and backend.is_main:
        log.info("%s", note)
    return bool(use)


def _log_resolution(spec: LoaderSpec) -> None:
    """The run log's line for ``data.resolution`` (every pipeline follows it), when it is set."""
    if not (spec.resized or spec.rect_val):
        return
    train = spec.train_sizes.describe() if spec.train_sizes else f"{spec.image_size} px"
    if spec.crop_scale_steps:
        train += "; crop area " + ", ".join(f"{m:g}..{spec.crop_scale[1]:g} from epoch {e}"
                                            for e, m in spec.crop_scale_steps)
    side = "at each epoch's training side" if spec.eval_follows_train else f"{spec.val_size} px"
    if spec.rect_val:
        since = f" from epoch {spec.rect_val_from_epoch}" if spec.rect_val_from_epoch else ""
        side = (f"of short side {side.removeprefix('at ')}, a rectangle per batch of like aspect ratio "
                f"(rect_val){since}")
    log.info("resolution: training crops %s; evaluation crops %s", train, side)




def warn_side_above_images(root: Path, spec: LoaderSpec) -> None:
    """One warning line when the largest training side of ``spec`` is more than
    :data:`SIDE_ABOVE_IMAGES` times the longest side of a sample of ``root/train``'s images,
    naming the side, the setting behind it, the images' side and what to do."""
    from largebatch.data.images import largest_sampled_side
    from largebatch.resolution import side_setting

    side = spec.largest_train_size()
    images = largest_sampled_side(root / "train")
    if images is None or side <= SIDE_ABOVE_IMAGES * images:
        return
    gib = spec.batch_size * 3 * side * side * 4 / 2**30  # float32: the pipelines normalise in it
    log.warning(
        "%s trains at %d px, %.1fx the longest side of the images in %s (%d px, sampled): every crop is "
        "upsampled, and a batch of %d images at %d px is %.1f GiB before the model's activations; lower the "
        "side to %d px (%dx the images) or less, or point data.root at larger images",
        side_setting(spec.train_sizes, spec.image_size, side), side, side / images, root, images, spec.batch_size,
        side, gib, SIDE_ABOVE_IMAGES * images, SIDE_ABOVE_IMAGES)


def _refuse_rect_val(spec: LoaderSpec, *, loader: str, reads_with: str, backend: Backend) -> None:
    """``spec.rect_val`` needs the torchvision pipeline and a backend that runs any batch shape:
    one line naming the fix, before a loader is built (``data.loader=auto`` is known only here)."""
    if not spec.rect_val:
        return
    if backend.name == "xla":
        raise UsageError("data.resolution.rect_val=true cannot run on the xla backend: each validation batch shape "
                         "would compile a graph of its own; set data.resolution.rect_val=false")
    if reads_with != "torchvision":
        raise UsageError(f"data.resolution.rect_val=true is read by the torchvision loader only, and data.loader="
                         f"{loader} reads with {reads_with} here: set data.loader=torchvision, or "
                         f"data.resolution.rect_val=false")


def make_decoded_stores(root: Path, spec: LoaderSpec, *, announce: bool = True) -> dict[str, DecodedStore]:
    """The decoded stores of ``root`` for ``spec``, built in the cache unless there already (one
    log line with their disk cost, with ``announce``), opened; a cache that cannot be written is
    one line, exit 74. Rank 0's work, and ``largebatch-make-decoded``'s."""
    from largebatch.data.pipelines.decoded import decoded_cache_root, ensure_decoded_stores

    try:
        return ensure_decoded_stores(root, spec, announce=announce)
    except OSError as err:
        raise WriteError(f"cannot write the decoded store to {decoded_cache_root()}: [Errno {err.errno}] "
                         f"{err.strerror or err}; set LARGEBATCH_CACHE to a writable folder with room for it",
                         path=decoded_cache_root(), errno=err.errno) from None


def _decoded_loaders(root: Path, spec: LoaderSpec, backend: Backend) -> tuple[Loader, Loader, int]:
    """``data.loader=decoded``: rank 0 builds the stores on first use (one log line with their
    disk cost), then the first rank of every other node opens them (building its own where the
    node's cache is its own disk), then the node's other ranks map them; a cache that cannot be
    written is one line, exit 74.

    Opening a store checks that its source's files are the ones it was built from: a listing of
    the split with a ``stat`` per file (ImageNet: 1.33M files, seconds to minutes on a shared
    file system). One rank per node does it; the node's other ranks open the store that rank has
    just checked in the same folder, without listing the split again."""
    from largebatch.data.pipelines.decoded import build_decoded_loaders

    _refuse_rect_val(spec, loader="decoded", reads_with="the decoded store", backend=backend)
    stores = None
    if backend.is_main:
        stores = make_decoded_stores(root, spec)  # opened here once: the loaders read these
        threads = max(1, spec.workers)  # the decoded loader's augmenting threads
        log.info("input pipeline: decoded store, batched crops on %s, %s, %s", spec.device,
                 "one batch at a time in a background thread" if threads == 1 else
                 f"{threads} batches at once in background threads", spec.layout)
        _log_resolution(spec)
    backend.barrier()
    if stores is None and backend.local_rank == 0:  # another node's first rank: its cache may be its own
        stores = make_decoded_stores(root, spec, announce=False)
    backend.barrier()
    return build_decoded_loaders(root, spec, stores=stores, check_source=False)


def build_run_loaders(
    root: Path, spec: LoaderSpec, *, loader: str, shards: Optional[str], backend: Backend
) -> tuple[Loader, Loader, int]:
    """This rank's ``(train_loader, val_loader, num_classes)``: loaders of the contract
    (:class:`~largebatch.data.contract.Loader`), whichever pipeline reads.

    Args:
        root: the image folder (:func:`resolve_data_root`).
        spec: what every pipeline is told (:class:`LoaderSpec`; ``batch_size`` is per device,
            ``rank``/``world_size`` the backend's). A CUDA ``spec.device`` decodes on the GPU
            (DALI's mixed decode, nvJPEG), so ``auto`` falls back to nvjpeg there, not torchvision.
        loader: ``torchvision``, ``nvjpeg``, ``dali``, ``decoded`` or ``auto`` (see the module docstring).
        shards: a ``largebatch-make-shards`` folder, read by DALI instead of ``root``; or None.
        backend: the run's backend (``is_main``, ``broadcast_object``).
    """
    if backend.is_main and not shards:
        warn_side_above_images(root, spec)
    if shards:
        return _shard_loaders(shards, spec, loader=loader, backend=backend)
    if loader == "decoded" or (loader == "auto" and backend.name == "cpu" and _agree_on_decoded(root, spec, backend)):
        return _decoded_loaders(root, spec, backend)
    fallback = "nvjpeg" if loader == "nvjpeg" or (loader == "auto" and spec.on_gpu) else "torchvision"
    decision = DaliDecision(False) if loader in ("torchvision", "nvjpeg") else _agree_on_dali(
        loader, root, backend, fallback)
    if decision.use_dali:
        return _dali_file_loaders(root, spec, loader=loader, backend=backend, file_lists=decision.file_lists)
    if fallback == "nvjpeg":
        return _nvjpeg_loaders(root, spec, loader=loader, backend=backend)
    return _torchvision_loaders(root, spec, loader=loader, backend=backend)


def pipeline_of(loader: object) -> str:
    """The ``data.loader`` value naming the pipeline that built ``loader`` (``torchvision``,
    ``nvjpeg``, ``decoded`` or ``dali``): what ``auto`` resolved to, which a checkpoint records
    (the crops a run trained on depend on it). Each pipeline is the module of that name under
    ``largebatch.data.pipelines`` (DALI's two readers both ``dali``); another loader is named
    by its class."""
    module = type(loader).__module__
    prefix = "largebatch.data.pipelines."
    if not module.startswith(prefix):
        return type(loader).__name__
    name = module[len(prefix):]
    return "dali" if name.startswith("dali") else name


def _decode(spec: LoaderSpec) -> str:
    """Where DALI decodes, for its start-up line."""
    return "mixed (GPU)" if spec.on_gpu else "CPU"


def _shard_loaders(shards: str, spec: LoaderSpec, *, loader: str, backend: Backend) -> tuple[Loader, Loader, int]:
    """``data.shards``: DALI's webdataset reader over the shards, which only DALI reads."""
    from largebatch.data.pipelines.dali_graph import require_dali
    from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders

    if loader in ("torchvision", "nvjpeg", "decoded"):
        raise DataError(
            f"data.shards={shards} is read by DALI only; set data.loader=dali (or auto), "
            f"or drop data.shards to read data.root's files with torchvision"
        )
    _refuse_rect_val(spec, loader=loader, reads_with="DALI (data.shards)", backend=backend)
    require_dali()
    train, val, num_classes = build_dali_shard_loaders(shards, spec)
    if backend.is_main:
        log.info("input pipeline: DALI webdataset reader over the shards in %s, %s decode, %s",
                 shards, _decode(spec), spec.layout)
        _log_resolution(spec)
    return train, val, num_classes


def _nvjpeg_loaders(root: Path, spec: LoaderSpec, *, loader: str, backend: Backend) -> tuple[Loader, Loader, int]:
    """``data.loader=nvjpeg``, or ``auto`` on a GPU without DALI: batched nvJPEG decode."""
    from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders

    _refuse_rect_val(spec, loader=loader, reads_with="nvjpeg", backend=backend)
    if backend.is_main:
        log.info("input pipeline: nvjpeg, %s decode and augmentation on %s, %d file-reading worker(s) per "
                 "rank, %s", "nvJPEG (GPU)" if spec.on_gpu else "CPU", spec.device, spec.workers, spec.layout)
        _log_resolution(spec)
    return build_nvjpeg_loaders(root, spec)


def _torchvision_loaders(root: Path, spec: LoaderSpec, *, loader: str, backend: Backend
                         ) -> tuple[Loader, Loader, int]:
    """``data.loader=torchvision``, or ``auto`` on the host without DALI: a DataLoader per split."""
    from largebatch.data.pipelines.torchvision import build_loaders

    _refuse_rect_val(spec, loader=loader, reads_with="torchvision", backend=backend)
    if backend.is_main:
        log.info("input pipeline: torchvision DataLoader, %d worker(s) per rank", spec.workers)
        _log_resolution(spec)
    return build_loaders(root, spec)


def _dali_file_loaders(root: Path, spec: LoaderSpec, *, loader: str, backend: Backend,
                       file_lists: Optional[dict[str, str]]) -> tuple[Loader, Loader, int]:
    """``data.loader=dali`` (or ``auto`` where every rank has DALI): DALI's file reader over the
    data check's lists."""
    from largebatch.data.pipelines.dali_files import build_dali_loaders

    _refuse_rect_val(spec, loader=loader, reads_with="DALI", backend=backend)
    train, val, num_classes = build_dali_loaders(root, spec, file_list=file_lists)
    if backend.is_main:
        log.info(
            "input pipeline: DALI, %s decode, %d thread(s), %s; %d train / %d val files from the "
            "data check's lists", _decode(spec), max(1, spec.workers), spec.layout, train.total_samples,
            val.total_samples,
        )
        _log_resolution(spec)
    return train, val, num_classes
