"""denseccl on MPI across simulated hosts (tests/hosts/simhosts.py): 2 and 3 hosts, 1 and 2
ranks per host. The rank programs are those of tests/mpi/ranks where they fit, and check every
result against NumPy built from all ranks' inputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.hosts.simhosts import SimHosts
from tests.support.checker import expect_summaries

pytestmark = [pytest.mark.mpi, pytest.mark.hosts]

HERE = Path(__file__).parent
MPI_RANKS = HERE.parent / "mpi" / "ranks"
LAYOUTS = [(2, 1), (2, 2), (3, 1), (3, 2)]
IDS = [f"{h}hosts-{k}per" for h, k in LAYOUTS]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("hosts, per_host", LAYOUTS, ids=IDS)
def test_placement_and_agreement_paths(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    """Board within a host, MPI across hosts, on the world and on splits within and across (the
    rank program checks each communicator; DENSECCL_DEBUG=INFO says the same to the user)."""
    program = [str(HERE / "ranks" / "placement.py"), str(hosts), str(per_host)]
    done = simhosts.mpiexec(program, hosts=hosts, per_host=per_host, env={"DENSECCL_DEBUG": "INFO"})
    size = hosts * per_host
    expect_summaries(done.stdout, "placement", size)
    board = done.stderr.count("agreement step: shared-memory board (")
    assert board == (size if per_host > 1 else 0), done.stderr  # the splits within a host
    said = "agreement step: MPI allreduce on the control communicator ({} ranks"
    mpi = {n: done.stderr.count(said.format(n)) for n in (size, hosts)}
    if per_host == 1:  # the world and the split across hosts have the same size
        assert mpi[size] == 2 * size, done.stderr
    else:
        assert mpi[size] == size and mpi[hosts] == size, done.stderr


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts, per_host", LAYOUTS, ids=IDS)
def test_collectives_on_random_layouts(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    """A seeded sample of tests/mpi's full matrix (every dtype, op, mode and layout kind)."""
    from tests.mpi.test_collectives import matrix

    cases = matrix(hosts * per_host)
    cases = [case for number, case in enumerate(cases) if number % 3 == (hosts + per_host) % 3]  # a third each
    path = simhosts.shared / f"cases-{hosts}-{per_host}.json"
    path.write_text(json.dumps(cases))
    done = simhosts.mpiexec([str(MPI_RANKS / "collectives.py"), str(path)], hosts=hosts, per_host=per_host,
                            env={"DENSECCL_TIMEOUT": "30"}, timeout=200)
    expect_summaries(done.stdout, "collectives", hosts * per_host)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts, per_host", LAYOUTS, ids=IDS)
def test_mismatch_matrix(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    args = ["--torch"] if (hosts, per_host) == (2, 1) else []
    done = simhosts.mpiexec([str(MPI_RANKS / "mismatch.py"), *args], hosts=hosts, per_host=per_host,
                            env={"DENSECCL_TIMEOUT": "20"}, timeout=200)
    expect_summaries(done.stdout, "mismatch", hosts * per_host)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hosts, per_host", [(2, 1), (3, 2)], ids=["2hosts-1per", "3hosts-2per"])
def test_peer_never_joins(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    """The last rank (on the last host) skips a collective: every other rank times out."""
    done = simhosts.mpiexec([str(MPI_RANKS / "timeouts.py"), "1.0"], hosts=hosts, per_host=per_host,
                            env={"DENSECCL_TIMEOUT": "2"}, timeout=150, expect_failure=None)  # ranks leave by os._exit
    expect_summaries(done.stdout, "timeouts", hosts * per_host)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("hosts, per_host", [(2, 2), (3, 1)], ids=["2hosts-2per", "3hosts-1per"])
def test_agreement_under_stress(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    """tests/mpi's seeded schedule of agreements, mismatches and invalid inputs, on the world
    and a split of it, both across hosts (so on the MPI path)."""
    done = simhosts.mpiexec([str(MPI_RANKS / "agreement_paths.py"), "0", "300"], hosts=hosts, per_host=per_host,
                            env={"DENSECCL_TIMEOUT": "30"}, timeout=200)
    expect_summaries(done.stdout, "agreement-paths-0", hosts * per_host)


@pytest.mark.timeout(120)
def test_hostfile(simhosts: SimHosts) -> None:
    """The hosts and their slots from a hostfile (hydra's `-f`, Open MPI's `--hostfile`)."""
    done = simhosts.mpiexec([str(HERE / "ranks" / "placement.py"), "3", "2"], hosts=3, per_host=2, hostfile=True)
    expect_summaries(done.stdout, "placement", 6)
