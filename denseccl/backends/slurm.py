"""Where the tasks of an srun job step meet when nobody said: Slurm's own variables.

srun without a PMI (``--mpi=none``, the usual ``MpiDefault``) starts each task with its rank
(``SLURM_PROCID``), the step's size (``SLURM_STEP_NUM_TASKS``), the step's nodes
(``SLURM_STEP_NODELIST``, in Slurm's compressed form) and the job and step ids, but with no
address to meet on. Every task can compute the same one from these: the first node of the step
(where block and cyclic distributions both put task 0) and a port derived from the job and step
ids, as Lightning's SLURM environment derives its port from the job id; the step id is in it
too, so that consecutive steps of one job (``srun`` twice in a batch script) do not reuse a port
that the previous step's store may still hold. ``MASTER_ADDR`` and ``MASTER_PORT``, where
exported, win, each on its own. A step that srun gave a PMI is left to MPI, as before.

Pure: reads a mapping, imports nothing else of denseccl but its constants.
"""

from __future__ import annotations

from typing import Mapping, Optional, Tuple

from .. import config

#: the variables srun sets in each task of a step that say where the step runs
NODELIST_VARIABLES = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST")


def first_node(nodelist: str) -> str:
    """The first host of a Slurm host list: ``"node[07-09,12],gpu1"`` -> ``"node07"``,
    ``"rack[1-2]-n[01-04]"`` -> ``"rack1-n01"``. Each bracket keeps its first number as written
    (zero padding included), which is what ``scontrol show hostnames`` lists first."""
    name, depth, bracket = [], 0, ""
    for character in nodelist.strip():
        if character == "," and depth == 0:
            break
        if character == "[":
            depth, bracket = depth + 1, ""
        elif character == "]":
            depth -= 1
            name.append(bracket.split(",")[0].split("-")[0])
        elif depth:
            bracket += character
        else:
            name.append(character)
    return "".join(name)


def step_port(job_id: int, step_id: int) -> int:
    """A port every task of a step computes alike, in ``config.SLURM_PORT_BASE`` + [0,
    ``SLURM_PORT_JOBS * SLURM_PORT_STEPS``): below Linux's ephemeral range, and distinct for
    that many consecutive jobs and steps of a job."""
    return config.SLURM_PORT_BASE + (job_id % config.SLURM_PORT_JOBS) * config.SLURM_PORT_STEPS + (
        step_id % config.SLURM_PORT_STEPS
    )


def srun_address(environ: Mapping[str, str]) -> Optional[Tuple[str, int]]:
    """``(host, port)`` of a task of an srun step started without a PMI, from Slurm's variables;
    None where this process is no such task (the batch script itself has no
    ``SLURM_STEP_NUM_TASKS``) or where srun gave it a PMI (MPI then says who is who)."""
    if not (environ.get("SLURM_PROCID", "").isdigit() and environ.get("SLURM_STEP_NUM_TASKS", "").isdigit()):
        return None
    if config.launched_by_mpi(environ):
        return None
    nodelist = next((environ[name] for name in NODELIST_VARIABLES if environ.get(name)), "")
    job = environ.get("SLURM_JOB_ID", environ.get("SLURM_JOBID", ""))
    step = environ.get("SLURM_STEP_ID", environ.get("SLURM_STEPID", ""))
    if not (nodelist and job.isdigit() and step.isdigit()):
        return None
    return first_node(nodelist), step_port(int(job), int(step))


def srun_mpi_option(library: str) -> str:
    """The srun option that gives ``library`` (``MPI.Get_library_version()``) its world: Open MPI
    speaks PMIx only, MPICH and its derivatives (the ``mpich`` wheel, MVAPICH, Intel MPI) PMI-1
    and PMI-2 (the wheel's MPICH fails under ``--mpi=pmix``: "unsupported PMI version PMIx")."""
    if "Open MPI" in library:
        return "srun --mpi=pmix (this MPI is Open MPI, which speaks PMIx)"
    if any(name in library for name in ("MPICH", "MVAPICH", "Intel")):
        return "srun --mpi=pmi2 (this MPI is MPICH, which speaks PMI-1/PMI-2, not PMIx)"
    return "srun --mpi=pmi2 (MPICH) or srun --mpi=pmix (Open MPI)"


def master_value(name: str, environ: Mapping[str, str]) -> Optional[str]:
    """``MASTER_ADDR`` or ``MASTER_PORT`` as exported, else as Slurm's variables give it."""
    value = environ.get(name)
    if value or name not in ("MASTER_ADDR", "MASTER_PORT"):
        return value
    address = srun_address(environ)
    if address is None:
        return None
    return address[0] if name == "MASTER_ADDR" else str(address[1])


__all__ = ["NODELIST_VARIABLES", "first_node", "master_value", "srun_address", "srun_mpi_option", "step_port"]
