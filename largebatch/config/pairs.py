"""The list-of-pairs keys: each item a pair ``[epoch, value]`` of the right types, or one line.

``data.resolution.steps``, ``data.resolution.crop_scale_steps``, ``batch_schedule.steps`` and
``schedule.points`` are lists of ``[epoch, value]`` pairs. The schema types them as lists of
anything, so a flat list (``[1,64]``), a ``null`` item or a float batch (``[[1,64.0]]``) reaches
:func:`check_pair_list`, which names the key, the item (position from 1, and value) and the form
to write, derived from what was written where it can be (``[1,64]`` -> ``[[1,64]]``). A value that
is no list at all (``crop_scale_steps=0.5``) fails in OmegaConf's merge; ``hydra_errors`` hands
it here too. The ranges (epochs ascending, sides >= 1, ...) are checked afterwards, by the
builders of each feature (``largebatch.config.checks``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

from largebatch.errors import ConfigError

__all__ = ["PAIR_KEYS", "check_pair_list"]


def _integer(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _whole(x: Any) -> bool:
    """An integer, or a float that is one (the epoch of a pair whose value is a float)."""
    return _integer(x) or (isinstance(x, float) and math.isfinite(x) and x == int(x))


@dataclass(frozen=True)
class PairForm:
    """What each item of a list-of-pairs key is: ``names`` ("[epoch, pixels]"), a test per slot,
    the types in words, and an example every default run accepts (the form when none can be
    derived from the value written)."""

    names: str
    tests: tuple[Callable[[Any], bool], Callable[[Any], bool]]
    types: str
    integer_slots: tuple[bool, bool]  # a whole float written there is suggested as an int
    example: tuple[tuple[float, float], ...]


PAIR_KEYS: dict[str, PairForm] = {
    "data.resolution.steps": PairForm("[epoch, pixels]", (_integer, _integer), "of integers", (True, True),
                                      ((0, 32),)),
    "data.resolution.crop_scale_steps": PairForm("[epoch, min_scale]", (_whole, _number),
                                                 "of an integer and a number", (True, False), ((1, 0.5),)),
    "batch_schedule.steps": PairForm("[epoch, global_batch_size]", (_integer, _integer), "of integers",
                                     (True, True), ((1, 64),)),
    "schedule.points": PairForm("[epoch, factor]", (_number, _number), "of numbers", (False, False),
                                ((0, 1), (1, 0.5))),
}


def _shown(value: Any) -> str:
    """``value`` as the command line writes it (``null``, ``[1, 64.0]``, ``'abc'``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _written(pairs: Sequence[Sequence[float]]) -> str:
    """``[[1,64],[2,128]]``: no spaces, so the shell passes it as one word."""
    return "[" + ",".join(f"[{p[0]!r},{p[1]!r}]" for p in pairs) + "]"


def _as_pair(form: PairForm, item: Any) -> Optional[tuple[float, float]]:
    """``item`` as a pair of the form, a whole float in an integer slot made an int; None if it is none."""
    if not (isinstance(item, (list, tuple)) and len(item) == 2 and all(_number(v) for v in item)):
        return None
    pair = tuple(int(v) if whole and _whole(v) else v for v, whole in zip(item, form.integer_slots))
    return pair if all(ok(v) for ok, v in zip(form.tests, pair)) else None  # type: ignore[return-value]


def _suggestion(form: PairForm, value: Any) -> tuple[tuple[float, float], ...]:
    """The pairs the value meant, where that can be read (a flat ``[e1, v1, e2, v2]``, pairs with
    whole floats, a lone value: the example's first epoch with it); else the form's example."""
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if len(items) == 1 and not isinstance(items[0], (list, tuple)):  # a lone value: the pair's value
        items = [[form.example[0][0], items[0]]]
    elif items and not any(isinstance(v, (list, tuple)) for v in items) and len(items) % 2 == 0:
        items = [items[i:i + 2] for i in range(0, len(items), 2)]  # flat: paired up in order
    pairs = [_as_pair(form, item) for item in items]
    if not pairs or any(p is None for p in pairs):
        return form.example
    return tuple(pairs)  # type: ignore[arg-type]


def check_pair_list(key: str, value: Any) -> None:
    """Raise a one-line :class:`ConfigError` unless ``value`` (of ``key``, one of :data:`PAIR_KEYS`)
    is a list of pairs of its form's types; the line names the item and the form to write."""
    form = PAIR_KEYS[key]
    fix = f"write {key}={_written(_suggestion(form, value))}"
    if not isinstance(value, (list, tuple)):
        raise ConfigError(f"{key}={_shown(value)} is not a list of pairs {form.names}; {fix}")
    for position, item in enumerate(value, start=1):
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise ConfigError(f"{key}: item {position} is {_shown(item)}, not a pair {form.names}; {fix}")
        if not all(ok(v) for ok, v in zip(form.tests, item)):
            raise ConfigError(f"{key}: item {position} is {_shown(item)}, not a pair {form.names} {form.types}; "
                              f"{fix}")
