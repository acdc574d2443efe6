"""MkDocs hook: the plots the benchmark scripts render into ``benchmarks/results/`` are shown
on the pages that discuss them, without a second copy in ``docs/``: each is added to the site
at build time under ``img/`` (``PLOTS``), so a page links it as ``img/<name>.png`` and a plot
re-rendered by its script (``benchmarks/scaling_rule.py --render``) is what the site shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# site path -> the script's output, relative to the repository
PLOTS = {"img/scaling_rule.png": "benchmarks/results/scaling_rule.png",
         "img/steps_to_target.png": "benchmarks/results/steps_to_target.png"}


def on_files(files: Files, config: Any, **_: Any) -> Files:
    root = Path(config.config_file_path).parent
    for uri, source in PLOTS.items():
        files.append(File.generated(config, uri, abs_src_path=str(root / source)))
    return files
