"""MkDocs hook: the package's docstrings use Sphinx's inline roles (:func:`x`, :class:`x`) and
``::`` before literal blocks, which mkdocstrings (Markdown) would print as written. Rewritten in
the rendered HTML of each page: a role keeps its code span, ``::`` ending a paragraph becomes
``:``. Written here because no maintained MkDocs or griffe extension converts Sphinx roles;
the docstrings stay readable in ``help()`` and editors as they are."""

from __future__ import annotations

import re
from typing import Any

ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|exc|obj|const):(<code\b)")
LITERAL_MARK = re.compile(r"::(</p>)")


def on_page_content(html: str, **_: Any) -> str:
    return LITERAL_MARK.sub(r":\1", ROLE.sub(r"\1", html))
