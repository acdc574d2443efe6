"""The GPU campaign: everything the accelerator path has to show, in one device call of at most
540 s (9 minutes, the offline install included), rehearsed on the CPU in CI so that it cannot rot.

The GPU machine it targets (H100/H200: torch 2.11 + CUDA 13, torchvision, timm, tensorboard, pytest;
no hydra-core, omegaconf or DALI, and no network) gives 15 minutes of GPU time for a whole
visit: its start, the call, the transfers and the idle wait before it goes back all count. So
nothing is prepared on it, and the visit is one call:

    # here, once, on a machine with pip (writes the ignored folder .whl/, ~0.5 MiB):
    python benchmarks/gpu_campaign.py prepare
    python benchmarks/gpu_campaign.py plan       # the phases, their budgets, the visit's total

    # on the GPU machine, with .whl/ carried into the checkout, in one call (timeout 540 s):
    python3 benchmarks/gpu_campaign.py run --out "$OUT"

    # in CI: the same call, the same phases in the same order, at toy size on the CPU
    python benchmarks/gpu_campaign.py run --rehearse --out /tmp/campaign

The call's phases, in order, with their GPU budgets (``PLAN``; 535 s together, under the call's
540 s): env 20, install 35, data 30 (20,480 train files over 1,000 classes, 82 batches of 256 an
epoch: 7,000 JPEGs written as the 6,144-file phase wrote them, the rest hard links, so no epoch
boundary falls in a row's 10 warm-up + 60 timed steps), then what issue 86 asks of this call:
no-host-sync 30 (``tests/test_no_host_sync.py`` alone in its own pytest process, its whole output
kept: on the H200 it failed alone and passed after the nvJPEG GPU tests), loader 35 (the nvJPEG
loader alone, no model: ``nvjpeg-serial``, one thread decoding and augmenting in turn, the old
arrangement, and ``nvjpeg``, the two overlapped, with each stage's ms per batch), compiled 140
(ResNet-50 bf16 channels-last training with LARS, batch 256, on one ``torch.compile`` model fed
synthetic data, the ceiling, then the JPEGs through both arrangements: img/s, MFU, throughput
loss, data wait; started only with 90 s left), cuda-graphs 100 (the same with ``reduce-overhead``,
synthetic and ``nvjpeg``; started with 70 s left), optimizer 35 (``optimizer_step.py``: LARS and
LAMB, LAMB also on e1b6366's per-tensor bias corrections, against torch's fused and foreach SGD
and AdamW and timm's Lars/Lamb, one run), ranks 30 (``launch/torchrun.sh`` with one rank on the
GPU, 20 steps of the smoke run with the hierarchical comm hook and global BN asked for: at world
size 1 the backend makes no process group, DDP or grouped BN, so this is the launcher and the
CUDA run under it; two ranks on one GPU over gloo would need the backend to offer it), tests 80
(cheapest first; the CLI training tests only on spare seconds), dali 0 (its rows only where
DALI is on the machine and spare seconds are left; otherwise the summary says why in one line).
The visit: a 180 s start allowance + the 540 s call + ~22 s of transfers = ~742 s, under the
780 s (13 minutes) a test holds it to.

Left out of this call, measured on the H200 on 2026-11-28: the eager train rows (4,697 img/s
synthetic, 3,650 through the nvJPEG loader), the noise scale's cost (1.001x a step) and the
300-step short training (loss down, exact evaluation, bit-identical resume); their 180 s go to
the rows above. ``benchmarks/noise_scale_overhead.py`` and ``short_training.py`` run them alone.

The CPU rehearsal (under a minute) runs the phases in the same order at toy size (timm's
``test_resnet`` at 32 px, batch 8, 1 warm-up + 2 timed steps): the versions, the install from
freshly built wheels with DALI's pins resolved, the JPEGs, the loader rows, the optimizer table,
``launch/torchrun.sh --dry-run`` and the gpu unit tests (collected, skipped). A step that only a
GPU can tell anything new builds its command line, which goes to the log with one line saying
why it is not run, and the files and tests it names are checked: the no-sync test alone, the
compiled train rows (with the compile off they are the rows ``tests/test_nvjpeg_benchmark.py``
runs), the optimizer suite's CUDA cases and the CLI trainings; cuda-graphs and dali are skipped.
``tests/test_gpu_campaign.py`` checks every GPU command line argument by argument and parses
each script's with that script's own parser.

Budgets are cumulative: a phase that ends early passes its spare seconds on, and none runs past
the sum. A step whose minimum does not fit what is left is not started (a compile that could not
finish is not begun); a step over its budget is killed with its processes and the campaign goes
on. After every step its table rows are printed and ``campaign.md`` in ``--out`` is rewritten
(the phases, then each phase's rows), so a call killed mid-phase keeps what it measured. The
files written: ``campaign.md``, ``campaign.log`` (every command's output), ``tests.jsonl``
(each test's result as it ends), ``throughput.md`` (every table row).

DALI's CUDA wheel and its libraries (~270 MB) are too large to carry in one call (64 MiB at a
time): ``prepare --dali`` splits them into 5 parts under ``.whl-dali/`` and ``stage`` keeps one
carried part on the machine per call, more calls than one visit holds; ``run`` installs DALI
when every part is staged (a longer visit) and otherwise leaves its rows out.

The ``tests`` phase runs one pytest call per group (the optimizer suite's CUDA cases, the GPU
unit tests, the eager CLI trainings, the compiled ones), each group under its own cap and each
test under a per-test limit. This file is also the pytest plugin those calls load (``-p
gpu_campaign``): it appends each test's start and result to ``tests.jsonl`` as they happen, so
a group killed at its budget still reports what passed or failed, the test it was cut in, and
the tests that never started.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / ".whl"
DALI_PARTS = REPO / ".whl-dali"
STAGE = Path("/tmp/largebatch-stage")

# What the project needs on the GPU machine and the machine lacks (its image's package list is in
# the device tool's KINDS.md). Exact pins: the versions our .venv is built with (a test checks
# they match), for CPython 3.12 on x86-64 manylinux, the machine's Python.
BASE_WHEELS = ("hydra-core==1.3.8", "omegaconf==2.3.1")
# antlr4-python3-runtime 4.9.3 (hydra-core 1.3 pins 4.9.*) is published as an sdist only: built
# into a pure-Python wheel here, since the machine cannot build it (no network for build deps).
SDIST_WHEELS = ("antlr4-python3-runtime==4.9.3",)
DALI_WHEELS = (
    "nvidia-dali-cuda130==2.4.0", "nvidia-nvimgcodec-cu13==0.9.0.20", "nvidia-libnvcomp-cu13==5.3.0.16",
    "nvidia-nvjpeg==13.3.2.43", "nvidia-nvjpeg2k-cu13==0.11.0.51", "nvidia-nvtiff-cu13==0.8.0.82",
    "astunparse==1.6.3", "gast==0.7.0", "optree==0.20.0", "nvtx==0.2.17", "makefun==1.16.0", "libcst==1.9.0",
)
DEVICE_PYTHON = "3.12"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux1_x86_64")
CARRY_MIB = 64  # what one device call carries, the working tree included
PART_MIB = 56   # one DALI part: leaves room for the working tree (~3 MiB) and the manifest
# the tests phase: each test's start and result, one JSON line each, in --out; the plugin's settings
TEST_RESULTS = "tests.jsonl"
RESULTS_ENV, GROUP_ENV, LIMIT_ENV = "GPU_CAMPAIGN_RESULTS", "GPU_CAMPAIGN_GROUP", "GPU_CAMPAIGN_TEST_LIMIT_S"


# ---------------------------------------------------------------------------------------------
# the wheels: prepared here, resolved in the rehearsal, installed on the machine


def pip_platform_args() -> list[str]:
    args = ["--only-binary=:all:", "--python-version", DEVICE_PYTHON, "--implementation", "cp"]
    for tag in PLATFORMS:
        args += ["--platform", tag]
    return args


def download_cmd(pins: Sequence[str], dest: Path) -> list[str]:
    return [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *pip_platform_args(), "-d", str(dest), *pins]


def resolve_cmd(pins: Sequence[str], report: Path) -> list[str]:
    """pip resolves each exact pin for the machine's Python and platform, reading metadata only
    (PyPI serves it apart from the wheel), so the 190 MB DALI wheel is not fetched to check it."""
    return [sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed", "--no-deps",
            *pip_platform_args(), "--target", str(report.parent / "never-written"), "--report", str(report), *pins]


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def split_bundle(wheels: Sequence[Path], out: Path, part_bytes: int) -> dict:
    """Tar ``wheels`` (already compressed: stored, not recompressed) and cut the tar into parts of
    at most ``part_bytes`` under ``out``, with ``manifest.json`` (each part's and the whole's SHA-256)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("part-*"):
        old.unlink()
    bundle = out / "bundle.tar"
    with tarfile.open(bundle, "w") as tar:
        for wheel in sorted(wheels):
            tar.add(wheel, arcname=wheel.name)
    parts, size = [], part_bytes
    with bundle.open("rb") as f:
        for i, block in enumerate(iter(lambda: f.read(size), b"")):
            part = out / f"part-{i:02d}"
            part.write_bytes(block)
            parts.append({"name": part.name, "bytes": len(block), "sha256": hashlib.sha256(block).hexdigest()})
    manifest = {"bundle_sha256": sha256(bundle), "bundle_bytes": bundle.stat().st_size, "parts": parts,
                "wheels": sorted(w.name for w in wheels)}
    bundle.unlink()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def stage_parts(source: Path, stage: Path) -> tuple[int, int]:
    """Copy each part under ``source`` whose SHA-256 matches its manifest into ``stage`` (with the
    manifest); return (parts staged, parts in all). A part that does not match is refused."""
    manifest = json.loads((source / "manifest.json").read_text())
    stage.mkdir(parents=True, exist_ok=True)
    staged_manifest = stage / "manifest.json"
    if staged_manifest.exists() and json.loads(staged_manifest.read_text()) != manifest:
        shutil.rmtree(stage)  # parts of another bundle: start again
        stage.mkdir(parents=True)
    shutil.copyfile(source / "manifest.json", staged_manifest)
    for part in manifest["parts"]:
        src = source / part["name"]
        if src.exists():
            if sha256(src) != part["sha256"]:
                raise SystemExit(f"gpu_campaign: {src} does not match its manifest (damaged in transfer?): carry it again")
            shutil.copyfile(src, stage / part["name"])
    have = [p for p in manifest["parts"] if (stage / p["name"]).exists()]
    return len(have), len(manifest["parts"])


