"""Progressive resizing: the training crop side as a function of the epoch.

Training at a low resolution first and raising it later trades early-epoch accuracy for speed:
fast.ai's DAWNBench 2018 ResNet-50 trained at 128, then 224, then 288 px (steps); FFCV's ResNet
configs ramp the side linearly between two epochs (e.g. 160 -> 192 px), rounded to a multiple
of 32 so that only a few distinct sizes (and compiled shapes) occur. Evaluating at a higher
resolution than the training crops helps, as Touvron et al. 2019 explain ("Fixing the
train-test resolution discrepancy", arXiv 1906.06423): evaluation has its own side, or
follows the training side's phase as fast.ai's evaluated each phase at its own side.

The same run changed its random-resized crop with the side: its last phase (288 px) took crops
of at least half the image (``min_scale`` 0.5), the earlier ones of 8%: :func:`min_scale_at`
reads such per-epoch steps (``data.resolution.crop_scale_steps``), :func:`check_crop_scale_steps`
checks them.

:class:`ResolutionSchedule` is pure data (picklable: loader workers evaluate it); its
:meth:`~ResolutionSchedule.size_at` depends on the epoch only, so a run resumed inside an epoch
trains at the side the uninterrupted run had. Epochs count from 0, as in ``metrics.jsonl``.


:func:`resolution_of` maps the ``data.resolution`` config section to its training schedule, once:
the config checks (``largebatch.config.checks``) call it to validate the section and the run
(``largebatch.run``) to train by it. Ground under both and the loaders: it imports only
``largebatch.errors`` (the config's type only for annotations).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from largebatch.errors import ConfigError

if TYPE_CHECKING:
    from largebatch.config.schema import TrainConfig

__all__ = ["ResolutionSchedule", "check_crop_scale_steps", "min_scale_at", "ramp_size", "resolution_of",
           "side_setting"]


def ramp_size(epoch: int, *, start_epoch: int, end_epoch: int, start_size: int, end_size: int,
              multiple: int) -> int:
    """FFCV's linear resolution ramp: ``start_size`` up to ``start_epoch``, ``end_size`` from
    ``end_epoch`` on, in between the linear interpolation rounded to the nearest ``multiple``
    (half up)."""
    if epoch <= start_epoch:
        return start_size
    if epoch >= end_epoch:
        return end_size
    size = start_size + (end_size - start_size) * (epoch - start_epoch) / (end_epoch - start_epoch)
    return int(math.floor(size / multiple + 0.5)) * multiple


@dataclass(frozen=True)
class ResolutionSchedule:
    """The training crop side per epoch: steps or a linear ramp (``kind``), see the module docstring.

    Args:
        kind: ``steps`` (``steps``: ``((epoch, size), ...)``, ascending epochs, the first at 0:
            from each epoch on, that side) or ``ramp`` (:func:`ramp_size` of the other fields).
        steps: the steps' ``(epoch, size)`` pairs.
        start_epoch, end_epoch: the ramp's ends (epochs, ``start_epoch < end_epoch``).
        start_size, end_size: the side at and before ``start_epoch``, at and after ``end_epoch``.
        multiple: the ramp's sides in between are rounded to a multiple of it (FFCV: 32).
    """

    kind: str
    steps: tuple[tuple[int, int], ...] = ()
    start_epoch: int = 0
    end_epoch: int = 0
    start_size: int = 0
    end_size: int = 0
    multiple: int = 32

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", tuple((int(e), int(s)) for e, s in self.steps))

    @classmethod
    def of(cls, kind: str, *, steps: Sequence[Sequence[int]] = (), start_epoch: int = 0, end_epoch: int = 0,
           start_size: Optional[int] = None, end_size: Optional[int] = None, multiple: int = 32,
           image_size: int, epochs: Optional[int] = None) -> Optional["ResolutionSchedule"]:
        """The schedule of the ``data.resolution`` settings (None for ``kind="none"``), checked:
        a bad value raises one-line :class:`ConfigError` naming the key. ``start_size`` and
        ``end_size`` default to ``image_size``; ``epochs`` (the run's) bounds the epochs named."""
        if kind == "none":
            return None
        if kind == "steps":
            schedule = cls("steps", steps=tuple(_check_steps(steps, epochs)))
        elif kind == "ramp":
            schedule = cls("ramp", start_epoch=start_epoch, end_epoch=end_epoch,
                           start_size=image_size if start_size is None else start_size,
                           end_size=image_size if end_size is None else end_size, multiple=multiple)
            schedule._check_ramp(epochs)
        else:
            raise ConfigError(f"data.resolution.schedule={kind} is not a schedule: use none, steps or ramp")
        return schedule

    def size_at(self, epoch: int) -> int:
        """The training crop side (pixels) of epoch ``epoch`` (from 0)."""
        if self.kind == "steps":
            size = self.steps[0][1]
            for start, side in self.steps:
                if epoch >= start:
                    size = side
            return size
        return ramp_size(epoch, start_epoch=self.start_epoch, end_epoch=self.end_epoch, start_size=self.start_size,
                         end_size=self.end_size, multiple=self.multiple)

    @property
    def largest(self) -> int:
        """The largest training crop side (pixels) of any epoch: a step's, or a ramp's larger end."""
        if self.kind == "steps":
            return max(side for _, side in self.steps)
        return max(self.start_size, self.end_size)

    def sizes(self, epochs: int) -> list[int]:
        """The distinct sides of epochs ``0 .. epochs - 1``, in the order they are first used."""
        seen: list[int] = []
        for epoch in range(epochs):
            size = self.size_at(epoch)
            if size not in seen:
                seen.append(size)
        return seen

    def describe(self) -> str:
        """One line for the run log: ``steps 128 px from epoch 0, 224 px from epoch 2`` or the ramp."""
        if self.kind == "steps":
            return "steps " + ", ".join(f"{s} px from epoch {e}" for e, s in self.steps)
        return (f"ramp {self.start_size} px at epoch {self.start_epoch} -> {self.end_size} px at epoch "
                f"{self.end_epoch}, multiples of {self.multiple}")

    def _check_ramp(self, epochs: Optional[int]) -> None:
        key = "data.resolution"
        if not (_int(self.start_epoch) and self.start_epoch >= 0):
            _bad(f"{key}.start_epoch", self.start_epoch, "an integer >= 0")
        if not (_int(self.end_epoch) and self.end_epoch > self.start_epoch):
            _bad(f"{key}.end_epoch", self.end_epoch, f"an integer > data.resolution.start_epoch ({self.start_epoch})")
        if epochs is not None and self.end_epoch > epochs:
            _bad(f"{key}.end_epoch", self.end_epoch, f"<= epochs ({epochs})")
        if not (_int(self.multiple) and self.multiple >= 1):
            _bad(f"{key}.multiple", self.multiple, "an integer >= 1")
        for name in ("start_size", "end_size"):
            value = getattr(self, name)
            if not (_int(value) and value >= self.multiple):
                _bad(f"{key}.{name}", value, f"an integer >= data.resolution.multiple ({self.multiple})")


def resolution_of(cfg: TrainConfig) -> Optional[ResolutionSchedule]:
    """The ``data.resolution`` section's training side per epoch, checked (a bad value raises
    one-line ``ConfigError`` naming the key); None when ``schedule=none``. ``cfg`` is the composed
    config with its choices as plain strings (``to_train_config``)."""
    res = cfg.data.resolution
    if res.schedule == "none" and len(res.steps):
        raise ConfigError(f"data.resolution.steps={[list(p) for p in res.steps]} is set but "
                          "data.resolution.schedule=none: set data.resolution.schedule=steps to use it")
    return ResolutionSchedule.of(res.schedule, steps=[list(p) for p in res.steps], start_epoch=res.start_epoch,
                                 end_epoch=res.end_epoch, start_size=res.start_size, end_size=res.end_size,
                                 multiple=res.multiple, image_size=cfg.data.image_size, epochs=cfg.epochs)


def side_setting(schedule: Optional[ResolutionSchedule], image_size: int, side: int) -> str:
    """The setting that asks for the training side ``side``, with its value, as a message names
    it for the user to lower: ``data.image_size=224``, ``data.resolution.steps=[[0, 32], [1, 4096]]``,
    ``data.resolution.end_size=288``."""
    if schedule is None:
        return f"data.image_size={image_size}"
    if schedule.kind == "steps":
        return f"data.resolution.steps={[list(p) for p in schedule.steps]}"
    if side == schedule.end_size or side == schedule.start_size:
        name = "end_size" if side == schedule.end_size else "start_size"
        return f"data.resolution.{name}={side}"
    return f"data.resolution.start_size={schedule.start_size} and end_size={schedule.end_size}"


def _int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _bad(key: str, value: object, must: str) -> None:
    raise ConfigError(f"{key}={value} is out of range: it must be {must}; set {key}= to such a value")


def _check_steps(steps: Sequence[Sequence[int]], epochs: Optional[int]) -> list[tuple[int, int]]:
    key, must = "data.resolution.steps", "[[epoch, pixels], ...] with epochs ascending from 0 and pixels >= 1"
    pairs = [list(p) for p in steps]
    if not pairs or any(len(p) != 2 or not all(_int(v) for v in p) for p in pairs):
        _bad(key, pairs, must)
    epochs_named = [e for e, _ in pairs]
    if epochs_named[0] != 0 or any(b <= a for a, b in zip(epochs_named, epochs_named[1:])) or any(
            s < 1 for _, s in pairs):
        _bad(key, pairs, must)
    if epochs is not None and epochs_named[-1] >= epochs:
        _bad(key, pairs, f"{must}, each epoch < epochs ({epochs})")
    return [(e, s) for e, s in pairs]


def min_scale_at(steps: Sequence[tuple[int, float]], epoch: int, default: float) -> float:
    """The random-resized crop's minimum area fraction of epoch ``epoch`` (from 0): the value of
    the last ``(epoch, min_scale)`` step at or before it, ``default`` before the first."""
    scale = default
    for start, value in steps:
        if epoch >= start:
            scale = value
    return scale


def check_crop_scale_steps(steps: Sequence[Sequence[float]], *, max_scale: float,
                           epochs: Optional[int] = None) -> tuple[tuple[int, float], ...]:
    """``data.resolution.crop_scale_steps`` as ``((epoch, min_scale), ...)``, checked: epochs
    ascending from >= 0 (and < ``epochs``), each ``0 < min_scale <= max_scale``
    (``data.crop_scale[1]``); else one-line :class:`ConfigError` naming the key."""
    key = "data.resolution.crop_scale_steps"
    must = (f"[[epoch, min_scale], ...] with epochs ascending from >= 0 and 0 < min_scale <= data.crop_scale[1] "
            f"({max_scale})")
    pairs = [list(p) for p in steps]
    if any(len(p) != 2 or not all(_number(v) for v in p) or float(p[0]) != int(p[0]) for p in pairs):
        _bad(key, pairs, must)  # the config types the pairs as floats: a whole-number epoch is an epoch
    epochs_named = [e for e, _ in pairs]
    if any(e < 0 for e in epochs_named) or any(b <= a for a, b in zip(epochs_named, epochs_named[1:])) or any(
            not 0 < s <= max_scale for _, s in pairs):
        _bad(key, pairs, must)
    if epochs is not None and epochs_named and epochs_named[-1] >= epochs:
        _bad(key, pairs, f"{must}, each epoch < epochs ({epochs})")
    return tuple((int(e), float(s)) for e, s in pairs)
