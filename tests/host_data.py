"""A recorder of tensors built from host data, for the optimizer tests' "no pageable copy" checks."""

from __future__ import annotations

from torch.overrides import TorchFunctionMode

__all__ = ["HostDataTensors"]


class HostDataTensors(TorchFunctionMode):
    """Records tensors built from host data (``torch.tensor(0.0, device=...)`` and kin): off the CPU
    each is a copy from a pageable host buffer, which blocks until the device has it (a sync)."""

    NAMES = {"tensor", "as_tensor", "asarray", "from_numpy", "frombuffer"}

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if getattr(func, "__name__", "") in self.NAMES:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))