def join_bundle(stage: Path, into: Path) -> Optional[list[Path]]:
    """The wheels of a fully staged bundle, unpacked into ``into``; None while parts are missing.
    A bundle whose joined bytes do not match the manifest is an error (one line)."""
    if not (stage / "manifest.json").exists():
        return None
    manifest = json.loads((stage / "manifest.json").read_text())
    if not all((stage / p["name"]).exists() for p in manifest["parts"]):
        return None
    into.mkdir(parents=True, exist_ok=True)
    bundle = into / "bundle.tar"
    with bundle.open("wb") as out:
        for part in manifest["parts"]:
            out.write((stage / part["name"]).read_bytes())
    if sha256(bundle) != manifest["bundle_sha256"]:
        raise SystemExit(f"gpu_campaign: the joined DALI bundle in {stage} does not match its manifest: stage it again")
    with tarfile.open(bundle) as tar:
        tar.extractall(into, filter="data")
    bundle.unlink()
    return sorted(into / name for name in manifest["wheels"])


def prepare(dali: bool, part_mib: int) -> int:
    WHEELS.mkdir(exist_ok=True)
    subprocess.run(download_cmd(BASE_WHEELS, WHEELS), check=True)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-binary=:all:", "-w", str(WHEELS),
                    *SDIST_WHEELS], check=True)
    total = sum(p.stat().st_size for p in WHEELS.glob("*.whl"))
    print(f"{WHEELS}: {len(list(WHEELS.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB (carry [\".whl\"])")
    if dali:
        with tempfile.TemporaryDirectory() as tmp:
            subprocess.run(download_cmd(DALI_WHEELS, Path(tmp)), check=True)
            manifest = split_bundle(sorted(Path(tmp).glob("*.whl")), DALI_PARTS, part_mib * 2**20)
        n = len(manifest["parts"])
        print(f"{DALI_PARTS}: DALI's {len(manifest['wheels'])} wheels, {manifest['bundle_bytes'] / 2**20:.0f} MiB "
              f"in {n} parts: {n} device calls, each carrying [\".whl-dali/manifest.json\", \".whl-dali/part-NN\"] and "
              f"running `python3 benchmarks/gpu_campaign.py stage`, one after the other while the machine is warm")
    return 0


# ---------------------------------------------------------------------------------------------
# the phases


