"""``data.loader=decoded`` (issue 72, item 2): a store decoded once into the cache, batches cut
and augmented as a whole (largebatch/data/pipelines/decoded.py). The contract's members and bad
files are checked with every loader (tests/test_loader_contract.py,
tests/test_bad_inputs_every_loader.py); here what is its own: a run trains and resumes mid-epoch
bit for bit through the CLI, a changed source is refused in one line, the crops are keyed by the
batch (not by the thread or the rank's neighbour), the evaluation crops are torchvision's."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines.decoded import build_decoded_loaders, ensure_decoded_stores
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.errors import DataError
from largebatch.resolution import ResolutionSchedule

SPEC = LoaderSpec(image_size=16, batch_size=4, workers=1)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("decoded") / "ds", num_classes=3, train_per_class=8,
                                   val_per_class=3, image_size=32)


def _batches(loader, epoch: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:  # type: ignore[no-untyped-def]
    loader.set_epoch(epoch)
    return list(loader)


def test_a_changed_source_is_refused_in_one_line(root: Path, tmp_path: Path) -> None:
    data = Path(shutil.copytree(root, tmp_path / "ds"))
    ensure_decoded_stores(data, SPEC, cache=tmp_path / "cache", announce=False)
    victim = sorted((data / "train").rglob("*.JPEG"))[0]
    victim.write_bytes(victim.read_bytes() + b"\0")
    with pytest.raises(DataError, match=r"its files changed since .*: delete it and rebuild it: rm -r \S+decoded-\S+-"
                                        r"train-24px && largebatch-make-decoded with the run's overrides \(or the run "
                                        r"rebuilds it on first use\)$") as err:
        build_decoded_loaders(data, SPEC, cache=tmp_path / "cache")
    assert "\n" not in str(err.value)


def test_the_crops_are_keyed_by_epoch_and_batch_not_by_the_thread(root: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ahead, inline = (build_decoded_loaders(root, SPEC, cache=cache, prefetch_batches=n)[0] for n in (2, 0))
    one, other = _batches(ahead, 1), _batches(inline, 1)
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(one, other))
    assert not torch.equal(one[0][0], _batches(inline, 2)[0][0])  # another epoch, other crops
    # three augmenting threads hand over the same batches in the same order, train and val, and
    # a pass ended early leaves the next pass whole
    threaded = build_decoded_loaders(root, replace(SPEC, workers=3), cache=cache)
    assert threaded[0].threads == 3
    val = _batches(build_decoded_loaders(root, SPEC, cache=cache)[1])
    for got, want in ((_batches(threaded[0], 1), one), (_batches(threaded[1]), val)):
        assert len(got) == len(want) >= 3
        assert all(torch.equal(x, y) and torch.equal(a, b) for (x, a), (y, b) in zip(got, want))
    threaded[0].set_epoch(1)
    next(iter(threaded[0]))
    assert all(torch.equal(x, y) for (x, _), (y, _) in zip(_batches(threaded[0], 1), one))
    # two ranks read disjoint halves of one permutation, and draw crops of their own
    ranks = [build_decoded_loaders(root, replace(SPEC, rank=r, world_size=2), cache=cache)[0] for r in (0, 1)]
    parts = [r.sampler.part() for r in ranks]
    assert not set(parts[0]) & set(parts[1]) and len(parts[0]) == len(parts[1]) == 12
    first = [ranks[r].batch([0, 1, 2, 3], 0, 0)[0] for r in (0, 1)]
    assert not torch.equal(first[0], first[1])


def test_evaluation_crops_are_torchvisions_every_image_once(root: Path, tmp_path: Path) -> None:
    """Square images: the store's shorter-side resize is PIL's, the centre crop a slice, so the
    batches equal the torchvision loader's, pixel for pixel; over 2 ranks every image once."""
    from largebatch.data.pipelines.torchvision import build_loaders

    _, val, _ = build_decoded_loaders(root, SPEC, cache=tmp_path / "cache")
    _, reference, _ = build_loaders(root, replace(SPEC, workers=0))
    ours, theirs = _batches(val), _batches(reference)
    assert torch.equal(torch.cat([y for _, y in ours]), torch.cat([y for _, y in theirs]))
    assert torch.allclose(torch.cat([x for x, _ in ours]), torch.cat([x for x, _ in theirs]), atol=1e-5)
    halves = [build_decoded_loaders(root, replace(SPEC, rank=r, world_size=2, val_batch_size=2),
                                    cache=tmp_path / "cache")[1] for r in (0, 1)]
    counts = [sum(len(y) for _, y in _batches(h)) for h in halves]
    assert counts == [5, 4]  # 9 images: each once


