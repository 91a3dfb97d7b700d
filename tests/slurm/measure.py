"""The benchmark on 2 simulated hosts x 2 ranks, started by srun --mpi=pmi2 and by mpiexec on
the same hosts, one after the other: srun first, because the mpiexec helper clears the hosts
after it (docs/benchmark.md, "Across 2 hosts: mpiexec and srun").

usage (root): python -m tests.slurm.measure OUT_DIR [bench options...]
Writes OUT_DIR/hosts-mpiexec.json and OUT_DIR/hosts-srun.json and prints each run's table.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tests.slurm.cluster import SlurmCluster

OPTIONS = ["-b", "64K", "-e", "16M", "-f", "16", "-n", "10", "-w", "2", "--rounds", "3",
           "--layouts", "contiguous,channels_last", "--contenders", "denseccl,mpi4py,naive"]


def main() -> None:
    out = Path(sys.argv[1]).resolve()
    options = sys.argv[2:] or OPTIONS
    with SlurmCluster(2) as cluster:
        assert cluster.hosts is not None
        scratch = cluster.base
        srun = cluster.run(["srun", "-N", "2", "--ntasks-per-node", "2", "--mpi=pmi2", sys.executable, "-m",
                            "denseccl.bench", *options, "--json", str(scratch / "s.json")], timeout=600)
        print(srun.stdout)
        # last: SimHosts.mpiexec kills whatever is left on the hosts afterwards, slurmd included
        mpiexec = cluster.hosts.mpiexec(["-m", "denseccl.bench", *options, "--json", str(scratch / "m.json")],
                                        hosts=2, per_host=2, timeout=600)
        print(mpiexec.stdout)
        out.mkdir(parents=True, exist_ok=True)
        (out / "hosts-mpiexec.json").write_text((scratch / "m.json").read_text())
        (out / "hosts-srun.json").write_text((scratch / "s.json").read_text())


if __name__ == "__main__":
    main()