@dataclass(frozen=True)
class Step:
    label: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    optional: bool = False  # its failure is recorded but does not fail the phase (e.g. a flaky probe)
    budget_s: Optional[float] = None  # its own cap inside the phase's budget (None: what the phase has left)
    min_s: float = 0.0  # it starts only with this much of the phase left (a compile that could not finish is not begun)
    keep_output: bool = False  # every line it prints goes to its phase's rows (else the table and result lines)
    # why the CPU rehearsal builds this step's command line but does not run it ("": it runs): the
    # rehearsal logs the command and checks that the files it names exist (missing_files)
    not_rehearsed: str = ""


@dataclass
class PhaseResult:
    name: str
    status: str = "not run"  # running | ok | failed: ... | cut at budget | skipped
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)  # the table rows and result lines its steps printed


@dataclass(frozen=True)
class Campaign:
    out: Path
    rehearse: bool
    work: Path  # data, runs, throw-away environments
    python: str = sys.executable

    @property
    def cuda(self) -> bool:
        return not self.rehearse

    def script(self, name: str) -> str:
        return str(Path(self.python).parent / name) if (Path(self.python).parent / name).exists() else name


def phase_env(c: Campaign) -> list[Step]:
    # torchvision's and timm's versions from their metadata: importing them cold costs seconds here
    # (5-8 s with torch on the loaded rehearsal machine), and the phases after import them anyway
    probe = ("import torch, platform; from importlib.metadata import version; print('python', "
             "platform.python_version(), '| torch', torch.__version__, '| CUDA', torch.version.cuda, '| torchvision', "
             "version('torchvision'), '| timm', version('timm')); print('device:', torch.cuda.get_device_name(0) "
             "if torch.cuda.is_available() else 'no CUDA device (CPU rehearsal)')")
    # nvidia-smi first: it takes a second, and the versions probe imports torch cold (seconds on a
    # fresh machine)
    steps = []
    if shutil.which("nvidia-smi"):
        steps.append(Step("nvidia-smi", ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,"
                                         "power.limit", "--format=csv"]))
    steps.append(Step("versions", [c.python, "-c", probe]))
    return steps


def phase_install(c: Campaign) -> list[Step]:
    """The carried wheels, then the project itself, offline (--no-index; no build isolation, which
    would fetch setuptools). In the rehearsal the same wheels go into a throw-away target and a
    throw-away venv, and the DALI pins are resolved against PyPI without fetching the wheels."""
    pip = [c.python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile"]
    steps = []
    if c.rehearse:
        wheels = c.work / "wheels"
        steps.append(Step("download the base pins", download_cmd(BASE_WHEELS, wheels)))
        steps.append(Step("build the sdist-only pins", [c.python, "-m", "pip", "wheel", "-q", "--no-deps",
                                                        "--no-binary=:all:", "-w", str(wheels), *SDIST_WHEELS]))
        site = c.work / "site"
        steps.append(Step("install them into a target", ["sh", "-c", f'{" ".join(pip)} --target {site} {wheels}/*.whl']))
        steps.append(Step("hydra imports from the target", [c.python, "-c", "import hydra, omegaconf, antlr4; "
                                                             "print('hydra', hydra.__version__, 'from', hydra.__file__)"],
                          env={"PYTHONPATH": str(site)}))
        steps.append(Step("the DALI pins resolve", resolve_cmd(DALI_WHEELS, c.work / "dali-resolve.json")))
        # The machine's command with a throw-away prefix: offline, no build isolation, the console
        # scripts written. --ignore-installed: without it pip would first uninstall this venv's own
        # editable install of the project.
        prefix = c.work / "prefix"
        steps.append(Step("offline editable install", ["sh", "-c",
                          f"{' '.join(pip)} --ignore-installed --no-build-isolation --prefix {prefix} -e {REPO} && "
                          f"{prefix}/bin/largebatch-train --help > /dev/null"]))
        return steps
    if WHEELS.is_dir() and any(WHEELS.glob("*.whl")):
        steps.append(Step("carried wheels", ["sh", "-c", f'{" ".join(pip)} {WHEELS}/*.whl']))
    steps.append(Step("the project, editable", [*pip, "--no-build-isolation", "-e", str(REPO)]))
    return steps


# The gpu-marked tests that train through the CLI (a minute or more each on the card), by node id:
# the other gpu-marked tests run before them, the compiled ones last.
EAGER_TRAININGS = ("tests/gpu/test_cuda_training.py",
                   "tests/gpu/test_nvjpeg_gpu.py::test_cli_nvjpeg_run_defaults_to_channels_last",
                   "tests/gpu/test_nvjpeg_gpu.py::test_auto_picks_dali_or_nvjpeg_on_cuda")
COMPILED_TRAININGS = ("tests/gpu/test_nvjpeg_gpu.py::test_compiled_training_saves_plain_checkpoints",)


@dataclass(frozen=True)
class SuiteGroup:
    label: str
    args: tuple[str, ...]  # pytest arguments: paths / node ids, selections
    budget_s: Optional[float]  # the group's cap on the GPU; None: whatever the phase has left (spare seconds)
    test_limit_s: float        # per test, set-up and tear-down included
    min_s: float = 0.0         # on the GPU it starts only with this much left
    not_rehearsed: str = ""    # why the CPU rehearsal does not run it ("": it runs)


SPARE_SECONDS_ONLY = "on the GPU it runs on spare seconds only, and its tests train on CUDA"


def suite_groups() -> list[SuiteGroup]:
    """The tests phase, cheapest first: a cut then costs the slowest tests, not the quick ones. The
    first two groups' caps are the phase's planned budget; the CLI trainings run on the seconds the
    phases before them did not use, each only when its ``min_s`` is left."""
    not_trainings = [a for t in (*EAGER_TRAININGS, *COMPILED_TRAININGS)
                     for a in (("--ignore", t) if "::" not in t else ("--deselect", t))]
    return [
        SuiteGroup("optimizer suite (CUDA cases)", ("tests/test_optim_timm_suite.py",), 40, 20,
                   not_rehearsed="its cases run on the CPU in the test suite; a GPU adds only its CUDA cases"),
        SuiteGroup("gpu unit tests", ("-m", "gpu", "tests", *not_trainings), 40, 30),
        SuiteGroup("eager CLI trainings", ("-m", "gpu", *EAGER_TRAININGS), None, 60, min_s=60,
                   not_rehearsed=SPARE_SECONDS_ONLY),
        SuiteGroup("compiled CLI trainings", ("-m", "gpu", *COMPILED_TRAININGS), None, 150, min_s=150,
                   not_rehearsed=SPARE_SECONDS_ONLY),
    ]


def group_step(c: Campaign, group: SuiteGroup, results: Path) -> Step:
    """One pytest call for ``group`` with this file as its plugin: results appended to ``results``."""
    # --rootdir: test ids relative to the repository wherever it is checked out (a group's own
    # --rootdir, later in its args, wins)
    argv = [c.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=-ra", "-p", "gpu_campaign",
            f"--rootdir={REPO}", *group.args]
    path = os.pathsep.join(p for p in (str(Path(__file__).resolve().parent), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, RESULTS_ENV: str(results), GROUP_ENV: group.label,
           LIMIT_ENV: f"{group.test_limit_s:g}"}
    if c.rehearse:
        return Step(group.label, argv, env)
    return Step(group.label, argv, env, budget_s=group.budget_s, min_s=group.min_s)


def marked_files(marker: str) -> tuple[str, ...]:
    """The test files that mark tests ``marker`` (``pytest.mark.<marker>`` on a test, a class or
    as the module's ``pytestmark``), relative to the repository."""
    return tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                        if f"mark.{marker}" in p.read_text(errors="replace")))


