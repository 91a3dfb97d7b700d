"""The one compiled part: denseccl._half_kernels, float16/bfloat16 loops for the MPI transport.

It is optional: without a C compiler the install still succeeds and denseccl reduces half types
with torch's kernels (when torch is imported) or NumPy's (slower); see transports/host_kernels.py.
Everything else is in pyproject.toml.
"""

import sys

from setuptools import Extension, setup

flags = [] if sys.platform == "win32" else ["-O3", "-std=c99", "-fno-trapping-math"]  # lets the loops vectorise
setup(ext_modules=[Extension("denseccl._half_kernels", ["denseccl/_half_kernels.c"], extra_compile_args=flags, optional=True)])
