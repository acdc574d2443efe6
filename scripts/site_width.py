"""Does every table of the documentation site fit its column at a given window width?

Builds the site (``mkdocs build``) into a scratch folder, opens each page in headless Chromium
at ``--width`` (default 1280 px) and prints, per page, the tables wider than the content column
(by how many pixels), and whether the page itself scrolls sideways. Exit 1 if any does.

    .venv/bin/python scripts/site_width.py            # needs Debian's chromium
    .venv/bin/python scripts/site_width.py --width 1024
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MEASURE = """<script>window.addEventListener('load', () => {
  const out = [];
  document.querySelectorAll('.md-typeset table').forEach((t, i) => {
    const box = t.closest('.md-typeset__scrollwrap') || t.parentElement;
    const over = t.scrollWidth - box.clientWidth;
    if (over > 1) out.push({table: i + 1, over_px: over, first_header: (t.querySelector('th') || {}).innerText});
  });
  const c = document.querySelector('.md-content');
  if (c && c.scrollWidth > c.clientWidth + 1) out.push({page_over_px: c.scrollWidth - c.clientWidth});
  const d = document.createElement('pre'); d.id = 'site-width'; d.textContent = JSON.stringify(out);
  document.body.appendChild(d);
});</script>"""
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--virtual-time-budget=3000"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--width", type=int, default=1280, help="window width in px (default 1280)")
    args = p.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        print("site_width: no chromium on PATH: apt-get install chromium", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "--site-dir", str(site)], cwd=ROOT, check=True,
                       env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
        wide = 0
        for page in [site / "index.html", *sorted(site.glob("*/index.html"))]:
            page.write_text(page.read_text(encoding="utf-8").replace("</body>", MEASURE + "</body>"), encoding="utf-8")
            dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--window-size={args.width},900", "--dump-dom",
                                  page.as_uri()], capture_output=True, text=True, timeout=120).stdout
            found = re.search(r'<pre id="site-width">(.*?)</pre>', dom, re.S)
            name = page.parent.name if page.parent != site else "index"
            if found is None:
                print(f"{name}: not measured (the page did not load)")
                wide += 1
                continue
            over = json.loads(found.group(1))
            wide += bool(over)
            print(f"{name}: " + ("fits" if not over else json.dumps(over)))
    print(f"{wide} page(s) wider than {args.width} px allows")
    return 1 if wide else 0


if __name__ == "__main__":
    sys.exit(main())