def rehearsal_group(group: SuiteGroup) -> SuiteGroup:
    """``group`` with the whole ``tests`` folder narrowed to the files that mark gpu tests: the same
    tests are selected, their --ignore and --deselect arguments the same, without importing the
    whole suite (on the CPU it runs, and so collects, in the test suite already). A file the group
    ignores is left out: pytest collects a file named on its command line even when --ignore names it."""
    ignored = {group.args[i + 1] for i, arg in enumerate(group.args[:-1]) if arg == "--ignore"}
    files = tuple(f for f in marked_files("gpu") if f not in ignored)
    args = tuple(a for arg in group.args for a in (files if arg == "tests" else (arg,)))
    return replace(group, args=args)


def phase_tests(c: Campaign) -> list[Step]:
    """The ``gpu``-marked tests and the CUDA cases of the others (the timm optimizer suite runs on
    CUDA where there is one), each result to ``tests.jsonl`` in --out as it ends. In the
    rehearsal the gpu unit tests collect (from the files that mark them) and skip, in one pytest
    process; the other groups' command lines are built and their files and tests checked."""
    results = c.out / TEST_RESULTS
    results.unlink(missing_ok=True)
    if not c.rehearse:
        return [group_step(c, g, results) for g in suite_groups()]
    return [replace(group_step(c, rehearsal_group(g), results), not_rehearsed=g.not_rehearsed)
            for g in suite_groups()]


def jpeg_root(c: Campaign) -> Path:
    return c.work / "jpegs"


# The JPEGs the loader and train rows read: 20,480 train files asked over 1,000 classes (21 a class:
# 21,000, 82 batches of 256 an epoch), of which 7 a class are written (7,000, as the 6,144-file phase
# of 2026-11-28 wrote) and the rest hard-linked to them; each row's warm-up + timed steps (70) end
# inside its loader's first epoch.
JPEG_FILES, JPEG_DISTINCT = 20480, 6144
WARMUP_STEPS, TIMED_STEPS = 10, 60


def phase_data(c: Campaign) -> list[Step]:
    # the rehearsal: 2 classes of 16 files (4 batches of 8 an epoch: the loader rows' 3 in one), 8 written
    size = (["--files", "32", "--distinct", "8", "--classes", "2", "--workers", "2"] if c.rehearse
            else ["--files", str(JPEG_FILES), "--distinct", str(JPEG_DISTINCT), "--classes", "1000"])
    return [Step("ImageNet-like JPEGs", [c.python, str(REPO / "benchmarks" / "throughput.py"), "--device",
                                         "cpu" if c.rehearse else "cuda", "--make-data", str(jpeg_root(c)), *size,
                                         "--data-only"])]


def phase_no_host_sync(c: Campaign, budget_s: float) -> list[Step]:
    """``tests/test_no_host_sync.py`` alone in its own pytest process, every line of its output kept
    (in campaign.log and campaign.md): on the H200 it failed alone and passed after the nvJPEG GPU
    tests in one process (the ``tests`` phase runs it that way again)."""
    args = ("-vv", "-rA", "--tb=long", "tests/test_no_host_sync.py")
    step = group_step(c, SuiteGroup("test_no_host_sync.py alone", args, None, 60), c.out / NO_SYNC_RESULTS)
    return [replace(step, keep_output=True, not_rehearsed=NO_SYNC_NOT_REHEARSED if c.rehearse else "")]


NO_SYNC_NOT_REHEARSED = ("its CUDA cases need a GPU (the tests phase's gpu group collects and skips them here) "
                         "and its CPU cases run in the test suite")


# The rehearsal's model: timm's 0.47 M-parameter test net, whose optimizer steps take milliseconds
# on the CPU (resnet10t's first steps took 0.3-2 s each here, 16 s for the optimizer table)
REHEARSAL_MODEL = "test_resnet"


def throughput_argv(c: Campaign, data: Sequence[str], compile_mode: str, budget_s: float, *,
                    loader_only: bool = False) -> list[str]:
    """``throughput.py`` on the JPEGs: LARS, bf16 channels-last ResNet-50 at 224 px, batch 256 on the
    GPU, no decode rows; train rows only, or (``loader_only``) loader rows only. Its own row budget 15 s
    under the phase's, so that it reports the rows it left out before the phase is cut."""
    argv = [c.python, str(REPO / "benchmarks" / "throughput.py"), "--root", str(jpeg_root(c)), "--data", *data,
            "--compile", compile_mode, "--optimizers", "lars", "--no-decode",
            "--no-train-rows" if loader_only else "--no-loader-rows", "--budget-s", f"{max(1.0, budget_s - 15):.0f}"]
    if c.rehearse:
        return [*argv, "--device", "cpu", "--model", REHEARSAL_MODEL, "--image-size", "32", "--batch", "8", "--steps",
                "2", "--warmup", "1", "--precisions", "fp32", "--workers", "2"]
    return [*argv, "--model", "resnet50", "--image-size", "224", "--batch", "256", "--steps", str(TIMED_STEPS),
            "--warmup", str(WARMUP_STEPS), "--precisions", "bf16", "--layouts", "NHWC"]


# In the rehearsal the compile is off (torch.compile runs the model eagerly): Inductor's CPU compile
# costs ~90 s a model here and says nothing of the GPU's; the command line is the GPU's.
NO_COMPILE = {"TORCH_COMPILE_DISABLE": "1"}


