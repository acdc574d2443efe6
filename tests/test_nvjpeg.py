"""The nvJPEG input path (``data.loader=nvjpeg``) run on the CPU: decode routing, crops,
sharding and order, exact evaluation, resume skip, bad files, batches on the device."""

from __future__ import annotations

import io
import logging
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from PIL import Image

from largebatch.backends.torch_dist import TorchDistributedBackend
from largebatch.data.pipelines import nvjpeg as nv
from largebatch.data.background import in_background
from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines.torchvision import build_loaders
from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders, cpu_decode_reason, jpeg_frame
from largebatch.data.synthetic import make_synthetic_imagenet
from largebatch.data.augment import CropRecipe, centre_crop_box, centre_crop_boxes, crop_table
from largebatch.data.crop_boxes import random_resized_crop_boxes
from largebatch.errors import DataError

SMALL = dict(num_classes=3, train_per_class=8, val_per_class=3, image_size=40)
LOADER = LoaderSpec(image_size=24, batch_size=4, workers=0, device="cpu")


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("nvjpeg") / "ds", **SMALL)


@pytest.fixture
def copy_root(data_root: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(data_root, tmp_path / "ds"))


def _encoded(mode: str = "RGB", fmt: str = "JPEG", size: tuple[int, int] = (40, 30)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 10)).convert(mode).save(buf, format=fmt, quality=90)
    return buf.getvalue()


def _epoch(loader: nv.NvjpegLoader, epoch: int, skip: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch, skip_batches=skip)
    return list(loader)


# -- routing: what nvJPEG takes and what goes to the CPU -------------------------------


def test_jpeg_frame_reads_size_and_components() -> None:
    assert jpeg_frame(_encoded(size=(41, 23))) == (23, 41, 3)
    assert jpeg_frame(_encoded("L")) == (30, 40, 1)
    assert jpeg_frame(_encoded("CMYK")) == (30, 40, 4)
    assert jpeg_frame(_encoded(fmt="PNG")) is None


