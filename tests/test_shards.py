"""largebatch-make-shards: the round trip, DALI's index format, and reading shards with DALI."""

from __future__ import annotations

import importlib.util
import io
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from largebatch.data.check import check_dataset, require_checked
from largebatch.data.contract import LoaderSpec
from largebatch.data.images import read_file_list
from largebatch.data.shards import iter_shard_samples, make_shards
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.tools.make_shards import main

HAS_DALI = importlib.util.find_spec("nvidia.dali") is not None


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """20 classes x 1 train + 1 val image: the label names the sample. Odd files included."""
    root = make_synthetic_imagenet(tmp_path_factory.mktemp("shards") / "set", num_classes=20,
                                   train_per_class=1, val_per_class=1, image_size=24)
    check_dataset(root, workers=2)
    return root


@pytest.fixture(scope="module")
def shards(checked: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("packed") / "out"
    assert main([str(checked), str(out), "--shard-size", "6", "--workers", "2"]) == 0
    return out


def test_round_trip_keeps_every_file_byte_for_byte(checked: Path, shards: Path) -> None:
    for split in ("train", "val"):
        paths, labels = read_file_list(require_checked(checked, split), "")
        expected = dict(zip(paths, labels))
        seen = {}
        for _key, image, label, rel in iter_shard_samples(shards / split):
            assert rel not in seen
            seen[rel] = label
            assert image == (checked / rel).read_bytes()
        assert seen == expected
        meta = json.loads((shards / split / "meta.json").read_text())
        assert meta["num_samples"] == 20 and [s["samples"] for s in meta["shards"]] == [6, 6, 6, 2]
        assert meta["classes"] == [f"n{c:04d}" for c in range(20)]
    train_order = [rel for _, _, _, rel in iter_shard_samples(shards / "train")]
    assert train_order != sorted(train_order)  # stored shuffled: DALI shuffles only in a buffer


def test_index_matches_dalis_wds2idx(shards: Path, tmp_path: Path) -> None:
    wds2idx = pytest.importorskip("wds2idx")  # shipped with nvidia-dali
    tar = shards / "train" / "shard-000000.tar"
    with wds2idx.IndexCreator(str(tar), str(tmp_path / "ref.idx"), verbose=False) as creator:
        creator.create_index()
    assert (tmp_path / "ref.idx").read_text() == (shards / "train" / "shard-000000.idx").read_text()


def test_reencode_turns_odd_files_into_rgb_jpegs(checked: Path, tmp_path: Path) -> None:
    metas = make_shards(checked, tmp_path / "re", shard_size=50, splits=["train"], reencode=True)
    odd = json.loads((checked / "largebatch-synthetic.json").read_text())["oddities"]
    assert metas["train"]["reencoded"] == len(odd) > 0
    for _, image, _, rel in iter_shard_samples(tmp_path / "re" / "train"):
        with Image.open(io.BytesIO(image)) as img:
            assert img.format == "JPEG" and img.mode == "RGB", rel
            if rel in odd:
                with Image.open(checked / rel) as src:
                    diff = np.abs(np.asarray(img, int) - np.asarray(src.convert("RGB"), int))
                assert diff.mean() < 4


@pytest.mark.parametrize("argv, message", [
    (["UNCHECKED", "OUT", "--shard-size", "4"], "has not been checked"),
    (["ROOT", "OUT", "--shard-size", "0"], "--shard-size"),
    (["ROOT", "EXISTING", "--shard-size", "4"], "exists already"),
    (["ROOT"], "required"),
])
def test_bad_input_exits_2_with_one_line(argv, message, checked, shards, tmp_path, capsys) -> None:
    unchecked = make_synthetic_imagenet(tmp_path / "raw", num_classes=1, train_per_class=1,
                                        val_per_class=1, image_size=16)
    names = {"ROOT": str(checked), "UNCHECKED": str(unchecked), "OUT": str(tmp_path / "o"),
             "EXISTING": str(shards)}
    with pytest.raises(SystemExit) as exc:
        main([names.get(a, a) for a in argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


@pytest.mark.skipif(not HAS_DALI, reason="needs nvidia-dali")
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_dali_reads_shards_disjoint_per_epoch_and_val_exactly_once(shards: Path, world_size: int) -> None:
    from largebatch.data.pipelines.dali_shards import build_dali_shard_loaders

    per_rank = (20 // world_size) // 2 * 2
    val_ids, epochs = [], {0: [], 1: []}
    for rank in range(world_size):
        spec = LoaderSpec(image_size=16, batch_size=2, workers=1, rank=rank, world_size=world_size, shuffle_buffer=4)
        train, val, classes = build_dali_shard_loaders(shards, spec)
        assert classes == 20 and len(train) == per_rank // 2  # the same step count on every rank
        assert train._buffer == 4  # spec.shuffle_buffer is the reader's initial_fill
        for epoch in epochs:
            train.set_epoch(epoch)
            batches = list(train)
            assert len(batches) == len(train)
            assert batches[0][0].shape == (2, 3, 16, 16)
            epochs[epoch].append([i for _, labels in batches for i in labels.tolist()])
        train.set_epoch(1, skip_batches=1)
        assert [b[1].tolist() for b in train] == [epochs[1][-1][i:i + 2] for i in range(2, per_rank, 2)]
        for _ in range(2):  # evaluating twice gives the same samples
            ids = [i for _, labels in val for i in labels.tolist()]
        assert len(list(val)) == len(val)
        val_ids += ids
    assert sorted(val_ids) == list(range(20))  # every val image exactly once, padding dropped
    for parts_of_epoch in epochs.values():
        union = [i for ids in parts_of_epoch for i in ids]
        assert len(union) == len(set(union)) == per_rank * world_size  # disjoint
    assert epochs[0] != epochs[1]


def test_readme_shard_loader_example_runs(checked: Path, tmp_path: Path) -> None:
    """The documented "from Python" block (docs/input-pipelines.md), run as written on small shards (CPU, small sizes)."""
    pytest.importorskip("nvidia.dali")

    from tests.docs_text import python_blocks

    (block,) = [b for b in python_blocks() if "build_dali_shard_loaders" in b]
    out = tmp_path / "shards"
    make_shards(checked, out, shard_size=16)
    program = (block.replace('"/data/imagenet-shards"', repr(str(out))).replace("image_size=224", "image_size=16")
               .replace("batch_size=256", "batch_size=4").replace("workers=8", "workers=1")
               .replace('device="cuda:0",', 'device="cpu",'))
    scope: dict = {}
    exec(compile(program, "README.md", "exec"), scope)
    assert scope["num_classes"] > 1 and tuple(scope["images"].shape) == (4, 3, 16, 16)


def test_data_shuffle_buffer_reaches_the_loader_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.shuffle_buffer``: the schema's key -> ``parts.data.data_of``'s ``LoaderSpec`` (-> the reader, above)."""
    from types import SimpleNamespace

    import torch

    import largebatch.data.build as build
    from largebatch.parts.data import data_of
    from largebatch.config import compose_config, to_train_config

    seen = {}

    def loaders(root: Path, spec: object, **kw: object) -> tuple[list, None, int]:
        seen["spec"] = spec
        return [None], None, 2  # one batch: it fills the one accumulation step

    monkeypatch.setattr(build, "build_run_loaders", loaders)
    backend = SimpleNamespace(device=torch.device("cpu"), rank=0, world_size=1, local_rank=0, is_main=True,
                              barrier=lambda: None)
    for overrides, expected in (([], 4096), (["data.shuffle_buffer=7"], 7)):
        seen.clear()
        cfg = to_train_config(compose_config([f"data.root={tmp_path}", *overrides]))
        data_of(cfg, backend, SimpleNamespace(per_device=4, accumulation_steps=1), None, False)
        assert seen["spec"].shuffle_buffer == expected
