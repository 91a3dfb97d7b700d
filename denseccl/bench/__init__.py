"""denseccl's benchmark, in the style of nccl-tests: ``python -m denseccl.bench`` under mpiexec.

Modules, one job each: ``options`` (the command line, nccl-tests' flags), ``conventions``
(sizes, counts, bandwidth factors), ``cases`` (layouts, inputs, references), ``libs`` (array
libraries), ``contenders`` / ``gpu`` (what is measured), ``job`` (the ranks and their
communicators), ``meta`` (versions, hosts, CPUs, ``--pin``), ``timing``, ``runner`` (the loop),
``progress`` (stderr during long runs), ``table``, ``plot``, ``report`` (tables from JSON),
``__main__`` (the command line); ``recorder_hook`` times the flight recorder's cost per call on
its own. docs/benchmark.md describes the flags, columns and results.
"""
