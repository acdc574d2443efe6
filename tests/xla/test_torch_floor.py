"""The oldest torch that setup.py allows has every ``torch.*`` name the package uses.

This folder runs in ``.venv-xla``, whose torch (2.9.0, pinned by torch-xla) is the oldest any
of our environments runs, and setup.py's floor (``tests/test_packaging.py`` keeps the two
equal). A name added to torch after it (``torch.accelerator.set_device_index`` came in 2.7,
once used by the decode thread while the floor said 2.4) fails here, naming the file and line.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import torch

PACKAGE = Path(__file__).resolve().parents[2] / "largebatch"


def _dotted(node: ast.expr) -> list[str] | None:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and node.id == "torch":
        return ["torch", *reversed(parts)]
    return None


def _torch_names() -> dict[str, str]:
    """Every ``torch.a.b...`` chain in the package (the longest at each place) -> its first place."""
    found: dict[str, str] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        inner: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and id(node) not in inner:
                chain = _dotted(node)
                if chain is not None:
                    value = node.value
                    while isinstance(value, ast.Attribute):
                        inner.add(id(value))
                        value = value.value
                    found.setdefault(".".join(chain), f"{path.relative_to(PACKAGE.parent)}:{node.lineno}")
    return found


def _resolves(name: str) -> bool:
    obj: object = torch
    parts = name.split(".")[1:]
    for i, part in enumerate(parts):
        if not hasattr(obj, part):
            try:  # a submodule not imported by ``import torch``
                obj = importlib.import_module(".".join(["torch", *parts[: i + 1]]))
                continue
            except ImportError:
                return False
        obj = getattr(obj, part)
    return True


def test_every_torch_name_the_package_uses_exists_in_the_oldest_torch_allowed() -> None:
    names = _torch_names()
    assert len(names) > 50, "the scan found almost no torch.* names: it is broken"
    missing = [f"{where}: {name}" for name, where in names.items() if not _resolves(name)]
    assert not missing, (
        f"torch {torch.__version__} (setup.py's floor) lacks these names: use what it has, or raise "
        "the floor in setup.py and constraints/xla.txt together:\n" + "\n".join(missing)
    )
