"""The input pipelines' GPU-only lines, run on a CPU with CUDA's device calls stood in for
(tests/cuda_standin.py): nvJPEG's stream handling and pinned copies, the batched resize's
pinned plan table, LoaderSpec's GPU index, DALI's mixed-decode graphs and the DALI loaders'
pipelines (defined for device 0, which DALI checks on a CPU; building them needs a GPU)."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch
import torchvision.io
from PIL import Image
from torch.utils.data import DataLoader

from largebatch.data.augment import CropRecipe, augment_batch
from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines import nvjpeg as nv
from tests.cuda_standin import CudaStandIn

CUDA = torch.device("cuda", 0)


def _image_bytes(colour: tuple[int, int, int], size: tuple[int, int], fmt: str = "JPEG") -> bytes:
    buf = io.BytesIO()
    image = Image.new("RGB", size, colour)
    image.paste((255 - colour[0], colour[1], 90), (0, 0, size[0] // 2, size[1] // 3))  # not uniform
    image.save(buf, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return buf.getvalue()


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8)


def _nvjpeg_on_the_cpu(cuda: CudaStandIn, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvJPEG's batched decode, stood in for by libjpeg's (the one call that needs the GPU)."""
    def decode(data, *, mode, device):  # type: ignore[no-untyped-def]
        cuda.log.append(("decode", torch.device(device), len(data) if isinstance(data, list) else 1))
        return torchvision.io.decode_jpeg(data, mode=mode, device="cpu")

    monkeypatch.setattr(nv, "decode_jpeg", decode)


# -- nvjpeg.decode_images: the current stream is finished before each nvJPEG call -----------------


def test_the_current_stream_is_finished_before_the_batched_nvjpeg_decode(monkeypatch: pytest.MonkeyPatch) -> None:
    files = [_as_tensor(_image_bytes((200, 30, 10), (40, 30))), _as_tensor(_image_bytes((10, 90, 200), (24, 36)))]
    expected = nv.decode_images(files, torch.device("cpu"))
    cuda = CudaStandIn(monkeypatch)
    _nvjpeg_on_the_cpu(cuda, monkeypatch)
    decoded = nv.decode_images(files, CUDA)
    assert cuda.log == [("record", "event1", "default"), ("synchronize", "event1"), ("decode", CUDA, 2)]
    assert len(decoded) == 2 and all(torch.equal(a, b) for a, b in zip(decoded, expected))


def test_after_a_failed_batch_each_file_is_decoded_alone_after_its_own_stream_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    good = _as_tensor(_image_bytes((200, 30, 10), (40, 30)))
    broken = _as_tensor(b"\xff\xd8\xff\xe0" + bytes(64) + b"\xff\xd9")  # looks like a JPEG, decodes as none
    cuda = CudaStandIn(monkeypatch)
    _nvjpeg_on_the_cpu(cuda, monkeypatch)
    decoded = nv.decode_images([good, broken], CUDA)
    assert decoded[1] is None and torch.equal(decoded[0], torchvision.io.decode_jpeg(good))
    waits = [("record", "default"), ("synchronize",)]
    assert [(e[0], *e[2:]) if e[0] == "record" else e[:1] if e[0] == "synchronize" else e for e in cuda.log] == [
        *waits, ("decode", CUDA, 2), *waits, ("decode", CUDA, 1), *waits, ("decode", CUDA, 1)]
    # three distinct events, each recorded then synchronized before its decode
    assert [e[1] for e in cuda.calls("record")] == ["event1", "event2", "event3"]


# -- NvjpegLoader.assemble on a CUDA device ------------------------------------------------------


def _encoded_batch(tmp_path: Path) -> tuple[DataLoader, nv.EncodedBatch]:
    files = [("a.JPEG", _image_bytes((200, 30, 10), (40, 30)), 0),
             ("b.JPEG", _image_bytes((30, 160, 90), (36, 44), fmt="PNG"), 1),  # ImageNet's PNG named .JPEG
             ("c.JPEG", _image_bytes((10, 90, 200), (48, 32)), 1)]
    samples = []
    for name, data, label in files:
        (tmp_path / name).write_bytes(data)
        samples.append((str(tmp_path / name), label))
    dataset = nv.EncodedImageFolder(samples, ["a", "b"], str(tmp_path))
    loader = DataLoader(dataset, batch_size=3, collate_fn=nv.collate_encoded)
    return loader, nv.collate_encoded([dataset[i] for i in range(3)])


