"""Static gates (issue 53): ruff's pyflakes rules (F) and mypy over the GPU-only modules.

No CPU test runs the modules in ``MYPY_PATHS`` end to end (NCCL, nvJPEG, DALI, the GPU
tests), so a wrong attribute or a wrong call there is found by mypy or on a GPU machine.
mypy's settings are in pyproject.toml ([tool.mypy]). The findings of today that are not
fixed yet are in ``MYPY_BASELINE``, one per line as ``path: code: message`` (no line numbers,
so an edit elsewhere in a file does not change them); a new finding fails the gate, and so
does a baseline line that no longer occurs, so the baseline only shrinks.

Typed where it matters (issue 55): no parameter or attribute named ``cfg`` (``raw_cfg``, ...) or
``backend`` is annotated ``Any`` in ``largebatch/``; ``TrainConfig``, ``Backend`` and the ``Loader``
Protocol are named instead (from another layer under ``if TYPE_CHECKING:``, ``tests/test_layers.py``).

Regenerate the baseline (after a merge, say) with ``python tests/test_static.py --write-baseline``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUFF_PATHS = ["largebatch", "benchmarks", "tests"]
MYPY_PATHS = [
    "largebatch/backends/torch_dist.py",
    "largebatch/run.py",
    "largebatch/parts/data.py",
    "largebatch/parts/model.py",
    "largebatch/parts/training.py",
    "largebatch/parts/diagnostics.py",
    "largebatch/parts/hooks.py",
    "largebatch/parts/record.py",
    "largebatch/parts/outcome.py",
    "largebatch/data/background.py",
    "largebatch/data/pipelines/nvjpeg.py",
    "largebatch/data/batched_resize.py",
    "largebatch/data/pipelines/dali_graph.py",
    "largebatch/engine/loop.py",
    "largebatch/engine/checkpoint.py",
    "largebatch/engine/checkpoint_retention.py",
    "largebatch/engine/rng_state.py",
    "largebatch/nn/sync_bn.py",
    "largebatch/comm/ddp_hooks.py",
    "largebatch/data/contract.py",
    "largebatch/data/loader_view.py",
    # on the GPU path too, and not followed for their types otherwise (follow_imports = "silent")
    "largebatch/data/pipelines/dali_files.py",
    "largebatch/data/pipelines/dali_shards.py",
    "largebatch/engine/noise_scale_hook.py",
    "largebatch/engine/ema.py",
    "largebatch/engine/evaluate.py",
    "largebatch/engine/compile.py",
    "largebatch/comm/reducers.py",
    "tests/gpu",
]
MYPY_BASELINE = ROOT / "tests" / "fixtures" / "mypy_baseline.txt"
# mypy's cache: git-ignored, kept between runs (a warm run takes seconds, a cold one ~30 s)
MYPY_CACHE = ROOT / ".mypy_cache"
# path:line: error: message  [code]   (mypy's default output; notes are not findings)
_MYPY_LINE = re.compile(r"^(?P<path>[^:\s][^:]*):\d+: error: (?P<message>.*?)  \[(?P<code>[a-z0-9-]+)\]$")


def _need(module: str) -> None:
    """Skip where ``module`` is not installed; under CI (``CI`` set) fail: the dev extra installs it."""
    if importlib.util.find_spec(module) is not None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{module} is missing under CI; the dev extra (setup.py) should install it")
    pytest.skip(f"{module} is not installed (pip install -e '.[dev]')")


def parse_mypy(output: str) -> Counter[str]:
    """Each ``error`` line of mypy's output as ``path: code: message`` (a multiset: a message may repeat)."""
    findings: Counter[str] = Counter()
    for line in output.splitlines():
        match = _MYPY_LINE.match(line)
        if match:
            findings[f"{match['path']}: {match['code']}: {match['message']}"] += 1
    return findings


def run_mypy() -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--cache-dir", str(MYPY_CACHE), "--no-error-summary", "--no-pretty",
         "--show-error-codes", "--no-color-output", *MYPY_PATHS],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )


def read_baseline() -> Counter[str]:
    lines = MYPY_BASELINE.read_text(encoding="utf-8").splitlines()
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


# -- ruff --------------------------------------------------------------------------------------
def test_ruff_pyflakes_rules_find_nothing() -> None:
    _need("ruff")
    proc = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--select", "F", "--output-format", "concise",
         *RUFF_PATHS],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, (
        f"ruff check --select F found these (fix each; `ruff check --select F --fix` fixes unused imports):\n"
        f"{proc.stdout}{proc.stderr}"
    )


# -- mypy --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mypy_findings() -> Counter[str]:
    _need("mypy")
    proc = run_mypy()
    findings = parse_mypy(proc.stdout)
    # exit 1: findings; anything else but 0 (2: bad config, a crash), or an exit 1 whose lines
    # this test cannot read, would otherwise pass as "no new finding"
    if proc.returncode not in (0, 1) or (proc.returncode == 1) != bool(findings):
        pytest.fail(f"mypy exited {proc.returncode} and the test read {sum(findings.values())} findings; "
                    f"its output:\n{proc.stdout}{proc.stderr}")
    return findings