def test_progressive_resizing_cuts_each_epoch_at_its_side(root: Path, tmp_path: Path) -> None:
    spec = replace(SPEC, train_sizes=ResolutionSchedule("steps", steps=((0, 8), (1, 16))), eval_follows_train=True)
    train, val, _ = build_decoded_loaders(root, spec, cache=tmp_path / "cache")
    assert train.store.side == 24 and val.store.side == 18  # 1.5 x the largest side; 16 / 0.875
    for epoch, side in ((0, 8), (1, 16)):
        assert _batches(train, epoch)[0][0].shape[-1] == side
        assert {x.shape[-1] for x, _ in _batches(val, epoch)} == {side}


def test_a_cache_it_cannot_write_is_one_line_exit_74(root: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from largebatch.data.build import build_run_loaders
    from largebatch.errors import WriteError, exit_code

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "file"))
    backend = SimpleNamespace(name="cpu", is_main=True, barrier=lambda: None)
    with pytest.raises(WriteError) as err:
        build_run_loaders(root, SPEC, loader="decoded", shards=None, backend=backend)
    assert str(err.value).startswith(f"cannot write the decoded store {tmp_path / 'file'}/decoded-")
    assert str(err.value).endswith(f"[Errno 17 EEXIST] File exists ({tmp_path / 'file'} is a file); set "
                                   "LARGEBATCH_CACHE to a writable folder")
    assert "\n" not in str(err.value) and exit_code(err.value) == 74


def test_a_run_trains_from_the_store_and_resumes_mid_epoch_bit_for_bit(cache: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """One run of 8 steps (2 epochs of 4) checkpointing every step, 2 augmenting threads; a copy
    of it cut back to its step-5 checkpoint resumes on 1 (from the store the first run built)
    and ends with its weights."""
    from largebatch.cli import main
    from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint
    from tests.smoke import EXACT

    args = [*EXACT, "data.loader=decoded", "checkpoint.every_steps=1"]
    run = cache / "run"
    assert main([*args, "data.workers=2", f"run_dir={run}"]) == 0
    out = capsys.readouterr().out
    assert "batched crops on cpu, 2 batches at once in background threads, NCHW" in out
    built = [line for line in out.splitlines() if "decoded store: " in line]
    # the images' 48 px capped at 1.5 x the 16 px crops; 16 / 0.875 for evaluation
    assert len(built) == 1 and "32 train images at 24 px (55.3 kB) + 8 val images at 18 px (7.8 kB)" in built[0]
    assert "decoded train, val once" in built[0]
    straight = list_checkpoints(run / "checkpoints")
    assert load_checkpoint(straight[-1])["train_state"]["step"] == 8
    resumed = cache / "resumed"
    shutil.copytree(run, resumed)
    for path in list_checkpoints(resumed / "checkpoints"):
        if load_checkpoint(path)["train_state"]["step"] > 5:
            path.unlink()
    assert main([*args, f"run_dir={resumed}", "resume=auto"]) == 0
    out = capsys.readouterr().out
    assert "decoded by an earlier run" in out and "one batch at a time in a background thread" in out
    a, b = load_checkpoint(straight[-1])["model"], load_checkpoint(list_checkpoints(resumed / "checkpoints")[-1])
    assert b["train_state"]["step"] == 8
    different = [k for k in a if not torch.equal(a[k], b["model"][k])]
    assert not different, f"{len(different)} tensors differ after the resume, e.g. {different[:3]}"


def _cpu_host() -> object:
    from types import SimpleNamespace

    return SimpleNamespace(name="cpu", is_main=True, barrier=lambda: None, broadcast_object=lambda obj: obj)


def test_auto_on_a_cpu_host_reads_the_store_that_fits_and_says_why(root: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Item 4: ``data.loader=auto`` on the CPU backend reads from the decoded store when it is
    built already or takes at most half the cache's free space; a cache without that room, or
    ``rect_val`` (the torchvision loader's), keeps the loader auto chose before, the log saying why."""
    import logging
    import shutil as shutil_module
    from collections import namedtuple

    from largebatch.data.build import build_run_loaders
    from largebatch.data.pipelines.decoded import DecodedLoader

    caplog.set_level(logging.INFO, logger="largebatch")
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    train, _, _ = build_run_loaders(root, SPEC, loader="auto", shards=None, backend=_cpu_host())
    assert isinstance(train, DecodedLoader)
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.loader=auto")]
    assert len(notes) == 1 and notes[0].startswith(
        "data.loader=auto: reading with the decoded store, the fastest input on a CPU host: the images are decoded "
        "once into 50.2 kB of the "), notes
    assert notes[0].endswith(f" free in {tmp_path}")  # the cache folder does not exist yet: its parent's disk

    caplog.clear()
    build_run_loaders(root, SPEC, loader="auto", shards=None, backend=_cpu_host())
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.loader=auto")] == [
        f"data.loader=auto: reading with the decoded store (50.2 kB in {tmp_path / 'cache'}, built by an earlier "
        "run), the fastest input on a CPU host"]

    # a nearly full disk: 60 kB free, and the 50.2 kB stores would take more than half
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil_module, "disk_usage", lambda path: usage(10**9, 10**9 - 60_000, 60_000))
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "full"))
    caplog.clear()
    train, _, _ = build_run_loaders(root, SPEC, loader="auto", shards=None, backend=_cpu_host())
    assert not isinstance(train, DecodedLoader)
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.loader=auto")]
    assert notes[0] == (f"data.loader=auto: not the decoded store: it would take 50.2 kB of the 60.0 kB free in "
                        f"{tmp_path} (auto takes at most half); set LARGEBATCH_CACHE to a folder with room for it, "
                        "or data.loader=decoded to build it anyway")
    assert not (tmp_path / "full").exists()

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))  # built, but rect_val is torchvision's
    caplog.clear()
    train, _, _ = build_run_loaders(root, replace(SPEC, rect_val=True), loader="auto", shards=None,
                                    backend=_cpu_host())
    assert not isinstance(train, DecodedLoader)
    assert not [r for r in caplog.records if "decoded store" in r.getMessage()]