def phase_loader(c: Campaign, budget_s: float) -> list[Step]:
    """The nvJPEG loader alone, no model, old and new arrangement: ``nvjpeg-serial`` (one thread
    decodes and augments in turn) and ``nvjpeg`` (decode of batch k+1 beside augmentation of
    batch k, two threads), with the ms per batch of each stage."""
    return [Step("loader rows: nvjpeg-serial + nvjpeg, no model",
                 throughput_argv(c, ["nvjpeg-serial", "nvjpeg"], "none", budget_s, loader_only=True))]


def phase_compiled(c: Campaign, budget_s: float) -> list[Step]:
    """One compiled model (``torch.compile`` default mode) fed synthetic data (the ceiling), then the
    JPEGs through both nvJPEG arrangements: the compile is inside the first row, so the phase's cap
    is what bounds it; the rows measured before a cut are in the log."""
    return [Step("train rows: synthetic + nvjpeg-serial + nvjpeg, compiled",
                 throughput_argv(c, ["synthetic", "nvjpeg-serial", "nvjpeg"], "default", budget_s),
                 env=NO_COMPILE if c.rehearse else {}, min_s=0 if c.rehearse else 90,
                 not_rehearsed=COMPILED_NOT_REHEARSED if c.rehearse else "")]


COMPILED_NOT_REHEARSED = ("with the compile off (Inductor's CPU compile: ~90 s, nothing of the GPU's) these are the "
                          "train rows tests/test_nvjpeg_benchmark.py runs (synthetic, nvjpeg-serial, nvjpeg on one "
                          "model); throughput.py's parser takes this command line in tests/test_gpu_campaign.py")


def phase_cuda_graphs(c: Campaign, budget_s: float) -> list[Step]:
    """The same model compiled with ``reduce-overhead`` (CUDA graphs: a step's kernels replayed in
    one launch), synthetic and the two-thread nvJPEG loader."""
    return [Step("train rows: synthetic + nvjpeg, reduce-overhead",
                 throughput_argv(c, ["synthetic", "nvjpeg"], "reduce-overhead", budget_s),
                 env=NO_COMPILE if c.rehearse else {}, min_s=0 if c.rehearse else 70)]


def phase_optimizer(c: Campaign, budget_s: float) -> list[Step]:
    """``step()`` alone on ResNet-50's parameters: LARS and LAMB (and LAMB on the per-tensor bias
    corrections of e1b6366, the old layout) against torch's fused and foreach SGD and AdamW and
    timm's Lars/Lamb, round-robin in one process."""
    argv = [c.python, str(REPO / "benchmarks" / "optimizer_step.py")]
    argv += (["--device", "cpu", "--model", REHEARSAL_MODEL, "--rounds", "1", "--warmup", "0"] if c.rehearse
             else ["--device", "cuda", "--rounds", "100"])
    return [Step("optimizer step, ResNet-50's parameters", argv)]


# launch/torchrun.sh's training overrides for the ranks phase: the comm and bn groups that put DDP's
# hierarchical communication hook and grouped SyncBN in the run where there is more than one rank
RANK_OVERRIDES = ("debug=smoke", "comm=hierarchical", "bn=global", "max_steps=20", "log_every=5", "progress=false",
                  "tensorboard=false", "checkpoint.keep=0")


def phase_ranks(c: Campaign, budget_s: float) -> list[Step]:
    """``launch/torchrun.sh`` with one rank on the GPU (``backend=cuda``; torchrun, the agent, the
    rank's exit code), 20 steps of the smoke run with the hierarchical comm hook and global BN
    asked for. At world size 1 our backend makes no process group, DDP or grouped BN (one rank
    needs none), so this is the launcher and the CUDA run under it, not yet NCCL: two ranks on one
    GPU need ``backend=cuda`` over gloo with both ranks on device 0, which the backend does not offer.

    The rehearsal runs the launcher with ``--dry-run`` (it checks its variables, finds the
    interpreter and prints torchrun's command): one rank trained on the CPU makes no process group
    either, so it would be a smoke run under torchrun, which tests/distributed runs with 2 gloo
    ranks; the GPU's overrides compose in tests/test_gpu_campaign.py."""
    env = {"NPROC_PER_NODE": "1", "PYTHON": c.python, "LARGEBATCH_CACHE": str(c.work / "cache")}
    overrides = [f"backend={'cpu' if c.rehearse else 'cuda'}", *RANK_OVERRIDES, f"run_dir={c.work / 'ranks-1'}"]
    if c.rehearse:
        return [Step("launch/torchrun.sh --dry-run, one rank", [str(REPO / "launch" / "torchrun.sh"), "--dry-run",
                                                                 *overrides], env)]
    return [Step("launch/torchrun.sh, one rank", [str(REPO / "launch" / "torchrun.sh"), *overrides], env)]


def dali_missing(c: Campaign) -> Optional[str]:
    """Why the DALI rows cannot run on this machine (None when they can)."""
    if c.rehearse:
        return "DALI's rows need its mixed decoder on a GPU (on the machine this phase costs a probe when DALI is missing)"
    probe = subprocess.run([c.python, "-c", "import nvidia.dali"], capture_output=True, cwd="/")
    if probe.returncode == 0 or join_ready(STAGE):
        return None
    return ("DALI is not on this machine: its CUDA wheels (~270 MB) arrive in 5 staged parts of 56 MiB, "
            "one device call each, which the visit's time does not hold")


def cuda_graphs_missing(c: Campaign) -> Optional[str]:
    return ("CUDA graphs need a GPU; the command line is the compiled phase's with reduce-overhead, parsed in "
            "tests/test_gpu_campaign.py") if c.rehearse else None


def join_ready(stage: Path) -> bool:
    if not (stage / "manifest.json").exists():
        return False
    return all((stage / p["name"]).exists() for p in json.loads((stage / "manifest.json").read_text())["parts"])


def phase_dali(c: Campaign, budget_s: float) -> list[Step]:
    """DALI's rows, eager, only where its wheel is on the machine (installed, or staged in parts)."""
    steps = []
    if not c.rehearse and join_ready(STAGE):
        steps.append(Step("DALI from its staged parts", [c.python, __file__, "install-dali", "--into",
                                                         str(c.work / "dali-wheels")], budget_s=60, min_s=105))
    steps.append(Step("train rows: synthetic + dali, eager", throughput_argv(c, ["synthetic", "dali"], "none",
                                                                             budget_s), min_s=0 if c.rehearse else 45))
    return steps


