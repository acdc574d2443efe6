"""MkDocs hook: a name in a table cell (a config key such as ``optimizer.exclude_bn_bias``, a
path, a function's dotted name, in a code span or not) may break after its ``.``, ``/`` and
``_`` (docs/stylesheets/extra.css keeps the browser from breaking a code span anywhere else):
the column is as wide as the name's longest part, so a table fits the page, and a key never
shows as ``global_bat`` / ``ch_size``."""

from __future__ import annotations

import re
from typing import Any

CELL = re.compile(r"(<td\b[^>]*>)(.*?)(</td>)", re.S)
TAG = re.compile(r"(<[^>]+>)")
# after . / _ ( before a letter (not inside a short number: 0.09, 1807.11205); in a number with
# more than 8 decimals, after its point and after the 8th (0.6666666666666666)
BREAK = re.compile(r"(?<=\w)([./_(])(?=[^\W\d])|(?<=\d)\.(?=\d{9})|(?<=\d\.\d{8})(?=\d)")


def _cell(m: re.Match[str]) -> str:
    parts = TAG.split(m.group(2))  # text at even positions, tags (never changed) at odd ones
    text = "".join(BREAK.sub(lambda b: b.group(0) + "<wbr>", p) if i % 2 == 0 else p for i, p in enumerate(parts))
    return m.group(1) + text + m.group(3)


def add_breaks(html: str) -> str:
    """``<wbr>`` after each ``.``, ``/``, ``_`` and ``(`` between a word character and a letter
    (and after the point of a long decimal) in the text of a table's cells (tags and their
    attributes are left as they are)."""
    return CELL.sub(_cell, html)


def on_page_content(html: str, **_: Any) -> str:
    return add_breaks(html)
