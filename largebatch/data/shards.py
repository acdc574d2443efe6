"""Packed shards: a checked ImageFolder tree as WebDataset tar files that DALI reads.

A million small files cost a metadata lookup and a random read each; on network file
systems that, not decoding, limits the input rate. ``largebatch-make-shards ROOT OUT
--shard-size N`` packs the files of the clean lists of ``largebatch-check-data`` into
``OUT/<split>/shard-000000.tar`` ... of N samples each, read sequentially by DALI's
``fn.readers.webdataset`` (:func:`largebatch.data.pipelines.dali_shards.build_dali_shard_loaders`).

Layout of one sample (WebDataset convention: members sharing a key form a sample):

* ``<key>.jpg`` (or ``.png``, ... by content): the file's bytes, unchanged, or re-encoded as
  an RGB JPEG with ``--reencode`` for the odd files the check found (PNG named .JPEG, CMYK,
  grayscale), so every image takes the fast JPEG path (and the GPU's hardware decoder);
* ``<key>.cls``: the label as ASCII text (what other WebDataset readers expect);
* ``<key>.lbl``: the label as a little-endian int64 (what DALI reads, ``dtypes=INT64``);
* ``<key>.path``: the source path relative to ROOT (traceability, tests).

Each tar has a DALI index ``shard-000000.idx`` (the format of DALI's ``wds2idx`` tool, written
here from the offsets we know, so no ``tar`` run is needed), and ``OUT/<split>/meta.json``
lists shards, counts and classes. Training samples are stored in a seeded random order: DALI's
reader shuffles only inside a buffer, so the stored order must already be mixed.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
from PIL import Image

from largebatch.data.check import _read_report, require_checked
from largebatch.data.images import list_classes, read_file_list
from largebatch.errors import DataError

__all__ = ["INDEX_VERSION", "REENCODE_KINDS", "iter_shard_samples", "make_shards"]

INDEX_VERSION = "v1.2"  # DALI's webdataset index format (tools/wds2idx.py)
_EXT = {"JPEG": "jpg", "PNG": "png", "BMP": "bmp", "TIFF": "tif", "WEBP": "webp"}
# the odd files (kinds of largebatch.data.check.KINDS) that reencode=True writes as RGB JPEG
REENCODE_KINDS = ("wrong_extension", "cmyk_jpeg", "grayscale_jpeg")


def _image_ext(data: bytes) -> str:
    if data[:3] == b"\xff\xd8\xff":
        return "jpg"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png"
    if data[:2] == b"BM":
        return "bmp"
    if data[:4] in (b"II*\x00", b"MM\x00*"):
        return "tif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    raise DataError(f"unknown image format (starts with {data[:8]!r})")


def _rgb_jpeg(data: bytes, quality: int = 95) -> bytes:
    with Image.open(io.BytesIO(data)) as img:
        out = io.BytesIO()
        img.convert("RGB").save(out, format="JPEG", quality=quality, subsampling=0)
        return out.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> tuple[int, int]:
    """Append one member; return the (offset, size) of its data in the archive."""
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = 0o644
    tar.addfile(info, io.BytesIO(data))
    padded = -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    return tar.offset - padded, len(data)  # data ends the member, before padding


def _write_shard(job: tuple[Path, Path, list[tuple[int, str, int]], str, set[str]]) -> int:
    tar_path, idx_path, samples, root, reencode = job
    lines = []
    with tarfile.open(tar_path, "w", format=tarfile.GNU_FORMAT) as tar:
        for key_index, rel, label in samples:
            data = Path(root, rel).read_bytes()
            if rel in reencode:
                data = _rgb_jpeg(data)
            key = f"{key_index:09d}"
            parts = []
            for ext, payload in ((_image_ext(data), data), ("cls", str(label).encode()),
                                 ("lbl", np.int64(label).tobytes()), ("path", rel.encode())):
                offset, size = _add(tar, f"{key}.{ext}", payload)
                parts.append(f"{ext} {offset} {size} {key}.{ext}")
            lines.append(" ".join(parts))
    idx_path.write_text(f"{INDEX_VERSION} {len(lines)}\n" + "\n".join(lines) + "\n")
    return len(samples)


def _odd_files(root: Path, split: str) -> set[str]:
    found = _read_report(root)
    if found is None:
        return set()
    return {p["path"] for p in found[0].get("problems", [])
            if p["split"] == split and p["kind"] in REENCODE_KINDS}


def make_shards(
    root: str | os.PathLike,
    out: str | os.PathLike,
    *,
    shard_size: int,
    splits: Sequence[str] = ("train", "val"),
    seed: int = 0,
    reencode: bool = False,
    workers: int = 1,
) -> dict[str, dict]:
    """Pack the checked splits of ``root`` into ``out/<split>/``; return each split's meta.

    Raises :class:`DataError` if ``root`` was not checked (``largebatch-check-data``) or
    ``out/<split>`` exists already.
    """
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    root = Path(root).expanduser().absolute()
    out = Path(out).expanduser().absolute()
    metas = {}
    for split in splits:
        file_list = require_checked(root, split)
        target = out / split
        if target.exists():
            raise DataError(f"{target} exists already: remove it or pick another OUT")
        paths, labels = read_file_list(file_list, "")
        order = list(range(len(paths)))
        if split == "train":  # the reader shuffles inside a buffer only: store mixed
            order = np.random.default_rng(seed).permutation(len(paths)).tolist()
        classes, _ = list_classes(root / split)
        odd = _odd_files(root, split) if reencode else set()
        out.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{split}.tmp-", dir=out))
        try:
            jobs, shards = [], []
            for s, begin in enumerate(range(0, len(order), shard_size)):
                chunk = [(i, paths[i], labels[i]) for i in order[begin : begin + shard_size]]
                samples = [(begin + k, rel, label) for k, (_, rel, label) in enumerate(chunk)]
                tar, idx = f"shard-{s:06d}.tar", f"shard-{s:06d}.idx"
                jobs.append((tmp / tar, tmp / idx, samples, str(root), odd))
                shards.append({"tar": tar, "index": idx, "samples": len(samples)})
            with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
                list(pool.map(_write_shard, jobs))
            meta = {"version": 1, "source": str(root), "split": split, "num_samples": len(order),
                    "shard_size": shard_size, "seed": seed, "reencoded": len(odd),
                    "classes": classes, "shards": shards}
            (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
            os.chmod(tmp, 0o755)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        metas[split] = meta
    return metas


def iter_shard_samples(folder: str | os.PathLike) -> Iterator[tuple[str, bytes, int, str]]:
    """``(key, image bytes, label, source path)`` of every sample of ``folder``'s tars, in order."""
    meta = json.loads(Path(folder, "meta.json").read_text())
    for shard in meta["shards"]:
        with tarfile.open(Path(folder, shard["tar"])) as tar:
            sample: dict[str, bytes] = {}
            key = None
            for member in tar:
                k, _, ext = member.name.partition(".")
                if key is not None and k != key:
                    yield _sample(key, sample)
                    sample = {}
                key = k
                sample[ext] = tar.extractfile(member).read()
            if key is not None:
                yield _sample(key, sample)


def _sample(key: str, parts: dict[str, bytes]) -> tuple[str, bytes, int, str]:
    image = next(v for k, v in parts.items() if k in _EXT.values() or k == "jpeg")
    return key, image, int(parts["cls"]), parts["path"].decode()