def test_cpu_decode_reason() -> None:
    good = _encoded()
    assert cpu_decode_reason(good) is None
    assert cpu_decode_reason(_encoded("L")) is None  # nvJPEG decodes grayscale to RGB
    assert cpu_decode_reason(_encoded("CMYK")) == "CMYK/YCCK JPEG"
    assert cpu_decode_reason(_encoded(fmt="PNG")) == "PNG data, not a JPEG"
    assert "end-of-image" in cpu_decode_reason(good[: len(good) // 2])
    assert cpu_decode_reason(b"<html>not found</html>") == "not a JPEG"


# -- augmentation geometry -------------------------------------------------------------


def test_random_resized_crops_of_images_of_many_sizes_follow_scale_and_ratio() -> None:
    sizes = torch.tensor([[375, 500], [500, 375], [10, 1000], [64, 48]]).repeat(75, 1)
    top, left, h, w = random_resized_crop_boxes(len(sizes), sizes[:, 0], sizes[:, 1], scale=(0.25, 1.0),
                                                ratio=(3 / 4, 4 / 3), generator=torch.Generator().manual_seed(0)).T
    assert ((top >= 0) & (top <= sizes[:, 0] - h) & (left >= 0) & (left <= sizes[:, 1] - w)).all()
    fits = sizes[:, 0] != 10
    area = (h * w / (sizes[:, 0] * sizes[:, 1]))[fits]
    assert ((area >= 0.24) & (area <= 1.01)).all()
    assert ((w / h)[fits] >= 3 / 4 - 0.05).all() and ((w / h)[fits] <= 4 / 3 + 0.05).all()
    # a 1000x10 strip never fits the ratio: the centre crop fallback at the widest ratio
    assert (torch.stack([top, left, h, w], 1)[~fits] == torch.tensor([0, 493, 10, 13])).all()


def test_a_batch_of_crops_is_a_function_of_its_generator_seed() -> None:
    sizes = torch.tensor([[375, 500], [500, 375], [30, 40]]).repeat(8, 1)
    table = lambda seed: crop_table(sizes, CropRecipe(24), train=True,  # noqa: E731
                                    generator=torch.Generator().manual_seed(seed))
    assert torch.equal(table(3), table(3))
    assert not torch.equal(table(3), table(4))
    with pytest.raises(ValueError, match="generator"):
        crop_table(sizes, CropRecipe(24), train=True)


def test_centre_crop_box_is_torchvision_resize_then_centre_crop() -> None:
    # 500x375 landscape at 224 / 0.875: shorter side 256, longer int(256 * 500 / 375) = 341
    assert centre_crop_box(375, 500, 224, 0.875) == ((256, 341), 16, 58)
    assert centre_crop_box(500, 375, 224, 0.875) == ((341, 256), 58, 16)
    # the batched form is the same arithmetic, size by size
    sizes = [(375, 500), (500, 375), (1, 7), (333, 333), (17, 9), (600, 120), (479, 640)]
    for size, ratio in ((224, 0.875), (24, 0.875), (160, 0.95)):
        resized, offsets = centre_crop_boxes(torch.tensor(sizes), size, ratio)
        assert [((r[0], r[1]), o[0], o[1]) for r, o in zip(resized.tolist(), offsets.tolist())] == [
            centre_crop_box(h, w, size, ratio) for h, w in sizes]


def test_constant_image_normalises_like_the_torchvision_transform(tmp_path: Path) -> None:
    for split in ("train", "val"):
        (tmp_path / split / "a").mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (50, 37), (10, 200, 30)).save(tmp_path / split / "a" / f"{i}.JPEG", quality=100)
    train, val, n = build_nvjpeg_loaders(tmp_path, LOADER)
    assert n == 1
    for loader in (train, val):
        (images, labels), = _epoch(loader, 0)
        expected = torch.tensor([(c / 255 - m) / s for c, m, s in zip((10, 200, 30), nv.IMAGENET_DEFAULT_MEAN,
                                                                      nv.IMAGENET_DEFAULT_STD)])
        assert images.shape == (4, 3, 24, 24) and labels.tolist() == [0] * 4
        assert torch.allclose(images.mean(dim=(0, 2, 3)), expected, atol=0.02)


# -- the loader against the torchvision loader -----------------------------------------


def test_val_batches_match_the_torchvision_loader(data_root: Path) -> None:
    """Same files, order and geometry: only the resize kernels differ (tensor vs Pillow)."""
    _, val, _ = build_nvjpeg_loaders(data_root, LOADER)
    _, reference, _ = build_loaders(data_root, LoaderSpec(image_size=24, batch_size=4, workers=0))
    ours, theirs = _epoch(val, 0), list(reference)
    assert len(ours) == len(theirs) == 3  # 9 val images, batch 4: 4 + 4 + 1, nothing dropped
    for (a, la), (b, lb) in zip(ours, theirs):
        assert torch.equal(la, lb)
        assert (a - b).abs().mean() < 0.02 and (a - b).abs().max() < 0.1


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_same_rank_parts_and_order_as_the_torchvision_loader(data_root: Path, world_size: int) -> None:
    seen_val = []
    for rank in range(world_size):
        spec = LoaderSpec(image_size=24, batch_size=2, workers=0, rank=rank, world_size=world_size, seed=5)
        train, val, _ = build_nvjpeg_loaders(data_root, spec)
        ref_train, ref_val, _ = build_loaders(data_root, spec)
        for epoch in (0, 1):
            ref_train.set_epoch(epoch)
            train.set_epoch(epoch)
            # the torchvision sampler yields (index, epoch): its data set seeds each crop from them
            assert list(train.sampler) == [i for i, _ in ref_train.sampler]
            labels = [y for _, y in train]
            assert len(labels) == len(ref_train)
            assert torch.equal(torch.cat(labels), torch.cat([y for _, y in ref_train]))
        seen_val += list(val.sampler)
        assert sum(len(y) for _, y in val) == len(val.sampler)  # exact: no padding
    assert sorted(seen_val) == list(range(9))  # every val image once over the ranks


def test_batches_do_not_depend_on_workers(data_root: Path) -> None:
    one = _epoch(build_nvjpeg_loaders(data_root, LOADER)[0], 1)
    two = _epoch(build_nvjpeg_loaders(data_root, replace(LOADER, workers=2))[0], 1)
    assert len(one) == len(two) == 6
    for (a, la), (b, lb) in zip(one, two):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_resume_skip_yields_the_uninterrupted_batches(data_root: Path) -> None:
    train = build_nvjpeg_loaders(data_root, LOADER)[0]
    full = _epoch(train, 3)
    resumed = _epoch(build_nvjpeg_loaders(data_root, LOADER)[0], 3, skip=2)
    assert len(resumed) == len(full) - 2
    for (a, la), (b, lb) in zip(full[2:], resumed):
        assert torch.equal(a, b) and torch.equal(la, lb)
    other_epoch = _epoch(train, 4)
    assert not torch.equal(other_epoch[0][0], full[0][0])  # new shuffle and new crops


def test_dtype_and_channels_last(data_root: Path) -> None:
    train, val, _ = build_nvjpeg_loaders(data_root, replace(LOADER, dtype=torch.bfloat16, channels_last=True))
    for loader in (train, val):
        images, labels = _epoch(loader, 0)[0]
        assert images.dtype == torch.bfloat16 and labels.dtype == torch.int64
        assert images.is_contiguous(memory_format=torch.channels_last)


def test_device_batches_are_not_copied_again_by_the_backend(data_root: Path) -> None:
    backend = TorchDistributedBackend("cpu")
    train = build_nvjpeg_loaders(data_root, replace(LOADER, channels_last=True))[0]
    train.set_epoch(0)
    raw = next(iter(train))
    wrapped = next(iter(backend.wrap_loader(train, channels_last=True)))
    assert torch.equal(raw[0], wrapped[0])
    batch = train.assemble(next(iter(train.loader)), 0)
    moved = backend.to_device(batch, channels_last=True)
    assert moved[0] is batch[0] and moved[1] is batch[1]


# -- bad files -------------------------------------------------------------------------


def _plant_bad_files(root: Path) -> dict[str, Path]:
    """Turn four val files (and the same four train files) into the oddities of ImageNet."""
    planted = {}
    for split in ("train", "val"):
        files = sorted((root / split).rglob("*.JPEG"))
        png, cmyk, truncated, empty = files[0], files[2], files[4], files[7]
        Image.open(png).convert("RGB").save(png, format="PNG")
        Image.open(cmyk).convert("CMYK").save(cmyk, format="JPEG")
        truncated.write_bytes(truncated.read_bytes()[:200])
        empty.write_bytes(b"")
        if split == "val":
            planted = {"png": png, "cmyk": cmyk, "truncated": truncated, "empty": empty}
    return planted


def test_bad_files_are_decoded_on_the_cpu_or_skipped(copy_root: Path, caplog: pytest.LogCaptureFixture) -> None:
    planted = _plant_bad_files(copy_root)
    train, val, _ = build_nvjpeg_loaders(copy_root, LOADER)
    with caplog.at_level(logging.WARNING, logger="largebatch.data.pipelines.nvjpeg"):
        batches = _epoch(val, 0)
    assert sum(len(y) for _, y in batches) == 9 - 2
    assert val.skipped == 2 and val.cpu_decoded == 2
    log = caplog.text
    assert f"decoding {planted['png']} on the CPU: PNG data" in log
    assert f"decoding {planted['cmyk']} on the CPU: CMYK" in log
    assert f"skipping unreadable image {planted['truncated']}" in log
    assert f"skipping unreadable image {planted['empty']}: empty file" in log
    # the CPU-decoded images are the torchvision loader's images
    _, reference, _ = build_loaders(copy_root, LoaderSpec(image_size=24, batch_size=4, workers=0))
    ref = list(reference)
    assert reference.skipped == 2
    for (a, la), (b, lb) in zip(batches, ref):
        assert torch.equal(la, lb) and (a - b).abs().mean() < 0.02
    # training keeps full batches whatever it skips
    for epoch in (0, 1):
        assert all(len(y) == 4 for _, y in _epoch(train, epoch))
    assert train.skipped > 0


def test_a_file_the_gpu_decoder_rejects_is_decoded_with_pillow(
    data_root: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """nvJPEG refuses some JPEGs that libjpeg reads (e.g. unusual sampling factors): the file
    is retried alone, then decoded by Pillow; the rest of the batch stays on the device path.
    The device decoder here is the real one, refusing the one file a real nvJPEG might."""
    _, val, _ = build_nvjpeg_loaders(data_root, LOADER)
    reference = _epoch(val, 0)
    refused = Path(val.dataset.samples[1][0]).read_bytes()
    real = nv.decode_jpeg

    def refusing(data, **kw):  # type: ignore[no-untyped-def]
        batch = data if isinstance(data, list) else [data]
        if any(d.numel() == len(refused) and bytes(d.numpy()) == refused for d in batch):
            raise RuntimeError("nvjpegDecode failed: NVJPEG_STATUS_JPEG_NOT_SUPPORTED")
        return real(data, **kw)

    monkeypatch.setattr(nv, "decode_jpeg", refusing)
    with caplog.at_level(logging.WARNING, logger="largebatch.data.pipelines.nvjpeg"):
        batches = _epoch(val, 0)
    assert val.cpu_decoded == 1 and val.skipped == 0
    assert "on the CPU: decode_jpeg on cpu failed on it" in caplog.text
    for (a, la), (b, lb) in zip(batches, reference):
        assert torch.equal(la, lb) and (a - b).abs().max() < 0.1


def test_a_jpeg_neither_decoder_reads_is_skipped(copy_root: Path) -> None:
    victim = sorted((copy_root / "val").rglob("*.JPEG"))[3]
    data = bytearray(victim.read_bytes())
    start = data.index(b"\xff\xda")  # start of scan
    data[start:start + 2] = b"\xff\x00"  # the scan header is gone: markers intact, data invalid
    victim.write_bytes(bytes(data))
    assert cpu_decode_reason(bytes(data)) is None  # looks like a JPEG: goes to the device decoder
    _, val, _ = build_nvjpeg_loaders(copy_root, LOADER)
    assert sum(len(y) for _, y in _epoch(val, 0)) == 8 and val.skipped == 1


def test_a_training_batch_of_unreadable_files_is_an_error(copy_root: Path) -> None:
    for path in (copy_root / "train").rglob("*.JPEG"):
        path.write_bytes(b"")
    train, _, _ = build_nvjpeg_loaders(copy_root, LOADER)
    with pytest.raises(DataError, match="all 4 images of a training batch are unreadable"):
        _epoch(train, 0)


def test_missing_folders_and_bad_crop_ratio(tmp_path: Path, data_root: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        build_nvjpeg_loaders(tmp_path / "nope", LOADER)
    with pytest.raises(ValueError, match="val_crop_ratio"):
        build_nvjpeg_loaders(data_root, replace(LOADER, val_crop_ratio=1.5))


# -- background decode -----------------------------------------------------------------


@pytest.mark.parametrize("overlap", [True, False])
def test_background_decode_gives_the_same_batches(data_root: Path, overlap: bool) -> None:
    inline = _epoch(build_nvjpeg_loaders(data_root, LOADER, prefetch_batches=0)[0], 2)
    ahead = _epoch(build_nvjpeg_loaders(data_root, LOADER, prefetch_batches=2, overlap=overlap)[0], 2)
    assert len(inline) == len(ahead) == 6
    for (a, la), (b, lb) in zip(inline, ahead):
        assert torch.equal(a, b) and torch.equal(la, lb)


@pytest.mark.parametrize("overlap", [True, False])
def test_the_stage_times_say_where_each_batch_went(data_root: Path, overlap: bool) -> None:
    """Per batch: the stream wait, the decode, the augmentation (host), the producer's time ahead
    and the consumer's wait; each non-negative, the decode and augmentation not zero."""
    train = build_nvjpeg_loaders(data_root, LOADER, prefetch_batches=2, overlap=overlap)[0]
    assert len(_epoch(train, 0)) == 6
    counts = train.stage_times.counts
    assert counts["decode"] == counts["device_wait"] == counts["augment"] == counts["data_wait"] == 6
    times = train.stage_times.per_batch_ms()
    assert {"device_wait", "decode", "augment", "ahead", "data_wait"} <= set(times)
    assert all(ms >= 0 for ms in times.values()) and times["decode"] > 0 and times["augment"] > 0
    train.stage_times.reset()
    assert train.stage_times.per_batch_ms() == {}


def test_leaving_an_epoch_early_stops_the_decode_thread(data_root: Path) -> None:
    import threading

    train = build_nvjpeg_loaders(data_root, LOADER)[0]
    train.set_epoch(0)
    batches = iter(train)
    next(batches)
    names = {"nvjpeg-decode", "nvjpeg-augment"}
    assert names <= {t.name for t in threading.enumerate()}  # decode and augmentation overlap
    batches.close()  # what dropping the iterator does (the loop stopping at max_steps)
    assert not names & {t.name for t in threading.enumerate()}


def test_an_error_in_the_decode_thread_reaches_the_consumer() -> None:
    def failing():  # type: ignore[no-untyped-def]
        yield 1
        raise DataError("bad batch")

    got = []
    with pytest.raises(DataError, match="bad batch"):
        for item in in_background(failing, 1):
            got.append(item)
    assert got == [1]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_new_epoch_ends_the_unfinished_one(data_root: Path, workers: int) -> None:
    """The loop starts epoch e+1 while epoch e's iterator is still alive (persistent workers
    share one DataLoader iterator): the new pass must not race with the old one's thread."""
    import threading

    reference = _epoch(build_nvjpeg_loaders(data_root, replace(LOADER, workers=workers))[0], 1)
    train = build_nvjpeg_loaders(data_root, replace(LOADER, workers=workers))[0]
    train.set_epoch(0)
    old = iter(train)
    next(old)
    train.set_epoch(1)
    new = list(train)
    assert not {"nvjpeg-decode", "nvjpeg-augment"} & {t.name for t in threading.enumerate()}
    assert len(new) == len(reference)
    for (a, la), (b, lb) in zip(new, reference):
        assert torch.equal(a, b) and torch.equal(la, lb)
    assert next(old, None) is None  # the old pass was ended


# -- one buffer per batch --------------------------------------------------------------


def test_collate_joins_the_bytes_into_one_buffer_and_keeps_the_rest() -> None:
    jpegs = [_encoded(size=(40 + k, 30)) for k in range(3)]
    png = nv._pil_decode(_encoded(fmt="PNG"))
    samples = [
        nv.EncodedSample(10, 0, "a", torch.frombuffer(bytearray(jpegs[0]), dtype=torch.uint8)),
        nv.EncodedSample(11, 1, "b", png, cpu_reason="PNG data, not a JPEG"),
        nv.EncodedSample(12, 2, "c", None, error="empty file"),
        nv.EncodedSample(13, 1, "d", torch.frombuffer(bytearray(jpegs[1]), dtype=torch.uint8)),
        nv.EncodedSample(14, 0, "e", torch.frombuffer(bytearray(jpegs[2]), dtype=torch.uint8)),
    ]
    batch = nv.collate_encoded(samples)
    assert batch.on_device == [0, 3, 4] and len(batch) == 5
    assert batch.data.dtype == torch.uint8 and batch.data.numel() == sum(map(len, jpegs))
    assert batch.offsets == [0, len(jpegs[0]), len(jpegs[0]) + len(jpegs[1]), sum(map(len, jpegs))]
    assert [bytes(t.numpy()) for t in batch.encoded()] == jpegs
    assert all(t.untyped_storage().data_ptr() == batch.data.untyped_storage().data_ptr() for t in batch.encoded())
    assert batch.labels.tolist() == [0, 1, 2, 1, 0] and batch.labels.dtype == torch.int64
    assert [s.dataset_index for s in batch.samples] == [10, 11, 12, 13, 14]
    assert batch.samples[1].payload is png and batch.samples[1].cpu_reason == "PNG data, not a JPEG"
    assert batch.samples[2].error == "empty file" and batch.samples[0].payload is None


def test_workers_hand_over_one_buffer_per_batch(data_root: Path) -> None:
    train, val, _ = build_nvjpeg_loaders(data_root, replace(LOADER, workers=2))
    assert train.prefetch_batches >= 2 and train.loader.prefetch_factor == 2  # >= 2 batches ahead
    train.set_epoch(0)
    for batch in train.loader:
        assert isinstance(batch, nv.EncodedBatch) and len(batch) == 4
        files = [Path(train.dataset.samples[batch.samples[k].dataset_index][0]).read_bytes() for k in batch.on_device]
        assert batch.data.numel() == sum(map(len, files)) and batch.data.is_shared()  # one shared tensor
        assert [bytes(t.numpy()) for t in batch.encoded()] == files
        assert all(batch.samples[k].payload is None for k in batch.on_device)


# -- issue 43 case 8: EXIF orientation, the same image whichever loader reads it ----------------
def _exif_jpeg(orientation: int) -> bytes:
    """A 20-high, 40-wide JPEG, white on its left half, tagged with ``orientation``."""
    import numpy as np

    pixels = np.zeros((20, 40, 3), np.uint8)
    pixels[:, :20] = 255
    exif = Image.Exif()
    exif[0x0112] = orientation
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "JPEG", quality=95, exif=exif.tobytes())
    return buf.getvalue()


@pytest.mark.parametrize("orientation", [3, 6, 8])
def test_every_loader_turns_an_exif_rotated_jpeg_upright(tmp_path: Path, orientation: int) -> None:
    """Orientation 6 was applied by DALI and not by the torchvision or nvjpeg loaders. Now the
    torchvision loader (Pillow, load_rgb) and nvjpeg (which sends such a file to Pillow) give
    what torchvision's decode_jpeg(apply_exif_orientation=True), like DALI's decoder, gives."""
    from torchvision.io import ImageReadMode, decode_jpeg

    from largebatch.data.images import load_rgb
    from largebatch.data.pipelines.nvjpeg import EncodedImageFolder, cpu_decode_reason, jpeg_exif_orientation

    data = _exif_jpeg(orientation)
    path = tmp_path / "photo.JPEG"
    path.write_bytes(data)
    upright = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                          apply_exif_orientation=True)
    assert upright.shape[1:] == ((20, 40) if orientation == 3 else (40, 20))
    assert jpeg_exif_orientation(data) == orientation
    assert cpu_decode_reason(data) == f"EXIF orientation {orientation}"
    pil = torch.from_numpy(__import__("numpy").asarray(load_rgb(str(path)))).permute(2, 0, 1)
    sample = EncodedImageFolder([(str(path), 0)])[0]
    assert sample.cpu_reason == f"EXIF orientation {orientation}" and sample.payload is not None
    for image in (pil, sample.payload):
        assert image.shape == upright.shape
        assert (image.int() - upright.int()).abs().max() <= 2  # the same decoder (libjpeg-turbo)
    plain = _exif_jpeg(1)
    assert jpeg_exif_orientation(plain) == 1 and cpu_decode_reason(plain) is None  # upright: nvJPEG's


def test_dali_turns_an_exif_rotated_jpeg_upright_too(tmp_path: Path) -> None:
    """The behaviour the other loaders now match: DALI's image decoder applies the orientation."""
    pytest.importorskip("nvidia.dali")
    import numpy as np
    from nvidia.dali import fn, pipeline_def, types

    path = tmp_path / "photo.JPEG"
    path.write_bytes(_exif_jpeg(6))

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def decode() -> object:
        encoded, _ = fn.readers.file(files=[str(path)], labels=[0])
        return fn.decoders.image(encoded, device="cpu", output_type=types.RGB)

    pipe = decode()
    pipe.build()
    (out,) = pipe.run()
    assert np.array(out.as_tensor()).shape == (1, 40, 20, 3)