@dataclass(frozen=True)
class Phase:
    name: str
    gpu_s: float       # budget on the GPU machine
    rehearse_s: float  # budget in the CPU rehearsal
    steps: Callable[[Campaign, float], list[Step]]  # (campaign, the phase's budget) -> steps
    gives: str = ""    # what it measures, the heading of its rows in campaign.md
    skip: Callable[[Campaign], Optional[str]] = lambda c: None  # why it cannot run here (None: it can)


# The one device call, in order: what everything needs (versions, install, JPEGs), then what issue 86
# asks of this call (the no-sync test alone, the loader rows, the compiled rows, CUDA graphs, LAMB old
# and new), one rank under torchrun, the GPU tests, DALI. Each phase's budget is what it may use; what
# a phase leaves passes on to the next, so the tests get every spare second.
PLAN: tuple[Phase, ...] = (
    Phase("env", 20, 60, lambda c, _: phase_env(c), "versions and the card"),
    Phase("install", 35, 240, lambda c, _: phase_install(c), "offline install"),
    Phase("data", 30, 60, lambda c, _: phase_data(c), "JPEGs"),
    Phase("no-host-sync", 30, 60, phase_no_host_sync, "tests/test_no_host_sync.py alone, its whole output"),
    Phase("loader", 35, 60, phase_loader, "the nvJPEG loader alone, one thread and two: img/s, ms per batch by stage"),
    Phase("compiled", 140, 120, phase_compiled,
          "ResNet-50 training, compiled: synthetic, nvjpeg-serial, nvjpeg on one model: img/s, MFU, data wait"),
    Phase("cuda-graphs", 100, 60, phase_cuda_graphs, "ResNet-50 training, reduce-overhead (CUDA graphs)",
          cuda_graphs_missing),
    Phase("optimizer", 35, 120, phase_optimizer, "optimizer step alone, LAMB old and new"),
    Phase("ranks", 30, 60, phase_ranks, "launch/torchrun.sh, one rank"),
    Phase("tests", 80, 300, lambda c, _: phase_tests(c), "GPU tests"),
    Phase("dali", 0, 60, phase_dali, "DALI rows", dali_missing),
)
PHASES: dict[str, Phase] = {p.name: p for p in PLAN}
# Phases with steps that start only on spare seconds (a minimum above the phase's own budget):
# the CLI training tests and DALI's rows, the last things the call gives.
SPARE_PHASES = ("tests", "dali")
NO_SYNC_RESULTS = "no-host-sync.jsonl"  # the no-host-sync phase's test results, beside tests.jsonl
WORK = Path("/tmp/largebatch-campaign")

# The visit: one device call on a machine there for 15 minutes of GPU time in all (its start,
# the call, the transfers and the idle wait before it is handed back all count).
CALL_LIMIT_S = 540           # the call's timeout (run ... timeout_s=540); the plan ends before it
CALL_MARGIN_S = 5            # Python's start and the last summary write, outside the phases
START_ALLOWANCE_S = 180      # the machine's start
TRANSFER_FIXED_S = 20        # both ways, whatever the size
TRANSFER_MIB_PER_S = 2.0     # carrying the working tree and .whl/, conservatively
VISIT_LIMIT_S = 13 * 60      # of the 15 minutes: the rest is the hand-back and a margin
TREE_MIB = 4.0               # the working tree without ignored folders (a test measures it)
BASE_WHEELS_MIB = 1.0        # .whl/ as prepare writes it (hydra-core, omegaconf, antlr4: ~0.5 MiB)


def carried_mib() -> float:
    """What the call carries: the working tree and the wheels in .whl/ (DALI's parts are not carried)."""
    wheels = sum(p.stat().st_size for p in WHEELS.glob("*.whl")) / 2**20 if WHEELS.is_dir() else 0.0
    return TREE_MIB + max(wheels, BASE_WHEELS_MIB)


def plan_table(carried: float) -> str:
    lines = ["| phase | GPU budget (s) | gives |", "|---|---:|---|"]
    lines += [f"| {p.name} | {p.gpu_s:.0f} | {p.gives} |" for p in PLAN]
    lines.append(f"| **the call** | **{plan_s():.0f}** | phases; the call's limit is {CALL_LIMIT_S} s |")
    return "\n".join(lines) + (
        f"\n\nthe visit: start {START_ALLOWANCE_S} s + call {CALL_LIMIT_S} s + transfers "
        f"{TRANSFER_FIXED_S + carried / TRANSFER_MIB_PER_S:.0f} s ({carried:.1f} MiB carried) = {visit_s(carried):.0f} s "
        f"of the {VISIT_LIMIT_S} s it may take")


def plan_s(phases: Sequence[Phase] = PLAN) -> float:
    """Seconds the one call's phases may use on the GPU, together."""
    return sum(p.gpu_s for p in phases)


def visit_s(carried_mib: float) -> float:
    """The visit's GPU time: the start, the call at its limit, the transfers of ``carried_mib``."""
    return START_ALLOWANCE_S + CALL_LIMIT_S + TRANSFER_FIXED_S + carried_mib / TRANSFER_MIB_PER_S


# ---------------------------------------------------------------------------------------------
# running and reporting


