"""The vendor boundary: which modules of ``largebatch/`` may name a device or communication stack.

The rule is written once, in ``largebatch/backends/__init__.py``'s docstring; this test holds it.
Every module is parsed with ``ast``; a *vendor name* is a reference to one of ``VENDOR_MODULES``
(or a module below it) by

* ``import torch.cuda`` / ``import torch_xla.runtime as xr`` / ``from torch.distributed import ...``
  / ``from torch import cuda``;
* an attribute chain on ``torch`` (under any name ``import torch`` bound): ``torch.cuda.Event()``,
  ``torch.backends.cudnn.benchmark = ...``, also inside a quoted annotation (``"torch.cuda.Stream"``);
* a string that is exactly such a dotted name (``sys.modules.get("torch_xla")``,
  ``importlib.import_module("nvidia.dali")``): the ways round an ``import``.

Why these modules: each is a vendor's device, runtime or library API (CUDA; cuDNN and the other
``torch.backends`` switches; the device-generic ``torch.accelerator``, which still picks and
drives a device; Apple's and Intel's devices; process groups and collectives; torch-xla;
NVIDIA's DALI). Not in the set, on purpose: device-type strings (``device.type == "cuda"``: data,
not a call into a stack), ``torch.amp`` / ``torch.autocast`` (device-generic, given the
backend's device type), ``torch.compiler`` (the compiler's API), and ``nn.parallel.
DistributedDataParallel`` used as a type to unwrap a model (``engine/evaluate.py``,
``engine/compile.py``); names in docstrings and comments are prose.

A name outside ``ALLOWED`` fails the test with its file and line; an ``ALLOWED`` entry that no
longer names what it allows fails too, so the list only shrinks.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, Optional

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "largebatch"
BACKENDS_DOC = PACKAGE / "backends" / "__init__.py"

VENDOR_MODULES = (
    "torch.cuda",
    "torch.backends",
    "torch.accelerator",
    "torch.mps",
    "torch.xpu",
    "torch.mtia",
    "torch.distributed",
    "torch_xla",
    "nvidia",
)
EVERY = frozenset(VENDOR_MODULES)

# path under largebatch/ (a folder ends with "/") -> the vendor modules it may name, and why.
ALLOWED: dict[str, frozenset[str]] = {
    # the device and communication stacks themselves
    "backends/": EVERY,
    # grouped BN's one collective on each runtime: process groups, XLA replica groups
    "comm/reducers.py": frozenset({"torch.distributed", "torch_xla"}),
    # DDP's communication hooks are collectives on the process group
    "comm/ddp_hooks.py": frozenset({"torch.distributed"}),
    # XLA:CPU replicas that are threads of one process: runtime environment, serialised step marker
    "comm/xla_cpu_threads.py": frozenset({"torch_xla"}),
    # the ProcessGroup torch's SyncBatchNorm takes (convert_torch_sync_batchnorm)
    "nn/sync_bn.py": frozenset({"torch.distributed"}),
    # SyncBatchNorm's ProcessGroup (a handle that cannot be pickled) set aside while the model is copied
    "engine/ema.py": frozenset({"torch.distributed"}),
    # the XLA launcher starts torch_xla.launch
    "launch/xla.py": frozenset({"torch_xla"}),
    # torchrun as the scripts start it is torch.distributed.run and its elastic agent
    "launch/torchrun.py": frozenset({"torch.distributed"}),
    # host-to-GPU copies on a side stream, and the current GPU's index (dali_graph.dali_device_id asks here)
    "data/background.py": frozenset({"torch.cuda"}),
    # GPU decode: the consumer's stream waits on an event recorded after nvJPEG
    "data/pipelines/nvjpeg.py": frozenset({"torch.cuda"}),
    # DALI's decode graph and its two readers
    "data/pipelines/dali_graph.py": frozenset({"nvidia"}),
    "data/pipelines/dali_files.py": frozenset({"nvidia"}),
    "data/pipelines/dali_shards.py": frozenset({"nvidia"}),
}


def _vendor_module(dotted: str) -> Optional[str]:
    """The entry of ``VENDOR_MODULES`` that ``dotted`` is or lies below, else None."""
    for name in VENDOR_MODULES:
        if dotted == name or dotted.startswith(name + "."):
            return name
    return None


def _chain(node: ast.expr) -> Optional[list[str]]:
    """``a.b.c`` -> ``["a", "b", "c"]``; None when the chain does not start at a plain name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _annotations(tree: ast.AST) -> Iterator[ast.expr]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                if arg is not None and arg.annotation is not None:
                    yield arg.annotation
            if node.returns is not None:
                yield node.returns
        elif isinstance(node, ast.AnnAssign):
            yield node.annotation


