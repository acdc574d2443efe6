"""The version a user cites: written once (``largebatch.__version__``), read by setup.py, printed
by ``--version`` of every console script that takes one."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

import largebatch
from tests.docs_text import ROOT


def test_setup_reads_the_package_version() -> None:
    setup = (ROOT / "setup.py").read_text(encoding="utf-8")
    assert "version=VERSION" in setup and not re.search(r'version="[\d.]+"', setup)
    proc = subprocess.run([sys.executable, "setup.py", "--version"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip().splitlines()[-1] == largebatch.__version__, proc.stderr


@pytest.mark.parametrize("module", ["largebatch.cli", "largebatch.tools.make_synthetic",
                                    "largebatch.tools.check_data", "largebatch.tools.make_shards",
                                    "largebatch.report"])
def test_version_prints_the_package_version(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    import importlib

    main = importlib.import_module(module).main
    try:
        code = main(["--version"])
    except SystemExit as e:  # argparse's version action exits
        code = e.code
    assert code == 0
    assert capsys.readouterr().out.strip() == f"largebatch {largebatch.__version__}"
