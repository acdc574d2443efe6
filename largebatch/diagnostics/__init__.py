"""Training diagnostics measured from the gradients as they are: the gradient noise scale."""

from .noise_scale import GradientNoiseScale, grad_sq_norm_estimate, noise_trace_estimate, squared_norm

__all__ = ["GradientNoiseScale", "grad_sq_norm_estimate", "noise_trace_estimate", "squared_norm"]
