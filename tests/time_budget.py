"""The suite's time budget: a whole run fails when its tests took longer than ``tests/time_budget.json`` allows.

The suite is the project's safety net, and its cost grows with every feature; this check makes
a feature pay for its tests' time up front. It sums every test's setup, call and teardown
durations (pytest's own, as ``--durations`` prints them) and compares the sum with the budget of the environment it runs in (``main``:
``.venv``; ``xla``: ``.venv-xla``, which runs ``tests/xla``). The budget carries headroom for a
noisy 2-core machine; over it, the run's exit code is 1 and one line names the total, the
budget and the slowest tests.

It applies where ``scripts/test.sh`` asks for it (``LARGEBATCH_TIME_BUDGET=1``, set when the
whole suite runs): a subset (``-k``, one file) is never held to the whole suite's budget.
``LARGEBATCH_TIME_BUDGET_FILE`` names another budget file (the guard's own test).
``LARGEBATCH_TEST_DURATIONS=DIR`` writes every test's seconds to ``DIR/durations-<env>.json``
(a profile of the suite, grouped as you like; any run, whole or not).

Under pytest-xdist (``scripts/test.sh`` runs the suite on several workers) the controller gets
every worker's reports: the sum is the same tests' seconds, each measured where it ran.
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

BUDGET_FILE = Path(__file__).resolve().parent / "time_budget.json"
ENV = "LARGEBATCH_TIME_BUDGET"

_durations: dict[str, float] = {}


def environment() -> str:
    """Which budget applies: ``xla`` in the torch-xla environment, else ``main``."""
    return "xla" if importlib.util.find_spec("torch_xla") is not None else "main"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def over_budget(durations: dict[str, float], budget_s: float, shown: int = 5) -> str | None:
    """The line to print when the durations sum to more than ``budget_s``, else None."""
    total = sum(durations.values())
    if total <= budget_s:
        return None
    slowest = sorted(durations.items(), key=lambda kv: -kv[1])[:shown]
    names = ", ".join(f"{node} {seconds:.0f} s" for node, seconds in slowest)
    return (f"the tests took {total:.0f} s in all, over this suite's budget of {budget_s:.0f} s "
            f"(tests/{BUDGET_FILE.name}): make the new tests cheaper (a shared trained run, a smaller model or data "
            f"set, in-process instead of a subprocess), then raise the budget only for what must cost more; "
            f"slowest: {names}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):
        return  # a pytest-xdist worker: its reports reach the controller, which sums them all
    profile = os.environ.get("LARGEBATCH_TEST_DURATIONS")
    if profile and _durations:
        Path(profile).mkdir(parents=True, exist_ok=True)
        (Path(profile) / f"durations-{environment()}.json").write_text(json.dumps(_durations, indent=0))
    if os.environ.get(ENV) != "1" or not _durations:
        return
    path = Path(os.environ.get("LARGEBATCH_TIME_BUDGET_FILE") or BUDGET_FILE)
    budget = json.loads(path.read_text())[environment()]
    line = over_budget(_durations, float(budget["seconds"]))
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    total = sum(_durations.values())
    if reporter is not None:
        reporter.write_line(f"time budget ({environment()}): {total:.0f} s of {budget['seconds']} s")
    if line is not None:
        if reporter is not None:
            reporter.write_line(line, red=True)
        if session.exitstatus == 0:
            session.exitstatus = 1
