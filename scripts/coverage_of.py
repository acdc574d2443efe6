"""Line coverage of ``largebatch/`` by some tests, subprocesses included; and what a change lost.

The suite's speed-ups must not test less: a test that moves to a cheaper form keeps every line
of ``largebatch/`` it ran. Most of our tests run the package in other processes (the CLI,
torchrun's ranks, SLURM jobs), so this measures with coverage.py's ``patch = subprocess``: every
Python process the tests start in this venv is measured too (its ``a1_coverage.pth`` starts
coverage where ``COVERAGE_PROCESS_CONFIG`` is set), forked ones too (and those ending in ``os._exit``), and a
process stopped by SIGTERM still saves.

    scripts/coverage_of.py run OUT.json [pytest arguments]   # e.g. tests/test_resume.py
    scripts/coverage_of.py lost BEFORE.json AFTER.json        # lines BEFORE ran and AFTER did not

``run`` writes the covered lines of each file of ``largebatch/`` as JSON and prints the total;
``lost`` prints each line the first covered and the second did not, and exits 1 if there is
any. Measure a test file before and after its change (``git stash`` is not needed: check out the
old test file into a scratch copy, or measure before editing). Exit codes: 0 ok, 1 lines lost,
2 bad arguments.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "largebatch"

# coverage.py's configuration: measure largebatch/ in this process and every Python process
# started from it (patch = subprocess) or forked (fork: tests/distributed's forkserver ranks, which
# end in os._exit, so _exit saves first), each process writing its own data file (parallel).
_RC = """\
[run]
source = {package}
parallel = true
data_file = {data}
patch = subprocess, fork, _exit
sigterm = true
"""


def run(out: Path, pytest_args: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="lb-coverage-") as tmp:
        data = Path(tmp) / ".coverage"
        rc_file = Path(tmp) / "coveragerc"
        rc_file.write_text(_RC.format(package=PACKAGE, data=data))
        env = dict(os.environ, COVERAGE_RCFILE=str(rc_file))
        code = subprocess.call([sys.executable, "-m", "coverage", "run", f"--rcfile={rc_file}", "-m", "pytest",
                                "-q", "-p", "no:cacheprovider", *pytest_args], cwd=ROOT, env=env)
        import coverage  # the dev extra installs it

        subprocess.check_call([sys.executable, "-m", "coverage", "combine", f"--rcfile={rc_file}", "-q"],
                              cwd=ROOT, env=env)
        measured = coverage.Coverage(data_file=str(data), config_file=str(rc_file))
        measured.load()
        covered: dict[str, list[int]] = {}
        statements = 0
        for name in sorted(measured.get_data().measured_files()):
            path = Path(name)
            if PACKAGE not in path.parents:
                continue
            _, lines, _, _, _ = measured.analysis2(name)
            covered[str(path.relative_to(ROOT))] = sorted(set(measured.get_data().lines(name) or []) & set(lines))
        for path in PACKAGE.rglob("*.py"):
            statements += len(measured.analysis2(str(path))[1])
        hit = sum(len(v) for v in covered.values())
        out.write_text(json.dumps({"pytest": pytest_args, "exit": code, "covered": covered}, indent=0))
        print(f"coverage: {hit} of {statements} statements of largebatch/ ran ({100 * hit / statements:.1f}%); "
              f"pytest exit {code}; lines in {out}")
        return 0 if code == 0 else code


def lost(before: Path, after: Path) -> int:
    was = json.loads(before.read_text())["covered"]
    now = json.loads(after.read_text())["covered"]
    missing = {f: sorted(set(lines) - set(now.get(f, []))) for f, lines in was.items()}
    missing = {f: lines for f, lines in missing.items() if lines}
    gained = sum(len(set(lines) - set(was.get(f, []))) for f, lines in now.items())
    for f, lines in missing.items():
        print(f"{f}: {len(lines)} lines no longer run: {lines}")
    total = sum(len(v) for v in missing.values())
    print(f"coverage: {total} lines lost, {gained} gained")
    return 1 if total else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "run":
        return run(Path(argv[1]), argv[2:])
    if len(argv) == 3 and argv[0] == "lost":
        return lost(Path(argv[1]), Path(argv[2]))
    print("usage: scripts/coverage_of.py run OUT.json [pytest arguments] | lost BEFORE.json AFTER.json",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
