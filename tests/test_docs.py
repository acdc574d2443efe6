"""The documentation site builds with ``mkdocs build --strict`` (a broken link or anchor, a page
left out of the navigation, a docstring mkdocstrings cannot render: each fails it), and the
README's links into docs/ lead to pages that exist."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs_text import PAGES, README, ROOT

pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install -e '.[docs]')")
pytest.importorskip("mkdocstrings", reason="the docs extra is not installed (pip install -e '.[docs]')")


def test_the_site_builds_strict(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    built = {p.relative_to(tmp_path / "site").as_posix() for p in (tmp_path / "site").rglob("index.html")}
    for page in PAGES:
        name = page.relative_to(ROOT / "docs").with_suffix("").as_posix()
        assert ("index.html" if name == "index" else f"{name}/index.html") in built, page
    # the study's plot, added from benchmarks/results/ at build time, shown on its page
    assert (tmp_path / "site" / "img" / "scaling_rule.png").read_bytes() == \
        (ROOT / "benchmarks" / "results" / "scaling_rule.png").read_bytes()
    assert 'src="../img/scaling_rule.png"' in (tmp_path / "site" / "scaling-rule" / "index.html").read_text()
    api = (tmp_path / "site" / "api" / "index.html").read_text()
    for name in ("LARS", "LAMB", "scale_lr", "GroupSyncBatchNorm", "LoaderSpec"):
        assert 'id="largebatch.' in api and name in api, name
    # the docstrings' Sphinx roles and literal-block markers do not reach the page as written
    assert not re.search(r":(func|meth|class|mod|attr|data):<code", api) and "::</p>" not in api
    # a role naming a documented object is a link to it: by its full path (`:func:`...)`, relative
    # to its class (`:meth:`update``), and a function re-exported under its module's name
    links = set(re.findall(r'<a class="autorefs autorefs-internal" title="([^"]+)" href="#', api))
    assert {"largebatch.diagnostics.squared_norm", "largebatch.optim.param_groups.param_groups",
            "update (largebatch.diagnostics.GradientNoiseScale.update)"} <= links, links
    # signatures are laid out by the formatter, one parameter a line, not one 287-character line
    assert "build_lr_scheduler</span><span class=\"p\">(</span>\n" in api
    # a class's heading carries its constructor's signature, every parameter named; the two
    # functions docs/reusable-parts.md uses are on the page too
    missing = _missing_signatures(api, SIGNED)
    assert not missing, missing
    # torch's objects link to torch's documentation, from the committed inventory (no network)
    for target in ("optim.html#torch.optim.Optimizer", "generated/torch.nn.Module.html#torch.nn.Module",
                   "generated/torch.nn.SyncBatchNorm.html#torch.nn.SyncBatchNorm.convert_sync_batchnorm"):
        assert f'href="https://docs.pytorch.org/docs/stable/{target}"' in api, target
    # the configuration reference's tables are written at build time: every key is on the page
    from largebatch.config.reference import key_docs

    reference = (tmp_path / "site" / "config-reference" / "index.html").read_text()
    # a key in a table may break after its dots and underscores only (scripts/mkdocs_table_code.py)
    assert "<td><code>global_<wbr>batch_<wbr>size</code></td>" in reference
    reference = reference.replace("<wbr>", "")
    missing = [d.key for d in key_docs() if f"<code>{d.key}</code>" not in reference]
    assert not missing and "<!-- config-reference" not in reference, missing
    # the measured results: benchmarks/README.md's tables on their page, and arXiv IDs as links
    results = (tmp_path / "site" / "results" / "index.html").read_text()
    missing = _missing_tables((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8"), results)
    assert not missing and "<!-- results:" not in results, missing
    plain = {f"{page.relative_to(tmp_path / 'site')}: {m}" for page in (tmp_path / "site").rglob("index.html")
             for m in _plain_arxiv_ids(page.read_text())}
    assert not plain, sorted(plain)
    assert '<a href="https://arxiv.org/abs/1811.05233">arXiv 1811.05233</a>' in \
        (tmp_path / "site" / "recipes" / "index.html").read_text()


ARXIV_ID = re.compile(r"\barXiv:? ?(\d{4}\.\d{4,5})")


def _plain_arxiv_ids(html: str) -> list[str]:
    """The arXiv IDs of a built page that are not a link to their abstract (code spans and blocks,
    which show what a user types, aside)."""
    html = re.sub(r'<a href="https://arxiv\.org/abs/(\d{4}\.\d{4,5})">arXiv:? ?\1</a>', "", html)
    html = re.sub(r"<(pre|code)\b.*?</\1>", "", html, flags=re.S)
    return ARXIV_ID.findall(html)


def _header_rows(markdown: str) -> list[tuple[bool, str]]:
    """(inside a code fence, line) of each table header row of ``markdown``: a ``|`` row followed by
    its ``|---|`` separator."""
    rows, fence, lines = [], False, markdown.splitlines()
    for line, after in zip(lines, lines[1:] + [""]):
        if line.lstrip().startswith("```"):
            fence = not fence
        if line.startswith("|") and re.match(r"^\|[\s:|-]*-[\s:|-]*$", after):
            rows.append((fence, line))
    return rows


def _missing_tables(markdown: str, html: str) -> list[str]:
    """The header rows of ``markdown``'s tables that are not on the built page ``html``: a table's
    header cells as a ``<thead>`` row (markup and the table hook's ``<wbr>`` aside), a table
    printed in a code block as its line."""
    import html as html_lib

    def text(s: str) -> str:
        return " ".join(html_lib.unescape(re.sub(r"<[^>]+>", "", s)).split())

    heads = [[text(c) for c in re.findall(r"<th[^>]*>(.*?)</th>", row, re.S)]
             for row in re.findall(r"<thead>(.*?)</thead>", html, re.S)]
    blocks = [html_lib.unescape(re.sub(r"<[^>]+>", "", b)) for b in re.findall(r"<pre.*?</pre>", html, re.S)]
    missing = []
    for fenced, row in _header_rows(markdown):
        if fenced:
            missing += [row] if not any(row in b for b in blocks) else []
            continue
        cells = [" ".join(re.sub(r"[`*]", "", c).split()) for c in row.strip().strip("|").split("|")]
        missing += [row] if cells not in heads else []
    return missing


def test_the_results_checks_catch_what_they_name() -> None:
    """The two checks above fail on a page that lost a table or cites an arXiv ID as plain text;
    the arXiv hook links an ID in text and leaves one in code alone."""
    import importlib.util

    markdown = "| a | `b` c |\n|---|--:|\n| 1 | 2 |\n\n```text\n| x | y |\n|---|---|\n```\n"
    page = "<table><thead><tr><th>a</th><th><code>b</code> c</th></tr></thead></table><pre><code>| x | y |</code></pre>"
    assert _missing_tables(markdown, page) == []
    assert _missing_tables(markdown + "\n| d |\n|---|\n", page) == ["| d |"]
    assert _missing_tables(markdown, page.replace("<th>a</th>", "")) == ["| a | `b` c |"]
    spec = importlib.util.spec_from_file_location("mkdocs_arxiv", ROOT / "scripts" / "mkdocs_arxiv.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # type: ignore[union-attr]
    page = "<p>Mikami (arXiv 1811.05233), <code>arXiv 1711.00489</code>, <a href=\"x\">arXiv 1812.06162</a></p>"
    assert _plain_arxiv_ids(page) == ["1811.05233", "1812.06162"]
    assert hook.link(page) == ('<p>Mikami (<a href="https://arxiv.org/abs/1811.05233">arXiv 1811.05233</a>), '
                               '<code>arXiv 1711.00489</code>, <a href="x">arXiv 1812.06162</a></p>')
    assert _plain_arxiv_ids(hook.link(page)) == ["1812.06162"]  # a link elsewhere is not the paper's


# pages that still name benchmarks/README.md as a plain path instead of linking the results page:
# docs/scaling-rule.md is rendered from benchmarks/scaling_rule_page.md (to be linked there)
PLAIN_RESULTS_PATH_LEFT: set[str] = set()


def test_pages_link_the_results_instead_of_naming_the_readme() -> None:
    """A page sends the reader to [Measured results](results.md), which shows benchmarks/README.md,
    not to the file's path; the README's arXiv IDs are links, as the site's are (the hook)."""
    found = [f"{path.relative_to(ROOT)}:{n}: {line.strip()}" for path in PAGES
             if path.name != "results.md" and path.relative_to(ROOT).as_posix() not in PLAIN_RESULTS_PATH_LEFT
             for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if "benchmarks/README" in line and not HTML_COMMENT_LINE.match(line)]
    assert not found, "\n".join(found)
    readme = README.read_text(encoding="utf-8")
    assert ARXIV_ID.findall(readme) and not ARXIV_ID.findall(re.sub(r"\[arXiv (\S+)\]\(https://arxiv\.org/abs/\1\)", "", readme))


SIGNED = ("largebatch.optim.LARS", "largebatch.optim.LAMB", "largebatch.nn.GroupSyncBatchNorm",
          "largebatch.diagnostics.GradientNoiseScale", "largebatch.data.contract.LoaderSpec",
          "largebatch.nn.destroy_process_groups", "largebatch.nn.convert_torch_sync_batchnorm")


def _missing_signatures(api: str, paths: tuple[str, ...]) -> list[str]:
    """The objects of ``paths`` whose signature is not on the built api page (``Name(`` under the
    object's heading), or lacks a parameter griffe (mkdocstrings' reader) finds in the source."""
    import griffe

    package = griffe.load("largebatch", search_paths=[str(ROOT)], allow_inspection=False)
    missing = []
    for path in paths:
        name = path.rsplit(".", 1)[1]
        section = api.partition(f'id="{path}"')[2].partition('<div class="doc doc-contents')[0]
        signature = re.search(rf'<span class="nf">{name}</span><span class="p">\((.*?)</code>', section, re.S)
        if not signature:
            missing.append(f"{name}(")
            continue
        text = re.sub(r"<[^>]+>", "", signature.group(1))
        params = [p.name for p in package[path.removeprefix("largebatch.")].parameters if p.name != "self"]
        missing += [f"{name}({p}" for p in params if not re.search(rf"\b{p}\b", text)]
    return missing


def test_the_committed_torch_inventory_is_the_scripts_table() -> None:
    """The API page links torch's objects through scripts/torch-objects.inv (mkdocs.yml): a local
    file, since mkdocstrings fails the strict build when it cannot download an inventory. It is
    what scripts/torch_inventory.py writes, and mkdocs.yml names no inventory by URL."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("torch_inventory", ROOT / "scripts" / "torch_inventory.py")
    inventory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(inventory)  # type: ignore[union-attr]
    assert (ROOT / "scripts" / "torch-objects.inv").read_bytes() == inventory.inventory()
    config = (ROOT / "mkdocs.yml").read_text()
    assert "url: file:scripts/torch-objects.inv" in config and f"base_url: {inventory.BASE_URL}" in config
    assert not re.search(r"^\s*-\s*(url:\s*)?https?://", config, re.M)


def test_the_site_builds_without_torch(tmp_path: Path) -> None:
    """``make docs`` sets up .venv-docs (scripts/setup_env.sh docs: the docs extra, hydra-core,
    omegaconf, the package without its dependencies; no torch): the build must import nothing
    of torch, torchvision, timm or DALI. Here the same build runs with those made unimportable."""
    blocked = "import sys; sys.modules.update(dict.fromkeys(['torch', 'torchvision', 'timm', 'nvidia.dali'])); "
    code = blocked + "from mkdocs.__main__ import cli; sys.argv[0] = 'mkdocs'; cli()"
    proc = subprocess.run([sys.executable, "-c", code, "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "site" / "api" / "index.html").is_file()
    setup_env = (ROOT / "scripts" / "setup_env.sh").read_text()
    assert "docs) make_docs_env" in setup_env and "scripts/setup_env.sh docs" in (ROOT / "Makefile").read_text()


WIDTH = 80
LIST_ITEM = re.compile(r"^(\s*)([-*+]|\d+\.)\s")


def _example_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the page's examples: fenced blocks with a language other than
    ``text`` (output listings, fenced plain or ``text``, print what a program prints and are
    exempt), and indented code blocks (4 spaces after a blank line that follows a paragraph,
    not a list)."""
    out, fence, prev_text, after_blank, in_indented = [], None, "", True, False
    for n, line in enumerate(text.splitlines(), 1):
        if fence is not None:
            if line.startswith("```"):
                fence = None
            elif fence not in ("", "text"):
                out.append((n, line))
            continue
        if line.startswith("```"):
            fence, in_indented = line[3:].strip(), False
            continue
        if not line.strip():
            after_blank = True
            continue
        if line.startswith("    ") and (in_indented or (after_blank and not LIST_ITEM.match(prev_text)
                                                         and not prev_text.startswith(" "))):
            in_indented = True
            out.append((n, line))
        else:
            in_indented, prev_text = False, line
        after_blank = False
    return out


def test_examples_fit_the_page() -> None:
    """Every example line of the site is at most 80 characters (long commands wrap with a
    backslash); output listings may be longer and wrap on the page (docs/stylesheets/extra.css)."""
    long = [f"{page.name}:{n}: {len(line)} characters" for page in PAGES
            for n, line in _example_lines(page.read_text(encoding="utf-8")) if len(line) > WIDTH]
    assert not long, "\n".join(long)
    assert _example_lines("text\n\n    x = 1\n\n```bash\nls\n```\n```text\nout\n```\n- a\n\n    b\n") == [
        (3, "    x = 1"), (6, "ls")]
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert "pre-wrap" in css and "stylesheets/extra.css" in (ROOT / "mkdocs.yml").read_text()


def test_a_name_in_a_table_breaks_at_its_dots_only() -> None:
    """A code span in a table cell breaks after ``.``, ``/`` and ``_`` (the hook's ``<wbr>``)
    and nowhere else (the stylesheet), so a config key never shows as ``global_bat`` /
    ``ch_size`` and a table of long keys fits the page instead of scrolling sideways."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("mkdocs_table_code", ROOT / "scripts" / "mkdocs_table_code.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)  # type: ignore[union-attr]
    html = ('<p>a.b</p><td><code>optimizer.lr</code> 23.74% ± 0.09, <code>0.6666666666666666</code> '
            'f(1) Average(decay, <a href="x/y.html" title="a.b">largebatch.optim</a></td>')
    assert hook.add_breaks(html) == (
        '<p>a.b</p><td><code>optimizer.<wbr>lr</code> 23.74% ± 0.09, <code>0.<wbr>66666666<wbr>66666666</code> '
        'f(1) Average(<wbr>decay, <a href="x/y.html" title="a.b">largebatch.<wbr>optim</a></td>')
    command = "<td><code>.venv/bin/largebatch-train debug=smoke data.root=/data/imagenet</code></td>"
    assert hook.add_breaks(command) == command  # a command breaks at its spaces only
    css = (ROOT / "docs" / "stylesheets" / "extra.css").read_text()
    assert re.search(r"\.md-typeset td code,\s*\.md-typeset th code \{[^}]*word-break: keep-all", css)
    header = "<th><code>largebatch.errors</code></th>"
    assert hook.add_breaks(header) == "<th><code>largebatch.<wbr>errors</code></th>"
    assert "scripts/mkdocs_table_code.py" in (ROOT / "mkdocs.yml").read_text()


def test_a_role_resolves_to_the_one_documented_object_it_names() -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("mkdocs_roles", ROOT / "scripts" / "mkdocs_roles.py")
    roles = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(roles)  # type: ignore[union-attr]
    documented = {"largebatch.optim.LARS", "largebatch.optim.LARS.step", "largebatch.optim.LAMB.step",
                  "largebatch.optim.param_groups.param_groups", "largebatch.diagnostics.GradientNoiseScale.update"}
    assert roles.resolve("largebatch.optim.LARS", documented) == "largebatch.optim.LARS"
    assert roles.resolve("update", documented) == "largebatch.diagnostics.GradientNoiseScale.update"
    assert roles.resolve("step", documented) == "step"  # two objects end with it: not guessed
    assert roles.resolve("largebatch.optim.param_groups", documented) == "largebatch.optim.param_groups.param_groups"
    html = roles.on_page_content('<p>see :class:<code>~largebatch.optim.LARS</code> and :func:<code>nothing</code>::</p>'
                                 '<h2 id="largebatch.optim.LARS">')
    assert ('<autoref identifier="largebatch.optim.LARS" optional><code>LARS</code></autoref>' in html
            and '<autoref identifier="nothing" optional><code>nothing</code></autoref>:</p>' in html), html


def test_every_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in PAGES:
        assert re.search(rf":\s*{re.escape(page.relative_to(ROOT / 'docs').as_posix())}\s*$", nav, re.M), page


def test_readme_links_into_docs_resolve() -> None:
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    assert links
    for link in links:
        assert (ROOT / link).is_file(), link


# Words that tell how and when the work on the project was organised rather than what the project
# is and does; the user pages (README, docs/, benchmarks/README.md) must not use them. Each entry,
# with why its exceptions are legitimate:
PROCESS_WORDS = {
    # a working session of whoever wrote the code; an "ssh session" and a process that starts
    # "a session of its own" (setsid) are what the project does, not how it was written
    "session": re.compile(r"(?<!ssh )\bsessions?\b(?! of its own)", re.I),
    # a loan of a machine for a while ("lease", "lent"); no legitimate use on the pages
    "lease": re.compile(r"\bleases?\b", re.I),
    "lent": re.compile(r"\blent\b", re.I),
    # the project's own issue tracker; an upstream project's issue, named with the project
    # ("pytorch issue 169545"), is a reference a user can follow
    "issue number": re.compile(r"(?<!pytorch )\bissues? \d+", re.I),
    "#number": re.compile(r"(?<![\w&/])#\d{2,}\b"),
    # "the issue asks for ...": a work item of ours, not a fact about the project
    "the issue": re.compile(r"\b(?:the|this|that) issue\b", re.I),
    # the tools the work was done with, not the project's own (largebatch/tools/ is the project's)
    "device tool": re.compile(r"\bdevice tools?\b", re.I),
    "helper": re.compile(r"\bhelpers?\b", re.I),
    "sandbox": re.compile(r"\bsandbox", re.I),
    # a file carried to a machine, a machine kept warm between calls: the loan's mechanics
    "carry": re.compile(r"\bcarry \[", re.I),
    "device time": re.compile(r"\bdevice time\b", re.I),
    # the loan seen from the results ("One call: one H200", "in a later call", "the visit", "the
    # carried wheels", "the machine was available for about 7 minutes", "this CPU")
    "call": re.compile(r"\b(?:a later|one device|in one|its own) call\b|\bthe call's\b|^#+ One call\b", re.I),
    "visit": re.compile(r"\b(?:the|a|15-minute) visit\b|\bcarried (?:wheels|in)\b|\bwas available for about\b", re.I),
    "this machine": re.compile(r"\bthis (?:CPU|machine)\b", re.I),
}


def test_the_process_words_catch_the_benchmarks_readme_as_it_was() -> None:
    for line in ["#### One call: one H200 SXM, 2026-11-28", "| 8 (16 of 16 in a later call with a longer cap) |",
                 "The visit: a 180 s start allowance + the 540 s call", "| install | 35 | the carried wheels and the project |",
                 "The machine was available for about", "## channels_last on this CPU (`benchmarks/cpu_layout.py`)"]:
        assert any(p.search(line) for p in PROCESS_WORDS.values()), line


def test_user_pages_speak_of_the_project_not_of_how_it_was_made() -> None:
    found = []
    for path in [README, *PAGES, ROOT / "benchmarks" / "README.md"]:
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{path.relative_to(ROOT)}:{n}: {name}: {line.strip()}"
                      for name, pattern in PROCESS_WORDS.items() if pattern.search(line)]
    assert not found, "\n".join(found)


# How the project was built and measured rather than what a user gets: the docs pages and the
# README say what the project does; the benchmarks README, the record of each measurement, may
# name its machine and its day. Each entry with what it caught:
BUILD_STORY = {
    # the budget of the machine the work was done on ("in two runs of under 10 minutes each",
    # "in one call of at most 9 minutes"), not a property of the script
    "run budget": re.compile(r"\bin (?:a single|one|two|three|\d+) (?:commands?|calls?|runs?|visits?) of (?:at most|under)\b",
                             re.I),
    # the machine the work was done on ("a GPU machine without internet access", "needs no network
    # (the wheels it installs are prepared beforehand)")
    "offline machine": re.compile(r"\bwithout (?:internet|network) access\b|\bneeds no network\b|\bprepared beforehand\b",
                                  re.I),
    # "this CPU", "on an otherwise idle 2-core AMD EPYC", "seeds 1 and 2 on the same machine",
    # "that CPU has no bf16", "within that machine's noise", "on a machine of your own"
    "our machine": re.compile(r"\bthis project's\b|\bthis (?:[\w-]+ )?(?:CPU|machine)\b|\botherwise idle\b"
                              r"|\b(?:that|the same) (?:CPU|machine)\b|\bthat machine's\b|\ba machine of your own\b", re.I),
    # how a number was measured rather than what it is ("not among these measurements", "peak at
    # 88.8-90.6% over five runs", "from pip's cache", "seconds into each (requeued) run")
    "measurement story": re.compile(r"\bnot among these measurements\b|\bover (?:five|\d+) runs\b|\bfrom pip's cache\b"
                                    r"|\bseconds into each\b|\bthe test checks\b|\bit was the (?:faster|slower)\b", re.I),
    "last checked": re.compile(r"\bwhere this (?:README|page) was\b|\blast checked\b", re.I),
    # what the code did before a change: the changelog's business, not the page's
    "before": re.compile(r"\((?:before this|before),|\(it was \d|\bnow reports\b|\bthe former (?:recipe|version|code)\b"
                         r"|\blanded\b|\btuning pass\b|\bhad taken\b|\bas before\)|\bfor torch's own teardown\b", re.I),
    "the test suite": re.compile(r"\bthe test suite\b|\bdoes exactly that\b", re.I),
}
# pages that still name test files in their text: to be rewritten (issue of the site, item 4);
# docs/layout.md's `tests/` row is the package layout, which a user reads legitimately
TEST_PATHS_LEFT: set[str] = set()
# what is untested is said once, in docs/index.md's Limitations section, not page by page
UNTESTED = re.compile(r"\buntested\b|\bnever (?:been )?run\b|\bhas never\b", re.I)
HTML_COMMENT_LINE = re.compile(r"^\s*<!--.*-->\s*$")


def build_story(rel: str, text: str) -> list[str]:
    """Lines of a user page (``rel``, its path from the root) that tell how the project was built or
    tested: the BUILD_STORY patterns, and a path under tests/ outside the page's "How this is tested"
    section (an HTML comment, a doc test's skip reason, is not shown and may name one)."""
    found, section, fence = [], "", False
    lines = text.splitlines()
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        if not fence and line.startswith("#"):
            section = line
        if HTML_COMMENT_LINE.match(line):
            continue
        # a phrase may break across two lines: search this line and the next, report where it starts
        joined = line + " " + (lines[n].strip() if n < len(lines) else "")
        found += [f"{rel}:{n}: {name}: {line.strip()}" for name, pattern in BUILD_STORY.items()
                  if (m := pattern.search(joined)) and m.start() < len(line)]
        if UNTESTED.search(joined[:len(line) + 20]) and "limitations" not in section.lower():
            found.append(f"{rel}:{n}: untested, outside the home page's Limitations: {line.strip()}")
        if ("tests/" in line and "how this is tested" not in section.lower() and rel not in TEST_PATHS_LEFT
                and rel != "docs/layout.md"):
            found.append(f"{rel}:{n}: a test file outside \"How this is tested\": {line.strip()}")
    return found


def test_user_pages_say_what_the_project_does_not_how_it_was_built() -> None:
    found = [hit for path in [README, *PAGES]
             for hit in build_story(path.relative_to(ROOT).as_posix(), path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


def test_the_build_story_check_catches_what_it_names() -> None:
    for line in ["`gpu_campaign.py` runs on a GPU machine without internet access, in two runs of under 10 minutes",
                 "(`tests/test_experiments.py` does exactly that for every preset.)",
                 "measured on this project's 2-core AMD EPYC machine",
                 "the run resumes (before this, the job failed with 143 or 1)",
                 "2.6 s for 2 ranks here, where torch's own teardown had taken ~22 s",
                 "the test suite runs `mkdocs build --strict`",
                 # what these patterns were added for, each as the page had it
                 "`gpu_campaign.py` measures the GPU path on one GPU in a single command of at most 9 minutes",
                 "that needs no network (the wheels it installs are prepared beforehand), headline numbers first:",
                 "on a 2-core AMD EPYC CPU (fp32); On an otherwise idle 2-core AMD EPYC CPU (fp32, as `auto` picks there)",
                 "Seeds 1 and 2 on the same machine: best 93.0% and 92.5%, training wall time 137.6 s and",
                 "bf16 rows give accuracy only (that CPU has no bf16 arithmetic, so they are emulated); on a CPU",
                 "with AVX-512 BF16 or AMX, `auto` picks bf16, which should be faster still, but its time is not among these measurements.",
                 "training images, 16 epochs) peak at 88.8-90.6% over five runs, because such crops often cut",
                 "needed GiB, exit code 74. Setting up `.venv` took about 2 minutes from pip's cache.",
                 "`--time=1 --signal=B:TERM@30` at the first check, seconds into each (requeued) run.",
                 "and exits 75. Multi-node and GPU jobs are untested (see [Limitations](index.md#limitations)).",
                 "and run where docker or podman is available. To run the SLURM tests on a machine of your own",
                 "with loader workers under `tini`, against ~22 s for torch's own teardown).",
                 "torchrun's failure box (with restarts left, torchrun restarts the group as before). A rank",
                 "`torchrun --standalone --nproc_per_node=2 --max-restarts=2`. The test checks that the run",
                 "micro-batches or ranks, the cost was within that machine's noise: see the benchmarks README).",
                 "runs a CPU-only pipeline; on a 2-core CPU it was the faster CPU path"]:
        assert build_story("docs/x.md", line), line
    assert build_story("docs/x.md", "on a GPU machine without internet\naccess")  # across a line break
    # a test path in the page's "How this is tested" section, or in a skip comment, is fine
    assert not build_story("docs/x.md", "## How this is tested\n\n`tests/test_slurm.py` submits jobs")
    assert not build_story("docs/x.md", '<!-- skip: next "tests/test_slurm.py runs it" -->\nRun it on a CPU.')
    assert build_story("docs/x.md", "## Usage\n\n`tests/test_slurm.py` submits jobs")
    # "untested" is said in the Limitations section only
    assert not build_story("docs/index.md", "## Limitations\n\n- **More than one node has never been run.**")
    assert build_story("docs/x.md", "## Usage\n\nMulti-node jobs are untested.")


def _nav_pages() -> list[tuple[str, str]]:
    """(section, page) of mkdocs.yml's nav, in order."""
    import yaml

    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))["nav"]
    return [(section, page) for group in nav for section, entries in group.items()
            for entry in entries for page in entry.values()]


def _table_pages(path: Path, prefix: str) -> list[tuple[str, str]]:
    """(section, page) of the page table (| section | page | what it covers |) of README or docs/index.md."""
    rows = re.findall(rf"^\| (\w+) \| \[[^\]]+\]\({re.escape(prefix)}([\w-]+\.md)\) \|", path.read_text(encoding="utf-8"), re.M)
    assert rows, path
    return rows


def test_the_pages_are_in_one_order_in_nav_home_and_readme() -> None:
    nav = [row for row in _nav_pages() if row[1] != "index.md"]
    assert {section for section, _ in nav} == {"Start", "Train", "Scale", "Reuse", "Reference", "Results"}
    assert _table_pages(ROOT / "docs" / "index.md", "") == nav
    assert _table_pages(README, "docs/") == nav


def test_layout_lists_every_module_of_the_package() -> None:
    layout = (ROOT / "docs" / "layout.md").read_text(encoding="utf-8")
    package = ROOT / "largebatch"
    names = [p.name + "/" if p.is_dir() else p.name for p in sorted(package.iterdir())
             if (p.is_dir() and (p / "__init__.py").is_file()) or (p.suffix == ".py")]
    assert names
    missing = [n for n in names if not re.search(rf"^\| `largebatch/{re.escape(n)}` \|", layout, re.M)]
    assert not missing, f"docs/layout.md does not list {missing}"


def test_the_benchmarks_page_names_every_script() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    missing = [p.name for p in sorted((ROOT / "benchmarks").glob("*.py")) if f"`{p.name}`" not in page]
    assert not missing, f"docs/benchmarks.md does not name {missing}"


MAX_WORDS = 120
HTML_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")


def _text_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of the prose blocks of a page: paragraphs, each list item on its own,
    an admonition's body. Fenced and indented code blocks, tables, headings and HTML comments
    are not prose and end the block before them."""
    code = {n for n, _ in _example_lines(text)}
    out: list[tuple[int, str]] = []
    cur: list[str] = []
    start, fence = 0, False

    def flush() -> None:
        if cur:
            out.append((start, " ".join(cur)))
            cur.clear()

    for n, line in enumerate(text.splitlines(), 1):
        s = line.strip()
        if s.startswith("```"):
            flush()
            fence = not fence
            continue
        if fence or n in code or not s or s.startswith(("|", "#", "!!!", "???")) or HTML_COMMENT.match(line):
            flush()
            continue
        if LIST_ITEM.match(line):
            flush()
            s = LIST_ITEM.sub("", line).strip()
        if not cur:
            start = n
        cur.append(s)
    flush()
    return out


def _words(block: str) -> int:
    """Words as a reader sees them: a link counts by its text, not its address."""
    return len(re.sub(r"\]\([^)]*\)", "]", block).split())


def test_no_wall_of_text() -> None:
    """No paragraph or list item of the site or the README runs over 120 words: a longer one
    is split into paragraphs, a list or a table."""
    long = [f"{path.relative_to(ROOT)}:{n}: {_words(block)} words" for path in [README, *PAGES]
            for n, block in _text_blocks(path.read_text(encoding="utf-8")) if _words(block) > MAX_WORDS]
    assert not long, "\n".join(long)
    para = " ".join(["word"] * 121)
    item = " ".join(["word"] * 70)
    sample = (f"intro\n\n{para[:300]}\n{para[300:]}\n\n```bash\n{para}\n```\n\n| {para} |\n\n"
              f"- {item}\n  {item}\n- {item}\n- [{item}]({'x/' * 60})\n\n!!! note\n    {item}\n\n<!-- {para} -->\n")
    assert [(n, _words(b)) for n, b in _text_blocks(sample)] == [(1, 1), (3, 121), (12, 140), (14, 70), (15, 70), (18, 70)]


MAX_PAGE_WORDS = 2500


def _open_text(text: str) -> str:
    """A page as it opens: the bodies of its collapsed notes (``??? note``, detail few readers
    need) blanked, line numbers kept."""
    out, folded = [], False
    for line in text.splitlines():
        if folded and line.strip() and not line.startswith("    "):
            folded = False
        out.append("" if folded else line)
        if line.startswith("??? "):
            folded = True
    return "\n".join(out)


def _page_words(text: str) -> int:
    """Words of prose a reader meets on a page as it opens: paragraphs and list items, not its
    tables, code, headings or collapsed notes."""
    return sum(_words(block) for _, block in _text_blocks(_open_text(text)))


def test_no_page_is_a_wall_of_text() -> None:
    """No page opens on more than 2,500 words of prose: a page with two topics is two pages, and
    detail few readers need (the sources of a preset's values, the mechanics under a feature)
    goes into a collapsed note or a table. The check fails on the recipes page before it was
    split (2,859 words: the presets, the time to target, the batch schedule, the EMA and the
    noise scale on one page)."""
    long = [f"{path.relative_to(ROOT)}: {_page_words(path.read_text(encoding='utf-8'))} words"
            for path in PAGES if _page_words(path.read_text(encoding="utf-8")) > MAX_PAGE_WORDS]
    assert not long, "\n".join(long)
    old = subprocess.run(["git", "show", "c7e730d:docs/recipes.md"], cwd=ROOT, capture_output=True, text=True)
    if old.returncode == 0:  # a checkout with its history: the page as it was fails
        assert _page_words(old.stdout) == 2859
    assert _page_words("\n\n".join([" ".join(["word"] * 100)] * 26)) > MAX_PAGE_WORDS
    note = " ".join(["word"] * 50)
    sample = f"intro words\n\n??? note \"Title\"\n    {note}\n\n    {note}\n\nafter the note\n\n| {note} |\n"
    assert _page_words(sample) == 5


def test_config_keys_are_tabled_once() -> None:
    """A key's default and allowed values are written on the configuration reference only (from
    the schema); a page that lists them by hand drifts from it, so it links there instead."""
    tables = [f"{path.relative_to(ROOT)}:{n}" for path in PAGES if path.name != "config-reference.md"
              for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
              if re.match(r"\|\s*key\s*\|\s*default\s*\|", line)]
    assert not tables, tables
    techniques = (ROOT / "docs" / "batch-ema-noise.md").read_text(encoding="utf-8")
    assert "config-reference.md#ema" in techniques and "config-reference.md#diagnostics" in techniques


def _indented_code_blocks(text: str) -> list[int]:
    """Lines that open an indented (4-space) code block: after a blank line, outside a fence and
    outside a list item or an admonition (whose bodies are indented)."""
    found: list[int] = []
    fence, container, after_blank = "", False, True
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence:
            fence = "" if stripped.startswith(fence) else fence
            continue
        opening = re.match(r"\s*(```+|~~~+)", line)
        if opening:
            fence = opening.group(1)
            continue
        if not stripped:
            after_blank = True
            continue
        indent = len(line) - len(stripped)
        if indent == 0:
            container = bool(re.match(r"([-*+]|\d+[.)])\s|!!!|\?\?\?", line))
        elif indent >= 4 and after_blank and not container:
            found.append(n)
        after_blank = False
    return found


def test_no_indented_code_block() -> None:
    """An indented block is code Sybil never runs and never marks as output: a command goes in a
    ```bash fence (run, or skipped with its reason), a listing in a ```text one."""
    found = [f"{path.relative_to(ROOT)}:{n}" for path in [README, *PAGES]
             for n in _indented_code_blocks(path.read_text(encoding="utf-8"))]
    assert not found, found
    sample = ("text\n\n    code\n\n- item\n\n    more of the item\n\n!!! note\n    body\n\n"
              "```text\n\n    in a fence\n```\n\npara\n    continued\n\n    code again\n")
    assert _indented_code_blocks(sample) == [3, 20]


def test_the_troubleshooting_page_has_every_exit_code() -> None:
    """The troubleshooting page's exit-code table is errors.py's constants, each by its name and
    value (so the two cannot drift), plus the two signal codes a run cannot write itself; the
    version it shows and the changelog's newest heading are the package's."""
    import largebatch
    from largebatch import errors

    page = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    table = page.partition("## Exit codes")[2].partition("\n## ")[0]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", table, re.M)
    named = {int(code): name.strip().strip("`") for code, name in rows if name.strip().startswith("`")}
    constants = {getattr(errors, name): name for name in errors.__all__ if name.startswith("EXIT_")}
    assert named == constants
    signals = {int(code): name.strip() for code, name in rows if int(code) not in named}
    assert signals == {137: "(128 + SIGKILL)", 143: "(128 + SIGTERM)"}
    versions = set(re.findall(r"prints `largebatch ([\d.]+\w*)`", page))
    assert versions == {largebatch.__version__}
    changelog = (ROOT / "docs" / "changelog.md").read_text(encoding="utf-8")
    assert re.search(r"^## (\S+)", changelog, re.M).group(1) == largebatch.__version__  # type: ignore[union-attr]


def test_the_readme_and_the_help_list_every_exit_code() -> None:
    """Issue 88 item 2: README's exit codes and ``largebatch-train --help`` omitted 4 (and --help
    74): each lists every code of errors.py, in order."""
    import subprocess
    import sys

    from largebatch import errors

    codes = sorted(getattr(errors, name) for name in errors.__all__ if name.startswith("EXIT_"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    paragraph = readme[readme.index("Exit codes of every command"):].split("\n\n")[0]
    helped = subprocess.run([sys.executable, "-m", "largebatch.train", "--help"], capture_output=True, text=True,
                            timeout=120).stdout
    line = " ".join(helped[helped.index("Exit codes:"):].split("With -m")[0].split())
    for text in (" ".join(paragraph.split()), line):
        listed = [int(code) for code in re.findall(r"(?:^|[;,] )(\d+) ", text.split(":", 1)[1].strip())]
        assert listed == codes, (listed, text)
