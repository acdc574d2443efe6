"""The gradient noise scale ``B_simple`` of every run, measured where it comes free or by an opt-in probe.

Based on McCandlish, Kaplan, Amodei et al. 2018, "An Empirical Model of Large-Batch Training"
(arXiv 1812.06162), appendix A.1: the squared norms of two mean gradients of the same step, over
``B_small`` and ``B_big`` examples, give unbiased estimates of ``|G|²`` and ``tr(Σ)``;
:class:`~largebatch.diagnostics.noise_scale.GradientNoiseScale` averages them over steps.
Where the two norms come from (:func:`plan_noise_scale`):

``ranks`` (DDP or XLA replicas, world > 1)
    ``B_small``: this rank's local gradient, its micro-batch x ``accumulation_steps`` images
    (with accumulation, the accumulated local gradient: DDP and XLA reduce once per step).
    DDP reduces only after the last micro-batch, and writes the average into the same bucket
    buffers (``gradient_as_bucket_view``), so the local norm can only be taken inside the comm
    hook, before the reduction: :class:`~largebatch.comm.SquaredNormTap` wraps whichever hook
    reduces (torch's own ``allreduce_hook`` for ``comm=flat``, the same one DDP runs without a
    hook, or ``comm_hook`` for the others) and sums one ``vector_norm`` per bucket.
    ``B_big``: the global batch, the all-reduced gradient in ``.grad`` after the last backward.
    On XLA the backend reduces in ``optimizer_step``, just before ``optimizer.step()``
    (``reduces_in_optimizer_step`` of its tap, ``largebatch.backends.xla.XlaLocalNormTap``):
    the local norm is ``.grad``'s after the last backward, the reduced one ``.grad``'s in the
    optimizer's step pre-hook, where the update is made; both in the step graph, so the graph
    is the same every step.
    Each rank's averages use its own local gradient; rank 0's are reported and checkpointed.
``micro-batches`` (one process, ``accumulation_steps`` = n >= 2)
    ``B_small``: the first micro-batch's gradient, read right after its backward (one extra
    foreach norm per step). The loop scales each micro-batch's mean loss by 1/n, so that
    gradient is 1/n of the micro-batch's mean gradient: its squared norm is multiplied by n².
    ``B_big``: the accumulated gradient after the last micro-batch, the mean over the step.
``probe`` (one process, no accumulation, ``probe_every`` = N >= 1; opt-in)
    No second norm comes free, so every N-th step pays for one: after the step's normal
    backward, the batch's two halves are run forward and backward again
    (``torch.autograd.grad``, which leaves ``.grad`` alone). ``B_small``: half the batch, the
    mean of the two halves' squared norms; ``B_big``: the batch, the step's ``.grad``. The
    optimizer step uses the same gradient as without the probe, bit for bit. Cost: two half
    forward/backward passes, about one step's compute, on 1/N of the steps. The probe's forwards
    would move the BN running statistics a second and third time and draw from the RNG
    (dropout, drop-path): the model's buffers are copied back and the RNG forked, so the run
    goes on exactly as without the probe. A ``torch.compile``'d model compiles once more for the
    half batch; with CUDA graphs (``reduce-overhead``) the probe is refused.
one process without accumulation and no probe (on XLA the probe is not offered)
    Not measured; the run says so in its closing lines.

The micro-batch path runs on one XLA device as it does elsewhere (tested against eager CPU, with
no graph added after warm-up); the probe is refused there (:func:`plan_noise_scale`): its half-batch
passes and RNG fork are not tried in the XLA step graph.

Both norms are of loss-scaled gradients under fp16: each is divided by the loss scale², read on
the device from the step the loop publishes for hooks (``Trainer.step_view``, whose micro-batches,
loss and scaling the probe also reads; ``GradScaler.get_scale()`` would read the host). An
overflowed step gives non-finite norms, which the tracker drops. Nothing here reads the host
during a step: the estimates are read with the loss on log steps (the Trainer's
``log_values``), as ``noise_scale`` (images), ``grad_sq_norm`` and ``noise_trace``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any, Optional

import torch

from largebatch.diagnostics.noise_scale import GradientNoiseScale, LocalNormTap, squared_norm
from largebatch.engine.loop import Hook
from largebatch.errors import UsageError

__all__ = ["EARLY_STEPS", "NoiseScaleHook", "NoiseScalePlan", "batch_against_noise_scale", "plan_noise_scale"]

log = logging.getLogger("largebatch")

EARLY_STEPS = 300  # [optimizer steps] the early line comes at a log step after this many, or after the first epoch


def batch_against_noise_scale(batch: int, noise_scale: float, step: int) -> str:
    """The run's early line: the global batch against the measured noise scale, in McCandlish
    et al.'s terms. Their model of training speed: steps S = S_min (1 + B_noise / B), examples
    E = E_min (1 + B / B_noise); B_simple stands in for B_noise."""
    ratio = batch / noise_scale
    if ratio < 0.5:
        regime = "perfect scaling: a larger batch still cuts the steps almost in proportion"
    elif ratio <= 2:
        regime = "near the critical batch, the bend from perfect scaling to diminishing returns"
    else:
        regime = "diminishing returns: a larger batch barely cuts the steps and costs more examples"
    return (f"noise scale after {step} steps: B_simple ~{noise_scale:.0f} images; your global batch {batch} is "
            f"{ratio:.2g}x it, {regime} (McCandlish et al. 2018: {1 + 1 / ratio:.2g}x the fewest steps, "
            f"{1 + ratio:.2g}x the fewest examples). An early estimate: the noise scale grows as the loss falls, "
            f"and B_simple equals their B_noise only where the Hessian is a multiple of the identity")


@dataclass(frozen=True)
class NoiseScalePlan:
    """Where the two gradients come from: ``source`` ``ranks`` | ``micro-batches`` | ``probe`` |
    None (not measured, ``reason`` says why), how many images each is the mean over, and for the
    probe the optimizer steps between two probes (``probe_every``; 0 for the other sources)."""

    source: Optional[str]
    batch_small: int = 0
    batch_big: int = 0
    reason: str = ""
    probe_every: int = 0

    def describe(self, beta: float) -> str:
        """The run's start-up line: what measures the noise scale, at what cost, or why nothing does."""
        if self.source is None:
            return f"noise scale: not measured ({self.reason})"
        if self.source == "probe":
            return (f"noise scale: measured by a probe every {self.probe_every} steps ({self.batch_small} vs "
                    f"{self.batch_big} images per gradient): one extra backward per probe, "
                    f"~{100 / self.probe_every:.0f}% of steps, EMA beta {beta:g}")
        return (f"noise scale: measured from {self.source} ({self.batch_small} vs {self.batch_big} images per "
                f"gradient), EMA beta {beta:g}")


