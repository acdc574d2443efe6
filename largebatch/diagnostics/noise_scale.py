"""The simple gradient noise scale ``B_simple``, measured from two gradient norms during training.

Based on McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training"
(arXiv 1812.06162). With ``G`` the true (full-data) gradient and ``Σ`` the covariance of the
per-example gradients, section 2 (Figure 1) defines the simple noise scale::

    B_simple = tr(Σ) / |G|²

the batch size around which a bigger batch stops buying a proportionally bigger step (below it,
doubling the batch about halves the steps; far above it, the steps hardly fall).

The mean gradient ``G_B`` of a batch of ``B`` independent examples has ``E|G_B|² = |G|² + tr(Σ)/B``.
Appendix A.1 measures that at two batch sizes ``B_small < B_big`` and solves for both terms, each
estimate unbiased::

    |G|²  ≈ (B_big · |G_big|² − B_small · |G_small|²) / (B_big − B_small)
    tr(Σ) ≈ (|G_small|² − |G_big|²) / (1/B_small − 1/B_big)

Each per-step estimate is very noisy (its standard deviation is of the order of the value), and the
ratio of two noisy unbiased estimates is biased (the |G|² estimate sits in a denominator and is
negatively correlated with the tr(Σ) one), so the appendix averages each term over steps first and
takes the ratio of the averages: :class:`GradientNoiseScale` does that with an exponential moving
average. In data-parallel training both norms come free: a rank's local gradient, before the
all-reduce, is the ``B_small`` one (``B_small`` = the per-rank batch) and the all-reduced gradient the
``B_big`` one (``B_big`` = the global batch), the pair appendix A.1 suggests.

The gradients must be means over their batch (a loss with ``reduction="mean"``): with a summed
loss the squared norms grow with ``B²`` and the formulas do not hold.

Nothing here reads a tensor back to the host or branches on a tensor value: the estimates, the
averages and the ratio are device tensors (``torch.where`` handles the edge cases), so the same
update runs every step on CUDA or XLA without a sync; read the values on log steps only.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any, Iterable, Optional, Protocol, Union

import torch
from torch import Tensor

from largebatch.errors import UsageError

__all__ = [
    "GradientNoiseScale",
    "LocalNormTap",
    "grad_sq_norm_estimate",
    "noise_trace_estimate",
    "squared_norm",
]

Scalar = Union[Tensor, float]


class LocalNormTap(Protocol):
    """Where a data-parallel run finds the ``B_small`` gradient: this rank's local gradient, before
    the reduction overwrites it. A backend's ``wrap_model(tap_local_norm=True)`` returns one
    (``largebatch.comm.SquaredNormTap`` around DDP's comm hook, ``largebatch.backends.xla.XlaLocalNormTap``
    over ``.grad`` on XLA replicas).

    :meth:`take`, asked after the step's last backward, gives ``|local gradient|²`` (a 0-dim
    float32 device tensor; None: nothing recorded). ``reduces_in_optimizer_step`` says where the
    reduced (``B_big``) gradient is then found: False, in ``.grad`` after the last backward (DDP);
    True, in ``.grad`` in the optimizer's step pre-hooks (XLA reduces in ``optimizer_step``).
    """

    reduces_in_optimizer_step: bool

    def take(self) -> Optional[Tensor]: ...


def _check_batches(batch_small: Any, batch_big: Any, where: str) -> None:
    for name, value in (("batch_small", batch_small), ("batch_big", batch_big)):
        # a tensor batch size would need a host read to check: the sizes are the caller's plain numbers
        if isinstance(value, Tensor) or isinstance(value, bool) or not isinstance(value, Real):
            raise UsageError(f"{where}: {name} must be a number of examples (int), got {type(value).__name__}")
        if not (math.isfinite(float(value)) and float(value) > 0):
            raise UsageError(f"{where}: {name}={value!r} must be a positive number of examples")
    if not float(batch_small) < float(batch_big):
        raise UsageError(
            f"{where}: batch_small={batch_small!r} must be smaller than batch_big={batch_big!r}: the two "
            f"squared norms must come from batches of different sizes (in data-parallel training the "
            f"per-rank batch and the global batch)"
        )


def grad_sq_norm_estimate(sq_norm_small: Scalar, batch_small: float, sq_norm_big: Scalar, batch_big: float) -> Scalar:
    """Unbiased estimate of ``|G|²``, the squared norm of the true gradient (arXiv 1812.06162, appendix A.1).

    ``(B_big · |G_big|² − B_small · |G_small|²) / (B_big − B_small)``. One step's estimate is noisy and
    can be negative; average it over steps (see :class:`GradientNoiseScale`).

    Args:
        sq_norm_small: ``|G_small|²``, the squared norm of a mean gradient over ``batch_small`` examples
            (a 0-dim tensor or a float).
        batch_small: ``B_small``, examples behind ``sq_norm_small`` (> 0).
        sq_norm_big: ``|G_big|²``, the same over ``batch_big`` examples.
        batch_big: ``B_big`` (> ``batch_small``).

    Returns:
        The estimate, a tensor on the inputs' device (a float for float inputs).

    Raises:
        UsageError (a ``ValueError``): a batch size that is not positive, or ``batch_small >= batch_big``.
    """
    _check_batches(batch_small, batch_big, "grad_sq_norm_estimate")
    return (batch_big * sq_norm_big - batch_small * sq_norm_small) / (batch_big - batch_small)


def noise_trace_estimate(sq_norm_small: Scalar, batch_small: float, sq_norm_big: Scalar, batch_big: float) -> Scalar:
    """Unbiased estimate of ``tr(Σ)``, the summed variance of the per-example gradients (appendix A.1).

    ``(|G_small|² − |G_big|²) / (1/B_small − 1/B_big)``. One step's estimate is noisy and can be
    negative; average it over steps (see :class:`GradientNoiseScale`).

    Args:
        sq_norm_small: ``|G_small|²``, the squared norm of a mean gradient over ``batch_small`` examples
            (a 0-dim tensor or a float).
        batch_small: ``B_small``, examples behind ``sq_norm_small`` (> 0).
        sq_norm_big: ``|G_big|²``, the same over ``batch_big`` examples.
        batch_big: ``B_big`` (> ``batch_small``).

    Returns:
        The estimate, a tensor on the inputs' device (a float for float inputs).

    Raises:
        UsageError (a ``ValueError``): a batch size that is not positive, or ``batch_small >= batch_big``.
    """
    _check_batches(batch_small, batch_big, "noise_trace_estimate")
    return (sq_norm_small - sq_norm_big) / (1.0 / batch_small - 1.0 / batch_big)


def squared_norm(tensors: Iterable[Tensor]) -> Tensor:
    """``Σ |t|²`` over ``tensors`` (e.g. ``[p.grad for p in params]``), as a 0-dim tensor on their device.

    One ``torch._foreach_norm`` over the list (a few kernels, not one per tensor on CUDA), accumulated
    in float32 whatever the gradients' dtype (float64 if one of them is float64). No host read.

    Args:
        tensors: floating-point tensors, all on one device (at least one).

    Raises:
        UsageError: no tensor, or tensors on more than one device.
    """
    tensors = list(tensors)
    if not tensors:
        raise UsageError("squared_norm: no tensor given (gradients not computed yet?)")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise UsageError(f"squared_norm: tensors on several devices {sorted(map(str, devices))}; call it per device")
    dtype = torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32
    norms = torch._foreach_norm(tensors, 2, dtype=dtype)
    return torch.stack(norms).square().sum()


class GradientNoiseScale:
    """Running ``B_simple = EMA(tr Σ) / EMA(|G|²)`` from the two squared gradient norms of each step.

    Paper: McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training",
    arXiv 1812.06162: section 2 (the noise scale), appendix A.1 (the two unbiased estimates, averaged
    over steps before their ratio is taken).

    :meth:`update` turns one step's ``|G_small|²`` and ``|G_big|²`` into the unbiased estimates of
    ``|G|²`` and ``tr(Σ)`` (:func:`grad_sq_norm_estimate`, :func:`noise_trace_estimate`) and folds each
    into an exponential moving average with decay ``beta``; :meth:`noise_scale` is the ratio of the two
    averages. Averaging before the ratio is the point: the ratio of one step's estimates is biased (the
    |G|² estimate in the denominator is noisy, often near zero, and anti-correlated with the tr(Σ) one).

    The averages are bias-corrected as Adam's are (Kingma & Ba 2015, sec. 3): after ``t`` updates each
    is ``Σ_i (1−β) β^(t−i) x_i / (1 − β^t)``, a weighted mean whose weights sum to 1 from the first
    step. The ratio would be the same without the correction (both averages carry the same ``1 − β^t``),
    but the two terms, which are reported too, would start near zero. The alternative of starting the
    average at the first estimate gives that one noisy step a weight ``β^(t−1)`` that stays far above
    the others' ``1−β`` for ~``1/(1−β)`` steps. The correction ``1 − β^t`` is itself kept as an average
    of ones on the device, so no step count enters the computation (the graph is the same every step).

    What is returned, as device tensors (no host branch decides it):

    * before any update: ``nan`` for all three (nothing measured);
    * ``|G|²`` average ``<= 0`` (early steps or a noise-dominated regime, where the signal is not yet
      resolved from the noise): :meth:`noise_scale` is ``+inf``, since any batch is smaller than the
      noise scale there; the two terms are returned as they are;
    * otherwise the ratio, which can be negative while the ``tr(Σ)`` average is (very early only):
      it is reported as is, so a reader sees the average has not settled rather than a clamped number.

    A step whose estimates are not finite (an overflowed fp16 gradient) leaves the state unchanged,
    chosen on the device with ``torch.where``.

    Args:
        beta: EMA decay per update, in [0, 1) (default: 0.99, an average over ~``(1+β)/(1−β)`` = 199
            steps; one step's estimates have a relative spread of order 1, so B_simple then moves by
            some percent from step to step).
        dtype: floating dtype of the averages (default: float32).
    """

    def __init__(self, beta: float = 0.99, *, dtype: torch.dtype = torch.float32) -> None:
        if isinstance(beta, bool) or not isinstance(beta, Real) or not 0.0 <= beta < 1.0:
            raise UsageError(f"GradientNoiseScale: beta={beta!r} must be in [0, 1) (e.g. 0.99)")
        if not dtype.is_floating_point:
            raise UsageError(f"GradientNoiseScale: dtype={dtype} must be a floating dtype (e.g. torch.float32)")
        self.beta: float = float(beta)
        self.dtype: torch.dtype = dtype
        self.updates: int = 0  # calls to update(), a host count (never read from a tensor)
        # [EMA of |G|² estimates, EMA of tr(Σ) estimates, EMA of ones = 1 − β^t]; moves to the inputs' device
        self._ema: Tensor = torch.zeros(3, dtype=dtype)
        # True until a state is loaded: the first update then makes the zeros on its inputs' device
        # instead of copying these from host memory (a copy from pageable memory synchronises)
        self._fresh: bool = True

    def update(self, sq_norm_small: Tensor, batch_small: float, sq_norm_big: Tensor, batch_big: float) -> None:
        """Fold one step's two squared gradient norms into the averages (no host read).

        Args:
            sq_norm_small: ``|G_small|²`` of this step, a 0-dim tensor (e.g. :func:`squared_norm` of a
                rank's local gradients before the all-reduce).
            batch_small: examples behind it (the per-rank batch).
            sq_norm_big: ``|G_big|²``, a 0-dim tensor on the same device (e.g. after the all-reduce).
            batch_big: examples behind it (the global batch), > ``batch_small``.
        """
        g2 = grad_sq_norm_estimate(sq_norm_small, batch_small, sq_norm_big, batch_big)
        tr = noise_trace_estimate(sq_norm_small, batch_small, sq_norm_big, batch_big)
        if not isinstance(g2, Tensor) or not isinstance(tr, Tensor):
            raise UsageError("GradientNoiseScale.update: the squared norms must be tensors (see squared_norm)")
        if self._ema.device != g2.device:  # the first update, or a state loaded on another device
            if self._fresh and self.updates == 0:
                self._ema = torch.zeros(3, dtype=self.dtype, device=g2.device)
            else:
                self._ema = self._ema.to(g2.device)
        step = torch.stack([g2.to(self.dtype), tr.to(self.dtype), torch.ones_like(g2, dtype=self.dtype)])
        updated = torch.lerp(self._ema, step, 1.0 - self.beta)
        self._ema = torch.where(torch.isfinite(step).all(), updated, self._ema)
        self.updates += 1

    def grad_sq_norm(self) -> Tensor:
        """The averaged estimate of ``|G|²`` (0-dim device tensor; ``nan`` before any update)."""
        return self._ema[0] / self._ema[2]

    def noise_trace(self) -> Tensor:
        """The averaged estimate of ``tr(Σ)`` (0-dim device tensor; ``nan`` before any update)."""
        return self._ema[1] / self._ema[2]

    def noise_scale(self) -> Tensor:
        """``B_simple``: averaged ``tr(Σ)`` over averaged ``|G|²`` (0-dim device tensor; see the class for
        ``nan`` and ``+inf``)."""
        g2, tr = self.grad_sq_norm(), self.noise_trace()
        # nan <= 0 is False, so before any update this is nan / nan = nan
        return torch.where(g2 <= 0, torch.full_like(g2, math.inf), tr / g2)

    def state_dict(self) -> dict[str, Any]:
        """The averages (a copy, still on the device), ``beta`` and the update count, for a checkpoint."""
        return {"beta": self.beta, "updates": self.updates, "ema": self._ema.detach().clone()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Continue the averages of a saved state; refuses one saved with another ``beta``.

        The averages stay on the device they are loaded on until the next :meth:`update` moves them to
        its inputs' device.
        """
        beta = float(state_dict["beta"])
        if beta != self.beta:
            raise UsageError(
                f"GradientNoiseScale: the saved averages were made with beta={beta} and this tracker has "
                f"beta={self.beta}: resume with beta={beta}, or start afresh"
            )
        ema = state_dict["ema"]
        if not isinstance(ema, Tensor) or ema.shape != (3,):
            raise UsageError(f"GradientNoiseScale: 'ema' must be a tensor of 3 values, got {ema!r}")
        self._ema = ema.detach().to(self.dtype).clone()
        self._fresh = False
        self.updates = int(state_dict["updates"])

    def __repr__(self) -> str:
        return f"GradientNoiseScale(beta={self.beta}, updates={self.updates})"

