"""Every example of the README and the documentation pages runs, or says why not (issue 45).

Sybil (a well-kept runner for examples in documentation) reads README.md and each page of docs/: its
```python blocks run in one namespace per page, in order, and its ```bash blocks run with bash
(``-euo pipefail``) in a scratch folder laid out as a fresh clone after ``make train``, with the
user's plain PATH: no virtualenv on it and none active, so a page says ``.venv/bin/largebatch-train``
or ``launch/torchrun.sh`` as a user types it, never a bare console script. A
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


def _plain_env(workdir: Path) -> dict[str, str]:
    """This environment as a user's shell has it without an activated venv: the venv's bin
    (this interpreter's, or an active one's) off PATH, VIRTUAL_ENV unset."""
    venv_bins = {str(Path(sys.executable).parent), str(Path(sys.prefix) / "bin")}
    if os.environ.get("VIRTUAL_ENV"):
        venv_bins.add(str(Path(os.environ["VIRTUAL_ENV"]) / "bin"))
    path = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d.rstrip("/") not in venv_bins]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PATH")}
    return {**env, "PATH": os.pathsep.join(path), "LARGEBATCH_CACHE": str(workdir / "cache"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def _shell(workdir: Path):
    env = _plain_env(workdir)

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


def test_examples_run_without_a_venv(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bash examples see no virtualenv, even under an activated one: a bare
    ``largebatch-train`` fails there as it does for a user who did not activate ``.venv``."""
    venv_bin = str(Path(sys.executable).parent)
    monkeypatch.setenv("VIRTUAL_ENV", str(Path(sys.executable).parent.parent))
    monkeypatch.setenv("PATH", os.pathsep.join([venv_bin, venv_bin + "/", os.environ.get("PATH", "")]))
    env = _plain_env(tmp_path)
    assert "VIRTUAL_ENV" not in env
    assert venv_bin not in [d.rstrip("/") for d in env["PATH"].split(os.pathsep)], env["PATH"]
