"""Typed schema of the Hydra config tree (``conf/``).

One dataclass per config group. ``conf/train.yaml`` lists ``train_schema`` first in its
defaults, so every YAML file and every command-line override is merged into these typed
nodes: a mistyped key or a value of the wrong type fails at compose time, naming the key.
Choice-valued settings are Enums, so an invalid choice names the valid ones.

Units are written next to each hyperparameter: the learning rate is *per base_batch_size
images* and is scaled to ``global_batch_size`` by ``lr_scaling`` (see ``largebatch.lr``).

One source for each value: a key that ``conf/train.yaml`` or every option of its group sets
(the recipe: batch, lr, epochs, crop size, model, optimizer, ...) has no default here
(``MISSING``), so the YAML is where a reader finds the default run's value. The defaults
written here are for keys no YAML file sets (checkpoint cadence, logging, seeds, ...), and a
test checks that none of them contradicts the default composition.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING

from largebatch import defaults as _defaults

__all__ = [
    "BackendConfig",
    "BNConfig",
    "CheckpointConfig",
    "CommConfig",
    "DataConfig",
    "DiagnosticsConfig",
    "EmaConfig",
    "ModelConfig",
    "NoiseScaleConfig",
    "OptimizerConfig",
    "PrecisionConfig",
    "RecipeConfig",
    "ResolutionConfig",
    "ScheduleConfig",
    "SyntheticDataConfig",
    "TrainConfig",
    "register_schema",
]


class LRScaling(str, Enum):
    linear = "linear"  # Goyal et al. 2017: lr = lr_base * global / base
    sqrt = "sqrt"  # Krizhevsky 2014 / You et al. 2019: lr = lr_base * sqrt(global / base)
    none = "none"


class ScheduleName(str, Enum):
    constant = "constant"
    step = "step"
    cosine = "cosine"
    poly = "poly"
    piecewise = "piecewise"  # schedule.points: linear between [epoch, factor] knots (fast.ai's phases)


class WarmupStart(str, Enum):
    factor = "factor"  # warmup_start_factor x the scaled lr
    base_lr = "base_lr"  # optimizer.lr, the lr per base_batch_size images (Goyal et al. 2017 sec. 2.2)


class RecipeMode(str, Enum):
    auto = "auto"  # data=imagenet without an experiment: the published recipe at the global batch
    off = "off"  # the values the config groups give, as composed


class PrecisionName(str, Enum):
    auto = "auto"  # bf16 where the device computes it natively, else fp32
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"  # autocast + dynamic loss scaling (GPU)


class BackendName(str, Enum):
    auto = "auto"  # xla if PJRT_DEVICE is set, cuda if a GPU is visible, else cpu
    cpu = "cpu"  # torch.distributed over gloo
    cuda = "cuda"  # torch.distributed over NCCL
    xla = "xla"  # torch-xla (PJRT)


class LoaderName(str, Enum):
    torchvision = "torchvision"
    dali = "dali"
    nvjpeg = "nvjpeg"  # workers read bytes; torchvision's nvJPEG decodes and augments on the GPU
    decoded = "decoded"  # each split decoded once into a store in the cache; crops cut per batch
    auto = "auto"  # DALI where installed (and the data checked); else nvjpeg on CUDA, torchvision elsewhere


class ResolutionKind(str, Enum):
    none = "none"  # every epoch at data.image_size
    steps = "steps"  # data.resolution.steps: [[epoch, pixels], ...] (fast.ai, DAWNBench 2018)
    ramp = "ramp"  # linear from start_size to end_size between two epochs (FFCV)


class BatchGrowth(str, Enum):
    accumulation = "accumulation"  # k times the micro-batches per step (no new shapes)
    per_device = "per_device"  # k loader batches concatenated: k times the per-device batch


class BatchLR(str, Enum):
    scale = "scale"  # the lr follows lr_scaling per phase (Mikami et al.)
    hold = "hold"  # the lr stays (Smith et al.: raise the batch instead of decaying the lr)


class CommAlgorithm(str, Enum):
    flat = "flat"
    hierarchical = "hierarchical"
    torus2d = "torus2d"


class CommCompress(str, Enum):
    none = "none"
    fp16 = "fp16"
    bf16 = "bf16"


class EmaTarget(str, Enum):
    raw = "raw"  # the trained weights' top-1
    ema = "ema"  # the weight EMA's top-1 (what the EfficientNet reference reports)


class NonFinitePolicy(str, Enum):
    skip = "skip"
    stop = "stop"


@dataclass
class ModelConfig:
    name: str = MISSING  # any timm model name (presets: conf/model/)
    zero_init_last_bn: bool = MISSING  # Goyal et al. 2017 sec. 5.1: gamma=0 in each block's last BN
    channels_last: Optional[bool] = None  # NHWC memory; null: on CUDA devices only (1.75x for RN50)
    drop_rate: float = 0.0  # dropout before the classifier (timm's drop_rate)
    drop_path_rate: float = 0.0  # stochastic depth rate (timm's drop_path_rate)
    # the classifier's weights drawn from N(0, fc_init_std) (fast.ai's DAWNBench code: 0.01);
    # null: timm's initialisation
    fc_init_std: Optional[float] = None
    # torch.compile mode (reduce-overhead and max-autotune replay CUDA graphs);
    # true/false mean default/none. Costs start-up time (~50 s for resnet18 on a
    # CPU). The run's config records the mode by its name (true is saved as default).
    compile: str = "none"


@dataclass
class OptimizerConfig:
    """The optimizer and its options (presets: ``conf/optimizer/``).

    The optimizer-specific options (``momentum`` to ``foreach``) are null by
    default: the optimizer's own default. Setting one the chosen optimizer does
    not take is an error at start, naming the option.
    """

    name: str = MISSING  # which optimizer; each name is also a preset: optimizer=<name>
    lr: float = MISSING  # per base_batch_size images, before scaling
    weight_decay: float = MISSING  # weight decay coefficient (not scaled with the batch)
    exclude_bn_bias: bool = MISSING  # no weight decay / no LARS adaptation on BN and bias
    # with exclude_bn_bias: true excludes the normalisation layers' parameters only, and biases
    # are decayed and adapted like weights (fast.ai's DAWNBench code, --no-bn-wd)
    decay_bias: bool = False
    # SGD, LARS: heavy-ball momentum (null: the optimizer's default)
    momentum: Optional[float] = None
    nesterov: Optional[bool] = None  # SGD, LARS: Nesterov momentum
    # LARS, LARC: the trust coefficient eta (You et al. 2017)
    trust_coefficient: Optional[float] = None
    eps: Optional[float] = None  # LARS, LAMB: added to the trust ratio's denominator
    # LARS: true folds lr x trust ratio into the momentum buffer (the TensorFlow LARS optimizers the
    # paper presets cite), false keeps torch's SGD form (lr multiplies the buffer); see
    # largebatch.optim.LARS. A resume that changes it is refused (the buffers mean different things).
    lr_in_momentum: Optional[bool] = None
    betas: Optional[List[float]] = None  # LAMB: Adam's moment decays [beta1, beta2]
    # LARS, LAMB: multi-tensor (foreach) kernels; null: the optimizer decides
    foreach: Optional[bool] = None


@dataclass
class ScheduleConfig:
    name: ScheduleName = MISSING  # the decay after warmup (presets: conf/schedule/)
    # [epochs] gradual warmup (Goyal et al. 2017 sec. 2.2), raised per iteration
    warmup_epochs: float = MISSING
    warmup_start_factor: float = 0.1  # warmup starts at this fraction of the scaled lr
    # [epochs] step decay: where the lr is multiplied by gamma
    milestones: List[float] = field(default_factory=list)
    gamma: float = 0.1  # step decay: factor at each milestone
    power: float = 2.0  # poly decay exponent (MLPerf ResNet-50: 2)
    end_factor: float = 0.0  # cosine/poly: final lr as a fraction of the scaled lr
    # Where warmup starts: "factor" (warmup_start_factor x the scaled lr) or "base_lr" (the
    # unscaled optimizer.lr, Goyal et al.'s "from eta to k*eta", right at any global batch).
    warmup_start: WarmupStart = WarmupStart.factor
    end_lr: Optional[float] = None  # cosine/poly: absolute final lr; set, it replaces end_factor
    # piecewise: [[epoch, factor], ...] of the scaled lr, epochs ascending (equal epochs: a jump),
    # linear in between, the first factor before and the last after
    points: List[Any] = field(default_factory=list)


@dataclass
class SyntheticDataConfig:
    """The embedded data set (``data.root=null``), generated on first use.

    The defaults are the generator's own (``largebatch.defaults``), so a data
    preset without a ``synthetic`` block and ``largebatch-make-synthetic``
    agree with ``conf/data/embedded.yaml``.
    """

    classes: int = _defaults.DEFAULT_CLASSES  # classes of the embedded data set
    # [images] training images generated per class
    train_per_class: int = _defaults.DEFAULT_TRAIN_PER_CLASS
    # [images] validation images generated per class
    val_per_class: int = _defaults.DEFAULT_VAL_PER_CLASS
    image_size: int = _defaults.DEFAULT_IMAGE_SIZE  # [pixels] generated JPEG side
    seed: int = 0  # seed of the generator (the same seed makes the same images)


@dataclass
class ResolutionConfig:
    """Progressive resizing: the training crop side and crop scale per epoch
    (``largebatch.resolution``), and the evaluation side. Epochs count from 0. Every loader
    (torchvision, nvjpeg, DALI over files or ``data.shards``) follows it; ``rect_val`` only the
    torchvision loader."""

    # none: every epoch at data.image_size; steps: data.resolution.steps; ramp: linear between
    # start_epoch and end_epoch, rounded to a multiple of `multiple`
    schedule: ResolutionKind = ResolutionKind.none
    # steps only: [[epoch, pixels], ...], epochs ascending from 0: from that epoch on, that side
    steps: List[Any] = field(default_factory=list)
    start_epoch: int = 0  # [epochs] ramp: start_size up to this epoch
    end_epoch: int = 0  # [epochs] ramp: end_size from this epoch on
    start_size: Optional[int] = None  # [pixels] ramp: the first side; null: data.image_size
    end_size: Optional[int] = None  # [pixels] ramp: the last side; null: data.image_size
    multiple: int = 32  # [pixels] ramp: sides in between rounded to a multiple of this
    # [pixels] evaluation crop side (centre crop of the image resized to eval_size /
    # data.val_crop_ratio); null: data.image_size
    eval_size: Optional[int] = None
    # evaluate after each epoch at that epoch's training side (fast.ai, DAWNBench 2018: each
    # phase at its own side); needs eval_size=null
    eval_follows_train: bool = False
    # [[epoch, min_scale], ...], epochs ascending from >= 0: from that epoch on, the training
    # crop's minimum area fraction (fast.ai 2018: 0.5 in its 288 px phase); data.crop_scale[0]
    # before the first step, data.crop_scale[1] the maximum throughout
    crop_scale_steps: List[Any] = field(default_factory=list)
    # evaluation in batches of like aspect ratio (fast.ai, DAWNBench 2018): the val set sorted
    # by width/height, each batch centre-cropped to one rectangle, short side the evaluation
    # side, long side from the batch's mean ratio (a multiple of 8); torchvision loader only,
    # not on XLA (a graph per shape)
    rect_val: bool = False
    # [epochs] rect_val=true only for evaluations after this epoch and later ones (fast.ai 2018:
    # its last phase); the earlier ones take the centre square
    rect_val_from_epoch: int = 0


@dataclass
class DataConfig:
    # ImageFolder root with train/ and val/; null: the embedded data set. No default, so a
    # data preset that does not set it (data=imagenet) asks for it at compose time.
    root: Optional[str] = MISSING
    loader: LoaderName = MISSING  # the input pipeline ([Input pipelines](input-pipelines.md))
    image_size: int = MISSING  # [pixels] training crop side
    val_crop_ratio: float = MISSING  # val: resize shorter side to image_size/ratio, center crop
    # [fraction of the image's area] RandomResizedCrop's area range
    crop_scale: List[float] = MISSING
    workers: int = MISSING  # DataLoader workers (or DALI threads) per process
    # Folder written by `largebatch-make-shards ROOT OUT` (WebDataset tars + DALI indexes):
    # read train/val from it with DALI's webdataset reader instead of data.root's files.
    shards: Optional[str] = None
    # data.shards only: samples DALI's webdataset reader mixes inside a rank's part (memory:
    # this many decoded-size samples per rank; 1: the packed order, shuffled per archive only)
    shuffle_buffer: int = _defaults.SHUFFLE_BUFFER
    synthetic: SyntheticDataConfig = field(default_factory=SyntheticDataConfig)
    resolution: ResolutionConfig = field(default_factory=ResolutionConfig)


@dataclass
class AdaptiveBatchConfig:
    """The batch raised by the measured gradient noise scale (``largebatch.batch_schedule.
    AdaptiveBatchSchedule``; McCandlish et al. 2018 App. D, Merrill et al. 2025), decided at each
    epoch start; needs the noise scale measured (diagnostics.noise_scale) and steps=[]."""

    enabled: bool = False  # decide each epoch's global batch from the noise scale
    # raise when the measured B_simple >= raise_at x the current global batch (finite: a batch
    # never raised is enabled=false)
    raise_at: float = 2.0
    growth: int = 2  # the factor of each raise
    # [images] no raise past this global batch (a multiple of global_batch_size); null: while an
    # epoch still has a whole optimizer step
    max_global_batch: Optional[int] = None


@dataclass
class BatchScheduleConfig:
    """Batch-size control: the global batch per epoch (``largebatch.batch_schedule``; Mikami et
    al. 2018, Smith et al. 2017). Epochs count from 0; before the first step, global_batch_size."""

    # [[epoch, global_batch], ...], epochs ascending in 1..epochs-1: from that epoch on, that global
    # batch, a whole multiple of global_batch_size, higher or lower than the phase before it;
    # []: global_batch_size every epoch
    steps: List[Any] = field(default_factory=list)
    via: BatchGrowth = BatchGrowth.accumulation  # how the larger batch is reached
    lr: BatchLR = BatchLR.scale  # the lr per phase: by lr_scaling, or held
    adaptive: AdaptiveBatchConfig = field(default_factory=AdaptiveBatchConfig)


@dataclass
class PrecisionConfig:
    name: PrecisionName = MISSING  # compute precision (autocast dtype)
    init_scale: float = 65536.0  # fp16 dynamic loss scaling: initial scale
    # [optimizer steps] fp16: steps without overflow before the scale doubles
    growth_interval: int = 2000


@dataclass
class BackendConfig:
    name: BackendName = MISSING  # where the run computes and communicates
    timeout_s: int = 1800  # [seconds] a collective waiting longer fails the run
    # CUDA only: cuDNN times its convolution algorithms on the first step of each shape and
    # keeps the fastest (fixed image size: a few slow first steps, then faster ones);
    # the throughput benchmark measures with it on, so its numbers carry over to training.
    cudnn_benchmark: bool = True


@dataclass
class BNConfig:
    # Ranks whose batches form one BN batch (Ying et al. 2018 sec. 3.3): 1 = per-worker BN
    # (Goyal et al.), -1 = the whole world.
    group_size: int = MISSING


@dataclass
class CommConfig:
    algorithm: CommAlgorithm = MISSING  # how gradients are all-reduced
    compress: CommCompress = MISSING  # dtype gradients travel in (none: their own)
    bucket_mb: float = MISSING  # [MiB] DDP bucket (tensor fusion) size
    # ranks per node of the hierarchical and torus2d algorithms; null: torchrun's
    # LOCAL_WORLD_SIZE
    ranks_per_node: Optional[int] = None


@dataclass
class CheckpointConfig:
    every_epochs: int = 1  # [epochs] between checkpoints; 0: only at the end
    # [optimizer steps] between checkpoints inside an epoch; 0: only at epoch ends
    every_steps: int = 0
    keep: int = 3  # newest checkpoints kept on disk


@dataclass
class EmaConfig:
    """Weight EMA (timm ``ModelEmaV3``: parameters and BN buffers), see ``largebatch.engine.ema``."""

    enabled: bool = False  # keep an EMA of the weights and evaluate it too
    decay: float = 0.9999  # per EMA update; horizon ~ every / (1 - decay) optimizer steps
    # timm's decay of the n-th update (n = 1, 2, ...), k = n - 1 - update_after_step:
    # 0 while k <= 0 (a copy of the weights), then with warmup clamp(1 - (1 + k / warmup_gamma)
    # ** -warmup_power, min_decay, decay), without it decay.
    warmup: bool = False
    warmup_gamma: float = 1.0  # warmup: the ramp's time scale, in updates
    warmup_power: float = 0.6666666666666666  # warmup: the ramp's exponent (timm: 2/3)
    min_decay: float = 0.0  # warmup: the decay is at least this
    # timm's update_after_step; -2 with warmup_gamma 9 and warmup_power 1 gives TensorFlow's
    # ExponentialMovingAverage(decay, num_updates=step): min(decay, (1 + n) / (10 + n)).
    update_after_step: int = 0
    every: int = 1  # [optimizer steps] between EMA updates
    # Which top-1 the run reports (best_top1) and times to target_top1; ema needs enabled=true.
    target: EmaTarget = EmaTarget.raw


@dataclass
class NoiseScaleConfig:
    """The gradient noise scale B_simple (McCandlish et al. 2018, arXiv 1812.06162), measured from
    two gradient norms each step where they come free, or by an opt-in probe where they do not;
    see ``largebatch.engine.noise_scale_hook``."""

    # on wherever it costs no extra backward: several ranks (local vs all-reduced gradient) or
    # accumulation_steps >= 2 (first micro-batch vs the step); one process without accumulation
    # is measured only with probe_every
    enabled: bool = True
    # EMA decay per measured step: ~(1+beta)/(1-beta) = 199 measurements (with the
    # probe, one every probe_every optimizer steps)
    beta: float = 0.99
    # one process without accumulation only: every N optimizer steps, the batch's two halves
    # run forward and backward once more (one extra backward per probe, about one step's
    # compute: a probe step took 1.2-1.5 steps on a 2-core CPU, N=10 cost 12-15%); 0 = no
    # probe
    probe_every: int = 0


@dataclass
class DiagnosticsConfig:
    """Measurements of the run that do not change it."""

    noise_scale: NoiseScaleConfig = field(default_factory=NoiseScaleConfig)


@dataclass
class RecipeConfig:
    """The ImageNet recipe derived from the published runs (``largebatch.imagenet_recipe``)."""

    # auto: on data=imagenet without an experiment preset, the published recipe for the model at
    # the global batch (a key set on the command line wins); off: the config groups' values
    mode: RecipeMode = RecipeMode.auto
    # written when the config is composed, not by hand: each derived key -> "value: source"
    derived: Dict[str, str] = field(default_factory=dict)
    # written when the config is composed: a batch outside the published points, named
    warnings: List[str] = field(default_factory=list)


@dataclass
class TrainConfig:
    """The whole run. ``to_train_config`` returns it with each Enum choice as its plain string."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    bn: BNConfig = field(default_factory=BNConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    ema: EmaConfig = field(default_factory=EmaConfig)
    diagnostics: DiagnosticsConfig = field(default_factory=DiagnosticsConfig)
    batch_schedule: BatchScheduleConfig = field(default_factory=BatchScheduleConfig)
    recipe: RecipeConfig = field(default_factory=RecipeConfig)

    epochs: int = MISSING  # [epochs] passes over the training set
    # [images] per optimizer step, all devices together
    global_batch_size: int = MISSING
    base_batch_size: int = MISSING  # [images] the batch optimizer.lr is given for
    # how optimizer.lr grows with global_batch_size / base_batch_size
    lr_scaling: LRScaling = MISSING
    accumulation_steps: int = 1  # micro-batches per optimizer step
    # weight of the uniform distribution mixed into the one-hot target
    label_smoothing: float = MISSING
    seed: int = 0  # seeds the initial weights, the data order and augmentation
    # [epochs] between evaluations (the last epoch is always evaluated)
    eval_every: int = 1
    # [optimizer steps] between loss read-backs / log lines
    log_every: int = _defaults.LOG_EVERY
    # [percent] null: none; time-to-accuracy is reported against it
    target_top1: Optional[float] = MISSING
    stop_at_target: bool = False  # end the run at the evaluation that reaches target_top1
    # [optimizer steps] stop after this many (smoke runs); null: run every epoch
    max_steps: Optional[int] = None
    # a non-finite loss or gradient: stop the run, or skip the step
    non_finite: NonFinitePolicy = NonFinitePolicy.stop
    # [optimizer steps] with non_finite=skip: give up after this many skipped steps
    max_skipped_steps: int = _defaults.MAX_SKIPPED_STEPS
    # a new run directory is made under it unless run_dir is set
    output_root: str = MISSING
    run_dir: Optional[str] = None  # the run's directory, exactly (null: under output_root)
    resume: Optional[str] = None  # null | auto | path to a checkpoint
    progress: bool = True  # tqdm progress bar on rank 0
    tensorboard: bool = True  # write TensorBoard event files in the run directory


def register_schema() -> None:
    """Register the schema under the name ``train_schema`` (used by conf/train.yaml)."""
    ConfigStore.instance().store(name="train_schema", node=TrainConfig)
