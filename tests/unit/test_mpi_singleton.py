"""An MPI world smaller than the launcher's job is refused (backends/mpi/init.py): srun without
PMI starts each task as an MPI singleton, where every collective returned the rank's own input."""

from __future__ import annotations

import pytest

from denseccl.backends.mpi.init import refuse_singleton
from denseccl.errors import DenseCCLError


@pytest.mark.parametrize("environ", [{"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"}, {"WORLD_SIZE": "2"}])
def test_a_singleton_world_of_a_larger_job_is_refused(environ) -> None:
    with pytest.raises(DenseCCLError, match="MPI's world has 1 rank.*srun --mpi=pmix.*MASTER_ADDR"):
        refuse_singleton(1, environ)


@pytest.mark.parametrize("environ", [{}, {"SLURM_PROCID": "0"}, {"SLURM_STEP_NUM_TASKS": "4"}, {"WORLD_SIZE": "x"}])
def test_a_world_as_large_as_the_job_is_taken(environ) -> None:
    refuse_singleton(4, environ)
    refuse_singleton(1, {k: v for k, v in environ.items() if k != "SLURM_STEP_NUM_TASKS"})
