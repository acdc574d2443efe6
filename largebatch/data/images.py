"""Image folders as every loader and the data check read them: listing, validation, one file.

One listing for all (:func:`list_split`, :func:`list_folder`): the torchvision and nvjpeg
loaders, the DALI file reader and ``largebatch-check-data`` see the same files with the same
labels, in torchvision's ``ImageFolder`` order, and refuse the same bad trees with the same
one-line ``DataError`` (a missing root or split, no class folder, an empty class, a link that
loops or leaves its class folder, a folder that cannot be read). Hidden folders are not classes
(:func:`list_classes`). Also what decoding one file
means (:func:`load_rgb`, Pillow, any format, to RGB), the decompression-bomb limit every loader
applies, and the DALI file-list format the data check writes.
"""

from __future__ import annotations

import os
import stat
from typing import NamedTuple, Sequence

from PIL import Image, ImageOps
from torchvision.datasets.folder import IMG_EXTENSIONS

from largebatch.errors import DataError

__all__ = [
    "SIDE_ABOVE_IMAGES",
    "IMG_EXTENSIONS",
    "Unreadable",
    "EXIF_ORIENTATION",
    "check_same_classes",
    "check_split_classes",
    "decompression_bomb_limit",
    "largest_sampled_side",
    "list_class_images",
    "list_classes",
    "list_folder",
    "list_split",
    "load_rgb",
    "not_a_folder",
    "not_a_regular_file",
    "read_file_list",
    "special_file",
    "split_folder",
]


def check_same_classes(train_root: str, train_classes: Sequence[str], val_root: str,
                       val_classes: Sequence[str]) -> None:
    """Both splits must have the same class folders (a label means one class in both); else one
    line naming a few folders only one split has."""
    if list(train_classes) != list(val_classes):
        only_train = sorted(set(train_classes) - set(val_classes))
        only_val = sorted(set(val_classes) - set(train_classes))
        raise DataError(
            f"train ({train_root}) and val ({val_root}) class folders differ: "
            f"{len(only_train)} only in train {only_train[:3]}, {len(only_val)} only in val "
            f"{only_val[:3]}; both splits need the same class folders"
        )


def list_classes(split_dir: str | os.PathLike) -> tuple[list[str], list[str]]:
    """``(classes, hidden)``: the class folders of ``split_dir``, sorted (torchvision's order and
    labels), and the hidden folders (names starting with ``.``) left out of them.

    torchvision's ``find_classes`` (0.29) takes every folder, hidden ones too: Jupyter's
    ``.ipynb_checkpoints/``, a file server's ``.snapshot/`` or a desktop's ``.Trash-1000/``
    became class 0 and shifted every label by one, or stopped the run as an empty class.
    Every listing here (the loaders, the data check, the shard maker) reads classes through
    this function, so they agree; the data check names the folders it skipped.
    """
    classes, hidden = [], []
    for entry in os.scandir(split_dir):
        if entry.is_dir():
            (hidden if entry.name.startswith(".") else classes).append(entry.name)
    return sorted(classes), sorted(hidden)


def check_split_classes(root: str | os.PathLike) -> None:
    """:func:`check_same_classes` of the class folders of ``root/train`` and ``root/val``.

    What the loaders that do not list both trees themselves (DALI reading the data check's
    lists) and the data check call: a class only one split has would otherwise pass the check
    and stop a DALI run at its first evaluation (a val label out of range), an epoch in.
    """
    train, val = split_folder(root, "train"), split_folder(root, "val")
    check_same_classes(train, list_classes(train)[0], val, list_classes(val)[0])


class Unreadable(NamedTuple):
    """What the data set returns for a file it cannot decode (the collate function counts it)."""

    index: int
    target: int


_SPECIAL = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
            (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISDIR, "a folder"))


# A training side more than this many times the longest side of the data's images gets a warning
# at start (largebatch.data.build), and data.loader=auto builds no decoded store that far above them. A random-resized crop at a side above its image's adds no detail, only pixels: 4x the
# side is 16x the pixels of the source, and a step's memory and time grow with them (side^2), so a
# side that far above the images is almost always a slip (a side meant for another data set, an
# extra digit) that would end in an out-of-memory error an epoch later. A side a little above the
# images (evaluating at 1.15x, FixRes-style, or 224 px crops of 160 px copies) stays well below it.
# A warning, not an error: upsampling small images on purpose is the user's call.
SIDE_ABOVE_IMAGES = 4


