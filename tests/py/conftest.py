"""pytest configuration for tests/py.

SMELT_REQUIRE_MODELS=1 (`make test` sets it: what CI runs) turns the skips that mean "this
machine lacks what the test needs" into failures, so CI cannot pass by skipping the tests
that need the real models:
- a test model is absent: the reason names `make models`, scripts/fetch-test-models.sh,
  a path under models/ or says "model absent";
- the build is absent: the reason names the smelt binary or libsmelt.so;
- a package of tests/requirements.txt is missing (pytest.importorskip);
- Chromium or its WebDriver is missing (the web chat's browser tests: the reason names
  chromium).
A skip inside a test or a fixture becomes that test's failure; a module skipped whole at
import (importorskip at module level) is listed at the end and fails the run. Other skips
(no ../shared data, a feature not in this build) stay skips. Without the variable every
skip is a skip, so the suites still run on a machine without models."""
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRE = os.environ.get("SMELT_REQUIRE_MODELS") == "1"
MARKERS = ("make models", "fetch-test-models", "models/", "model absent", "smelt binary",
           "libsmelt.so", "chromium")


def _required_packages():
    names = set()
    with open(os.path.join(ROOT, "tests", "requirements.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                names.add(re.split(r"[<>=!~\[;\s]", line, 1)[0].lower().replace("-", "_"))
    return names


PACKAGES = _required_packages()


def libsmelt_path():
    """The built libsmelt.so (SMELT_LIB, next to SMELT_BIN, or build/), for the tests that call
    the C library through ctypes; skips (a failure under SMELT_REQUIRE_MODELS=1) when absent."""
    cands = []
    if os.environ.get("SMELT_LIB"):
        cands.append(os.environ["SMELT_LIB"])
    if os.environ.get("SMELT_BIN"):
        cands.append(os.path.join(os.path.dirname(os.environ["SMELT_BIN"]), "libsmelt.so"))
    cands.append(os.path.join(ROOT, "build", "libsmelt.so"))
    for c in cands:
        if os.path.exists(c):
            return c
    pytest.skip("SKIP libsmelt.so not built (looked in %s)" % ", ".join(cands))


def missing_requirement(reason):
    """True when a skip with this reason is a missing model, build or required package."""
    m = re.search(r"could not import '([\w.]+)'", reason)
    if m:
        return m.group(1).split(".")[0].lower() in PACKAGES
    return any(k in reason for k in MARKERS)


def _reason(longrepr):
    # a skip's longrepr is (path, line, "Skipped: reason")
    return longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if not REQUIRE or not rep.skipped or hasattr(rep, "wasxfail"):
        return
    reason = _reason(rep.longrepr)
    if missing_requirement(reason):
        rep.outcome = "failed"
        rep.longrepr = f"SMELT_REQUIRE_MODELS=1, so this skip is a failure: {reason}"


_skipped_modules = []


def pytest_collectreport(report):
    if REQUIRE and report.skipped and missing_requirement(_reason(report.longrepr)):
        _skipped_modules.append((report.nodeid, _reason(report.longrepr)))


def pytest_terminal_summary(terminalreporter):
    if _skipped_modules:
        terminalreporter.section("SMELT_REQUIRE_MODELS=1: modules skipped whole (failures)")
        for nodeid, reason in _skipped_modules:
            terminalreporter.line(f"FAILED {nodeid}: {reason}")


def pytest_sessionfinish(session, exitstatus):
    if _skipped_modules and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
