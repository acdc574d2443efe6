"""MkDocs hook: the package's docstrings use Sphinx's inline roles (:func:`x`, :class:`x`) and
``::`` before literal blocks, which mkdocstrings (Markdown) would print as written. Rewritten in
the rendered HTML of each page: a role becomes a cross-reference to the object it names, which
the autorefs plugin (installed with mkdocstrings) turns into a link where the object is
documented on the site and leaves as the plain code span elsewhere (``optional``); ``::``
ending a paragraph becomes ``:``. Written here because no maintained MkDocs or griffe extension
converts Sphinx roles; the docstrings stay readable in ``help()`` and editors as they are.

``:class:`~largebatch.comm.SquaredNormTap``` shows ``SquaredNormTap`` (Sphinx's ``~``: the last
name only) and links to ``largebatch.comm.SquaredNormTap``. A name Sphinx would resolve
relative to the docstring's module or class (``:meth:`update```) links to the one object
documented on the same page whose path ends with it, if there is exactly one; a function
re-exported under its module's name (``largebatch.optim.param_groups``, documented as
``largebatch.optim.param_groups.param_groups``) links to the function."""

from __future__ import annotations

import html
import re
from typing import Any

ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|exc|obj|const):<code>(~?)([\w.]+)(\(\))?</code>")
LEFTOVER_ROLE = re.compile(r":(?:func|meth|class|mod|attr|data|exc|obj|const):(<code\b)")
LITERAL_MARK = re.compile(r"::(</p>)")


ANCHOR = re.compile(r'\bid="(largebatch\.[\w.]+)"')


def resolve(target: str, documented: set[str]) -> str:
    """The documented object ``target`` names (module docstring above), else ``target``."""
    last = target.rsplit(".", 1)[-1]
    if target in documented:
        return target
    if f"{target}.{last}" in documented:
        return f"{target}.{last}"
    ends = [d for d in documented if d.endswith("." + target)]
    return ends[0] if len(ends) == 1 else target


def on_page_content(html_text: str, **_: Any) -> str:
    documented = set(ANCHOR.findall(html_text))

    def reference(m: re.Match[str]) -> str:
        short, target, call = m.group(1), m.group(2), m.group(3) or ""
        shown = (target.rsplit(".", 1)[-1] if short else target) + call
        return (f'<autoref identifier="{html.escape(resolve(target, documented), quote=True)}" optional>'
                f"<code>{html.escape(shown)}</code></autoref>")

    html_text = ROLE.sub(reference, html_text)
    return LITERAL_MARK.sub(r":\1", LEFTOVER_ROLE.sub(r"\1", html_text))
