"""Every loader satisfies the written loader contract (largebatch.data.contract.Loader).

The five pipelines are built on the CPU over one generated data set and checked the same way:
``isinstance(loader, Loader)`` (the Protocol's members exist), then the behaviour the members
promise: ``len()`` batches per epoch, full training batches of ``batch_size``, every
validation image once, ``evaluation`` and ``total_samples`` saying which split and how large,
``set_epoch(e, k)`` skipping the first ``k`` batches of epoch ``e``
(the same batches the full pass gives from ``k`` on) and without a skip the whole epoch
again, ``skipped`` an int.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
import torch

from largebatch.data.contract import Loader, LoaderSpec
from largebatch.data.synthetic import make_synthetic_imagenet

SIZE, BATCH = 16, 4


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("contract") / "ds", num_classes=3,
                                   train_per_class=8, val_per_class=3, image_size=32)


def _torchvision(root: Path, tmp: Path, **spec: Any) -> tuple[Any, Any]:
    from largebatch.data.pipelines.torchvision import build_loaders

    train, val, _ = build_loaders(root, LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=0, **spec))
    return train, val


def _nvjpeg(root: Path, tmp: Path, **spec: Any) -> tuple[Any, Any]:
    from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders

    train, val, _ = build_nvjpeg_loaders(root, LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=0, device="cpu", **spec))
    return train, val


def _dali_files(root: Path, tmp: Path, **spec: Any) -> tuple[Any, Any]:
    pytest.importorskip("nvidia.dali")
    from largebatch.data.pipelines.dali_files import build_dali_loaders

    train, val, _ = build_dali_loaders(root, LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=1, **spec))
    return train, val


def _dali_shards(root: Path, tmp: Path, **spec: Any) -> tuple[Any, Any]:
    pytest.importorskip("nvidia.dali")
    from largebatch.data.check import check_dataset
    from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders
    from largebatch.data.shards import make_shards

    shards = tmp / "shards"
    if not shards.exists():
        check_dataset(root, workers=1)
        make_shards(root, shards, shard_size=7)
    train, val, _ = build_dali_shard_loaders(shards, LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=1, **spec))
    return train, val


def _decoded(root: Path, tmp: Path, **spec: Any) -> tuple[Any, Any]:
    from largebatch.data.pipelines.decoded import build_decoded_loaders

    train, val, _ = build_decoded_loaders(root, LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=1, **spec),
                                          cache=tmp / "cache")
    return train, val


PIPELINES: dict[str, Callable[..., tuple[Any, Any]]] = {
    "torchvision": _torchvision, "nvjpeg": _nvjpeg, "dali-files": _dali_files, "dali-shards": _dali_shards,
    "decoded": _decoded,
}


def _labels(loader: Any) -> list[list[int]]:
    out = []
    for images, labels, *_ in loader:
        assert images.dtype.is_floating_point and images.shape[1:] == (3, SIZE, SIZE)
        assert labels.dtype == torch.int64 and len(labels) == len(images)
        out.append(labels.tolist())
    return out


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_every_loader_satisfies_the_contract(root: Path, tmp_path_factory: pytest.TempPathFactory,
                                             pipeline: str) -> None:
    train, val = PIPELINES[pipeline](root, tmp_path_factory.mktemp(pipeline))
    for loader in (train, val):
        assert isinstance(loader, Loader), f"{type(loader).__name__} lacks a member of the contract"
        assert isinstance(loader.skipped, int) and loader.batch_size == BATCH
    assert (train.evaluation, val.evaluation) == (False, True)
    assert (train.total_samples, val.total_samples) == (3 * 8, 3 * 3)  # the splits, all ranks together
    train.set_epoch(1)
    full = _labels(train)
    assert len(full) == len(train) and all(len(b) == BATCH for b in full)
    train.set_epoch(1, skip_batches=2)
    assert _labels(train) == full[2:]  # a resumed epoch: the batches the full pass gives from 2 on
    train.set_epoch(1)
    assert _labels(train) == full  # set_epoch without a skip gives the whole epoch again
    val.set_epoch(0)
    assert sum(len(b) for b in _labels(val)) == 3 * 3  # every validation image once
    train.set_epoch(1)
    next(iter(train))  # a pass left half read, as a stopped run leaves it
    train.close()
    train.set_epoch(1)
    assert _labels(train) == full  # closed: the next pass starts afresh


@pytest.mark.parametrize("pipeline", ["torchvision", "nvjpeg"])
def test_close_ends_the_loader_workers_at_once(root: Path, pipeline: str) -> None:
    """Persistent workers ignore SIGTERM while the run goes on and torch ends them only in its
    iterator's __del__, 10 s a worker where its queue sentinel is lost (issue 60): close() ends
    them now, with the stop handler they have."""
    import time
    from dataclasses import replace

    from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders
    from largebatch.data.pipelines.torchvision import build_loaders

    spec = LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=2)
    build = build_loaders if pipeline == "torchvision" else build_nvjpeg_loaders
    train = build(root, replace(spec, device=torch.device("cpu")))[0]
    train.set_epoch(0)
    next(iter(train))
    workers = list(train.loader._iterator._workers)  # this loader's (torch keeps them there)
    assert len(workers) == 2 and all(p.is_alive() for p in workers)
    started = time.monotonic()
    train.close()
    assert time.monotonic() - started < 2.0
    assert not any(p.is_alive() for p in workers), "a worker outlived close()"


def test_the_spec_refuses_a_bad_crop_ratio_for_every_pipeline_in_one_line() -> None:
    from largebatch.errors import UsageError

    with pytest.raises(UsageError, match=r"data.val_crop_ratio\) must be in \(0, 1\], got 1.5$"):
        LoaderSpec(image_size=SIZE, batch_size=BATCH, workers=0, val_crop_ratio=1.5)


@pytest.mark.parametrize("pipeline", PIPELINES)
def test_a_training_pass_is_whole_optimizer_steps(root: Path, tmp_path_factory: pytest.TempPathFactory,
                                                  pipeline: str) -> None:
    """24 images in batches of 4 are 6 batches; with 4 micro-batches a step, the loop trains on
    4 of them. A training pass now yields those 4 only: DALI's file pipeline, left with 2 unread
    batches every epoch, was rebuilt every epoch (issue 53)."""
    train, _ = PIPELINES[pipeline](root, tmp_path_factory.mktemp(pipeline), accumulation_steps=4)
    builds = []
    if pipeline == "dali-files":
        build = train._build
        train._build = lambda: builds.append(1) or build()
    for epoch in range(3):
        train.set_epoch(epoch)
        assert len(_labels(train)) == len(train) == 4
    if pipeline == "dali-files":
        assert len(builds) == 1, f"the pipeline was built {len(builds)} times in 3 epochs"
