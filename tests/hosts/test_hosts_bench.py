"""The benchmark across simulated hosts: every contender, torch.distributed's included, meets
across hosts (no loopback address or interface baked into its rendezvous) and verifies its rows."""

from __future__ import annotations

import json

import pytest

from tests.hosts.simhosts import SimHosts

pytestmark = [pytest.mark.mpi, pytest.mark.hosts]


@pytest.mark.timeout(180)
@pytest.mark.parametrize("hosts, per_host", [(2, 1), (3, 2)], ids=["2hosts-1per", "3hosts-2per"])
def test_bench_runs_across_hosts(simhosts: SimHosts, hosts: int, per_host: int) -> None:
    out = simhosts.shared / f"bench-{hosts}-{per_host}.json"
    contenders = "denseccl,mpi4py,naive,gloo,denseccl-torch"
    done = simhosts.mpiexec(
        ["-m", "denseccl.bench", "-b", "4K", "-e", "64K", "-f", "16", "-n", "2", "-w", "1", "--rounds", "1",
         "--layouts", "contiguous,transposed", "--contenders", contenders, "--json", str(out)],
        hosts=hosts, per_host=per_host, timeout=150,
    )
    assert "Avg bus bandwidth" in done.stdout, done.describe()
    data = json.loads(out.read_text())
    rows = data["rows"]
    assert data["meta"]["nranks"] == hosts * per_host
    assert (data["meta"].get("hosts"), data["meta"].get("ranks_per_host")) == (hosts, per_host), data["meta"]
    assert f"#  hosts {hosts} (" in done.stdout
    assert rows and all(row.get("error") is None and row["wrong"] == 0 for row in rows), rows
    ran = {row["contender"] for row in rows}
    missing = set(contenders.split(",")) - ran
    assert not missing, f"contenders that did not run across hosts: {missing}\n{done.describe()}"