def test_a_batch_assembled_on_cuda_pins_its_host_parts_and_equals_the_cpu_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The PNG (decoded by Pillow in the worker) and the labels are pinned before their
    non-blocking copies; the two JPEGs go to nvJPEG in one call after the stream wait; the
    batch is the CPU loader's (the batched augmentation gives the per-image crops)."""
    loader, batch = _encoded_batch(tmp_path)
    assert batch.on_device == [0, 2] and batch.samples[1].cpu_reason == "PNG data, not a JPEG"
    spec = LoaderSpec(image_size=24, batch_size=3, workers=0, device="cpu", seed=5)
    cpu_images, cpu_labels = nv.NvjpegLoader(loader, spec, train=True, prefetch_batches=0).assemble(batch, 2)

    cuda = CudaStandIn(monkeypatch)
    _nvjpeg_on_the_cpu(cuda, monkeypatch)
    on_cuda = nv.NvjpegLoader(loader, LoaderSpec(image_size=24, batch_size=3, workers=0, device=CUDA, seed=5),
                              train=True, prefetch_batches=0)
    images, labels = on_cuda.assemble(batch, 2)
    assert on_cuda.cpu_decoded == 1
    png_shape, label_shape = (3, 44, 36), (3,)
    assert cuda.calls("decode", "pin", "copy") == [
        ("decode", CUDA, 2),
        ("pin", png_shape), ("copy", png_shape, True, True),  # pinned, then a non-blocking copy
        ("pin", label_shape), ("copy", label_shape, True, True),
    ]
    assert torch.equal(labels, cpu_labels)
    assert images.shape == cpu_images.shape and (images - cpu_images).abs().max() < 1e-3 * 255 / 58