def vendor_names(source: str) -> list[tuple[int, str]]:
    """``(line, vendor module)`` of every vendor name ``source`` references (see the module docstring)."""
    tree = ast.parse(source)
    torch_names = {"torch"} | {
        alias.asname for node in ast.walk(tree) if isinstance(node, ast.Import)
        for alias in node.names if alias.name == "torch" and alias.asname
    }
    found: list[tuple[int, str]] = []

    def note(line: int, dotted: str) -> None:
        vendor = _vendor_module(dotted)
        if vendor is not None:
            found.append((line, vendor))

    def attributes(root: ast.AST, line: Optional[int] = None) -> None:
        for node in ast.walk(root):
            if isinstance(node, ast.Attribute):
                chain = _chain(node)
                if chain and chain[0] in torch_names:
                    note(line or node.lineno, ".".join(["torch", *chain[1:]]))

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                note(node.lineno, alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            note(node.lineno, node.module)
            if _vendor_module(node.module) is None:
                for alias in node.names:
                    note(node.lineno, f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.replace(".", "").replace("_", "").isalnum():
                note(node.lineno, node.value)
    attributes(tree)
    for annotation in _annotations(tree):
        if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
            try:
                quoted = ast.parse(annotation.value, mode="eval")
            except SyntaxError:
                continue
            attributes(quoted, annotation.lineno)
    # an attribute chain is seen once per prefix (torch.cuda.Event and torch.cuda): one per line
    return sorted(set(found))


def _allowed_for(relative: str) -> frozenset[str]:
    allowed: frozenset[str] = frozenset()
    for path, names in ALLOWED.items():
        if relative == path or (path.endswith("/") and relative.startswith(path)):
            allowed |= names
    return allowed


def violations(package: Path = PACKAGE) -> list[str]:
    """``path:line: name`` of each vendor name outside what ``ALLOWED`` lets its module name."""
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        allowed = _allowed_for(relative)
        for line, vendor in vendor_names(path.read_text(encoding="utf-8")):
            if vendor not in allowed:
                found.append(f"largebatch/{relative}:{line}: {vendor}")
    return found


def test_vendor_names_stay_inside_the_allowed_modules() -> None:
    found = violations()
    assert not found, (
        "vendor names outside the vendor boundary (largebatch/backends/__init__.py): reach the device "
        "through Backend, or list the module in ALLOWED and the backends docstring with why:\n"
        + "\n".join(found)
    )


def test_every_allowed_entry_still_names_what_it_allows() -> None:
    used: dict[str, set[str]] = {path: set() for path in ALLOWED}
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE).as_posix()
        for entry in ALLOWED:
            if relative == entry or (entry.endswith("/") and relative.startswith(entry)):
                used[entry] |= {vendor for _, vendor in vendor_names(path.read_text(encoding="utf-8"))}
    stale = {path: sorted(names - used[path]) for path, names in ALLOWED.items()
             if path != "backends/" and names - used[path]}
    assert not stale, f"remove from ALLOWED (no longer named there): {stale}"


def test_the_written_rule_names_every_allowed_module() -> None:
    doc = ast.get_docstring(ast.parse(BACKENDS_DOC.read_text(encoding="utf-8"))) or ""
    unnamed = [path for path in ALLOWED if path != "backends/" and Path(path).name not in doc]
    assert not unnamed, f"largebatch/backends/__init__.py's docstring does not name: {unnamed}"
    missing = [name for name in VENDOR_MODULES if name not in doc]
    assert not missing, f"the docstring's vendor set lacks: {missing}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import torch.distributed as dist\n", [(1, "torch.distributed")]),
        ("import torch_xla\n", [(1, "torch_xla")]),
        ("def f():\n    import torch_xla.core.xla_model as xm\n", [(2, "torch_xla")]),
        ("from torch import cuda\n", [(1, "torch.cuda")]),
        ("from torch.cuda import Stream\n", [(1, "torch.cuda")]),
        ("from nvidia.dali import fn\n", [(1, "nvidia")]),
        ("import torch\nx = torch.cuda.Event()\n", [(2, "torch.cuda")]),
        ("import torch\ntorch.backends.cudnn.benchmark = True\n", [(2, "torch.backends")]),
        ("import torch as t\nt.accelerator.current_device_index()\n", [(2, "torch.accelerator")]),
        ("import torch\ndef f(s: 'torch.cuda.Stream') -> None: ...\n", [(2, "torch.cuda")]),
        ("import sys\nm = sys.modules.get('torch_xla')\n", [(2, "torch_xla")]),
        ("import torch\ntorch.mps.synchronize()\ntorch.xpu.synchronize()\n", [(2, "torch.mps"), (3, "torch.xpu")]),
    ],
)
def test_the_checker_finds_a_planted_vendor_name(source: str, expected: list[tuple[int, str]]) -> None:
    assert vendor_names(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        '"""Runs on torch.cuda devices, or torch_xla ones."""\n',  # prose
        "import torch\nx = torch.device('cuda')\n",  # a device-type string
        "import torch\ntorch.compiler.cudagraph_mark_step_begin()\n",
        "import torch\nwith torch.autocast('cuda'):\n    pass\n",
        "from torch import nn\nnn.parallel.DistributedDataParallel\n",
        "import torch_xla_free\nimport torch\ntorch.cudax = 1\n",  # a longer name is not a vendor module
        "x = 'torch.cuda is not ready'\n",  # a sentence, not a name
        "from .cuda import thing\n",  # a relative import is the project's own
    ],
)
def test_the_checker_passes_what_is_not_a_vendor_name(source: str) -> None:
    assert vendor_names(source) == []


def test_a_planted_violation_in_a_package_is_named_by_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "backends").mkdir()
    (tmp_path / "backends" / "gpu.py").write_text("import torch\ntorch.cuda.synchronize()\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "loader.py").write_text("import torch\n\n\ndef f():\n    torch.cuda.synchronize()\n")
    (tmp_path / "comm").mkdir()
    (tmp_path / "comm" / "ddp_hooks.py").write_text("import torch.distributed\nimport torch_xla\n")
    assert violations(tmp_path) == ["largebatch/comm/ddp_hooks.py:2: torch_xla",
                                    "largebatch/data/loader.py:5: torch.cuda"]
