"""MkDocs hook: the benchmarks' results on the site, without a second copy in ``docs/``.

* The plots the benchmark scripts render into ``benchmarks/results/`` are added to the site at
  build time under ``img/`` (``PLOTS``), so a page links it as ``img/<name>.png`` and a plot
  re-rendered by its script (``benchmarks/scaling_rule.py --render``) is what the site shows.
* ``docs/results.md`` holds a short introduction and the ``MARKER`` line, which is replaced by
  ``benchmarks/README.md`` (the record of every measurement) below its title, so the page's
  tables are the README's and cannot drift from them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

# site path -> the script's output, relative to the repository
PLOTS = {"img/scaling_rule.png": "benchmarks/results/scaling_rule.png",
         "img/steps_to_target.png": "benchmarks/results/steps_to_target.png"}
PAGE = "results.md"
SOURCE = "benchmarks/README.md"
MARKER = "<!-- results: benchmarks/README.md is written here at build time -->"
FENCE = re.compile(r"^\s*(```+|~~~+)")
NESTED_ITEM = re.compile(r"^( {2,3})(?=[-*+] |\d+\. )")


def _root(config: Any) -> Path:
    return Path(config.config_file_path).parent


def on_files(files: Files, config: Any, **_: Any) -> Files:
    root = _root(config)
    for uri, source in PLOTS.items():
        files.append(File.generated(config, uri, abs_src_path=str(root / source)))
    return files


def readme_body(text: str) -> str:
    """``benchmarks/README.md`` below its ``# `` title, as Python-Markdown reads it: GitHub nests a
    list item indented by two spaces, Python-Markdown only by four, so nested items (and the
    lines that continue them) are indented to four outside code fences."""
    lines = text.splitlines()
    if lines and lines[0].startswith("# "):
        lines = lines[1:]
    out, fence, nested = [], "", False
    for line in lines:
        opening = FENCE.match(line)
        if fence:
            fence = "" if opening and opening.group(1).startswith(fence) else fence
            out.append(line)
            continue
        if opening:
            fence, nested = opening.group(1), False
            out.append(line)
            continue
        if NESTED_ITEM.match(line):
            nested = True
            line = "    " + line.lstrip()
        elif nested and line.startswith("    ") and not line.startswith("      "):
            line = "      " + line.lstrip()
        elif not line.startswith(" "):
            nested = False
        out.append(line)
    return "\n".join(out) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker line {MARKER!r}")
    return markdown.replace(MARKER, readme_body((_root(config) / SOURCE).read_text(encoding="utf-8")))


def on_serve(server: Any, config: Any, **_: Any) -> Any:
    """``make docs`` rebuilds the results page when the README changes."""
    server.watch(str(_root(config) / SOURCE))
    return server
