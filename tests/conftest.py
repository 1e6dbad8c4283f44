"""The tests' fixtures. Shared helpers are in tests/helpers.py, the tiny runs' flags in tests/tiny.py."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from cs336_systems.peak_flops import PEAK_CACHE_ENV
from tests.helpers import FIXTURES

if "OMP_NUM_THREADS" not in os.environ:  # .ci/run sets it (and a CPU name) to run tests as on another machine
    torch.set_num_threads(min(2, os.cpu_count() or 1))


@pytest.fixture(autouse=True, scope="session")
def _peak_cache(tmp_path_factory):
    """Calibrated MFU peaks go to the session's own directory (children inherit it), never ~/.cache."""
    os.environ[PEAK_CACHE_ENV] = str(tmp_path_factory.mktemp("peak_cache"))


@pytest.fixture(autouse=True)
def _forget_interrupts():
    """A test that delivers a real Ctrl-C leaves lifetime's memory of it; the next test in this
    process starts as a fresh command would."""
    yield
    from cs336_systems import lifetime

    lifetime._received.clear()


@pytest.fixture
def fixtures_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    return FIXTURES


@pytest.fixture
def fresh_cs336_basics(monkeypatch):
    """No cs336_basics imported when the test starts, and none it imports left to the next test: a test
    that imports a student's package finds the one its own path names, whatever ran before it."""

    def imported() -> list[str]:
        return [m for m in sys.modules if m == "cs336_basics" or m.startswith("cs336_basics.")]

    for name in imported():
        monkeypatch.delitem(sys.modules, name)  # put back after the test
    yield
    for name in imported():  # before monkeypatch puts back the earlier ones
        del sys.modules[name]


@pytest.fixture
def saved_figures(monkeypatch):
    """Every matplotlib Figure saved during the test (still written to its file): a plot test checks
    what is drawn (titles, labels, each line's points), not only that a file exists."""
    from matplotlib.figure import Figure

    saved = []
    original = Figure.savefig

    def savefig(self, *args, **kwargs):
        saved.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", savefig)
    return saved
