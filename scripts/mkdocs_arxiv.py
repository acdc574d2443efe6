"""MkDocs hook: an arXiv identifier written as plain text on a page ("arXiv 1811.05233") becomes
a link to its abstract (https://arxiv.org/abs/1811.05233), so the papers a page cites are one
click away without a link written by hand next to every citation. Text inside a link, a code
span or a code block is left as it is."""

from __future__ import annotations

import re
from typing import Any

ARXIV = re.compile(r"\barXiv:? ?(\d{4}\.\d{4,5})(v\d+)?\b")
TAG = re.compile(r"(<[^>]+>)")
OPAQUE = {"a", "code", "pre"}  # no link inside these


def link(html: str) -> str:
    """``html`` with each plain-text arXiv identifier outside ``<a>``, ``<code>`` and ``<pre>`` linked."""
    out, depth = [], 0
    for part in TAG.split(html):
        if part.startswith("<"):
            name = re.match(r"</?\s*([a-zA-Z0-9]+)", part)
            if name and name.group(1).lower() in OPAQUE and not part.endswith("/>"):
                depth += -1 if part.startswith("</") else 1
            out.append(part)
        elif depth <= 0:
            out.append(ARXIV.sub(r'<a href="https://arxiv.org/abs/\1">\g<0></a>', part))
        else:
            out.append(part)
    return "".join(out)


def on_page_content(html: str, **_: Any) -> str:
    return link(html)
