"""MkDocs hook: a name in a table cell (a config key such as ``optimizer.exclude_bn_bias``, a
path, a function's dotted name, in a code span or not) may break after its ``.``, ``/`` and
``_`` (docs/stylesheets/extra.css keeps the browser from breaking a code span anywhere else):
the column is as wide as the name's longest part, so a table fits the page, and a key never
shows as ``global_bat`` / ``ch_size``. A code span with a space in it is a command: it breaks at
its spaces only, never inside one of its tokens (``.venv/bin/`` / ``largebatch-train``)."""

from __future__ import annotations

import re
from typing import Any

CELL = re.compile(r"(<t[dh]\b[^>]*>)(.*?)(</t[dh]>)", re.S)  # body and header cells
TAG = re.compile(r"(<[^>]+>)")
# after . / _ ( before a letter (not inside a short number: 0.09, 1807.11205); in a number with
# more than 8 decimals, after its point and after the 8th (0.6666666666666666)
BREAK = re.compile(r"(?<=\w)([./_(])(?=[^\W\d])|(?<=\d)\.(?=\d{9})|(?<=\d\.\d{8})(?=\d)")


CODE = re.compile(r"(<code\b[^>]*>.*?</code>)", re.S)


def _breaks(html: str) -> str:
    parts = TAG.split(html)  # text at even positions, tags (never changed) at odd ones
    return "".join(BREAK.sub(lambda b: b.group(0) + "<wbr>", p) if i % 2 == 0 else p for i, p in enumerate(parts))


def _cell(m: re.Match[str]) -> str:
    # a code span with a space is a command: it breaks at its spaces only, never inside a token
    pieces = CODE.split(m.group(2))  # code spans at odd positions
    text = "".join(p if i % 2 and " " in TAG.sub("", p) else _breaks(p) for i, p in enumerate(pieces))
    return m.group(1) + text + m.group(3)


def add_breaks(html: str) -> str:
    """``<wbr>`` after each ``.``, ``/``, ``_`` and ``(`` between a word character and a letter
    (and after the point of a long decimal) in the text of a table's cells (tags and their
    attributes are left as they are)."""
    return CELL.sub(_cell, html)


def on_page_content(html: str, **_: Any) -> str:
    return add_breaks(html)
