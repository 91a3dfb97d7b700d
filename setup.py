"""The compiled parts, all optional: denseccl.backends.mpi._half_kernels, float16/bfloat16 loops for the MPI
transport; denseccl._fence, the memory fence of the shared-memory agreement board; and
denseccl._ring, the flight recorder's record folded into the clock read every call makes.

Without a C compiler the install still succeeds: denseccl reduces half types with torch's kernels
(when torch is imported) or NumPy's (slower), see backends/mpi/host_kernels.py; and without the
fence, ranks launched without MPI agree through the board only on x86 (whose store order suffices),
see channel/fence.py; and without the ring, the recorder records in Python (about 120 ns more per
call, recorder.py). Everything else is in pyproject.toml.
"""

import sys

from setuptools import Extension, setup

# -O3 and -fno-trapping-math let the loops vectorise; -g0 drops the debug info Python's own CFLAGS
# ask for (-g), and -s strips the symbol table from the shared object (about 5x smaller).
posix = sys.platform != "win32"
flags = ["-O3", "-std=c99", "-fno-trapping-math", "-g0"] if posix else []
link = ["-s"] if posix and sys.platform != "darwin" else []
fence_flags = ["-O2", "-std=c11", "-g0"] if posix else []
setup(ext_modules=[
    Extension("denseccl.backends.mpi._half_kernels", ["denseccl/backends/mpi/_half_kernels.c"],
              extra_compile_args=flags, extra_link_args=link, optional=True),
    Extension("denseccl._fence", ["denseccl/_fence.c"], extra_compile_args=fence_flags, extra_link_args=link,
              optional=True),
    Extension("denseccl._ring", ["denseccl/_ring.c"], extra_compile_args=fence_flags, extra_link_args=link,
              optional=True),
])
