"""The Python examples of the README and the docs pages run as written (they are the reusable
API users copy)."""

from __future__ import annotations

import pytest

from tests.docs_text import README, python_blocks as _python_blocks


def test_readme_has_python_examples() -> None:
    assert len(_python_blocks()) >= 2


def test_optimizer_example_runs() -> None:
    """The "Use the optimizers in your own project" example: three LARS steps that move the weights."""
    block = next(b for b in _python_blocks() if "from largebatch.optim import LARS" in b and "torch_xla" not in b
                 and "init_process_group" not in b and "range(3)" in b)
    scope: dict = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["lr"] == pytest.approx(1.6)
    assert scope["optimizer"].state, "LARS kept no momentum state: the steps did not run"
    assert scope["scheduler"].last_epoch == 3


def test_group_sync_bn_example_names_real_functions() -> None:
    """The CUDA grouped-BN example needs GPUs, so only its imports are checked here; its gloo
    twin runs as written under torchrun in tests/distributed/test_readme_gbn.py."""
    block = next(b for b in _python_blocks() if "convert_group_sync_batchnorm" in b)
    imports = "\n".join(line for line in block.splitlines() if line.startswith(("import", "from")))
    exec(compile(imports, "README.md", "exec"), {})


def test_plain_torch_xla_example_is_the_tested_program() -> None:
    """The "Reuse in a plain torch-xla program" example: its largebatch imports run, and its
    calls are those of tests/xla/plain_program.py, which the XLA suite runs on 4 replicas."""
    block = next(b for b in _python_blocks() if "torch_xla.launch(" in b)
    imports = "\n".join(line for line in block.splitlines() if line.startswith("from largebatch"))
    exec(compile(imports, "README.md", "exec"), {})
    program = (README.parent / "tests" / "xla" / "plain_program.py").read_text(encoding="utf-8")
    for call in (
        "convert_group_sync_batchnorm(model, group_size=2)",
        "xm.optimizer_step(optimizer)",
        "optimizer.zero_grad(set_to_none=True)",
        "pl.MpDeviceLoader(",
        "torch_xla.launch(",
    ):
        assert call in block and call.split("(")[0] in program, call
