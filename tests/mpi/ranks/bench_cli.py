"""Rank program: ``python -m denseccl.bench`` with the arguments given (for tests/mpi/test_bench_cli.py).

``BENCH_HIDE=module,...`` makes those modules unimportable first, as if they were not installed
(``matplotlib``; ``denseccl.backends.mpi._half_kernels``, as if built without a C compiler).
"""

import os
import sys

for name in filter(None, os.environ.get("BENCH_HIDE", "").split(",")):
    sys.modules[name] = None  # type: ignore[assignment] - import now raises ImportError

from denseccl.bench.__main__ import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
