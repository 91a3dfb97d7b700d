"""The torch backend across simulated hosts: the default group, subgroups within and across
hosts, DDP, and tests/torch's full collectives program; every result against plain torch."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.hosts.simhosts import SimHosts
from tests.support.checker import expect_summaries

pytest.importorskip("torch")
pytestmark = [pytest.mark.mpi, pytest.mark.torch, pytest.mark.hosts]

HERE = Path(__file__).parent
PROGRAM = HERE / "ranks" / "torch_groups.py"
TWO_LAYOUTS = [(2, 2), (3, 1)]
IDS = ["2hosts-2per", "3hosts-1per"]


def run(simhosts: SimHosts, hosts: int, per_host: int, *scenarios: str) -> None:
    done = simhosts.mpiexec([str(PROGRAM), str(hosts), str(per_host), *scenarios], hosts=hosts, per_host=per_host,
                            env={"DENSECCL_TIMEOUT": "15"}, timeout=150)
    expect_summaries(done.stdout, "torch-" + "-".join(scenarios), hosts * per_host)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hosts, per_host", TWO_LAYOUTS, ids=IDS)
def test_world_group_and_subgroups_across_hosts(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    run(simhosts, hosts, per_host, "world", "across")


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hosts, per_host", TWO_LAYOUTS, ids=IDS)
def test_subgroups_within_hosts(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    """One group per host: [0, 1] and [2, 3] on two hosts, singletons on three."""
    run(simhosts, hosts, per_host, "within")


@pytest.mark.timeout(180)
def test_ddp_across_hosts(simhosts: SimHosts) -> None:
    run(simhosts, 3, 1, "ddp")


@pytest.mark.timeout(180)
def test_every_collective_on_every_layout(simhosts: SimHosts) -> None:
    """tests/torch/ranks/collectives.py (every collective and layout, a subgroup, async bursts)."""
    done = simhosts.mpiexec([str(HERE.parent / "torch" / "ranks" / "collectives.py")], hosts=2, per_host=2, timeout=150)
    expect_summaries(done.stdout, "torch-collectives", 4)
