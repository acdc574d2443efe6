"""The data check: find the files DALI cannot decode, before a DALI run, and list the rest.

The torchvision path skips an unreadable image and counts it; a DALI pipeline cannot skip a
sample (one bad file stops the run with a decoder error). So ``largebatch-check-data ROOT``
decodes every image of ``ROOT/train`` and ``ROOT/val`` once, in parallel, and writes:

* ``.largebatch-filelist-<split>.txt``: the files DALI can decode, as DALI ``file_list``
  lines ``<split>/<class>/<file> <label>`` (paths relative to ROOT, labels in torchvision's
  ImageFolder order), read by ``build_dali_loaders(file_list=...)``;
* ``.largebatch-check.json``: what was found, and a fingerprint (names, sizes and
  modification times) of each split, so :func:`require_checked` notices files added,
  removed, replaced or rewritten since.

Both go into ROOT when it is writable, else into ``$LARGEBATCH_CACHE`` (or
``~/.cache/largebatch``) under ``check-<hash of ROOT>/``. The fingerprint includes each
file's mtime: a file rewritten in place after the check (same name, same size) would
otherwise pass as checked and stop a DALI run with a decoder error. A copy of the data set
that keeps mtimes (``rsync -a``, ``cp -p``) keeps its check; another copy needs a new one.

What each odd file is, and what DALI 2.4's decoders do with it (measured, see
``tests/test_check_data.py``), is in :data:`KINDS`. Fatal kinds are left out of the file list.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple, Sequence

from PIL import Image

from largebatch.data.images import (
    EXIF_ORIENTATION,
    check_split_classes,
    list_classes,
    list_split,
    not_a_folder,
    special_file,
)
from largebatch.errors import DataError

__all__ = [
    "KINDS",
    "CheckReport",
    "Kind",
    "Problem",
    "check_dataset",
    "inspect_image",
    "require_checked",
    "state_dirs",
]

REPORT_NAME = ".largebatch-check.json"
REPORT_VERSION = 2  # 2: the fingerprint includes mtimes
SPLITS = ("train", "val")


def file_list_name(split: str) -> str:
    return f".largebatch-filelist-{split}.txt"


class Kind(NamedTuple):
    fatal: bool  # left out of the file list
    what: str
    dali: str  # what DALI 2.4 does with it (CPU decoder; mixed/GPU decoder)
    fix: str


_REENCODE = "re-encode as an RGB JPEG (Image.open(p).convert('RGB').save(p, 'JPEG', quality=95))"
KINDS: dict[str, Kind] = {
    "empty": Kind(True, "zero-byte file", "decoder error, the pipeline stops",
                  "restore it from the source archive, or delete it"),
    "truncated": Kind(True, "image data that ends early (cut-off download or copy)",
                      "decoder error ('Premature end of JPEG data'), the pipeline stops",
                      "restore it from the source archive, or delete it"),
    "corrupt": Kind(True, "image data that no decoder can read", "decoder error, the pipeline stops",
                    "restore it from the source archive, or delete it"),
    "not_image": Kind(True, "not an image (text, HTML error page, ...) under an image name",
                      "decoder error, the pipeline stops", "delete it"),
    "unsupported_format": Kind(True, "an image format DALI has no decoder for (GIF, ...)",
                               "decoder error, the pipeline stops", _REENCODE),
    "unreadable": Kind(True, "a file that cannot be opened (permissions, broken link)",
                       "read error, the pipeline stops", "fix its permissions or remove it"),
    "not_a_file": Kind(True, "a FIFO, socket or device under an image name (never opened: reading "
                       "a FIFO waits forever)", "the reader waits forever (a FIFO) or fails",
                       "move it out of the data set"),
    "unlistable_name": Kind(True, "a name a DALI file list cannot hold (newline, trailing "
                            "whitespace, or bytes that are not UTF-8: shown escaped, as \\xe9)",
                            "cannot be listed", "rename it"),
    "wrong_extension": Kind(False, "PNG (or other non-JPEG) data named .JPEG, as in ImageNet",
                            "decoded by content, like Pillow; never by the GPU's JPEG decoders",
                            _REENCODE + " to keep every image on the fast JPEG path"),
    "cmyk_jpeg": Kind(False, "CMYK JPEG, as in ImageNet", "decoded to RGB, like Pillow",
                      _REENCODE + " (optional)"),
    "exif_rotated": Kind(False, "a JPEG whose EXIF orientation says to turn or mirror it (a camera's)",
                         "turned upright, as every loader of this project does",
                         "none needed; to store it upright: "
                         "ImageOps.exif_transpose(Image.open(p)).convert('RGB').save(p, 'JPEG', quality=95)"),
    "grayscale_jpeg": Kind(False, "single-channel JPEG, as in ImageNet",
                           "decoded to RGB (gray replicated), like Pillow",
                           "none needed; " + _REENCODE + " if other tools need 3 channels"),
    "huge_image": Kind(True, "an image over Pillow's decompression-bomb limit (a few bytes can "
                       "claim 30000x30000 pixels)", "decoded, at the cost of its whole size in memory; "
                       "the torchvision and nvjpeg loaders skip it", "downscale it, or delete it"),
}

# Leading bytes of the formats DALI's image decoders read, and of some they do not.
_MAGIC = (
    (b"\xff\xd8\xff", "JPEG"), (b"\x89PNG\r\n\x1a\n", "PNG"), (b"BM", "BMP"),
    (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"), (b"\x00\x00\x00\x0cjP  ", "JPEG2000"),
    (b"\xff\x4f\xff\x51", "JPEG2000"), (b"GIF87a", "GIF"), (b"GIF89a", "GIF"),
    (b"P1", "PNM"), (b"P2", "PNM"), (b"P3", "PNM"), (b"P4", "PNM"), (b"P5", "PNM"), (b"P6", "PNM"),
)
DALI_FORMATS = {"JPEG", "PNG", "BMP", "TIFF", "JPEG2000", "PNM", "WEBP"}


def _sniff(head: bytes) -> str | None:
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "WEBP"
    for magic, fmt in _MAGIC:
        if head.startswith(magic):
            return fmt
    return None


def inspect_image(path: str | os.PathLike) -> tuple[str | None, str]:
    """``(kind, detail)`` of one file; kind None for a plain RGB JPEG (or any fine image)."""
    path = os.fspath(path)
    special = special_file(path)
    if special is not None:  # before open(): a FIFO would block the check forever
        return "not_a_file", special
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as err:
        return "unreadable", str(err)
    if not head:
        return "empty", "0 bytes"
    fmt = _sniff(head)
    if fmt is None:
        return "not_image", f"starts with {head[:8]!r}, the mark of no image format"
    if fmt not in DALI_FORMATS:
        return "unsupported_format", f"{fmt} data"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with Image.open(path) as img:
                mode, size = img.mode, img.size
                orientation = img.getexif().get(EXIF_ORIENTATION, 1) if img.format == "JPEG" else 1
                if img.format == "JPEG":  # DCT-domain downscale: reads every byte, 1/64 the pixels
                    img.draft(img.mode, (max(1, img.width // 8), max(1, img.height // 8)))
                img.load()
    except Image.DecompressionBombError as err:
        return "huge_image", str(err)
    except (OSError, ValueError, SyntaxError) as err:
        msg = str(err)
        cut = ("truncated", "premature end", "broken data stream")
        kind = "truncated" if any(c in msg.lower() for c in cut) else "corrupt"
        return kind, f"{fmt}: {msg}"
    ext = os.path.splitext(path)[1].lower()
    if fmt != "JPEG" and ext in (".jpg", ".jpeg"):
        return "wrong_extension", f"{fmt} data named {os.path.basename(path)}"
    if fmt == "JPEG" and mode == "CMYK":
        return "cmyk_jpeg", f"CMYK {size[0]}x{size[1]}"
    if fmt == "JPEG" and mode == "L":
        return "grayscale_jpeg", f"grayscale {size[0]}x{size[1]}"
    if orientation in range(2, 9):
        return "exif_rotated", f"EXIF orientation {orientation}"
    return None, ""


def _stat_key(path: str) -> str:
    """``size:mtime_ns`` of a file (``-1`` when it cannot be stat'ed): its fingerprint entry."""
    try:
        st = os.stat(path)
    except OSError:
        return "-1"
    return f"{st.st_size}:{st.st_mtime_ns}"


def _inspect_many(paths: list[str]) -> list[tuple[str | None, str, str]]:
    out = []
    for p in paths:
        key = _stat_key(p)  # before decoding: a file rewritten during the check looks changed
        kind, detail = inspect_image(p)
        out.append((kind, detail, key))
    return out


# ---------------------------------------------------------------------------------------
# the report


@dataclass(frozen=True)
class Problem:
    """One odd file: ``path`` relative to the data root."""

    split: str
    path: str
    kind: str
    detail: str

    @property
    def fatal(self) -> bool:
        return KINDS[self.kind].fatal


@dataclass
class SplitSummary:
    files: int  # image files found (ImageFolder's extensions)
    listed: int  # of them, in the file list
    classes: int
    fingerprint: str
    file_list: str
    hidden: list[str] = field(default_factory=list)  # hidden folders skipped, not classes


@dataclass
class CheckReport:
    """What :func:`check_dataset` found and wrote."""

    root: str
    splits: dict[str, SplitSummary]
    problems: list[Problem] = field(default_factory=list)
    report_path: str = ""
    seconds: float = 0.0

    @property
    def fatal(self) -> list[Problem]:
        return [p for p in self.problems if p.fatal]

    @property
    def ok(self) -> bool:
        """True if every file can be decoded by DALI (notes aside)."""
        return not self.fatal

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for p in self.problems:
            counts[p.kind] = counts.get(p.kind, 0) + 1
        return counts

    def to_json(self) -> dict:
        return {
            "version": REPORT_VERSION,
            "root": self.root,
            "checked_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "seconds": round(self.seconds, 2),
            "splits": {s: asdict(v) for s, v in self.splits.items()},
            "counts": self.counts(),
            "kinds": {k: KINDS[k]._asdict() for k in self.counts()},
            "problems": [asdict(p) | {"fatal": p.fatal} for p in self.problems],
        }


def _fingerprint(entries: Sequence[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for rel, key in entries:
        h.update(f"{rel}\t{key}\n".encode("utf-8", "surrogateescape"))
    return f"{len(entries)}:{h.hexdigest()[:24]}"


def _rel(path: str, root: str) -> str:
    return Path(os.path.relpath(path, root)).as_posix()


def _shown(rel: str) -> str:
    """``rel`` as printable text: bytes of a name that are not UTF-8 (held by Python as
    surrogates, which no UTF-8 stream takes) become ``\\xe9`` escapes; other names are unchanged."""
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _unlistable(rel: str) -> str | None:
    """Why a DALI file list (UTF-8 text, one name a line) cannot hold ``rel``, or None."""
    if _shown(rel) != rel:
        return "not UTF-8"
    if rel != rel.strip() or "\n" in rel or "\r" in rel:
        return "newline or surrounding whitespace"
    return None


def state_dirs(root: str | os.PathLike) -> list[Path]:
    """Where the lists and report of ``root`` may live: ROOT itself, then the cache."""
    root = Path(root).expanduser().absolute()
    cache = os.environ.get("LARGEBATCH_CACHE") or os.path.join("~", ".cache", "largebatch")
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:16]
    return [root, Path(cache).expanduser() / f"check-{digest}"]


def _writable_state_dir(root: Path) -> Path:
    here, cache = state_dirs(root)
    if os.access(here, os.W_OK):
        return here
    cache.mkdir(parents=True, exist_ok=True)
    return cache


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _split_entries(root: Path, split: str) -> tuple[list[str], list[str], list[int]]:
    classes, paths, labels = list_split(root, split)
    return classes, paths, labels


def check_dataset(
    root: str | os.PathLike,
    *,
    workers: int = 0,
    splits: Sequence[str] = SPLITS,
) -> CheckReport:
    """Decode every image of ``root/<split>`` once; write the clean file lists and the report.

    Args:
        root: data root holding ``train/<class>/`` and ``val/<class>/``.
        workers: threads that decode (Pillow decodes without the GIL); 0: one per CPU.
        splits: the splits to check (each must exist).

    Returns the :class:`CheckReport`; raises :class:`DataError` for a missing folder, or for
    train and val class folders that differ (when both are checked), before writing anything.
    """
    start = time.perf_counter()
    root = Path(root).expanduser().absolute()
    if not root.is_dir():
        raise DataError(f"data root {root} {not_a_folder(root)}: give the folder holding train/ and val/")
    if set(SPLITS) <= set(splits):
        check_split_classes(root)
    workers = workers or os.cpu_count() or 1
    out_dir = _writable_state_dir(root)
    report = CheckReport(root=str(root), splits={})
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for split in splits:
            if not (root / split).is_dir():
                raise DataError(f"data root {root} has no {split}/ folder: expected "
                                f"{root}/{split}/<class>/*.JPEG")
            classes, paths, labels = _split_entries(root, split)
            chunk = max(1, min(256, len(paths) // (4 * workers) + 1))
            chunks = [paths[i : i + chunk] for i in range(0, len(paths), chunk)]
            results = [r for part in pool.map(_inspect_many, chunks) for r in part]
            lines, entries = [], []
            for path, label, (kind, detail, key) in zip(paths, labels, results):
                rel = _rel(path, str(root))
                entries.append((rel, key))
                why = _unlistable(rel)
                if why and (kind is None or not KINDS[kind].fatal):  # a note: it cannot be listed either
                    kind, detail = "unlistable_name", why if why == "not UTF-8" else repr(rel)
                if kind is not None:
                    report.problems.append(Problem(split, _shown(rel), kind, detail))
                if kind is None or not KINDS[kind].fatal:
                    lines.append(f"{rel} {label}\n")
            list_path = out_dir / file_list_name(split)
            _write_atomic(list_path, "".join(lines))
            report.splits[split] = SplitSummary(
                files=len(paths), listed=len(lines), classes=len(classes),
                fingerprint=_fingerprint(entries), file_list=str(list_path),
                hidden=list_classes(root / split)[1])
    report.seconds = time.perf_counter() - start
    report.report_path = str(out_dir / REPORT_NAME)
    _write_atomic(Path(report.report_path), json.dumps(report.to_json(), indent=1) + "\n")
    return report


def _read_report(root: Path) -> tuple[dict, Path] | None:
    for folder in state_dirs(root):
        try:
            report = json.loads((folder / REPORT_NAME).read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if report.get("version") == REPORT_VERSION and report.get("root") == str(root):
            return report, folder
    return None


def require_checked(root: str | os.PathLike, split: str) -> Path:
    """The clean file list of ``root/split``, or :class:`DataError` if the set is unchecked.

    The list is stale (and refused) when the split's image files changed since the check:
    a file added, removed, renamed, resized or rewritten (its mtime).
    """
    root = Path(root).expanduser().absolute()
    fix = f"run: largebatch-check-data {root}"
    unchecked = f"data set {root} has not been checked for files DALI cannot decode; {fix}"
    found = _read_report(root)
    if found is None or split not in found[0].get("splits", {}):
        raise DataError(unchecked)
    report, folder = found
    summary = report["splits"][split]
    _, paths, _ = _split_entries(root, split)
    entries = []
    for p in paths:
        entries.append((_rel(p, str(root)), _stat_key(p)))
    now = _fingerprint(entries)
    if now != summary["fingerprint"]:
        raise DataError(
            f"data set {root} has not been checked for files DALI cannot decode since it "
            f"changed ({split}: {summary['files']} image files at the check, {len(entries)} "
            f"now, or files replaced or rewritten since); {fix}"
        )
    file_list = folder / file_list_name(split)
    if not file_list.is_file():
        raise DataError(unchecked + f" ({file_list} is missing)")
    return file_list

