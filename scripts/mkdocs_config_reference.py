"""MkDocs hook: docs/config-reference.md's tables, written from the schema at
build time (:func:`largebatch.config.reference.reference_tables`), so the
page lists every key with its schema default and cannot drift from it. The
page holds the prose and the ``MARKER`` line the tables replace."""

from __future__ import annotations

from typing import Any

PAGE = "config-reference.md"
MARKER = "<!-- config-reference: the tables are written here at build time -->"


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        raise ValueError(f"docs/{PAGE} lost its marker line {MARKER!r}")
    from largebatch.config.reference import reference_tables

    return markdown.replace(MARKER, reference_tables())
