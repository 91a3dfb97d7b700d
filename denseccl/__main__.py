"""``python -m denseccl``: print the environment report (versions, the MPI library, the compiled
kernels, which backends can run here and why not, the relevant environment variables).

Attach its output to bug reports, as torch users attach ``python -m torch.utils.collect_env``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Optional, Sequence


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m denseccl", description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    try:
        import mpi4py  # noqa: PLC0415 - optional

        # MPI.Get_library_version() is allowed before MPI_Init: asking it must not start MPI (an
        # Open MPI singleton, for one, may look for a launcher).
        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
    except ImportError:
        pass
    from . import envreport  # noqa: PLC0415

    if not args.json:
        print(envreport.report())
        return 0
    built, kernels = envreport.half_kernels()
    report = {
        "versions": envreport.versions(load=True),
        "mpi_library": envreport.mpi_library_version(load=True),
        "half_kernels": {"built": built, "detail": kernels},
        "agreement": envreport.agreement_paths(),
        "backends": {name: {"available": ok, "detail": why} for name, (ok, why) in envreport.backends().items()},
        "cpus": envreport.cpus(),
        "environment": envreport.environment(),
    }
    print(json.dumps(report, indent=1))
    return 0

if __name__ == "__main__":
    sys.exit(main())
