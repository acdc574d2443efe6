"""The user documentation as the tests read it: README.md and the pages of docs/ (the MkDocs
site). A block an example test runs may live in either, so moving a section between them
keeps its test."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("**/*.md"))


def doc_files() -> list[Path]:
    return [README, *PAGES]


def python_blocks() -> list[str]:
    """Every ```python block of the README and the docs pages, in that order."""
    return [b for f in doc_files() for b in re.findall(r"```python\n(.*?)```", f.read_text(encoding="utf-8"), flags=re.S)]
