"""Simulated hosts for the tests in this folder: one set of three hosts per session (a job on
two uses h0 and h1), removed at the end of the session, or skipped with the reason."""

from __future__ import annotations

from typing import Iterator

import pytest

from tests.hosts.simhosts import SimHosts, unavailable


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "hosts: runs MPI jobs across simulated hosts (Linux namespaces; needs root)")


@pytest.fixture(scope="session")
def simhosts() -> Iterator[SimHosts]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(reason)
    with SimHosts(3) as hosts:
        yield hosts