def test_the_batched_resize_pins_its_plan_table_before_copying_it_to_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a device (``meta`` here: no values, a real non-CPU device) the plan integers of the whole
    batch (and the way back to batch order) go pinned and non-blocking, in one copy, whatever
    the number of groups; the CPU path never pins."""
    images = [torch.rand(3, 20, 16) * 255, torch.rand(3, 12, 30) * 255, torch.rand(3, 40, 40) * 255]
    cuda = CudaStandIn(monkeypatch)
    real_to = torch.Tensor.to
    copies: list[tuple[torch.device, bool, bool]] = []

    def to(t, device=None, *args, non_blocking=False, **kw):  # type: ignore[no-untyped-def]
        if isinstance(device, torch.device) and device.type == "meta":
            copies.append((device, t.data_ptr() in cuda.pinned, non_blocking))
        return real_to(t, device, *args, non_blocking=non_blocking, **kw)

    monkeypatch.setattr(torch.Tensor, "to", to)
    draw = lambda: torch.Generator().manual_seed(1)  # noqa: E731
    on_cpu = augment_batch(images, CropRecipe(8), train=True, generator=draw(), max_pixels=2_000)
    assert cuda.calls("pin") == [] and copies == []
    on_meta = [real_to(image, "meta") for image in images]
    on_device = augment_batch(on_meta, CropRecipe(8), train=True, generator=draw(), max_pixels=2_000)
    assert cuda.calls("pin") == [("pin", (3, 11))]  # 2 groups, one table
    assert copies == [(torch.device("meta"), True, True)]
    assert on_device.device.type == "meta" and on_device.shape == on_cpu.shape == (3, 3, 8, 8)


# -- dali_device_id: DALI's GPU index -------------------------------------------------------------


def test_dali_decodes_on_the_current_gpu_when_the_device_names_no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    from largebatch.data.pipelines.dali_graph import dali_device_id

    asked: list[str] = []
    monkeypatch.setattr(torch.cuda, "current_device", lambda: asked.append("current_device") or 3)
    assert dali_device_id(LoaderSpec(image_size=24, batch_size=2, workers=0, device="cuda")) == 3
    assert dali_device_id(LoaderSpec(image_size=24, batch_size=2, workers=0, device="cuda:1")) == 1
    assert dali_device_id(LoaderSpec(image_size=24, batch_size=2, workers=0, device="cpu")) is None
    assert asked == ["current_device"]


# -- DALI's mixed-decode graphs, defined for GPU 0 ------------------------------------------------


def _define(graph, tmp_path: Path):  # type: ignore[no-untyped-def]
    """Define (not build) a pipeline for GPU 0 around ``graph(encoded)``: DALI checks each
    operator's arguments and device here, with no GPU; ``build()`` would need one."""
    dali = pytest.importorskip("nvidia.dali")
    (tmp_path / "x.jpg").write_bytes(_image_bytes((200, 30, 10), (40, 30)))

    @dali.pipeline_def(batch_size=2, num_threads=1, device_id=0)
    def pipeline():  # type: ignore[no-untyped-def]
        encoded, labels = dali.fn.readers.file(files=[str(tmp_path / "x.jpg")], labels=[0])
        return graph(encoded), labels.gpu()

    return pipeline()


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_the_mixed_decode_graphs_are_valid_dali_graphs_on_the_gpu(tmp_path: Path, train: bool, layout: str) -> None:
    from largebatch.data.pipelines import dali_graph as dg

    outputs: list = []

    def graph(encoded):  # type: ignore[no-untyped-def]
        if train:
            images = dg._train_images(encoded, gpu=True, image_size=24, crop_scale=(0.25, 1.0), layout=layout,
                                      dtype=torch.float16, hw_decoder_load=0.5)
        else:
            images = dg._val_images(encoded, gpu=True, image_size=24, val_crop_ratio=0.875, layout=layout,
                                    dtype=torch.float32, hw_decoder_load=0.5)
        outputs.append(images)
        return images

    _define(graph, tmp_path)
    (images,) = outputs
    assert images.device == "gpu"  # the decode is mixed: everything after it runs on the GPU


def test_a_misspelled_mixed_decoder_argument_fails_at_definition(tmp_path: Path) -> None:
    """What makes the test above worth having: DALI rejects a wrong argument name on a CPU."""
    pytest.importorskip("nvidia.dali")
    from nvidia.dali import fn

    with pytest.raises(KeyError, match="hw_decoder_lod"):
        _define(lambda encoded: fn.decoders.image(encoded, device="mixed", hw_decoder_lod=0.5), tmp_path)


# -- in_background on a CUDA device: a stream of its own, events handed over ---------------------


def test_the_background_thread_queues_on_its_own_stream_and_the_consumer_waits_for_each_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The thread selects the device and queues its work on a side stream; each item's event
    is recorded there before the consumer's stream waits on it, and every CUDA tensor of the
    item is then record_stream-ed on the consumer's stream."""
    import threading

    from largebatch.data.background import in_background

    cuda = CudaStandIn(monkeypatch)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda t: True))  # the items are on CUDA
    selected: list[tuple[torch.device, str]] = []
    monkeypatch.setattr(torch.cuda, "set_device",
                        lambda d: selected.append((d, threading.current_thread().name)))
    produced_on: list[str] = []
    items = [torch.zeros(2), (torch.zeros(3), [torch.zeros(4)], "a name"), {"images": torch.zeros(5)}]

    def produce():  # type: ignore[no-untyped-def]
        for item in items:
            produced_on.append(cuda.current_stream().name)
            yield item

    device = torch.device("cuda", 1)
    received = list(in_background(produce, 2, device=device, name="standin-decode"))
    assert len(received) == 3 and all(a is b for a, b in zip(received, items))
    assert selected == [(1, "standin-decode")]
    assert produced_on == ["side1"] * 3 and cuda.current_stream().name == "default"
    handover = [e for e in cuda.log if e[0] in ("record", "wait", "record_stream")]
    assert _each_event_recorded_before_its_wait(handover)


