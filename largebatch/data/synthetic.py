"""The embedded default data set: a generated ImageNet-style tree of real JPEG files.

``make_synthetic_imagenet`` writes ``ROOT/train/<wnid>/*.JPEG`` and ``ROOT/val/<wnid>/*.JPEG``
(ImageFolder layout, class folders named like ImageNet wnids: ``n0000``, ``n0001``, ...), so
every loader that reads ImageNet reads it unchanged. It exists so that a run, a test or a
benchmark needs no download, yet exercises the real input path (files, JPEG decode, crops).

What makes a class (so that neither colour nor position gives it away, and it survives
RandomResizedCrop and a horizontal flip):

====  =====================================  ====  ======================================
 0    vertical stripes (+-12 deg)              5   blobs: a few large soft spots
 1    horizontal stripes (+-12 deg)            6   pinwheel: angular sectors round a point
 2    diagonal stripes (45 or 135, +-12 deg)   7   grid of thin lines, any rotation
 3    concentric rings                         8   lattice of small dots, any rotation
 4    checkerboard, any rotation               9   spiral arms
====  =====================================  ====  ======================================

Classes 10..99 draw family ``c % 10`` over a faint texture of family
``(c % 10 + c // 10) % 10``. Every image gets random foreground and background colours,
phase, centre, frequency (within the family's band), occluding clutter shapes and pixel
noise, so a small CNN learns it in a couple of minutes but not in one epoch.

Oddities that real ImageNet has (in the train split only, at fixed, spread-out positions,
see :func:`oddity_positions`): three grayscale JPEGs (mode ``L``), one CMYK JPEG, and one
PNG file named ``.JPEG``. Loaders must turn each into an RGB image.

Determinism: each image draws from its own generator seeded by ``(seed, split, class,
index)``, and is written by Pillow at a fixed JPEG quality, so the same arguments give
byte-identical files for the same numpy and Pillow versions, whatever ``workers`` is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Mapping

import numpy as np
from PIL import Image

from largebatch.defaults import (  # the embedded set's sizes, written once
    DEFAULT_CLASSES,
    DEFAULT_IMAGE_SIZE,
    DEFAULT_TRAIN_PER_CLASS,
    DEFAULT_VAL_PER_CLASS,
    MAX_CLASSES,
    MAX_IMAGE_SIZE,
    MIN_IMAGE_SIZE,
)
from largebatch.errors import UsageError

__all__ = [
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "SyntheticSpec",
    "default_dataset_root",
    "ensure_synthetic",
    "check_args",
    "make_synthetic_imagenet",
    "oddity_positions",
    "read_manifest",
]

FORMAT_VERSION = 1  # bump when the generated pixels change
MANIFEST_NAME = "largebatch-synthetic.json"
JPEG_QUALITY = 90
NUM_FAMILIES = 10  # MAX_CLASSES (largebatch.defaults) is NUM_FAMILIES x NUM_FAMILIES (tests/test_synthetic.py)
_SPLIT_IDS = {"train": 0, "val": 1}



class SyntheticSpec(dict):
    """The arguments that determine the generated files (what the manifest records)."""

    @classmethod
    def of(
        cls, num_classes: int, train_per_class: int, val_per_class: int, image_size: int, seed: int
    ) -> "SyntheticSpec":
        return cls(
            version=FORMAT_VERSION,
            num_classes=int(num_classes),
            train_per_class=int(train_per_class),
            val_per_class=int(val_per_class),
            image_size=int(image_size),
            seed=int(seed),
        )

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self, sort_keys=True).encode()).hexdigest()[:12]


def check_args(num_classes: int, train_per_class: int, val_per_class: int, image_size: int,
               seed: int, *, names: Mapping[str, str] | None = None) -> None:
    """Raise ``UsageError`` naming the first argument of the generator out of its range, by the
    name ``names`` gives it (a tool's flag, a config key), else by its own."""
    name = (lambda arg: (names or {}).get(arg, arg))
    if not 1 <= num_classes <= MAX_CLASSES:
        raise UsageError(f"{name('num_classes')} must be in 1..{MAX_CLASSES}, got {num_classes}")
    if train_per_class < 1:
        raise UsageError(f"{name('train_per_class')} must be >= 1, got {train_per_class}")
    if val_per_class < 1:
        raise UsageError(f"{name('val_per_class')} must be >= 1, got {val_per_class}")
    if not MIN_IMAGE_SIZE <= image_size <= MAX_IMAGE_SIZE:
        raise UsageError(f"{name('image_size')} must be in {MIN_IMAGE_SIZE}..{MAX_IMAGE_SIZE} pixels, got {image_size}")
    if seed < 0:
        raise UsageError(f"{name('seed')} must be >= 0, got {seed}")


def class_folder_name(class_index: int) -> str:
    """ImageNet-style wnid folder name of a class: ``n0000``, ``n0001``, ..."""
    return f"n{class_index:04d}"


def oddity_positions(num_classes: int, train_per_class: int) -> dict[tuple[int, int], str]:
    """``{(class, index): kind}`` of the odd train files: kind is ``L``, ``CMYK`` or ``PNG``.

    Five kinds (L, L, L, CMYK, PNG) at evenly spread flat positions of the train split;
    fewer when the split holds fewer than five images.
    """
    total = num_classes * train_per_class
    kinds = ("L", "L", "L", "CMYK", "PNG")[:total]
    positions = {}
    for k, kind in enumerate(kinds):
        flat = (k * total) // len(kinds)
        positions[(flat // train_per_class, flat % train_per_class)] = kind
    return positions


# ---------------------------------------------------------------------------------------
# pixels


def _grid(size: int) -> tuple[np.ndarray, np.ndarray]:
    c = (np.arange(size, dtype=np.float32) + 0.5) / size * 2.0 - 1.0  # [-1, 1]
    return np.meshgrid(c, c)  # x (columns), y (rows)


def _square(wave: np.ndarray, sharp: float) -> np.ndarray:
    """A sine wave in [-1, 1] squashed towards a square wave in [0, 1]."""
    return 0.5 + 0.5 * np.tanh(sharp * wave)


def _rotate(x: np.ndarray, y: np.ndarray, deg: float) -> tuple[np.ndarray, np.ndarray]:
    t = np.deg2rad(deg)
    return x * np.cos(t) + y * np.sin(t), -x * np.sin(t) + y * np.cos(t)


def _family_mask(family: int, rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The class structure: a mask in [0, 1] of the family's pattern with random parameters."""
    phase = rng.uniform(0, 2 * np.pi)
    sharp = rng.uniform(1.5, 4.0)
    cx, cy = rng.uniform(-0.6, 0.6, size=2)
    if family in (0, 1, 2):  # oriented stripes; flip maps a band onto itself (or its mirror)
        centre = (0.0, 90.0, rng.choice([45.0, 135.0]))[family]
        u, _ = _rotate(x, y, centre + rng.uniform(-12, 12))
        freq = rng.uniform(2.0, 4.0)  # cycles per unit length
        return _square(np.sin(2 * np.pi * freq * u + phase), sharp)
    r = np.hypot(x - cx, y - cy)
    theta = np.arctan2(y - cy, x - cx)
    if family == 3:  # rings
        return _square(np.sin(2 * np.pi * rng.uniform(2.0, 4.0) * r + phase), sharp)
    if family == 4:  # checkerboard
        u, v = _rotate(x, y, rng.uniform(0, 90))
        f = rng.uniform(1.5, 3.0)
        return _square(np.sin(2 * np.pi * f * u + phase) * np.sin(2 * np.pi * f * v), sharp)
    if family == 5:  # blobs
        m = np.zeros_like(x)
        for _ in range(rng.integers(2, 5)):
            bx, by = rng.uniform(-0.9, 0.9, size=2)
            s = rng.uniform(0.15, 0.35)
            m = np.maximum(m, np.exp(-((x - bx) ** 2 + (y - by) ** 2) / (2 * s * s)))
        return _square(m - 0.5, 6.0)
    if family == 6:  # pinwheel sectors
        return _square(np.sin(rng.integers(3, 7) * theta + phase), sharp)
    if family == 7:  # grid of thin lines
        u, v = _rotate(x, y, rng.uniform(0, 90))
        f = rng.uniform(2.0, 3.5)
        lines = np.maximum(np.cos(2 * np.pi * f * u + phase), np.cos(2 * np.pi * f * v))
        return _square(lines - 0.8, 10.0)
    if family == 8:  # lattice of dots
        u, v = _rotate(x, y, rng.uniform(0, 90))
        f = rng.uniform(2.5, 4.0)
        du = (u * f + phase / (2 * np.pi)) % 1.0 - 0.5
        dv = (v * f) % 1.0 - 0.5
        return _square(0.2 - np.hypot(du, dv), 25.0)
    if family == 9:  # spiral arms
        arms = rng.integers(1, 4) * rng.choice([-1, 1])
        return _square(np.sin(arms * theta + 2 * np.pi * rng.uniform(1.5, 3.0) * r + phase), sharp)
    raise ValueError(f"unknown family {family}")


def _random_colour(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0, 255, size=3).astype(np.float32)


def _two_colours(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Foreground and background colours far enough apart that the pattern shows."""
    while True:
        fg, bg = _random_colour(rng), _random_colour(rng)
        if np.abs(fg - bg).sum() > 150:
            return fg, bg


def _add_clutter(img: np.ndarray, rng: np.random.Generator, x: np.ndarray, y: np.ndarray) -> None:
    """Occluding rectangles and ellipses of random colours (in place)."""
    for _ in range(rng.integers(1, 4)):
        cx, cy = rng.uniform(-1, 1, size=2)
        w, h = rng.uniform(0.08, 0.3, size=2)
        if rng.random() < 0.5:
            inside = (np.abs(x - cx) < w) & (np.abs(y - cy) < h)
        else:
            inside = ((x - cx) / w) ** 2 + ((y - cy) / h) ** 2 < 1.0
        img[inside] = _random_colour(rng)


def render_image(num_classes: int, class_index: int, rng: np.random.Generator, size: int) -> np.ndarray:
    """One RGB image (uint8, size x size x 3) of class ``class_index``."""
    del num_classes  # the pattern depends on the class only
    x, y = _grid(size)
    family = class_index % NUM_FAMILIES
    mask = _family_mask(family, rng, x, y)
    if class_index >= NUM_FAMILIES:  # family pairs: a faint second texture under the first
        under = (family + class_index // NUM_FAMILIES) % NUM_FAMILIES
        mask = np.maximum(mask, 0.45 * _family_mask(under, rng, x, y))
    fg, bg = _two_colours(rng)
    img = bg + mask[..., None] * (fg - bg)
    _add_clutter(img, rng, x, y)
    img += rng.normal(0.0, rng.uniform(4.0, 18.0), size=img.shape).astype(np.float32)
    return np.clip(img, 0, 255).astype(np.uint8)


def _image_rng(seed: int, split: str, class_index: int, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, _SPLIT_IDS[split], class_index, index])


def _write_one(job: tuple[str, str, int, int, int, int, int, str | None]) -> None:
    path, split, class_index, index, num_classes, size, seed, oddity = job
    pixels = render_image(num_classes, class_index, _image_rng(seed, split, class_index, index), size)
    img = Image.fromarray(pixels, mode="RGB")
    if oddity == "PNG":  # a PNG file with a .JPEG name, as in ImageNet's train set
        img.save(path, format="PNG")
        return
    if oddity == "L":
        img = img.convert("L")
    elif oddity == "CMYK":
        img = img.convert("CMYK")
    img.save(path, format="JPEG", quality=JPEG_QUALITY)


def _write_class(jobs: list) -> int:
    for job in jobs:
        _write_one(job)
    return len(jobs)


# ---------------------------------------------------------------------------------------
# the tree on disk


def read_manifest(root: Path) -> dict | None:
    """The manifest a generated tree at ``root`` carries (spec and file counts), or None."""
    try:
        return json.loads((root / MANIFEST_NAME).read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None


def _existing(root: Path, spec: SyntheticSpec) -> bool:
    """True if ``root`` already holds this data set; raise if it holds something else."""
    if not root.exists():
        return False
    manifest = read_manifest(root)
    if manifest is not None and manifest.get("spec") == spec:
        return True
    if manifest is not None:
        raise ValueError(
            f"{root} holds a synthetic data set made with other arguments "
            f"({manifest.get('spec')}); use another root or delete that folder"
        )
    if root.is_dir() and not any(root.iterdir()):
        return False  # an empty folder: fill it
    raise ValueError(f"{root} exists and is not a largebatch synthetic data set; use another root")


def make_synthetic_imagenet(
    root: str | os.PathLike,
    *,
    num_classes: int = DEFAULT_CLASSES,
    train_per_class: int = DEFAULT_TRAIN_PER_CLASS,
    val_per_class: int = DEFAULT_VAL_PER_CLASS,
    image_size: int = DEFAULT_IMAGE_SIZE,
    seed: int = 0,
    workers: int = 0,
) -> Path:
    """Write the generated data set under ``root`` (once) and return ``root`` as a Path.

    Args:
        root: target folder; must not exist, be empty, or hold this very data set.
        num_classes: 1..100 classes (see the module docstring for what each is).
        train_per_class: train images per class.
        val_per_class: val images per class.
        image_size: side of the square generated images, pixels.
        seed: base seed; each image is seeded by ``(seed, split, class, index)``.
        workers: processes used to write (0: in this process). Does not change the bytes.

    The tree is built in a temporary folder beside ``root`` and renamed into place, so a
    reader never sees a half-written set; a manifest (``largebatch-synthetic.json``) records
    the arguments. A second call with the same arguments returns at once; other arguments
    into the same root raise ``ValueError``.
    """
    check_args(num_classes, train_per_class, val_per_class, image_size, seed)
    root = Path(root).expanduser().absolute()
    spec = SyntheticSpec.of(num_classes, train_per_class, val_per_class, image_size, seed)
    if _existing(root, spec):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.tmp-", dir=root.parent))
    try:
        counts = _write_tree(tmp, spec, workers)
        manifest = {"spec": spec, "counts": counts,
                    "oddities": {f"train/{class_folder_name(c)}/{_file_name('train', c, i)}": k
                                 for (c, i), k in oddity_positions(num_classes, train_per_class).items()},
                    "numpy": np.__version__, "pillow": Image.__version__}
        (tmp / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
        try:
            os.rename(tmp, root)  # atomic; replaces an empty folder
        except OSError:
            # Someone else finished first: theirs is as good as ours if it is the same set.
            if not _existing(root, spec):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root


def _file_name(split: str, class_index: int, index: int) -> str:
    return f"{class_folder_name(class_index)}_{split}_{index:06d}.JPEG"


def _write_tree(tmp: Path, spec: SyntheticSpec, workers: int) -> dict[str, int]:
    n, size, seed = spec["num_classes"], spec["image_size"], spec["seed"]
    odd = oddity_positions(n, spec["train_per_class"])
    chunks = []
    counts = {}
    for split, per_class in (("train", spec["train_per_class"]), ("val", spec["val_per_class"])):
        counts[split] = n * per_class
        for c in range(n):
            folder = tmp / split / class_folder_name(c)
            folder.mkdir(parents=True)
            chunks.append([
                (str(folder / _file_name(split, c, i)), split, c, i, n, size, seed,
                 odd.get((c, i)) if split == "train" else None)
                for i in range(per_class)
            ])
    if workers > 0:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            list(pool.map(_write_class, chunks))
    else:
        for chunk in chunks:
            _write_class(chunk)
    return counts


def default_dataset_root(
    *,
    num_classes: int = DEFAULT_CLASSES,
    train_per_class: int = DEFAULT_TRAIN_PER_CLASS,
    val_per_class: int = DEFAULT_VAL_PER_CLASS,
    image_size: int = DEFAULT_IMAGE_SIZE,
    seed: int = 0,
) -> Path:
    """Cache folder of the data set with these arguments.

    ``$LARGEBATCH_CACHE/synthetic-<hash>`` if that variable is set, else
    ``~/.cache/largebatch/synthetic-<hash>``; the hash covers the arguments and the format
    version, so different sets never share a folder.
    """
    spec = SyntheticSpec.of(num_classes, train_per_class, val_per_class, image_size, seed)
    cache = os.environ.get("LARGEBATCH_CACHE") or os.path.join("~", ".cache", "largebatch")
    return Path(cache).expanduser() / f"synthetic-{spec.digest()}"


def ensure_synthetic(
    root: str | os.PathLike | None = None,
    *,
    num_classes: int = DEFAULT_CLASSES,
    train_per_class: int = DEFAULT_TRAIN_PER_CLASS,
    val_per_class: int = DEFAULT_VAL_PER_CLASS,
    image_size: int = DEFAULT_IMAGE_SIZE,
    seed: int = 0,
    workers: int = 0,
) -> Path:
    """The data set's root, generated on first use (``root=None``: the cache folder)."""
    args = dict(num_classes=num_classes, train_per_class=train_per_class,
                val_per_class=val_per_class, image_size=image_size, seed=seed)
    if root is None:
        root = default_dataset_root(**args)
    return make_synthetic_imagenet(root, workers=workers, **args)

