"""The LARS updates of the implementations our presets and README cite, transcribed to torch, one
function per source, for the tests of ``LARS(lr_in_momentum=...)`` (tests/test_optim_lars_forms.py,
tests/xla/test_single_device.py).

Each function performs one step on lists of float tensors, in place, as the source does for one
variable at a time; ``skipped`` marks the variables the source's ``skip_list`` leaves out of LARS
(BN and bias: no trust ratio, no weight decay). The buffers start at zero, as the sources' slots.

Sources (``git show <commit>:<path>``):
  tensorflow/tpu e380f765021a8853abfbfd53af727604039a7d8c
      models/official/efficientnet/lars_optimizer.py (LARSOptimizer.compute_lr, _resource_apply_dense);
  tensorflow/tensorflow 66bb198acad21260038805e02960b791cb467177
      tensorflow/contrib/opt/python/training/lars_optimizer.py (tf.contrib.opt.LARSOptimizer, used by
      tensorflow/tpu b13e6b6d19ba633e4f55f7ab5910f675d203e38a models/official/resnet/lars_util.py): the same
      compute_lr and ResourceApplyMomentum call as the EfficientNet file, line for line;
  mlcommons/training 3c81f6f9559547ae18e2739c775b1264b317c077
      retired_benchmarks/resnet-tf2/tensorflow2/lars_optimizer.py (LARSOptimizer.compute_lr,
      _resource_apply_dense);
  timm 1.0.31 timm/optim/lars.py (_single_tensor_lars): torch's SGD form, run as timm's own code in the tests.
"""

from __future__ import annotations

import torch
from torch import Tensor

KERAS_EPSILON = 1e-7  # tensorflow/tensorflow d7cae7e tensorflow/python/keras/backend_config.py _EPSILON


def _tf_trust_ratio(var: Tensor, grad: Tensor, *, eeta: float, weight_decay: float, epsilon: float) -> Tensor:
    # compute_lr (both files):
    #   w_norm = norm(var); g_norm = norm(grad)
    #   trust_ratio = where(w_norm > 0, where(g_norm > 0,
    #                       eeta * w_norm / (g_norm + weight_decay * w_norm + epsilon), 1.0), 1.0)
    w_norm, g_norm = torch.linalg.vector_norm(var), torch.linalg.vector_norm(grad)
    ratio = eeta * w_norm / (g_norm + weight_decay * w_norm + epsilon)
    return torch.where(w_norm > 0, torch.where(g_norm > 0, ratio, 1.0), 1.0)


def tf_tpu_lars_step(
    params: list[Tensor],
    grads: list[Tensor],
    moms: list[Tensor],
    skipped: list[bool],
    *,
    learning_rate: float,
    momentum: float,
    weight_decay: float,
    eeta: float,
    epsilon: float,
    use_nesterov: bool,
) -> None:
    """tensorflow/tpu e380f76 efficientnet/lars_optimizer.py (= tf.contrib.opt.LARSOptimizer @66bb198)."""
    for var, grad, mom, skip in zip(params, grads, moms, skipped):
        # compute_lr: scaled_lr = learning_rate; if not skipped: scaled_lr = learning_rate * trust_ratio,
        #             grad = grad + weight_decay * var
        scaled_lr = torch.tensor(learning_rate, dtype=var.dtype)
        if not skip:
            scaled_lr = learning_rate * _tf_trust_ratio(var, grad, eeta=eeta, weight_decay=weight_decay,
                                                        epsilon=epsilon)
            grad = grad + weight_decay * var
        # _resource_apply_dense: ResourceApplyMomentum(var, mom, lr=1.0, grad=grad * scaled_lr, momentum,
        #                                              use_nesterov), whose kernel is
        #   accum = accum * momentum + grad
        #   var -= lr * accum                      (use_nesterov: var -= grad * lr + accum * momentum * lr)
        g = grad * scaled_lr
        mom.mul_(momentum).add_(g)
        if use_nesterov:
            var.sub_(g * 1.0 + mom * momentum * 1.0)
        else:
            var.sub_(1.0 * mom)


def mlperf_lars_step(
    params: list[Tensor],
    grads: list[Tensor],
    moms: list[Tensor],
    skipped: list[bool],
    *,
    learning_rate: float,
    momentum: float,
    weight_decay: float,
    eeta: float,
    epsilon: float,
    use_nesterov: bool,
) -> None:
    """mlcommons/training 3c81f6f retired_benchmarks/resnet-tf2/tensorflow2/lars_optimizer.py."""
    epsilon = epsilon or KERAS_EPSILON  # __init__: self.epsilon = epsilon or backend_config.epsilon()
    for var, grad, mom, skip in zip(params, grads, moms, skipped):
        scaled_lr = torch.tensor(learning_rate, dtype=var.dtype)  # compute_lr, as tf_tpu_lars_step
        if not skip:
            scaled_lr = learning_rate * _tf_trust_ratio(var, grad, eeta=eeta, weight_decay=weight_decay,
                                                        epsilon=epsilon)
            grad = grad + weight_decay * var
        # _resource_apply_dense (its buffer holds minus ours):
        #   mom_t = mom * self.momentum - grad * scaled_lr
        #   var_t = var + mom_t * self.momentum - grad * scaled_lr   if use_nesterov
        #   var_t = var + mom_t                                      otherwise
        mom_t = mom * momentum - grad * scaled_lr
        mom.copy_(mom_t)
        if use_nesterov:
            var.copy_(var + mom_t * momentum - grad * scaled_lr)
        else:
            var.copy_(var + mom_t)


def warmup_poly_lrs(steps: int = 20, warmup: int = 5, peak: float = 2.0, end: float = 0.01,
                    power: float = 2.0) -> list[float]:
    """An lr that changes at every step: linear warmup from peak / warmup to peak, then poly decay to
    ``end`` (the LARS presets' shape: tensorflow/tpu lars_util.py poly_rate_schedule, MLPerf
    lars_util.py PolynomialDecayWithWarmup)."""
    decay = steps - warmup
    return [peak * (t + 1) / warmup if t < warmup else end + (peak - end) * (1 - (t - warmup) / decay) ** power
            for t in range(steps)]