def plan_noise_scale(
    *, world_size: int, accumulation_steps: int, per_device_batch: int, local_norm_tap: Optional[LocalNormTap],
    probe_every: int = 0, xla: bool = False, cuda_graphs: bool = False,
) -> NoiseScalePlan:
    """Choose the measurement (module docstring) for a run of this shape.

    ``local_norm_tap``: the tap ``Backend.wrap_model(tap_local_norm=True)`` returned
    (:class:`~largebatch.comm.SquaredNormTap` under DDP, ``largebatch.backends.xla.XlaLocalNormTap``
    on XLA replicas; None where the backend records no local norm, e.g. one process).
    ``probe_every``: optimizer steps between two probes where nothing comes free (0: no probe);
    ignored where something does.
    The probe is refused on XLA (``xla``: its half-batch passes and RNG fork are untried in the XLA
    step graph) and with CUDA graphs (``cuda_graphs``: the half batch would replay into the step's
    CUDA-graph buffers); the plan's ``reason`` says what to set instead.
    """
    if isinstance(probe_every, bool) or not isinstance(probe_every, int) or probe_every < 0:
        raise UsageError(f"plan_noise_scale: probe_every={probe_every!r} must be an integer >= 0 (0: no probe)")
    local_batch = per_device_batch * accumulation_steps
    if world_size > 1:
        if local_norm_tap is None:
            return NoiseScalePlan(None, reason="this backend does not record the local gradient's norm yet")
        return NoiseScalePlan("ranks", local_batch, local_batch * world_size)
    if accumulation_steps >= 2:
        return NoiseScalePlan("micro-batches", per_device_batch, local_batch)
    if not probe_every:
        return NoiseScalePlan(None, reason="one process, no accumulation")
    if per_device_batch < 2:
        return NoiseScalePlan(None, reason="one process, no accumulation, and a batch of 1 has no halves to probe")
    if xla:
        return NoiseScalePlan(None, reason="the probe does not run on XLA; use accumulation_steps >= 2")
    if cuda_graphs:
        return NoiseScalePlan(None, reason="the probe does not run with CUDA graphs (model.compile=reduce-overhead)")
    return NoiseScalePlan("probe", per_device_batch // 2, per_device_batch, probe_every=probe_every)


class NoiseScaleHook(Hook):
    """Updates a :class:`GradientNoiseScale` every step from the plan's two squared norms.

    Registers ``noise_scale``, ``grad_sq_norm`` and ``noise_trace`` as the Trainer's
    ``log_values`` (read with the loss on log steps); :meth:`report` gives summary.json's
    ``noise_scale_final`` and the closing line. ``tracker`` is checkpointed (``noise_scale``).
    """

    def __init__(self, plan: NoiseScalePlan, *, beta: float = 0.99,
                 local_norm_tap: Optional[LocalNormTap] = None) -> None:
        self.plan = plan
        self.tracker = GradientNoiseScale(beta)
        self.local_norm_tap = local_norm_tap
        self._small: Optional[torch.Tensor] = None
        self._pre_step: Any = None  # the optimizer step pre-hook's handle (XLA replicas)
        self._told = False  # the early line (global batch against B_simple) was said
        self._epoch_done = False  # an epoch has ended: the early line may come at the next log step

    def before_train(self) -> None:
        if self.plan.source is None:
            return
        t = self.tracker
        self.trainer.log_values.update(noise_scale=t.noise_scale, grad_sq_norm=t.grad_sq_norm,
                                       noise_trace=t.noise_trace)
        if self._reduced_in_step():
            self._pre_step = self.trainer.optimizer.register_step_pre_hook(self._after_reduction)

    def after_epoch(self) -> None:
        self._epoch_done = True

    def after_log(self, metrics: dict[str, float]) -> None:
        """Once, at the first log step after the first epoch or EARLY_STEPS steps where B_simple is
        resolved (a positive finite estimate; early averages can be neither): the global batch
        against it. It reads the value the log step read already: no host read of its own."""
        if self._told or not (self._epoch_done or self.trainer.state.step >= EARLY_STEPS):
            return
        value = metrics.get("noise_scale")
        if value is not None and math.isfinite(value) and value > 0:
            self._told = True
            log.info("%s", batch_against_noise_scale(self._sizes()[1], value, self.trainer.state.step))

    def after_train(self) -> None:
        if self._pre_step is not None:
            self._pre_step.remove()
            self._pre_step = None

    def _reduced_in_step(self) -> bool:
        """The backend reduces the gradients in ``optimizer_step`` (XLA), not in the last backward."""
        tap = self.local_norm_tap  # a plan from ranks has one (plan_noise_scale)
        return self.plan.source == "ranks" and tap is not None and tap.reduces_in_optimizer_step

    def _after_reduction(self, *_: Any) -> None:
        """Optimizer step pre-hook: ``.grad`` is the reduced gradient; fold the step's pair in."""
        if self._small is None:
            return
        self.tracker.update(self._small, *self._with_norm(self._grad_sq_norm(1.0)))
        self._small = None

    def _sizes(self) -> tuple[int, int]:
        """The images behind the small and the big gradient in this step: the plan's, times the
        batch schedule's factor k where the larger batch makes them larger (both under
        ``via=per_device``; the big one only where accumulation adds micro-batches to one process)."""
        t = self.trainer
        schedule, k = t.settings.batch_schedule, t.settings.batch_factor(t.state.epoch)
        small, big = self.plan.batch_small, self.plan.batch_big
        if schedule is None or k == 1:
            return small, big
        same_small = self.plan.source in ("micro-batches", "probe") and schedule.via == "accumulation"
        return (small if same_small else small * k), big * k

    def _with_norm(self, big_sq_norm: torch.Tensor) -> tuple[int, torch.Tensor, int]:
        """``(batch_small, |G_big|², batch_big)``: the tracker's arguments after the small norm."""
        small, big = self._sizes()
        return small, big_sq_norm, big

    def _grad_sq_norm(self, factor: float) -> torch.Tensor:
        """``factor`` x the squared norm of the optimizer's gradients, loss scale taken out."""
        grads = [p.grad for g in self.trainer.optimizer.param_groups for p in g["params"] if p.grad is not None]
        return self._unscale(squared_norm(grads) * factor)

    def _unscale(self, sq_norm: torch.Tensor) -> torch.Tensor:
        scale = self.trainer.step_view.loss_scale(sq_norm)  # a device tensor: no host read
        if scale is None:  # no loss scaling
            return sq_norm
        return sq_norm / scale.square()

    def _probe_sq_norm(self) -> torch.Tensor:
        """Mean of ``|G_half|²`` over the step's batch's two halves, loss scale taken out; ``.grad``,
        the model's buffers (BN running statistics) and the RNG are left as they were.

        Why an extra pass rather than two half backwards that replace the full one (free, as their
        mean is the full-batch gradient): that holds only without batch coupling. BatchNorm, in
        every model here, normalises each half with its own statistics, so the step's gradient would
        change and the running statistics would be updated twice from half batches. Two half passes
        beside the normal step cost about one step's compute on a probe step, and change nothing.
        """
        t, step = self.trainer, self.trainer.step_view
        images, labels, *_ = step.micro_batches[0]
        half = self._sizes()[0]
        params = [p for g in t.optimizer.param_groups for p in g["params"] if p.requires_grad]
        buffers = list(t.model.buffers())
        saved = [b.clone() for b in buffers]  # device copies: no host read
        device = images.device
        sq_norms = []
        # the probe's draws (dropout, drop-path) come from a fork: later steps draw what they would have
        with torch.random.fork_rng(devices=[] if device.type == "cpu" else [device], device_type=device.type):
            for part in (slice(0, half), slice(half, 2 * half)):
                loss = step.loss(images[part], labels[part])
                grads = torch.autograd.grad(step.scaled(loss), params, allow_unused=True)
                sq_norms.append(squared_norm([g for g in grads if g is not None]))
        if buffers:
            torch._foreach_copy_(buffers, saved)
        return self._unscale((sq_norms[0] + sq_norms[1]) / 2)

    def after_backward(self, micro_batch: int) -> None:
        source = self.plan.source
        if source == "probe":
            if self.trainer.state.step % self.plan.probe_every == 0:  # a host count: no read
                self.tracker.update(self._probe_sq_norm(), *self._with_norm(self._grad_sq_norm(1.0)))
            return
        n = len(self.trainer.step_view.micro_batches)  # a batch schedule may add some
        if source == "micro-batches" and micro_batch == 0:
            self._small = self._grad_sq_norm(float(n * n))  # the 1/n loss scaling undone
        if source is None or micro_batch != n - 1:
            return
        if source == "ranks" and self.local_norm_tap is not None:
            local = self.local_norm_tap.take()
            self._small = None if local is None else self._unscale(local)
        if self._small is None or self._reduced_in_step():  # no bucket was reduced; or: at the reduction
            return
        self.tracker.update(self._small, *self._with_norm(self._grad_sq_norm(1.0)))
        self._small = None

    def report(self, global_batch_size: int) -> tuple[dict[str, Any], str]:
        """summary.json's fields and the run's closing line (one host read, at the end)."""
        if self.plan.source is None:
            return {"noise_scale_final": None}, f"noise scale: not measured ({self.plan.reason})"
        if not self.tracker.updates:
            return {"noise_scale_final": None}, "noise scale: not measured (no step ran)"
        value = float(self.tracker.noise_scale())
        final = value if math.isfinite(value) else None
        shown = f"~{value:.0f} images" if final is not None else f"{value} (not resolved from the noise yet)"
        return ({"noise_scale_final": None if final is None else round(final, 1)},
                f"gradient noise scale at the end: {shown}; your global batch is {global_batch_size}")
