"""A pytest plugin: under CI (``CI=true``) every skip is a failure; the summary prints the skip count.

A test that cannot run in CI (vLLM missing, no mount rights, no registry server, no linter) must not
pass there as "skipped". conftest.py imports these hooks; ``pytest -p helpers.ci`` loads them alone.
"""

from __future__ import annotations

import os

import pytest

_skips: list[str] = []  # node ids that skipped (under CI: that failed for skipping)


def under_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def _skip_fails_under_ci(report) -> None:
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    _skips.append(report.nodeid)
    if under_ci():
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = f"skipped under CI (CI={os.environ['CI']}), which counts as a failure: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _skip_fails_under_ci(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield  # a module-level importorskip skips the whole module here
    _skip_fails_under_ci(outcome.get_result())


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    ci = " (CI: each one failed)" if under_ci() and _skips else ""
    terminalreporter.write_line(f"kernelcache: {len(_skips)} skipped{ci}")