def test_a_run_after_the_first_lists_each_split_once(root: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.loader=auto`` with the stores built (every run after the first): rank 0 plans from
    the stores' headers and opens each store once, so each split is listed once, by the check that
    its files have not changed since the store was built. It was listed three times (the plan, the
    build step's open, the loaders' open): on ImageNet each listing walks 1.28M files."""
    from largebatch.data import images
    from largebatch.data.build import build_run_loaders

    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    build_run_loaders(root, SPEC, loader="auto", shards=None, backend=_cpu_host())  # the first run builds them
    listed: list[str] = []
    real = images.list_class_images

    def counted(split_dir, *args, **kwargs):  # type: ignore[no-untyped-def]
        listed.append(Path(split_dir).name)
        return real(split_dir, *args, **kwargs)

    monkeypatch.setattr(images, "list_class_images", counted)
    train, val, classes = build_run_loaders(root, SPEC, loader="auto", shards=None, backend=_cpu_host())
    assert sorted(listed) == ["train", "val"]
    assert (len(train.store), len(val.store), classes) == (24, 9, 3)


def test_auto_builds_no_store_of_images_upscaled_far_past_their_side(root: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Issue 90 case 3: ``auto`` decoded 36 px images into a store at 1024 px (534 MB of upscaled
    copies) and the run then ran out of memory at its first step. A store side more than
    SIDE_ABOVE_IMAGES times the images' longest side is not auto's choice: torchvision reads, the
    log says why, nothing is written to the cache; data.loader=decoded still builds it."""
    import logging
    from dataclasses import replace

    from largebatch.data.build import build_run_loaders
    from largebatch.data.pipelines.decoded import DecodedLoader

    caplog.set_level(logging.INFO, logger="largebatch")
    monkeypatch.setenv("LARGEBATCH_CACHE", str(tmp_path / "cache"))
    train, _, _ = build_run_loaders(root, replace(SPEC, image_size=256), loader="auto", shards=None,
                                    backend=_cpu_host())
    assert not isinstance(train, DecodedLoader)
    (note,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("data.loader=auto: not the decoded")]
    # the evaluation store's side: 256 / 0.875
    assert note.startswith("data.loader=auto: not the decoded store: it would hold the images at 293 px, 9.2x their "
                           "longest side (32 px, sampled)") and note.endswith("data.loader=decoded builds it anyway")
    assert not (tmp_path / "cache").exists()
