"""Rank program: ``python -m denseccl.bench`` with the arguments given (for tests/mpi/test_bench_cli.py)."""

import sys

from denseccl.bench.__main__ import main

sys.exit(main(sys.argv[1:]))