def _each_event_recorded_before_its_wait(log: list) -> bool:  # type: ignore[type-arg]
    """The producer may run ahead (depth 2): records interleave, but each event is recorded
    before the consumer waits on it, and an item's record_streams follow its wait."""
    position = {(e[0], e[1] if e[0] == "record" else e[2]): i for i, e in enumerate(log) if e[0] != "record_stream"}
    waits = [e[2] for e in log if e[0] == "wait"]
    assert waits == ["event1", "event2", "event3"]
    assert all(position[("record", ev)] < position[("wait", ev)] for ev in waits)
    streams = [(i, e[1]) for i, e in enumerate(log) if e[0] == "record_stream"]
    assert [shape for _, shape in streams] == [(2,), (3,), (4,), (5,)]
    assert all(e[2] == "default" for e in log if e[0] == "record_stream")
    bounds = [position[("wait", ev)] for ev in waits] + [len(log)]
    per_item = [[s for i, s in streams if bounds[k] < i < bounds[k + 1]] for k in range(3)]
    assert per_item == [[(2,)], [(3,), (4,)], [(5,)]]
    return True


# -- the DALI loaders' pipelines: the labels follow the images to the GPU ------------------------


def _devices_of_the_outputs(monkeypatch: pytest.MonkeyPatch, loader) -> tuple[list[bool], list[str]]:  # type: ignore[no-untyped-def]
    """``loader._build()``'s pipeline, defined (for GPU 0 where the loader has one) and handed
    to a stand-in for DALI's iterator, which would build it: the ``gpu`` flags its graph got
    and the device of each output (images, labels)."""
    plugin = pytest.importorskip("nvidia.dali.plugin.pytorch")
    from largebatch.data.pipelines import dali_graph as dg

    handed: list = []
    monkeypatch.setattr(plugin, "DALIGenericIterator", lambda pipe, names, **kw: handed.append((pipe, names)))
    asked: list[bool] = []

    def graph(encoded, gpu, side, phase):  # type: ignore[no-untyped-def]
        asked.append(gpu)
        return dg._train_images(encoded, gpu=gpu, image_size=24 if side is None else side,
                                crop_scale=(0.25, 1.0) if phase is None else phase,
                                layout="NCHW", dtype=torch.float32, hw_decoder_load=0.5)

    loader._graph = graph
    loader._build()
    ((pipe, names),) = handed
    assert names == ["images", "labels"]
    return asked, [node.device for node in pipe._graph_out]  # the outputs as defined (no public getter)


@pytest.mark.parametrize("device_id", [0, None])
def test_the_file_loaders_labels_follow_its_images_to_the_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device_id: int | None
) -> None:
    from largebatch.data.pipelines.dali_files import DaliLoader
    from largebatch.data.pipelines.dali_graph import DaliPipeline
    from largebatch.data.samplers import ExactShardSampler

    loader = DaliLoader([str(tmp_path / "a.jpg")], [0], sampler=ExactShardSampler(1, rank=0, world_size=1),
                        batch_size=1, drop_last=False, seed=0,
                        pipeline=DaliPipeline(lambda e, g, s, p: e, 1, device_id, "NCHW"))
    on = "gpu" if device_id is not None else "cpu"
    assert _devices_of_the_outputs(monkeypatch, loader) == ([device_id is not None], [on, on])


@pytest.mark.parametrize("device_id", [0, None])
def test_the_shard_loaders_labels_follow_its_images_to_the_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, device_id: int | None
) -> None:
    from largebatch.data.pipelines.dali_graph import DaliPipeline
    from largebatch.data.pipelines.dali_shards import DaliShardLoader

    spec = LoaderSpec(image_size=24, batch_size=2, workers=0, device="cpu", seed=5)
    loader = DaliShardLoader([str(tmp_path / "0.tar")], [str(tmp_path / "0.idx")], 4, spec, train=True,
                             pipeline=DaliPipeline(lambda e, g, s, p: e, 1, device_id, "NCHW"))
    on = "gpu" if device_id is not None else "cpu"
    assert _devices_of_the_outputs(monkeypatch, loader) == ([device_id is not None], [on, on])
