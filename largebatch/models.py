"""Model construction: timm models with the large-batch model surgery.

* zero-initialised last BN gamma of every residual block (Goyal et al. 2017, sec. 5.1: each
  block starts as the identity, which makes the early, high-lr phase of large-batch
  training stable);
* optionally, the classifier's weights drawn from N(0, std) (fast.ai's DAWNBench 2018 code,
  diux-dev/imagenet18 ``training/resnet.py``: N(0, 0.01) with ``--init-bn0``) instead of
  timm's default.

The channels_last memory format is the backend's choice, made where the model is moved to
its device (``Backend.prepare_model`` in ``largebatch/backends/base.py``).

No weights are downloaded: models are built from scratch (``pretrained=False``).
"""

from __future__ import annotations

import difflib
import re

import timm
from torch import nn

from largebatch.errors import ModelError

__all__ = ["build_model", "check_model_name", "init_classifier", "zero_init_last_bn", "ModelError"]


def zero_init_last_bn(model: nn.Module) -> int:
    """Zero the gamma of the last BN in each residual block; return how many were zeroed.

    timm's ResNet blocks implement ``zero_init_last()``; EfficientNet/MobileNet blocks do not,
    so for blocks with a skip connection (``has_skip``) the BN that ends the residual branch
    (``bn3`` in inverted residuals, ``bn2`` in depthwise-separable blocks) is zeroed here.
    """
    count = 0
    for module in model.modules():
        if callable(getattr(module, "zero_init_last", None)):
            module.zero_init_last()
            count += 1
        elif getattr(module, "has_skip", False):
            for attr in ("bn3", "bn2"):
                bn = getattr(module, attr, None)
                if isinstance(bn, nn.modules.batchnorm._BatchNorm) and bn.weight is not None:
                    nn.init.zeros_(bn.weight)
                    count += 1
                    break
    return count


def check_model_name(name: str) -> None:
    """Raise :class:`ModelError` when timm has no model ``name``: the closest names timm has and
    how to list them (``timm.list_models`` with a pattern)."""
    if timm.is_model(name):
        return
    names = timm.list_models()
    close = difflib.get_close_matches(name, names, n=6, cutoff=0.6) or timm.list_models(f"*{name.split('_')[0]}*")[:6]
    similar = f"; similar names: {', '.join(close)}" if close else ""
    stem = re.match(r"[A-Za-z]+", name)
    pattern = f"{stem.group(0)}*" if stem and close else "*"
    raise ModelError(
        f"unknown model {name!r}: timm has no such model{similar}; list timm's {len(names)} models with "
        f"python -c \"import timm; print(timm.list_models('{pattern}'))\""
    )


def build_model(
    name: str,
    num_classes: int,
    *,
    zero_init_last_bn_gamma: bool = True,
    drop_rate: float = 0.0,
    drop_path_rate: float = 0.0,
    fc_init_std: float | None = None,
) -> nn.Module:
    """Build the timm model ``name`` for ``num_classes`` classes, from scratch.

    ``fc_init_std``: draw the classifier's weights from N(0, fc_init_std) (its bias keeps its
    initialisation); None keeps timm's (for ResNet, torch's uniform +-1/sqrt(fan_in))."""
    check_model_name(name)
    kwargs: dict = {"num_classes": num_classes, "drop_rate": drop_rate}
    if drop_path_rate:
        kwargs["drop_path_rate"] = drop_path_rate
    try:
        # timm's ResNet zero-inits by default; make that follow our flag.
        model = timm.create_model(name, pretrained=False, zero_init_last=False, **kwargs)
    except TypeError:
        model = timm.create_model(name, pretrained=False, **kwargs)
    if zero_init_last_bn_gamma:
        zero_init_last_bn(model)
    if fc_init_std is not None:
        init_classifier(model, fc_init_std)
    return model


def init_classifier(model: nn.Module, std: float) -> nn.Linear:
    """Draw the weights of ``model``'s classifier (timm's ``get_classifier()``) from N(0, std);
    return it. :class:`ModelError` when the classifier is not one ``nn.Linear``."""
    head = model.get_classifier() if callable(getattr(model, "get_classifier", None)) else None
    if not isinstance(head, nn.Linear):
        raise ModelError(f"model.fc_init_std needs a model whose classifier is one nn.Linear "
                         f"(timm's get_classifier()); {type(model).__name__} has {type(head).__name__}")
    nn.init.normal_(head.weight, mean=0.0, std=std)
    return head
