"""The one compiled part: denseccl._half_kernels, float16/bfloat16 loops for the MPI transport.

It is optional: without a C compiler the install still succeeds and denseccl reduces half types
with torch's kernels (when torch is imported) or NumPy's (slower); see backends/mpi/host_kernels.py.
Everything else is in pyproject.toml.
"""

import sys

from setuptools import Extension, setup

# -O3 and -fno-trapping-math let the loops vectorise; -g0 drops the debug info Python's own CFLAGS
# ask for (-g), and -s strips the symbol table from the shared object (about 5x smaller).
posix = sys.platform != "win32"
flags = ["-O3", "-std=c99", "-fno-trapping-math", "-g0"] if posix else []
link = ["-s"] if posix and sys.platform != "darwin" else []
setup(ext_modules=[Extension("denseccl._half_kernels", ["denseccl/_half_kernels.c"], extra_compile_args=flags,
                             extra_link_args=link, optional=True)])
