"""No function of the engine, the data package or ``run.py`` takes more than 9 parameters.

A run option travels as a field of a settings object (``StepSettings``, ``EvalSettings``,
``CheckpointSettings``, ``LogSettings``, ``ResumeCheck``, ``LoaderSpec``, ``CropRecipe``,
``DaliPipeline``), built once in ``run.py``, not as one more keyword through five signatures.
Read with ``ast``; ``self``/``cls`` do not count, ``*args``/``**kwargs`` do.
"""

from __future__ import annotations

import ast
from pathlib import Path


PACKAGE = Path(__file__).resolve().parent.parent / "largebatch"
LIMIT = 9


def _too_long(paths: list[Path]) -> list[str]:
    out = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                names = [x.arg for x in a.posonlyargs + a.args + a.kwonlyargs if x.arg not in ("self", "cls")]
                n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
                if n > LIMIT:
                    out.append(f"{path.name}:{node.lineno} {node.name} ({n})")
    return out


def test_no_function_of_the_engine_data_or_run_takes_more_than_nine_parameters() -> None:
    paths = sorted((PACKAGE / "engine").rglob("*.py")) + sorted((PACKAGE / "data").rglob("*.py")) + [PACKAGE / "run.py"]
    too_long = _too_long(paths)
    assert not too_long, f"take a settings object instead of more keywords: {too_long}"


def test_the_count_sees_a_long_signature(tmp_path: Path) -> None:
    """Ten parameters are flagged; self plus eight and ``*rest`` (nine) are not."""
    f = tmp_path / "long.py"
    f.write_text("def f(a, b, c, d, e, f, g, h, i, *, j=0): ...\n"
                 "class C:\n    def m(self, a, b, c, d, e, f, g, h, *rest): ...\n", encoding="utf-8")
    assert _too_long([f]) == ["long.py:1 f (10)"]