def largest_sampled_side(split_dir: str | os.PathLike, *, classes: int = 8, per_class: int = 4) -> int | None:
    """The longest side (pixels) among a few images of ``split_dir``: the first ``per_class``
    files of ``classes`` class folders spread over the sorted list, read from their headers
    (no decode: milliseconds, also on ImageNet). None where no image could be read."""
    try:
        names, _ = list_classes(split_dir)
    except OSError:
        return None
    picked = names[::max(1, len(names) // classes)][:classes]
    largest = None
    for name in picked:
        try:
            with os.scandir(os.path.join(split_dir, name)) as entries:
                files = [e.path for e in entries if e.name.lower().endswith(IMG_EXTENSIONS)][:per_class]
        except OSError:
            continue
        for path in files:
            if special_file(path) is not None:  # a FIFO: opening it would wait forever
                continue
            try:
                with Image.open(path) as img:
                    side = max(img.size)
            except (OSError, ValueError, Image.DecompressionBombError):
                continue
            largest = side if largest is None else max(largest, side)
    return largest


def special_file(path: str | os.PathLike) -> str | None:
    """What ``path`` is (``"a FIFO (named pipe)"``, ``"a socket"``, a device) when it is not a
    regular file, found by ``stat`` (links followed) without opening it; None for a regular
    file or one that cannot be stat'ed (opening it then reports why).

    Opening a FIFO for reading waits for a writer, forever, in a call no signal handler
    interrupts: a run would hang silently and not even stop on SIGTERM. So every reader (the
    loaders, the data check) asks this before it opens an image.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISREG(mode):
        return None
    return next((what for test, what in _SPECIAL if test(mode)), "not a regular file")


def not_a_regular_file(path: str | os.PathLike, what: str) -> OSError:
    """The ``OSError`` a reader raises (and skips and counts) for a :func:`special_file`."""
    return OSError(f"{os.fspath(path)} is {what}, not an image file: not opened (reading it could wait "
                   f"forever); move it out of the data set")


def load_rgb(path: str) -> Image.Image:
    """Decode any image Pillow reads (JPEG L/CMYK, PNG, palette, RGBA) into an RGB image.

    The content decides the format, not the name: ImageNet holds a PNG and CMYK JPEGs named
    ``.JPEG``. An EXIF orientation (a camera's "rotate 90 degrees to view") is applied, as
    every loader does (DALI's decoder, nvjpeg's CPU path for such files), so an image reads
    the same whichever loader trained or evaluates. Raises ``OSError``/``ValueError`` for a
    file that is not a whole image, without opening one that is not a regular file (a FIFO).
    """
    special = special_file(path) if isinstance(path, (str, os.PathLike)) else None  # not bytes read already
    if special is not None:
        raise not_a_regular_file(path, special)
    with Image.open(path) as img:
        img.load()  # decode now, inside the caller's error handling (truncation shows here)
        if img.getexif().get(EXIF_ORIENTATION, 1) in range(2, 9):
            img = ImageOps.exif_transpose(img)
        if img.mode == "P" and "transparency" in img.info:
            img = img.convert("RGBA")  # avoids Pillow's palette-transparency warning
        return img.convert("RGB")


def list_class_images(
    split_dir: str | os.PathLike, class_to_idx: dict[str, int], extensions: tuple[str, ...] = IMG_EXTENSIONS
) -> list[tuple[str, int]]:
    """``(path, label)`` of every image under each class folder: torchvision's order and labels.

    Written here instead of torchvision's ``make_dataset`` because that one walks with
    ``os.walk(followlinks=True)`` and no guard: a link such as ``train/a/up -> ..`` is
    followed ~40 levels deep and lists every other class's images again, labelled ``a``,
    without a word. Here each directory is entered once (by its real path), and a directory
    link that loops back to a folder above it or leaves its class folder is refused with a
    ``DataError`` naming it; a folder that cannot be read is named too. Links to files and a
    class folder that is itself a link (datasets assembled from links) are followed.
    """
    split_dir = os.fspath(split_dir)
    samples: list[tuple[str, int]] = []
    for cls in sorted(class_to_idx):
        class_dir = os.path.join(split_dir, cls)
        class_real = os.path.realpath(class_dir)
        seen = {class_real}

        def unreadable(err: OSError) -> None:
            raise DataError(f"cannot read folder {err.filename}: {err.strerror}; make it readable "
                            f"or move it out of {split_dir}")

        found = []
        for here, dirs, files in os.walk(class_dir, onerror=unreadable, followlinks=True):
            here_real = os.path.realpath(here)
            for name in list(dirs):
                path = os.path.join(here, name)
                real = os.path.realpath(path)
                if os.path.islink(path):
                    if here_real == real or here_real.startswith(real + os.sep):
                        raise DataError(f"{path} links to {real}, a folder above it (a loop): "
                                        f"remove the link")
                    if real != class_real and not real.startswith(class_real + os.sep):
                        raise DataError(f"{path} links to {real}, outside its class folder "
                                        f"{class_dir}: its images would be labelled {cls!r}; "
                                        f"remove the link or link the files one by one")
                if real in seen:
                    dirs.remove(name)  # reached twice (two links, or a link and the folder)
                else:
                    seen.add(real)
            found.append((here, sorted(files)))
        for here, files in sorted(found):
            for name in files:
                if name.lower().endswith(extensions):  # a broken link is listed, then reported unreadable
                    samples.append((os.path.join(here, name), class_to_idx[cls]))
    return samples


EXIF_ORIENTATION = 0x0112  # the EXIF tag: 1 upright, 2-8 mirrored and/or rotated


def decompression_bomb_limit() -> int | None:
    """The most pixels an image may have: Pillow's ``Image.open`` refuses more than twice
    ``Image.MAX_IMAGE_PIXELS`` (a 600-byte JPEG can claim 30000x30000); None if unlimited."""
    return None if Image.MAX_IMAGE_PIXELS is None else 2 * Image.MAX_IMAGE_PIXELS


def not_a_folder(path: str | os.PathLike) -> str:
    """Why ``path``, which is not a directory, cannot be one: ``"does not exist"`` or
    ``"is a file, not a folder"`` (a data.root pointing at an archive or a file list)."""
    if os.path.lexists(path) and not os.path.isdir(path):
        return "is a file, not a folder" if os.path.exists(path) else "is a broken link"
    return "does not exist"


def split_folder(root: str | os.PathLike, split: str) -> str:
    """``root/split``, or a ``DataError`` saying which of the two is missing."""
    root = os.fspath(root)
    path = os.path.join(root, split)
    if not os.path.isdir(root):
        raise DataError(f"data root {root} {not_a_folder(root)}: set data.root to a folder holding "
                        f"train/ and val/, or leave it unset for the embedded data set")
    if not os.path.isdir(path):
        raise DataError(f"data root {root} has no {split}/ folder: expected "
                        f"{root}/{split}/<class>/*.JPEG")
    return path


def list_folder(split_dir: str | os.PathLike) -> tuple[list[str], list[tuple[str, int]]]:
    """``(classes, [(path, label), ...])`` of an ImageFolder tree, checked.

    Raises ``DataError`` for a missing folder, a folder without class sub-folders, or a class
    folder without an image (naming the first, with the extensions read).
    """
    root = os.fspath(split_dir)
    if not os.path.isdir(root):
        raise DataError(f"data folder {root} {not_a_folder(root)}: point data.root at an "
                        f"ImageFolder tree (<root>/<class>/*.JPEG)")
    try:
        classes, hidden = list_classes(root)
    except OSError as err:
        raise DataError(f"cannot read folder {root}: {err.strerror}; make it readable") from None
    if not classes:
        skipped = f" (hidden folders are not classes: {', '.join(hidden)})" if hidden else ""
        raise DataError(f"data folder {root} has no class sub-folders{skipped}: expected "
                        f"{root}/<class>/*.JPEG")
    samples = list_class_images(root, {c: i for i, c in enumerate(classes)})
    counts = [0] * len(classes)
    for _, target in samples:
        counts[target] += 1
    empty = [c for c, n in zip(classes, counts) if n == 0]
    if empty:
        raise DataError(
            f"class folder {os.path.join(root, empty[0])} holds no image "
            f"({len(empty)} empty class folder(s); extensions read: {', '.join(IMG_EXTENSIONS)}): "
            f"add images or remove the folder"
        )
    return classes, samples


def list_split(root: str | os.PathLike, split: str) -> tuple[list[str], list[str], list[int]]:
    """``(classes, paths, labels)`` of ``root/split`` (``train`` or ``val``), checked as
    :func:`split_folder` and :func:`list_folder` check it."""
    classes, samples = list_folder(split_folder(root, split))
    return classes, [p for p, _ in samples], [t for _, t in samples]


def read_file_list(path: str | os.PathLike, base: str | os.PathLike) -> tuple[list[str], list[int]]:
    """Paths (joined to ``base``) and labels of a DALI file list: ``relative/path label`` lines."""
    paths, labels = [], []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            name, _, label = line.rpartition(" ")
            if not name or not label.lstrip("-").isdigit():
                raise DataError(f"{path}:{lineno}: expected 'relative/path label', got {line!r}")
            paths.append(os.path.join(os.fspath(base), name))
            labels.append(int(label))
    return paths, labels
