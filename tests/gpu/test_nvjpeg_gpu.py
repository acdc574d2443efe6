"""The nvjpeg input path with the real nvJPEG on a CUDA GPU, compile modes, and a step
without host syncs. Skipped where no GPU is visible (CPU coverage: tests/test_nvjpeg*.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from largebatch.cli import main
from largebatch.data.augment import IMAGENET_DEFAULT_STD
from largebatch.data.contract import LoaderSpec
from largebatch.data.pipelines import nvjpeg as nv
from largebatch.data.pipelines.nvjpeg import build_nvjpeg_loaders
from largebatch.data.synthetic import make_synthetic_imagenet

pytestmark = pytest.mark.gpu

SMALL = dict(num_classes=4, train_per_class=16, val_per_class=4, image_size=96)
TINY = ["debug=smoke", "progress=false", "data.workers=2", "backend=cuda", "epochs=1"]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_synthetic_imagenet(tmp_path_factory.mktemp("nvjpeg_gpu") / "ds", **SMALL)


def _loaders(root: Path, device: str, prefetch_batches: int = 2,
             **spec: Any) -> tuple[nv.NvjpegLoader, nv.NvjpegLoader, int]:
    loader_spec = LoaderSpec(image_size=64, batch_size=8, workers=2, device=torch.device(device), **spec)
    return build_nvjpeg_loaders(root, loader_spec, prefetch_batches=prefetch_batches)


def _raw_decode_bound(root: Path, std: tuple[float, ...]) -> float:
    """The largest |nvJPEG - libjpeg| a normalised pixel can show, from the decoded files.

    Each file is decoded alone by nvJPEG (synchronised) and by Pillow; the largest pixel
    difference over the set, in uint8 levels, is the codecs' own (IDCT rounding, chroma
    upsampling). Crop, antialiased bilinear resize and flip take convex combinations of
    pixels, so they cannot make a difference larger; normalising divides it by 255 * std.
    """
    from torchvision.io import ImageReadMode, decode_jpeg

    worst = 0
    for path in sorted((root / "train").rglob("*.JPEG")):
        data = path.read_bytes()
        if nv.cpu_decode_reason(data) is not None:
            continue  # decoded on the CPU by the loader too (PNG, CMYK)
        gpu = decode_jpeg(torch.frombuffer(bytearray(data), dtype=torch.uint8), mode=ImageReadMode.RGB,
                          device="cuda")
        torch.cuda.synchronize()
        cpu = torch.from_numpy(np.asarray(Image.open(path).convert("RGB"))).permute(2, 0, 1)
        worst = max(worst, int((gpu.cpu().int() - cpu.int()).abs().max()))
    return worst / (255 * min(std))


def test_gpu_batches_match_cpu_decode_within_the_codecs_difference(data_root: Path) -> None:
    """Geometry, order and labels are equal; pixels differ by at most the measured codec
    difference (plus bf16 rounding), not a fixed guess."""
    gpu_train, gpu_val, _ = _loaders(data_root, "cuda", dtype=torch.bfloat16, channels_last=True)
    cpu_train, cpu_val, _ = _loaders(data_root, "cpu")
    bound = _raw_decode_bound(data_root, IMAGENET_DEFAULT_STD)  # the loader normalises with it
    print(f"measured codec bound after normalisation: {bound:.4f}")
    for gpu, cpu in ((gpu_train, cpu_train), (gpu_val, cpu_val)):
        gpu.set_epoch(2)
        cpu.set_epoch(2)
        for (a, la), (b, lb) in zip(gpu, cpu):
            assert a.is_cuda and la.is_cuda and a.dtype == torch.bfloat16
            assert a.is_contiguous(memory_format=torch.channels_last)
            assert torch.equal(la.cpu(), lb)
            excess = (a.float().cpu() - b).abs() - bound - b.abs() * 2**-8  # bf16: 8 mantissa bits
            assert excess.max() <= 1e-4, float(excess.max())
    assert gpu_train.cpu_decoded > 0  # the embedded CMYK / PNG files (when in the epoch's batches)


def test_background_decode_equals_synchronised_decode_under_load(data_root: Path) -> None:
    """nvJPEG against nvJPEG: batches decoded in the background thread while this thread
    allocates, uses and frees memory (as a training step does) are bit-identical to the same
    epoch decoded in this thread with the device synchronised after every batch. Corruption
    from nvJPEG's stream writing into memory still in use shows here; codec differences
    cannot (same decoder, same calls)."""
    quiet, _, _ = _loaders(data_root, "cuda", prefetch_batches=0)
    quiet.set_epoch(1)
    reference = []
    for images, labels in quiet:
        torch.cuda.synchronize()
        reference.append((images.clone(), labels.clone()))
    busy, _, _ = _loaders(data_root, "cuda", prefetch_batches=3)
    busy.set_epoch(1)
    got = []
    for images, labels in busy:
        for size in (1 << 14, 1 << 16, 1 << 18, 1 << 20):  # the decoded images' size classes and more
            scratch = torch.randn(size, device="cuda")
            scratch.mul_(2).add_(1)
            del scratch  # freed while its kernels may still be queued
        square = torch.randn(1024, 1024, device="cuda")
        (square @ square).sum()
        del square
        got.append((images.clone(), labels.clone()))
    torch.cuda.synchronize()
    assert len(got) == len(reference)
    for (a, la), (b, lb) in zip(got, reference):
        assert torch.equal(la, lb) and torch.equal(a, b)


def test_bad_files_on_the_gpu(data_root: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(data_root, tmp_path / "ds"))
    files = sorted((root / "val").rglob("*.JPEG"))
    Image.open(files[0]).convert("RGB").save(files[0], format="PNG")
    Image.open(files[1]).convert("CMYK").save(files[1], format="JPEG")
    files[2].write_bytes(files[2].read_bytes()[:300])
    files[3].write_bytes(b"")
    _, val, _ = _loaders(root, "cuda")
    val.set_epoch(0)
    assert sum(len(y) for _, y in val) == len(files) - 2
    assert val.skipped == 2 and val.cpu_decoded == 2


def test_cli_nvjpeg_run_defaults_to_channels_last(cache: Path) -> None:
    run = cache / "run"
    assert main([*TINY, "data.loader=nvjpeg", "precision=bf16", f"run_dir={run}"]) == 0
    assert "input pipeline: nvjpeg, nvJPEG (GPU) decode" in (run / "train.log").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert summary["channels_last"] is True and summary["final_top1"] is not None


def test_auto_picks_dali_or_nvjpeg_on_cuda(cache: Path) -> None:
    run = cache / "run"
    assert main([*TINY, "data.loader=auto", "max_steps=2", f"run_dir={run}"]) == 0
    log = (run / "train.log").read_text()
    assert "input pipeline: DALI" in log or "input pipeline: nvjpeg" in log


@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune-no-cudagraphs"])
def test_compiled_training_saves_plain_checkpoints(cache: Path, mode: str) -> None:
    from largebatch.engine.checkpoint import list_checkpoints, load_checkpoint

    run = cache / "run"
    assert main([*TINY, "data.loader=nvjpeg", "precision=bf16", f"model.compile={mode}", f"run_dir={run}"]) == 0
    state = load_checkpoint(list_checkpoints(run / "checkpoints")[-1])
    assert not [k for k in state["model"] if "_orig_mod" in k]
    assert main([*TINY, "data.loader=nvjpeg", "precision=bf16", f"model.compile={mode}", f"run_dir={run}",
                 "epochs=2", "resume=auto"]) == 0


def test_training_step_has_no_host_sync() -> None:
    """bf16 + LARS: the step queues work and returns (fp16's GradScaler reads found_inf, a sync)."""
    from largebatch.backends.torch_dist import TorchDistributedBackend
    from largebatch.engine.loop import StepSettings, Trainer
    from largebatch.models import build_model
    from largebatch.optim import build_optimizer

    backend = TorchDistributedBackend("cuda")
    backend.start()
    model = backend.prepare_model(build_model("resnet10t", 10), channels_last=True)
    optimizer = build_optimizer("lars", model, lr=0.1, weight_decay=5e-5, exclude_bn_bias=True)
    batch = (torch.randn(16, 3, 64, 64, device=backend.device).contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (16,), device=backend.device))
    trainer = Trainer(model=model, optimizer=optimizer,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
                      train_loader=[batch] * 4, backend=backend,
                      settings=StepSettings(epochs=1, global_batch_size=16, autocast_dtype=torch.bfloat16))
    trainer.run_step([batch])  # first step: cuDNN/cuBLAS set-up may sync
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            trainer.run_step([batch])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert F.cross_entropy(model(batch[0]).float(), batch[1]).isfinite()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("tf32", [False, True])
def test_batched_augmentation_on_the_gpu_matches_the_per_image_path(tf32: bool) -> None:
    """The batched crop-resize-flip on CUDA against the per-image F.interpolate path; with TF32
    matmuls allowed (as benchmarks/throughput.py and cudnn_benchmark runs set them) the error
    is that of TF32's 10-bit mantissa on 0..255 values: held to 1 level. Without TF32 the two
    sum in different orders in fp32: 0.0028 of a level measured on an H100, held to 0.01."""
    from largebatch.data.augment import CropRecipe, augment_batch, augment_each

    g = torch.Generator().manual_seed(0)
    images = [torch.randint(0, 256, (3, 375, 500) if i % 4 else (3, 500, 375), dtype=torch.uint8,
                            generator=g).cuda() for i in range(64)]
    previous = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        for train in (True, False):
            recipe, draw = CropRecipe(224), lambda: torch.Generator().manual_seed(0)
            diff = (augment_batch(images, recipe, train=train, generator=draw())
                    - augment_each(images, recipe, train=train, generator=draw())).abs()
            assert diff.max() < (1.0 if tf32 else 0.01)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = previous


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_cuda_loader_pins_each_batch_buffer(data_root: Path) -> None:
    """On a CUDA device the DataLoader pins the one buffer per batch (EncodedBatch.pin_memory)
    whatever pin_memory says: nvJPEG reads pinned bytes, labels copy asynchronously."""
    train, _, _ = _loaders(data_root, "cuda")
    assert train.loader.pin_memory
    train.set_epoch(0)
    batch = next(iter(train.loader))
    assert isinstance(batch, nv.EncodedBatch)
    assert batch.data.is_pinned() and batch.labels.is_pinned()
    assert all(t.is_pinned() for t in batch.encoded())
    assembled = train.assemble(batch, 0)
    assert assembled is not None
    images, labels = assembled
    assert images.is_cuda and labels.is_cuda and len(labels) == len(batch)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_throughput_benchmark_fills_the_gpu_columns(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """benchmarks/throughput.py at a tiny size on the GPU: both MFU columns, the stall and the
    profiler's idle time per step are numbers, and the header names the variant and driver."""
    import importlib.util
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "throughput.py"
    spec = importlib.util.spec_from_file_location("throughput", script)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "throughput", bench)
    spec.loader.exec_module(bench)
    assert bench.main(["--make-data", str(tmp_path / "jpegs"), "--files", "64", "--classes", "4", "--model",
                       "resnet10t", "--image-size", "64", "--batch", "16", "--steps", "3", "--warmup", "2",
                       "--precisions", "bf16", "--compile", "none", "--workers", "2", "--data", "nvjpeg"]) == 0
    out = capsys.readouterr().out
    assert "variant: " in out and "driver " in out
    train = [line.split("|") for line in out.splitlines() if line.startswith("| train |")]
    assert len(train) == 2  # synthetic + nvjpeg
    nvjpeg = [c.strip() for c in train[1]][1:-1]
    assert nvjpeg[3].endswith("%") and nvjpeg[5].endswith("%") and float(nvjpeg[6]) >= 0
    assert nvjpeg[4].endswith("%") or "not in the spec table" in out
