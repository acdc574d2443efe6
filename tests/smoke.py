"""The override lists the training tests start from, written once.

``SHRUNK`` is ``debug=smoke`` shrunk further: 4 classes x 8 train images at 16 px, global batch 8,
so 4 steps per epoch and 2 epochs, with no progress bar, no TensorBoard and no loader workers.
``EXACT`` adds what makes an exact resume testable (``tests/test_resume.py``): fp32, a warmup +
cosine schedule whose position matters, and every checkpoint kept.

``smoke(*overrides)`` returns ``SHRUNK`` (or ``base``) with each override in place of the one for
the same key, or appended: ``smoke("data.workers=2", "epochs=3")``. A test's own overrides stay
written in the test; only the shared start is here.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["EXACT", "SHRUNK", "smoke"]

SHRUNK = [
    "debug=smoke",
    "progress=false",
    "tensorboard=false",
    "data.workers=0",
    "global_batch_size=8",
    "data.synthetic.train_per_class=8",
    "data.synthetic.val_per_class=2",
    "data.image_size=16",
]


def _key(override: str) -> str:
    return override.split("=", 1)[0]


def smoke(*overrides: str, base: Sequence[str] = SHRUNK) -> list[str]:
    """``base`` with each of ``overrides`` replacing the entry for its key, or appended."""
    out = list(base)
    for override in overrides:
        keys = [_key(o) for o in out]
        if _key(override) in keys:
            out[keys.index(_key(override))] = override
        else:
            out.append(override)
    return out


# A warmup + cosine schedule and random-resized crops make the schedule position and the RNG
# state matter; momentum SGD makes the optimizer state matter.
EXACT = smoke("model=resnet10t", "precision=fp32", "schedule=cosine", "schedule.warmup_epochs=0.5",
              "checkpoint.keep=0")
