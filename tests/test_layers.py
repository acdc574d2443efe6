"""The package's layering (``shared/LAYOUT.md``): imports point down, never up, and never in a circle.

Every ``import`` in ``largebatch/`` is read with ``ast``, at module level and inside functions
alike (a function-level import hides a circle from Python, not from a reader). Layers, top to
bottom:

| layer | modules | may import |
|---|---|---|
| edge | ``cli``, ``multirun``, ``launch/``, ``tools/``, ``train``, ``report`` | anything below |
| orchestration | ``run``, ``parts/`` (its builders, one per config section); ``config/`` (read only by the edge) | engine/backends, building blocks, ground |
| engine / backends | ``engine/``, ``backends/`` (neither imports the other) | building blocks, ground |
| building blocks | ``nn/``, ``optim/``, ``lr/``, ``comm/``, ``data/``, ``diagnostics/``, ``models`` | ground; across packages only ``nn`` -> ``comm.reducers`` |
| ground | ``errors``, ``defaults``, ``largebatch`` (the version) | only ``errors`` (``errors``: nothing) |

``config/`` is light: it imports only ``config/`` and the ground, which loads no torch
(``import largebatch.config`` loads no torch; ``tests/test_config.py`` runs it). The values the
config and the library share (the embedded set's sizes, the compile modes) are in the ground
(``defaults``), so the config reads nothing of the library. Nothing but ``train`` imports ``cli``. ``ALLOWED_UPWARD`` names the
imports that break these rules today; the structure stages that remove them shrink it.

Types across layers: an annotation may name a type of another layer (``engine/`` naming
``backends.base.Backend``, ``run`` naming ``config.schema.TrainConfig``) through an import under
``if TYPE_CHECKING:``. With ``from __future__ import annotations`` such an annotation is never
evaluated, so the import is no run-time dependency: the direction rules above read run-time
imports only, and exempt the ``TYPE_CHECKING`` ones. Those still may not close a circle (the
circle test reads both kinds: a reader, a type checker and ``shared/tools/import_cycles.py`` see
them), and run-time imports keep every rule.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "largebatch"

EDGE, ORCHESTRATION, ENGINE, BLOCKS, GROUND = 4, 3, 2, 1, 0

# The first dotted part under largebatch -> layer.
LAYER_OF_UNIT = {
    "cli": EDGE, "multirun": EDGE, "launch": EDGE, "tools": EDGE, "train": EDGE, "report": EDGE,
    "run": ORCHESTRATION, "parts": ORCHESTRATION, "config": ORCHESTRATION,
    "engine": ENGINE, "backends": ENGINE,
    "nn": BLOCKS, "optim": BLOCKS, "lr": BLOCKS, "comm": BLOCKS, "data": BLOCKS,
    "diagnostics": BLOCKS, "models": BLOCKS,
    "errors": GROUND, "defaults": GROUND, "lazy": GROUND, "resolution": GROUND, "batch_schedule": GROUND,
    "imagenet_recipe": GROUND,
    "": GROUND,
}

# Imports that break the rules today, each removed by a named structure stage (LAYOUT.md).
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = ["largebatch", *path.relative_to(package).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(node: ast.ImportFrom, current: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``, the test of an ``if`` whose body only static tools run."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def read_imports(package: Path = PACKAGE, *, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports at run time (function-level imports included);
    ``type_checking=True``: also those imported only under ``if TYPE_CHECKING:``."""
    modules = {_module_name(p, package): p for p in package.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        type_only = {
            id(sub)
            for node in ast.walk(tree) if isinstance(node, ast.If) and _is_type_checking(node.test)
            for stmt in node.body for sub in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in type_only and not type_checking:
                continue
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = _resolve(node, name, path.name == "__init__.py")
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    graph[name].add(target)
        graph.setdefault(name, set())
    return dict(graph)


def _unit(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def rule_broken(importer: str, imported: str) -> str | None:
    """Why ``importer`` may not import ``imported`` (None: it may)."""
    a, b = _unit(importer), _unit(imported)
    la, lb = LAYER_OF_UNIT[a], LAYER_OF_UNIT[b]
    if b == "cli" and a != "train":
        return "only train imports the command line (cli)"
    if a == b:
        return None
    if la == GROUND:
        if imported == "largebatch.errors" and a != "errors":
            return None
        return "the ground imports nothing of the project but errors (and errors nothing)"
    if lb == GROUND:
        return None
    if a == "config":
        return "config/ imports only config/ and the ground (it stays light: no torch)"
    if b in ("config", "run") and la != EDGE:
        return f"{b} is read only by the edge"
    if lb > la:
        return "an import that points up a layer"
    if la == lb == ENGINE:
        return "engine/ and backends/ do not import each other"
    if la == lb == BLOCKS and not (a == "nn" and imported == "largebatch.comm.reducers"):
        return "building blocks import across packages only nn -> comm.reducers"
    return None


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _without_allowed(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {m: {t for t in ts if (m, t) not in ALLOWED_UPWARD} for m, ts in graph.items()}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in read_imports() if _unit(m) not in LAYER_OF_UNIT)
    assert not unplaced, f"add these to LAYER_OF_UNIT (and LAYOUT.md's table): {unplaced}"


def broken_imports(graph: dict[str, set[str]]) -> list[str]:
    """Each import of ``graph`` that breaks a rule (and is not in ``ALLOWED_UPWARD``), with why."""
    return [
        f"{m} -> {t}: {why}"
        for m, targets in sorted(graph.items()) for t in sorted(targets)
        if (m, t) not in ALLOWED_UPWARD and (why := rule_broken(m, t))
    ]


def test_imports_point_down() -> None:
    broken = broken_imports(read_imports())
    assert not broken, "\n".join(broken)


def test_the_allow_list_holds_only_imports_that_still_exist_and_break_a_rule() -> None:
    graph = read_imports()
    stale = sorted(f"{m} -> {t}" for m, t in ALLOWED_UPWARD if t not in graph.get(m, set()) or not rule_broken(m, t))
    assert not stale, f"remove from ALLOWED_UPWARD (fixed): {stale}"


def test_no_import_circle() -> None:
    found = cycles(_without_allowed(read_imports(type_checking=True)))  # TYPE_CHECKING imports too
    assert not found, f"import circles: {found}"


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("largebatch.multirun", "largebatch.cli"),  # the circle stage 1 removed
        ("largebatch.engine.loop", "largebatch.backends.base"),
        ("largebatch.optim.lars", "largebatch.lr.schedules"),
        ("largebatch.errors", "largebatch.models"),
        ("largebatch.config.checks", "largebatch.engine.loop"),
        ("largebatch.config.schema", "largebatch.data.synthetic"),  # the import stage 3 removed
        ("largebatch.config.checks", "largebatch.engine.compile"),
        ("largebatch.config.schema", "largebatch.data.contract"),  # the config reads the ground only
        ("largebatch.defaults", "largebatch.data.synthetic"),
        ("largebatch.errors", "largebatch.defaults"),
        ("largebatch.engine.hooks", "largebatch.run"),
        ("largebatch.data.pipelines.torchvision", "largebatch.engine.checkpoint"),
        ("largebatch.diagnostics.noise_scale", "largebatch.optim.lars"),  # a block: torch and the ground only
        ("largebatch.diagnostics.noise_scale", "largebatch.engine.loop"),
    ],
)
def test_the_rules_catch_what_they_name(importer: str, imported: str) -> None:
    assert rule_broken(importer, imported)


def test_the_ground_imports_only_errors() -> None:
    graph = read_imports()
    ground = [m for m in graph if LAYER_OF_UNIT[_unit(m)] == GROUND]
    assert "largebatch.defaults" in ground
    outside = sorted(f"{m} -> {t}" for m in ground for t in graph[m] if t != "largebatch.errors" or m == "largebatch.errors")
    assert not outside, f"the ground must stay light (config/ reads it): {outside}"


def test_the_loader_contract_is_a_leaf_of_data() -> None:
    """``data/contract.py`` (the ``Loader`` Protocol, ``LoaderSpec``) is what the loaders implement:
    they import it, it imports none of them, at run time or under ``TYPE_CHECKING`` (its defaults
    come from the ground)."""
    contract = "largebatch.data.contract"
    imported = read_imports(type_checking=True)[contract]
    inside_data = sorted(t for t in imported if t == "largebatch.data" or t.startswith("largebatch.data."))
    assert not inside_data, f"{contract} must not import the modules that implement it: {inside_data}"
    assert {"largebatch.defaults", "largebatch.resolution"} <= imported  # the scan sees its imports


def test_a_new_circle_is_found() -> None:
    graph = {k: set(v) for k, v in _without_allowed(read_imports()).items()}
    graph["largebatch.errors"].add("largebatch.cli")  # cli -> errors exists: now a circle
    assert any({"largebatch.cli", "largebatch.errors"} <= set(group) for group in cycles(graph))


@pytest.mark.parametrize("package", ["data", "data/pipelines"])
def test_a_lazy_package_lists_each_name_once_for_readers_and_once_for_run_time_alike(package: str) -> None:
    """``largebatch.lazy``: a package's ``if TYPE_CHECKING:`` imports (what static tools see) and its
    ``lazy_exports`` map (what run time loads) name the same names from the same modules."""
    path = PACKAGE / package / "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    prefix = "largebatch." + package.replace("/", ".") + "."
    seen: dict[str, str] = {}
    mapped: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.module.startswith(prefix), ast.dump(imp)
                seen.update({a.name: imp.module[len(prefix):] for a in imp.names})
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
            mapped = ast.literal_eval(node.args[1])
    assert seen and seen == mapped


def test_a_lazy_package_loads_its_modules_on_first_use_only() -> None:
    import subprocess
    import sys

    code = ("import sys, largebatch.data as d, largebatch.data.pipelines as p; "
            "assert 'largebatch.data.samplers' not in sys.modules and 'torch' not in sys.modules; "
            "assert d.ShardedSampler.__module__ == 'largebatch.data.samplers'; "
            "assert 'ShardedSampler' in dir(d) and 'build_dali_loaders' in p.__all__; "
            "import largebatch.data as again; assert again.LoaderSpec is d.LoaderSpec\n"
            "try:\n    d.no_such_name\nexcept AttributeError as e:\n    assert 'no_such_name' in str(e)\n"
            "else:\n    raise SystemExit('no AttributeError')")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _fake_package(root: Path, files: dict[str, str]) -> Path:
    package = root / "largebatch"
    for rel, text in {"__init__.py": "", **files}.items():
        path = package / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(text, encoding="utf-8")
    return package


_TYPING_HEAD = "from __future__ import annotations\nfrom typing import TYPE_CHECKING\nimport typing\n"


@pytest.mark.parametrize(
    ("importer", "source", "caught"),
    [
        # engine/ and backends/ do not import each other ... at run time
        ("engine/loop.py", "from largebatch.backends.base import Backend\n", True),
        ("engine/loop.py", "def f():\n    from largebatch.backends import base\n", True),
        ("engine/loop.py", "if TYPE_CHECKING:\n    from largebatch.backends.base import Backend\n", False),
        ("engine/loop.py", "if typing.TYPE_CHECKING:\n    import largebatch.backends.base\n", False),
        ("engine/loop.py", "if TYPE_CHECKING:\n    pass\nelse:\n    from largebatch.backends.base import Backend\n", True),
        # config is read only by the edge ... at run time
        ("engine/loop.py", "from largebatch.config.schema import TrainConfig\n", True),
        ("engine/loop.py", "if TYPE_CHECKING:\n    from largebatch.config.schema import TrainConfig\n", False),
    ],
)
def test_a_type_checking_import_is_exempt_from_the_direction_rules_and_a_run_time_one_is_not(
    tmp_path: Path, importer: str, source: str, caught: bool
) -> None:
    package = _fake_package(tmp_path, {importer: _TYPING_HEAD + source, "backends/base.py": "",
                                       "config/schema.py": ""})
    assert bool(broken_imports(read_imports(package))) is caught
    # a reader and a type checker still see the import
    assert read_imports(package, type_checking=True)["largebatch.engine.loop"] & {
        "largebatch.backends.base", "largebatch.backends", "largebatch.config.schema"}


def test_a_type_checking_import_that_closes_a_circle_is_found(tmp_path: Path) -> None:
    package = _fake_package(tmp_path, {
        "engine/loop.py": "from largebatch.data.contract import Loader\n",  # down: allowed
        "data/contract.py": _TYPING_HEAD + "if TYPE_CHECKING:\n    from largebatch.engine.loop import Trainer\n",
    })
    assert not broken_imports(read_imports(package))
    assert not cycles(read_imports(package))
    assert {"largebatch.data.contract", "largebatch.engine.loop"} <= set(
        sum(cycles(read_imports(package, type_checking=True)), []))
