#!/usr/bin/env bash
# tests/gpu/fetch_wheels.sh — run on a machine WITH PyPI before a GPU session: downloads the
# wheels the GPU machine lacks (it reaches no registry) into ./.whl (git-ignored through
# .git/info/exclude), for the device tool to carry; tests/gpu/run.sh installs from ./.whl with
# --no-index when that folder exists. Default: mpich (mpiexec + libmpi for the mpi4py that is
# there), for the MPI-launched two-rank test and the benchmark. Extra names may be given.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >>.git/info/exclude
python="${PYTHON:-$root/.venv/bin/python}"
[ -x "$python" ] || python=python3
packages=("${@:-mpich}")
"$python" -m pip download --no-deps --only-binary=:all: --python-version "${GPU_PYTHON_VERSION:-3.12}" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl "${packages[@]}"
ls -la .whl
echo "carry .whl with the device tool (carry: [\".whl\"]) and run: bash tests/gpu/run.sh"
