"""Each paper preset resolves to its source's numbers.

The expected values are written here as constants citing where they come from (paper, or the
authors' reference code), not read back from the YAML: the test composes the preset and builds
what the trainer builds from it (``largebatch.lr.scale_lr``, ``schedule_factors`` and the
scheduler on a dummy optimizer, ``largebatch.optim`` on a small model with BN and biases), then
compares the resolved peak lr, warmup length, start and end lr, decay power, weight decay and
excluded parameters with the source.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn

from largebatch.config import compose_config, to_train_config
from largebatch.lr import build_lr_scheduler, scale_lr, schedule_factors
from largebatch.optim import build_optimizer

IMAGENET_TRAIN = 1_281_167  # images in the ILSVRC-2012 train split (resnet_config.py num_train_images)


@dataclass(frozen=True)
class Reference:
    """What a source says one preset's run does, at the preset's global batch."""

    batch: int
    peak_lr: float
    warmup_epochs: float
    start_lr: float  # lr at step 0
    decay: str  # "poly" or "step"
    end_lr: float  # lr at the last step (poly)
    power: float  # poly power
    weight_decay: float
    epochs: float
    optimizer: str
    eps: float | None = None  # LARS epsilon


REFERENCES = {
    # Goyal et al. 2017 (arXiv 1706.02677) sec. 5.1: kn = 8k, eta = 0.1 * kn / 256, weight decay
    # 1e-4, 90 epochs, /10 at 30, 60, 80; sec. 2.2: warmup over 5 epochs from eta to k * eta.
    "goyal2017_rn50_8k": Reference(8192, 0.1 * 8192 / 256, 5, 0.1, "step", 0.0, 0.0, 1e-4, 90, "sgd"),
    # tensorflow/tpu models/official/resnet: lars_util.py poly_rate_schedule (32,768: plr 34,
    # w_epochs 12, warmup from 0, tf.train.polynomial_decay power 2, default end 1e-4),
    # configs/resnet_config.py weight_decay 1e-4, configs/cloud/v3-1024.yaml 3,558 steps at 32,768
    # (= 91.0 epochs), LARSOptimizer epsilon 0.
    "ying2018_rn50_32k_tpu": Reference(32768, 34.0, 12, 0.0, "poly", 1e-4, 2.0, 1e-4, 91, "lars", 0.0),
    # Jia et al. 2018: batch 64K, 90 epochs (abstract); the LARS schedule is the 65,536 row of the
    # same tensorflow/tpu lars_util.py (plr 41, 16 warmup epochs), chosen as the preset says.
    "jia2018_rn50_64k": Reference(65536, 41.0, 16, 0.0, "poly", 1e-4, 2.0, 1e-4, 90, "lars", 0.0),
    # mlcommons/training image_classification/tensorflow2: lars_util.py PolynomialDecayWithWarmup
    # (batch < 16,384: 10.0, 5 warmup epochs, from 0; end_learning_rate 1e-4; power 2.0),
    # define_lars_flags lars_epsilon 0, run_and_time.sh --weight_decay=0.0002 --train_epochs=41.
    "mlperf_rn50": Reference(3072, 10.0, 5, 0.0, "poly", 1e-4, 2.0, 2e-4, 41, "lars", 0.0),
    # tensorflow/tpu models/official/efficientnet: main.py scaled_lr = base_learning_rate *
    # batch / 256 (base lr chosen 0.1, see the preset), --lr_warmup_epochs 5 from 0,
    # utils.build_learning_rate poly end_learning_rate=0.1 power 2, weight decay 1e-5 in the loss
    # + --lars_weight_decay 1e-5, --lars_epsilon 0, 350 epochs. Batch: the paper (B2 32,768; B5 65,536).
    "wongpanich2020_effnet_b2": Reference(32768, 0.1 * 32768 / 256, 5, 0.0, "poly", 0.1, 2.0, 2e-5, 350, "lars", 0.0),
    "wongpanich2020_effnet_b5": Reference(65536, 0.1 * 65536 / 256, 5, 0.0, "poly", 0.1, 2.0, 2e-5, 350, "lars", 0.0),
}
# Top-1 at which each preset stops the time-to-accuracy clock: MLPerf's 75.90% for ResNet-50,
# except Jia et al., who report 75.8% (abstract); Wongpanich et al.: B2 79.7%, B5 83% (the paper).
TARGETS = {"goyal2017_rn50_8k": 75.9, "ying2018_rn50_32k_tpu": 75.9, "jia2018_rn50_64k": 75.8,
           "mlperf_rn50": 75.9, "wongpanich2020_effnet_b2": 79.7, "wongpanich2020_effnet_b5": 83.0}


def _cfg(name: str, *overrides: str):
    return to_train_config(compose_config([f"experiment={name}", "data.root=/data/imagenet", *overrides]))


def _lr_curve(cfg) -> tuple[list[float], int, int]:
    """The lr at every optimizer step of an ImageNet epoch budget, as the trainer builds it."""
    peak = scale_lr(cfg.optimizer.lr, cfg.global_batch_size, cfg.base_batch_size, cfg.lr_scaling)
    start, end = schedule_factors(
        peak, base_lr=cfg.optimizer.lr, warmup_start=cfg.schedule.warmup_start,
        warmup_start_factor=cfg.schedule.warmup_start_factor, end_lr=cfg.schedule.end_lr,
        end_factor=cfg.schedule.end_factor,
    )
    steps_per_epoch = IMAGENET_TRAIN // cfg.global_batch_size
    opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=peak)
    sched = build_lr_scheduler(
        opt, name=cfg.schedule.name, steps_per_epoch=steps_per_epoch, epochs=cfg.epochs,
        warmup_epochs=cfg.schedule.warmup_epochs, warmup_start_factor=start,
        milestones=cfg.schedule.milestones, gamma=cfg.schedule.gamma, power=cfg.schedule.power, end_factor=end,
    )
    total = steps_per_epoch * cfg.epochs
    multiplier = sched.lr_lambdas[0]  # what LambdaLR applies to the group's lr at each step
    return [peak * multiplier(step) for step in range(total)], steps_per_epoch, total


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_preset_resolves_to_its_source(name: str) -> None:
    ref, cfg = REFERENCES[name], _cfg(name)
    assert cfg.global_batch_size == ref.batch and cfg.epochs == ref.epochs
    assert cfg.optimizer.name == ref.optimizer and cfg.optimizer.weight_decay == pytest.approx(ref.weight_decay)
    assert cfg.target_top1 == TARGETS[name]
    if ref.eps is not None:
        assert cfg.optimizer.eps == ref.eps
    lrs, spe, total = _lr_curve(cfg)
    peak = max(lrs)
    assert peak == pytest.approx(ref.peak_lr, rel=1e-3)
    assert lrs[0] == pytest.approx(ref.start_lr, abs=1e-9)
    # Warmup: the first step at the peak. The references count warmup steps as
    # w_epochs * images // batch; an epoch here is whole steps (the last partial batch is
    # dropped), so the two differ by less than one step per warmup epoch.
    first_peak = next(i for i, lr in enumerate(lrs) if lr == pytest.approx(peak, rel=1e-9))
    assert first_peak == round(ref.warmup_epochs * spe)
    assert abs(first_peak - ref.warmup_epochs * IMAGENET_TRAIN // ref.batch) <= ref.warmup_epochs
    if ref.decay == "poly":
        assert lrs[-1] == pytest.approx(ref.end_lr, rel=0.05, abs=1e-3 * ref.end_lr + 1e-3 * (peak - ref.end_lr))
        mid = first_peak + (total - first_peak) // 2  # (1 - 1/2) ** power of the way from peak to end
        expected = ref.end_lr + (peak - ref.end_lr) * 0.5 ** ref.power
        assert lrs[mid] == pytest.approx(expected, rel=0.02)
    else:  # Goyal: /10 at epochs 30, 60, 80
        for epoch, factor in ((29, 1.0), (30, 0.1), (60, 0.01), (80, 0.001)):
            assert lrs[epoch * spe] == pytest.approx(ref.peak_lr * factor)


def test_goyal_warmup_start_follows_the_batch() -> None:
    """Goyal sec. 2.2: the warmup starts at eta = 0.1 (the lr per 256) whatever kn is (it was a
    constant 1/32, right only at 8k)."""
    for batch in (1024, 8192, 16384):
        lrs, _, _ = _lr_curve(_cfg("goyal2017_rn50_8k", f"global_batch_size={batch}"))
        assert lrs[0] == pytest.approx(0.1)
        assert max(lrs) == pytest.approx(0.1 * batch / 256)


def test_lookup_presets_keep_their_peak_when_the_batch_changes() -> None:
    """The TPU references look the lr up per batch: lr_scaling none, so a changed batch keeps the
    preset's row (the header says which row to set) instead of scaling it linearly."""
    cfg = _cfg("ying2018_rn50_32k_tpu", "global_batch_size=16384")
    assert scale_lr(cfg.optimizer.lr, 16384, cfg.base_batch_size, cfg.lr_scaling) == 34.0


class _Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 2)


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_preset_excludes_bn_and_bias(name: str) -> None:
    """BN and bias get no weight decay and (LARS) no trust ratio: lars_util.init_lars_optimizer
    skip_list ['batch_normalization', 'bias']; Goyal sec. 5.1 (no decay on BN gamma/beta)."""
    cfg = _cfg(name)
    model = _Tiny()
    opt = build_optimizer(cfg.optimizer.name, model, lr=1.0, weight_decay=cfg.optimizer.weight_decay,
                          exclude_bn_bias=cfg.optimizer.exclude_bn_bias)
    excluded = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.0 and g.get("lars_exclude") for p in g["params"]}
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == pytest.approx(REFERENCES[name].weight_decay)
               for p in g["params"]}
    assert excluded == {id(model.conv.bias), id(model.bn.weight), id(model.bn.bias), id(model.fc.bias)}
    assert decayed == {id(model.conv.weight), id(model.fc.weight)}
