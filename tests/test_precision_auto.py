"""``precision=auto`` on a CPU: bf16 only where the CPU computes it (AVX-512 BF16 or AMX), fp32
elsewhere. oneDNN's own "bf16 supported" is true on any AVX-512 CPU, where bf16 is emulated and
the default run's step took 1.6x the fp32 time (an AVX-512 Xeon without AVX-512 BF16)."""

from __future__ import annotations

import sys

import pytest
import torch

from largebatch.backends import torch_dist
from largebatch.backends.torch_dist import TorchDistributedBackend, cpu_computes_bf16
from largebatch.engine.precision import resolve_precision


def _cpu_flags() -> set[str]:
    with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        return set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())


@pytest.mark.parametrize("bf16, amx, picks", [(False, False, "fp32"), (True, False, "bf16"), (False, True, "bf16")])
def test_auto_follows_the_cpus_bf16_units(monkeypatch: pytest.MonkeyPatch, bf16: bool, amx: bool, picks: str) -> None:
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)  # an AVX-512 CPU: not the answer
    policy = resolve_precision("auto", TorchDistributedBackend("cpu"))
    assert policy.name == picks and policy.autocast_dtype == (torch.bfloat16 if picks == "bf16" else None)


def test_the_answer_is_this_cpus_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's CPUID probes and, where a torch lacks them, the kernel's flags say the same."""
    if not sys.platform.startswith("linux"):
        pytest.skip("reads /proc/cpuinfo")
    flags = _cpu_flags()
    native = "avx512_bf16" in flags or "amx_bf16" in flags
    assert cpu_computes_bf16() is native
    monkeypatch.delattr(torch.cpu, "_is_avx512_bf16_supported")
    assert torch_dist.cpu_computes_bf16() is native
