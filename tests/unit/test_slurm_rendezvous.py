"""Where an srun step without a PMI meets (denseccl/backends/slurm.py), and what a refusal under
srun tells the user to launch with (backends/mpi/init.py)."""

from __future__ import annotations

import pytest

from denseccl.backends.mpi.init import refuse_singleton
from denseccl.backends.rendezvous import env_launch
from denseccl.backends.slurm import first_node, master_value, srun_address, srun_mpi_option, step_port
from denseccl.errors import DenseCCLError

#: what srun sets in task 1 of step 3 of job 123457, on nodes h0 and h1 (no PMI)
TASK = {"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "h[0-1]",
        "SLURM_JOB_NODELIST": "h[0-3]", "SLURM_JOB_ID": "123457", "SLURM_STEP_ID": "3"}


@pytest.mark.parametrize("nodelist, first", [
    ("h0", "h0"), ("h[0-1]", "h0"), ("node[07-09,12],gpu1", "node07"), ("a,b[1-2]", "a"),
    ("rack[1-2]-n[01-04]", "rack1-n01"), ("n[3,1]", "n3"), (" x ", "x"),
])
def test_the_first_node_of_a_host_list(nodelist: str, first: str) -> None:
    assert first_node(nodelist) == first


def test_the_port_differs_by_job_and_step_and_stays_below_the_ephemeral_range() -> None:
    ports = {step_port(job, step) for job in range(1000) for step in range(10)}
    assert len(ports) == 10000 and min(ports) == 15000 and max(ports) == 24999
    assert step_port(123457, 3) == 15000 + 457 * 10 + 3


def test_a_task_without_pmi_meets_at_the_steps_first_node() -> None:
    assert srun_address(TASK) == ("h0", 19573)
    assert env_launch(TASK)
    assert master_value("MASTER_ADDR", {**TASK, "MASTER_ADDR": "10.0.0.1"}) == "10.0.0.1"
    assert master_value("MASTER_PORT", {**TASK, "MASTER_ADDR": "10.0.0.1"}) == "19573"  # each on its own
    without_step_list = {k: v for k, v in TASK.items() if k != "SLURM_STEP_NODELIST"}
    assert srun_address(without_step_list) == ("h0", 19573)


@pytest.mark.parametrize("missing", ["SLURM_STEP_NUM_TASKS", "SLURM_JOB_ID", "SLURM_STEP_ID"])
def test_no_address_outside_a_step(missing: str) -> None:
    """The batch script itself has no SLURM_STEP_NUM_TASKS; a task without ids has no port."""
    environ = {k: v for k, v in TASK.items() if k != missing}
    assert srun_address(environ) is None and not env_launch(environ)


@pytest.mark.parametrize("pmi", ["PMI_RANK", "PMIX_RANK"])
def test_a_step_with_a_pmi_is_left_to_mpi(pmi: str) -> None:
    assert srun_address({**TASK, pmi: "1"}) is None


@pytest.mark.parametrize("library, option", [
    ("MPICH Version:      4.3.2", "--mpi=pmi2"),
    ("Open MPI v5.0.8, package: Open MPI", "--mpi=pmix"),
    ("Intel(R) MPI Library 2021.10", "--mpi=pmi2"),
])
def test_the_refusal_names_the_launch_this_mpi_speaks(library: str, option: str) -> None:
    assert option in srun_mpi_option(library)
    with pytest.raises(DenseCCLError, match=f"srun {option}") as raised:
        refuse_singleton(1, {"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "2"}, library)
    other = "--mpi=pmix" if option == "--mpi=pmi2" else "--mpi=pmi2 "
    assert other not in str(raised.value).split("Launch with")[1]