def test_mypy_finds_nothing_outside_the_baseline(mypy_findings: Counter[str]) -> None:
    new = mypy_findings - read_baseline()
    assert not new, (
        "mypy finds what tests/fixtures/mypy_baseline.txt does not hold: fix each (or, for a false "
        "positive you cannot type away, add its line there):\n" + "\n".join(sorted(new.elements()))
    )


def test_mypy_baseline_holds_only_findings_that_still_occur(mypy_findings: Counter[str]) -> None:
    gone = read_baseline() - mypy_findings
    assert not gone, (
        "these lines of tests/fixtures/mypy_baseline.txt no longer occur (fixed): delete them:\n"
        + "\n".join(sorted(gone.elements()))
    )


def test_parse_mypy_reads_errors_and_skips_notes() -> None:
    output = (
        'largebatch/a.py:12: error: Item "None" of "Work | None" has no attribute "get_future"  [union-attr]\n'
        "largebatch/a.py:14: note:      Superclass:\n"
        "tests/gpu/t.py:3: error: \"NvjpegLoader\" has no attribute \"std\"  [attr-defined]\n"
        'largebatch/a.py:90: error: Item "None" of "Work | None" has no attribute "get_future"  [union-attr]\n'
    )
    assert parse_mypy(output) == Counter({
        'largebatch/a.py: union-attr: Item "None" of "Work | None" has no attribute "get_future"': 2,
        'tests/gpu/t.py: attr-defined: "NvjpegLoader" has no attribute "std"': 1,
    })


# -- typed where it matters ---------------------------------------------------------------------
def _is_any(annotation: ast.expr) -> bool:
    """``Any``, ``typing.Any``, ``"Any"``, or ``Optional[Any]``."""
    text = ast.unparse(annotation).strip("'\"")
    return text in ("Any", "typing.Any", "Optional[Any]", "Any | None", "None | Any")


def untyped_config_and_backend(source: str, path: str = "<source>") -> list[str]:
    """``path:line name: Any`` for each parameter or attribute named ``cfg``/``*_cfg`` or ``backend``
    annotated ``Any``."""
    found = []
    for node in ast.walk(ast.parse(source, path)):
        named: list[tuple[str, ast.expr | None, int]] = []
        if isinstance(node, ast.arg):
            named = [(node.arg, node.annotation, node.lineno)]
        elif isinstance(node, ast.AnnAssign):
            target = node.target
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            named = [(name, node.annotation, node.lineno)]
        for name, annotation, line in named:
            if (name in ("cfg", "backend") or name.endswith("_cfg")) and annotation and _is_any(annotation):
                found.append(f"{path}:{line} {name}: {ast.unparse(annotation)}")
    return found


def test_no_config_or_backend_is_annotated_any() -> None:
    found = [hit for p in sorted((ROOT / "largebatch").rglob("*.py"))
             for hit in untyped_config_and_backend(p.read_text(encoding="utf-8"), str(p.relative_to(ROOT)))]
    assert not found, (
        "name the type (TrainConfig, Backend; another layer's under `if TYPE_CHECKING:`), or pass the "
        "few config fields the function reads:\n" + "\n".join(found)
    )


def test_the_any_check_finds_each_form() -> None:
    source = ("from typing import Any, Optional\n"
              "def f(cfg: Any, raw_cfg: Optional[Any] = None, *, backend: 'Any' = None) -> None: ...\n"
              "class C:\n    backend: Any\n    def g(self, backend: Backend, cfg: TrainConfig, other: Any) -> Any: ...\n")
    assert sorted(hit.split(" ", 1)[1] for hit in untyped_config_and_backend(source)) == [
        "backend: 'Any'", "backend: Any", "cfg: Any", "raw_cfg: Optional[Any]"]


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-baseline"]:
        sys.exit(f"usage: {sys.argv[0]} --write-baseline   (writes {MYPY_BASELINE.relative_to(ROOT)})")
    proc = run_mypy()
    if proc.returncode not in (0, 1):
        sys.exit(f"mypy exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    header = ["# mypy findings not fixed yet (tests/test_static.py); one per line, `path: code: message`.",
              "# Delete a line when its finding is fixed; regenerate: python tests/test_static.py --write-baseline"]
    # the notes under the header (why a finding stays, e.g. torch's own typing) are kept
    old = MYPY_BASELINE.read_text(encoding="utf-8").splitlines() if MYPY_BASELINE.exists() else []
    notes = [line for line in old if line.startswith("#") and line not in header]
    MYPY_BASELINE.write_text("".join(f"{line}\n" for line in header + notes)
                             + "".join(f"{f}\n" for f in sorted(parse_mypy(proc.stdout).elements())),
                             encoding="utf-8")
    print(f"wrote {MYPY_BASELINE}")


def test_every_module_with_gpu_only_lines_is_type_checked() -> None:
    """The GPU path's modules (their lines marked ``# gpu-only``, tests/test_gpu_lines_gate.py)
    are checked by mypy: no CPU test runs those lines end to end."""
    marked = {str(p.relative_to(ROOT)) for p in (ROOT / "largebatch").rglob("*.py") if "# gpu-only" in p.read_text()}
    assert marked and marked <= set(MYPY_PATHS), sorted(marked - set(MYPY_PATHS))
