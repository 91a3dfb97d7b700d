"""denseccl's benchmark, in the style of nccl-tests: ``python -m denseccl.bench`` under mpiexec.

Modules, one job each: ``conventions`` (sizes, counts, bandwidth factors), ``cases`` (layouts,
inputs, references), ``libs`` (array libraries), ``contenders`` / ``gpu`` (what is measured),
``timing``, ``runner`` (the loop), ``table``, ``plot``, ``__main__`` (the command line).
"""
