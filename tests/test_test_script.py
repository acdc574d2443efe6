"""scripts/test.sh, the README's test command (issue 70): .venv-xla is set up while the main
environment's tests run, after .venv is in and only where the disk has room for both (else after
the suite), and the XLA tests start only once it is ready; a failed set-up ends the run with its
output. The script runs as it is, in a copy of the tree whose set-up scripts and
pytest are stand-ins that write down when they start and end (the real ones take minutes; CI
runs them)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _tree(tmp_path: Path, xla_setup_exit: int, room_beside_suite: bool = True) -> Path:
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    shutil.copy(ROOT / "scripts" / "test.sh", tree / "scripts" / "test.sh")
    events = tree / "events"
    # main's set-up returns at once, xla's takes 2 s (it runs beside the main tests, which take 1 s);
    # without room beside the suite, xla's exits 74 (setup_env.sh's "no space") where asked for
    # headroom
    _executable(tree / "scripts" / "setup_env.sh", f"""#!/usr/bin/env bash
if [[ $1 == xla && ! -e {tree}/xla-ready ]]; then
  echo "setup xla start headroom=${{HEADROOM_GIB:-0}}" >> {events}
  if [[ -n ${{HEADROOM_GIB:-}} && {int(room_beside_suite)} == 0 ]]; then echo "no room beside" >&2; exit 74; fi
  sleep 2; echo "pip says why" ; echo "setup xla end" >> {events}
  [[ {xla_setup_exit} == 0 ]] && touch {tree}/xla-ready
  exit {xla_setup_exit}
fi
echo "setup $1" >> {events}
""")
    _executable(tree / "scripts" / "test_xla.sh", f"""#!/usr/bin/env bash
[[ -e {tree}/xla-ready ]] || {{ echo "xla tests without their venv" >> {events}; exit 1; }}
echo "xla tests threads=$OMP_NUM_THREADS" >> {events}
""")
    _executable(tree / ".venv" / "bin" / "python", f"""#!/usr/bin/env bash
echo "main tests start $* threads=$OMP_NUM_THREADS" >> {events}; sleep 1; echo "main tests end" >> {events}
""")
    return tree


def _run(tree: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ["PATH"], "HOME": str(tree), **extra}
    return subprocess.run(["bash", str(tree / "scripts" / "test.sh")], cwd=tree, env=env, capture_output=True,
                          text=True, timeout=60)


def test_the_xla_venv_is_set_up_while_the_main_tests_run(tmp_path: Path) -> None:
    tree = _tree(tmp_path, xla_setup_exit=0)
    proc = _run(tree)
    assert proc.returncode == 0, proc.stderr
    events = (tree / "events").read_text().splitlines()
    main_start = next(i for i, e in enumerate(events) if e.startswith("main tests start"))
    xla_start = events.index("setup xla start headroom=4")  # room left for the suite's files
    assert events.index("setup main") < xla_start < events.index("main tests end")  # after .venv, beside the tests
    xla = next(i for i, e in enumerate(events) if e.startswith("xla tests"))
    assert events.index("setup xla end") < xla
    assert "-n" in events[main_start].split() and "--dist loadgroup" in events[main_start]  # the whole suite: xdist


def test_a_failed_xla_setup_ends_the_run_with_its_output(tmp_path: Path) -> None:
    tree = _tree(tmp_path, xla_setup_exit=1)
    proc = _run(tree)
    assert proc.returncode == 1
    assert "pip says why" in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith(
        "test.sh: setting up .venv-xla failed"), proc.stderr
    assert "xla tests" not in (tree / "events").read_text()


def test_without_room_beside_the_suite_the_xla_venv_is_set_up_after_it(tmp_path: Path) -> None:
    """Two set-ups side by side each saw the same free space and filled the disk between them
    (CI: pip's ENOSPC in .venv-xla). Where .venv-xla and the suite's files do not both fit, its
    set-up says so at once (74) and runs after the suite, whose files are gone by then."""
    tree = _tree(tmp_path, xla_setup_exit=0, room_beside_suite=False)
    proc = _run(tree)
    assert proc.returncode == 0, proc.stderr
    events = (tree / "events").read_text().splitlines()
    assert events.index("main tests end") < events.index("setup xla start headroom=0") < events.index(
        "setup xla end") < next(i for i, e in enumerate(events) if e.startswith("xla tests"))
    assert "no room beside" in proc.stderr and "setting up .venv-xla now, after the main suite" in proc.stderr


def test_each_worker_gets_its_share_of_the_cores_as_threads(tmp_path: Path) -> None:
    """More torch threads than cores spin in OpenMP's barriers: a worker gets cores / workers
    (at least 1); the XLA tests, one process, keep 2; a user's OMP_NUM_THREADS wins."""
    cores = len(os.sched_getaffinity(0))  # what nproc counts
    for workers, extra, threads in ((1, {}, cores), (cores, {}, 1), (cores * 2, {}, 1),
                                    (cores, {"OMP_NUM_THREADS": "3"}, 3)):
        tree = _tree(tmp_path / f"{workers}-{len(extra)}", xla_setup_exit=0)
        proc = _run(tree, LARGEBATCH_TEST_WORKERS=str(workers), **extra)
        assert proc.returncode == 0, proc.stderr
        events = (tree / "events").read_text().splitlines()
        main = next(e for e in events if e.startswith("main tests start"))
        assert main.endswith(f"threads={threads}") and f"-n {workers}" in main, (workers, extra, main)
        xla = next(e for e in events if e.startswith("xla tests"))
        assert xla == f"xla tests threads={extra.get('OMP_NUM_THREADS', 2)}", (workers, extra, xla)


def test_xdist_groups_keep_their_tests_on_one_worker(tmp_path: Path) -> None:
    """``--dist loadgroup`` sends an ``xdist_group``'s tests to one worker: tests/test_slurm.py's
    jobs, and the fixtures of the modules grouped to start their ranks once, count on it.
    pytest 9.2 with pytest-xdist 3.8 silently drops every group (xdist writes the group into a
    node id field pytest 9.2 no longer reads: pytest-dev/pytest-xdist#1386), hence the pins in
    constraints/main.txt; this fails on a pair that drops them."""
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text("import pytest\n\n\n@pytest.mark.xdist_group('one')\n"
                                     "@pytest.mark.parametrize('i', range(4))\ndef test_grouped(i):\n    pass\n\n\n"
                                     "@pytest.mark.parametrize('i', range(4))\ndef test_free(i):\n    pass\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-n", "2", "--dist", "loadgroup", "-p",
                           "no:cacheprovider", str(tmp_path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    workers = {line.split()[0] for line in proc.stdout.splitlines() if "test_grouped" in line and "PASSED" in line}
    ran = [line for line in proc.stdout.splitlines() if "test_grouped" in line and "PASSED" in line]
    assert len(ran) == 8 and len(workers) == 1, "\n".join(ran)
