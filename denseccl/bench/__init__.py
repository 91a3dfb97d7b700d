"""denseccl's benchmark, in the style of nccl-tests: ``python -m denseccl.bench`` under mpiexec.

Modules, one job each: ``options`` (the command line, nccl-tests' flags), ``conventions``
(sizes, counts, bandwidth factors), ``cases`` (layouts, inputs, references), ``libs`` (array
libraries), ``contenders`` / ``gpu`` (what is measured), ``job`` (the ranks and their
communicators), ``meta`` (versions, hosts, CPUs, ``--pin``), ``timing``, ``runner`` (the loop),
``heartbeat`` (stderr during long runs), ``table``, ``plot``, ``report`` (tables from JSON),
``__main__`` (the command line). On their own: ``recorder_hook`` (the flight recorder's cost
per call), ``agreement_step`` (the agreement step alone on every control channel) and
``gloo_calls`` (each small gloo-engine call against torch's gloo). docs/benchmark.md describes
the flags, columns and results.
"""