def run_step(step: Step, timeout_s: float, log, env: dict[str, str]) -> tuple[Optional[int], float]:
    """Run ``step`` with its output appended to ``log``; kill its whole process group at the
    timeout (loader workers, torchrun ranks). Returns (exit code or None if cut, seconds)."""
    log.write(f"\n$ {' '.join(step.argv)}\n")
    log.flush()
    t0 = time.monotonic()
    proc = subprocess.Popen(step.argv, stdout=log, stderr=subprocess.STDOUT, env={**env, **step.env},
                            cwd=REPO, start_new_session=True)
    try:
        rc: Optional[int] = proc.wait(timeout=max(1.0, timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        rc = None
        log.write(f"[gpu_campaign: cut at its budget, {timeout_s:.0f} s]\n")
    return rc, time.monotonic() - t0


def new_output(c: Campaign, start: int) -> str:
    """What the log gained since byte ``start``."""
    with (c.out / "campaign.log").open("rb") as f:
        f.seek(start)
        return f.read().decode(errors="replace")


REPORTED = ("|", "largebatch: ", "budget of", "DALI is not", "MFU peaks", "ratios", "  largebatch", "  LARS")


def run(c: Campaign, phases: Sequence[str]) -> int:
    """The phases in order, each under its budget (cumulative: a phase that ends early passes its
    spare on; none runs past the sum). Each step's rows go to stdout and campaign.md as it ends."""
    c.out.mkdir(parents=True, exist_ok=True)
    c.work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"))
    results = [PhaseResult(name) for name in phases]
    deadline = time.monotonic()
    with (c.out / "campaign.log").open("a") as log:
        log.write(f"gpu_campaign {'rehearsal' if c.rehearse else 'run'} of {', '.join(phases)}, "
                  f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, work folder {c.work}\n")
        log.flush()
        for result in results:
            phase = PHASES[result.name]
            deadline += phase.rehearse_s if c.rehearse else phase.gpu_s
            t0 = time.monotonic()
            reason = phase.skip(c)
            if reason:
                result.status = "skipped"
                result.notes.append(reason)
                print(f"[{phase.name}] skipped: {reason}", flush=True)
                write_summary(c, results)
                continue
            result.status = "running"
            log.write(f"\n=== phase {phase.name} (budget {deadline - t0:.0f} s) ===\n")
            failed, cut, ran = [], False, 0
            for step in phase.steps(c, deadline - t0):
                if c.rehearse and step.not_rehearsed:
                    failed += not_rehearsed(phase.name, step, result, log)
                    continue
                ran += 1
                left = deadline - time.monotonic()
                if left <= max(1.0, step.min_s):
                    cut = cut or left <= 1
                    result.notes.append(f"not started: {step.label} ({left:.0f} s left"
                                        + (f", needs {step.min_s:.0f} s)" if step.min_s else ")"))
                    continue
                start = log.tell()
                rc, seconds = run_step(step, left if step.budget_s is None else min(left, step.budget_s), log, env)
                log.flush()
                if rc is None:
                    cut = True
                    result.notes.append(f"cut: {step.label}")
                elif rc != 0 and not step.optional:
                    failed.append(f"{step.label} (exit {rc})")
                lines = new_output(c, start).strip("\n").splitlines()  # "$ command", then its output
                if step.keep_output:
                    result.rows += ["```", *lines, "```"]
                    print("\n".join(lines), flush=True)
                else:
                    result.rows += [line for line in lines if line.startswith(REPORTED)]
                result.seconds = time.monotonic() - t0
                print(f"[{phase.name}] {step.label}: {'cut' if rc is None else f'exit {rc}'} ({seconds:.1f} s)",
                      flush=True)
                if not step.keep_output:
                    print("\n".join(line for line in result.rows[-200:] if line.startswith("|")), flush=True)
                write_summary(c, results)
            result.seconds = time.monotonic() - t0
            result.status = ("failed: " + "; ".join(failed) if failed else "cut at budget" if cut
                             else "not rehearsed" if c.rehearse and not ran else "ok")
            write_summary(c, results)
    print((c.out / "campaign.md").read_text())
    return 0 if all(r.status in ("ok", "skipped", "not rehearsed") for r in results) else 1


def missing_files(argv: Sequence[str]) -> list[str]:
    """What ``argv`` names in this checkout (a script, a test file or folder, a test of a pytest node
    id) and the checkout lacks: the check the rehearsal makes of a command line it does not run."""
    missing = []
    for arg in argv:
        path, _, test = arg.partition("::")
        file = Path(path) if Path(path).is_absolute() else REPO / path
        if file.parts[: len(REPO.parts)] != REPO.parts or file.parts[len(REPO.parts):][:1] not in (
                ("benchmarks",), ("launch",), ("tests",)):
            continue
        if not (file.is_file() or file.is_dir() and not test):
            missing.append(arg)
        elif test:
            name = re.split(r"[\[:]", test)[0]
            if not re.search(rf"^\s*(def|class) {re.escape(name)}\b", file.read_text(), re.MULTILINE):
                missing.append(arg)
    return missing


def not_rehearsed(phase: str, step: Step, result: PhaseResult, log) -> list[str]:
    """A step the rehearsal does not run: its command in the log with the reason, one note, and
    the files it names checked. Returns the phase's failures (a missing file)."""
    missing = missing_files(step.argv)
    log.write(f"\n$ {' '.join(step.argv)}\n[gpu_campaign: not run in the rehearsal: {step.not_rehearsed}]\n")
    log.flush()
    result.notes.append(f"not rehearsed: {step.label} ({step.not_rehearsed})")
    print(f"[{phase}] {step.label}: not rehearsed: {step.not_rehearsed}", flush=True)
    return [f"{step.label} (no such file or test: {', '.join(missing)})"] if missing else []


def write_summary(c: Campaign, results: list[PhaseResult]) -> None:
    """campaign.md from what has been measured so far: the phases, then each phase's rows."""
    text = (c.out / "campaign.log").read_text(errors="replace") if (c.out / "campaign.log").exists() else ""
    table = [line for r in results for line in r.rows if line.startswith("|")]
    if table:
        (c.out / "throughput.md").write_text("\n".join(table) + "\n")
    lines = [f"# GPU campaign ({'CPU rehearsal, toy sizes: no number here is a GPU number' if c.rehearse else 'GPU'}), "
             f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    lines += [line for line in text.splitlines() if line.startswith(("python ", "device:", "date "))][:3]
    smi = re.search(r"^name, driver_version.*\n(.+)$", text, re.MULTILINE)
    if smi:
        lines.append(f"nvidia-smi: {smi.group(1)}")
    lines += ["", "| phase | budget (s) | status | seconds | notes |", "|---|---:|---|---:|---|"]
    lines += [f"| {r.name} | {PHASES[r.name].rehearse_s if c.rehearse else PHASES[r.name].gpu_s:.0f} | {r.status} "
              f"| {r.seconds:.0f} | {'; '.join(r.notes)} |" for r in results]
    for r in results:
        if r.name == "tests" and r.status != "not run":
            lines += ["", f"## {PHASES[r.name].gives or r.name}"] + tests_report(c.out / TEST_RESULTS)
        elif r.rows and r.name != "data":
            rows = [f"- {line}" if line.startswith("largebatch: ") else line for line in r.rows]
            # a blank line before each table, so that two tables of a phase stay two tables
            body = [x for i, line in enumerate(rows)
                    for x in (([""] if line.startswith("|") and i and not rows[i - 1].startswith("|") else [])
                              + [line])]
            lines += ["", f"## {PHASES[r.name].gives or r.name}", ""] + body
    (c.out / "campaign.md").write_text("\n".join(lines) + "\n")


# ---------------------------------------------------------------------------------------------
# the tests phase's record: this module is also a pytest plugin (pytest -p gpu_campaign)

_outcomes: dict[str, tuple[str, str]] = {}  # node id -> (outcome, first failure line), in this pytest process


def _record(**fields: object) -> None:
    """One JSON line, written and flushed at once: a SIGKILL a moment later loses nothing before it."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a") as f:
            f.write(json.dumps({"group": os.environ.get(GROUP_ENV, ""), **fields}) + "\n")


def _over_limit(signum: int, frame: object) -> None:
    import pytest

    raise pytest.fail.Exception(f"over the campaign's per-test limit of {os.environ[LIMIT_ENV]} s", pytrace=False)


def pytest_collection_finish(session) -> None:  # type: ignore[no-untyped-def]
    _record(event="collected", tests=[item.nodeid for item in session.items],
            collect_only=bool(session.config.option.collectonly))


def pytest_runtest_logstart(nodeid: str, location: object) -> None:
    _record(event="start", test=nodeid)
    limit = float(os.environ.get(LIMIT_ENV) or 0)
    if limit > 0:  # SIGALRM fails a test stuck in Python; one stuck in C waits for the group's budget
        signal.signal(signal.SIGALRM, _over_limit)
        signal.setitimer(signal.ITIMER_REAL, limit)


def pytest_runtest_logreport(report) -> None:  # type: ignore[no-untyped-def]
    """The test's outcome: the first of set-up, call, tear-down that did not pass."""
    if report.nodeid in _outcomes and _outcomes[report.nodeid][0] != "passed":
        return
    outcome = {"failed": "failed" if report.when == "call" else "error"}.get(report.outcome, report.outcome)
    message = ""
    if report.outcome != "passed" and report.longrepr is not None:
        # the error line ("E   AssertionError: ..."), else the last line (a skip's reason, a fail(pytrace=False))
        text = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longreprtext
        lines = [line.strip() for line in str(text).splitlines() if line.strip()] or [""]
        message = next((line[1:].strip() for line in lines if line.startswith("E ")), lines[-1])[:300]
    _outcomes[report.nodeid] = (outcome, message)


def pytest_runtest_logfinish(nodeid: str, location: object) -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    outcome, message = _outcomes.get(nodeid, ("error", "no report"))
    _record(event="result", test=nodeid, outcome=outcome, message=message)


def tests_report(path: Path) -> list[str]:
    """campaign.md's test lines from ``tests.jsonl``: per group the counts, each failure with its
    line, the test a cut group was in and the tests it never started."""
    if not path.exists():
        return []
    groups: dict[str, dict] = {}
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line cut mid-write
        g = groups.setdefault(rec["group"], {"collected": [], "collect_only": False, "started": [], "results": {}})
        if rec["event"] == "collected":
            g["collected"] += rec["tests"]
            g["collect_only"] = rec["collect_only"]
        elif rec["event"] == "start":
            g["started"].append(rec["test"])
        elif rec["event"] == "result":
            g["results"][rec["test"]] = (rec["outcome"], rec["message"])
    lines = []
    for name, g in groups.items():
        if g["collect_only"]:
            lines.append(f"- {name}: {len(g['collected'])} collected (--collect-only)")
            continue
        counts: dict[str, int] = {}
        for outcome, _ in g["results"].values():
            counts[outcome] = counts.get(outcome, 0) + 1
        cut = [t for t in g["started"] if t not in g["results"]]
        never = [t for t in g["collected"] if t not in g["results"] and t not in cut]
        summary = ", ".join(f"{n} {o}" for o, n in sorted(counts.items())) or "no test finished"
        lines.append(f"- {name}: {summary}" + (f"; cut during {', '.join(cut)}" if cut else "")
                     + (f"; {len(never)} never started" if never else ""))
        lines += [f"  - {outcome}: {test}" + (f": {message}" if message else "")
                  for test, (outcome, message) in g["results"].items() if outcome != "skipped"]
        lines += [f"  - never started: {test}" for test in never]
    return lines


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="verb", required=True)
    prep = sub.add_parser("prepare", help="download/build the wheels the GPU machine lacks into .whl/ (+ .whl-dali/)")
    prep.add_argument("--dali", action="store_true", help="also DALI's CUDA wheels, split into parts (for a longer visit)")
    prep.add_argument("--part-mib", type=int, default=PART_MIB)
    stage = sub.add_parser("stage", help="on the GPU machine: keep the carried DALI part(s) in " + str(STAGE))
    stage.add_argument("--stage", type=Path, default=STAGE)
    inst = sub.add_parser("install-dali", help="on the GPU machine: install DALI from the staged parts")
    inst.add_argument("--into", type=Path, required=True)
    go = sub.add_parser("run", help="the campaign's phases, each under its budget")
    go.add_argument("--out", type=Path, required=True, help="where campaign.md and the logs go ($OUT on the machine)")
    go.add_argument("--work", type=Path, default=WORK, help=f"data, runs, scratch (default {WORK})")
    go.add_argument("--rehearse", action="store_true", help="the same phases in the same order, toy size, on the CPU")
    go.add_argument("--phases", nargs="+", choices=list(PHASES), default=None,
                    help="these phases, in this order (default: the whole plan)")
    sub.add_parser("plan", help="the one call's phases with their budgets, and the visit's total")
    args = p.parse_args(argv)
    if args.verb == "prepare":
        return prepare(args.dali, args.part_mib)
    if args.verb == "stage":
        if not (DALI_PARTS / "manifest.json").exists():
            print(f"gpu_campaign: no {DALI_PARTS.name}/manifest.json was carried: carry it with the part", file=sys.stderr)
            return 2
        have, total = stage_parts(DALI_PARTS, args.stage)
        print(f"staged {have} of {total} DALI parts in {args.stage}")
        return 0
    if args.verb == "install-dali":
        wheels = None
        for source in (STAGE, DALI_PARTS):
            if (source / "manifest.json").exists():
                if source == DALI_PARTS:
                    stage_parts(DALI_PARTS, STAGE)
                wheels = join_bundle(STAGE, args.into)
                break
        if wheels is None:
            print("DALI not installed: not every part is staged (`gpu_campaign.py stage` after carrying each part); "
                  "the DALI rows are left out")
            return 0
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        *map(str, wheels)], check=True)
        print(f"DALI installed from {len(wheels)} staged wheels")
        return 0
    if args.verb == "plan":
        print(plan_table(carried_mib()))
        return 0
    phases = args.phases or list(PHASES)
    return run(Campaign(out=args.out, rehearse=args.rehearse, work=args.work), phases)


if __name__ == "__main__":
    raise SystemExit(main())
