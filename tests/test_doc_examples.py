"""Every example of the README and the documentation pages runs, or says why not (issue 45).

Sybil (a well-kept runner for examples in documentation) reads README.md and each page of docs/: its
```python blocks run in one namespace per page, in order, and its ```bash blocks run with bash
(``-euo pipefail``) in a scratch folder, with this environment's console scripts on PATH. A
block that cannot run here (GPUs, a TPU, a cluster, a data set at a fixed path) is preceded by
``<!-- skip: next "the reason" -->``, the one way the pages mark it; a skip without a reason
fails. Output listings use plain or ```text fences and are not examples.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import unittest
from pathlib import Path

import pytest

from tests.docs_text import ROOT, doc_files

sybil = pytest.importorskip("sybil", reason="Sybil is not installed (pip install -e '.[dev]')")
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser  # noqa: E402

SKIP = re.compile(r"<!--\s*skip:\s*(.*?)\s*-->")
EXAMPLE_FENCE = re.compile(r"^```(python|bash)\s*$", re.M)


def _shell(workdir: Path):
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "LARGEBATCH_CACHE": str(workdir / "cache"), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}

    def evaluate(example) -> None:
        proc = subprocess.run(["bash", "-euo", "pipefail", "-c", example.parsed], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise AssertionError(f"{example.path}:{example.line}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return evaluate


@pytest.mark.parametrize("page", doc_files(), ids=[p.name for p in doc_files()])
def test_every_example_runs_or_says_why_not(page: Path, tmp_path: Path) -> None:
    for folder in ("launch", "benchmarks", "scripts", "conf"):
        (tmp_path / folder).symlink_to(ROOT / folder)  # the commands name these as in a checkout
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # ".venv/bin/..." as make train made it
    reader = sybil.Sybil(parsers=[PythonCodeBlockParser(), CodeBlockParser(language="bash", evaluator=_shell(tmp_path)),
                                  SkipParser()])
    ran, skipped = 0, []
    cwd = os.getcwd()
    os.chdir(tmp_path)  # what a Python example writes lands in the scratch folder too
    try:
        for example in reader.parse(page).examples():
            try:
                example.evaluate()
            except unittest.SkipTest as why:
                skipped.append(str(why))
                continue
            ran += isinstance(example.parsed, str)
    finally:
        os.chdir(cwd)
    blocks = len(EXAMPLE_FENCE.findall(page.read_text(encoding="utf-8")))
    assert all(skipped), f"{page.name}: a skip without its reason"
    assert ran + len(skipped) == blocks, (page.name, ran, skipped, blocks)


def test_skips_name_their_reason() -> None:
    for page in doc_files():
        for directive in SKIP.findall(page.read_text(encoding="utf-8")):
            assert re.fullmatch(r'next "[^"]{10,}"', directive), f"{page.name}: <!-- skip: {directive} -->"
