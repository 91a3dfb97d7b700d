#!/usr/bin/env bash
# tests/gpu/run.sh — everything that needs a GPU, in one call that fits the device tool's 600 s.
#
#   bash tests/gpu/run.sh            (results under $OUT if set, else ./gpu-results)
#
# Steps, each with a time cap inside one overall budget (DENSECCL_GPU_BUDGET, default 540 s; a
# step that no longer fits is skipped and said so):
# 1. finds a Python with CuPy, NCCL and pytest; installs what is missing from ./.whl (carried
#    wheels, see tests/gpu/fetch_wheels.sh) or, failing that, PyPI with short timeouts; writes
#    versions.txt;
# 1b. builds a wheel offline (--no-build-isolation, no index) and checks torch against the extra;
# 2. the GPU tests of one process (all of tests/gpu but test_gpu_ranks.py);
# 2b. probes of the real stack (tests/gpu/probe.py, one process each): does ncclCommDestroy wait
#    for a kernel, close() with a blocked stream (timeout 2 s, and none), a global-mode capture
#    after a dropped Work, a capture stream destroyed after its capture, torch's stream for
#    handle 0, a CuPy stream let go before the torch tensor recorded on it; each prints what it
#    measured, PASS/FAIL lines count like tests;
# 3. two ranks on one GPU: plainly (denseccl must refuse on both ranks before NCCL) and with a
#    separate NCCL_HOSTID per rank over sockets on lo: two-ranks.json;
# 3b. a DDP step of a channels-last ResNet-18, torch's NCCL backend against denseccl's, with the
#    host's time in backward() (tests/gpu/ddp_step.py, two ranks where they run, else one);
# 4. the two-rank GPU tests (tests/gpu/test_gpu_ranks.py) in the mode that worked;
# 5. the GPU benchmark (needs mpi4py with an MPI library: skipped, not failed, without one), one
#    rank to 256 MiB, then two ranks to 16 MiB where two ranks run, and the DDP step time.
# Inner time limits are shorter than the cap around them (pytest dumps every thread's stack
# before its cap; rank programs are killed with their output kept), so a hang still says where.
#
# Results: at most 8 files come back from $OUT, so everything is merged into these, ready to be
# copied into docs/gpu/:
#   summary.txt    what happened, step by step; its last line is "gpu: N passed, M failed"
#   versions.txt   GPU, driver, CUDA, NCCL, CuPy, torch, MPI
#   tests.txt      every test's outcome and time
#   two-ranks.json what NCCL said to two ranks on one GPU
#   bench.txt      the benchmark tables (bench.json: their rows)
#   run.log        everything printed
# Exit status: 0 when nothing failed, 1 otherwise.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-results}"
mkdir -p "$out"
work="$(mktemp -d /tmp/denseccl-gpu.XXXXXX)"  # scratch (junit files, pip logs): not brought back
budget="${DENSECCL_GPU_BUDGET:-540}"
started=$SECONDS
summary="$out/summary.txt"
steps="$work/steps.txt"
: >"$summary"
: >"$steps"
exec > >(tee -a "$out/run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"  # every NCCL failure says why ("Duplicate GPU detected", ...)

note() { echo "$*" | tee -a "$summary"; }
record() { echo "$*" >>"$steps"; note "$*"; }  # PASS/FAIL/SKIP of a step that is not a pytest test
left() { echo $((budget - (SECONDS - started))); }
# cap SECONDS: the smaller of SECONDS and what is left of the budget minus a margin
cap() { local c="$1" l; l=$(($(left) - 15)); [ "$l" -lt "$c" ] && c="$l"; echo "$c"; }
step() { echo; echo "=== $* ($(left) s of the budget left)"; }
finish() {
  echo
  note "done in $((SECONDS - started)) s"
  "$PY" tests/gpu/report.py tests "$work"/*.xml >"$out/tests.txt" 2>&1 || true
  "$PY" tests/gpu/report.py count "$steps" "$work"/*.xml 2>&1 | tee -a "$summary"
  ls "$out" | wc -l | xargs -I{} echo "files in \$OUT: {} (at most 8 come back)"
  echo "--- summary"; cat "$summary"
  rm -rf "$work"
  grep -q '^gpu: [0-9]* passed, 0 failed$' "$summary"
  exit $?
}

# -- 1. Python and packages ---------------------------------------------------------------------
step "environment"
PY=""
for candidate in "${DENSECCL_PYTHON:-}" python3 /opt/torch/.venv/bin/python3 "$root/.venv/bin/python" python; do
  [ -n "$candidate" ] || continue
  command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
  if "$candidate" -c "import cupy" >/dev/null 2>&1; then PY="$candidate"; break; fi
  [ -z "$PY" ] && "$candidate" -c "import numpy" >/dev/null 2>&1 && PY="$candidate"
done
if [ -z "$PY" ]; then
  PY=python3
  record "FAIL environment: no Python with numpy found (tried \$DENSECCL_PYTHON, python3, /opt/torch/.venv/bin/python3, .venv/bin/python)"
  finish
fi
PY="$(command -v "$PY" || echo "$PY")"
note "python: $PY"

has() {  # has MODULE-CHECK: mpi (mpi4py with an MPI library), cupy, nccl, gpu, pytest, torch_cuda
  case "$1" in
    mpi) "$PY" -c "from mpi4py import MPI" >/dev/null 2>&1 ;;
    mpi4py) "$PY" -c "import mpi4py" >/dev/null 2>&1 ;;
    cupy) "$PY" -c "import cupy" >/dev/null 2>&1 ;;
    gpu) "$PY" -c "import cupy, sys; sys.exit(0 if cupy.is_available() else 1)" >/dev/null 2>&1 ;;
    nccl) "$PY" -W ignore -c "from cupy.cuda import nccl; import sys; sys.exit(0 if nccl.available else 1)" >/dev/null 2>&1 ;;
    torch_cuda) "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" >/dev/null 2>&1 ;;
    *) "$PY" -c "import $1" >/dev/null 2>&1 ;;
  esac
}

cuda_major="$("$PY" -c 'import cupy; print(cupy.cuda.runtime.runtimeGetVersion() // 1000)' 2>/dev/null || echo 12)"
[ "$cuda_major" -ge 13 ] 2>/dev/null && suffix=13 || suffix=12
wanted=()
has numpy || wanted+=(numpy)
has cupy || wanted+=("cupy-cuda${suffix}x")
has nccl || wanted+=("nvidia-nccl-cu${suffix}")
has pytest || wanted+=(pytest)
has mpi4py || wanted+=(mpi4py)
has mpi || wanted+=(mpich)
if [ "${#wanted[@]}" -gt 0 ]; then
  prefix=/tmp/denseccl-prefix  # wheels' data (mpich's lib/libmpi.so.12, bin/mpiexec) land under it
  if [ -d "$root/.whl" ]; then source_args=(--no-index --no-deps --find-links "$root/.whl"); else source_args=(--timeout 5 --retries 0); fi
  note "missing: ${wanted[*]}; trying pip ($([ -d "$root/.whl" ] && echo "carried wheels in .whl" || echo "PyPI"))"
  for package in "${wanted[@]}"; do
    if timeout "$(cap 60)" "$PY" -m pip install --disable-pip-version-check -q --no-compile --prefix "$prefix" "${source_args[@]}" "$package" >"$work/pip.log" 2>&1; then
      note "pip: installed $package"
    else
      note "pip: could not install $package: $(grep -v '^\s*$' "$work/pip.log" | tail -n 1 | cut -c1-200)"
    fi
  done
  site="$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$prefix', 'platbase': '$prefix'}))")"
  platsite="$("$PY" -c "import sysconfig; print(sysconfig.get_path('platlib', vars={'base': '$prefix', 'platbase': '$prefix'}))")"
  export PYTHONPATH="$PYTHONPATH:$site:$platsite" PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
"$PY" tests/gpu/report.py versions >"$out/versions.txt" 2>&1
cat "$out/versions.txt"
if ! has gpu || ! has nccl; then
  record "FAIL environment: CuPy with a GPU and NCCL is needed: $("$PY" -c 'from denseccl.backends.nccl.init import nccl_missing; print(nccl_missing())' 2>&1 | tail -n 1)"
  # DENSECCL_GPU_DRY=1 goes on regardless: how tests/unit/test_nccl_run_script.py runs this script on a CPU
  [ "${DENSECCL_GPU_DRY:-0}" = 1 ] || finish
fi
if ! has pytest; then
  record "FAIL environment: pytest is missing and could not be installed"
  finish
fi
note "torch with CUDA: $(has torch_cuda && echo yes || echo no); MPI: $(has mpi && echo yes || echo "no (benchmark skipped; carry mpich with tests/gpu/fetch_wheels.sh)")"

run_pytest() {  # name, cap, pytest arguments...
  local name="$1" limit; limit="$(cap "$2")"; shift 2
  if [ "$limit" -lt 30 ]; then record "SKIP pytest $name: not enough of the budget left"; return; fi
  # pytest dumps every thread's stack 15 s before its cap; tests keep their own limits below
  # DENSECCL_GPU_INNER_TIMEOUT so that a hung rank's output is printed before that
  DENSECCL_GPU_INNER_TIMEOUT=$((limit - 30)) timeout -k 10 "$limit" "$PY" -m pytest -v -rfE -p no:cacheprovider \
    -o faulthandler_timeout=$((limit - 15)) --junitxml="$work/$name.xml" "$@"
  local status=$?
  if [ ! -s "$work/$name.xml" ]; then
    record "FAIL pytest $name: no results (exit $status$([ "$status" -ge 124 ] && echo ", killed at its cap of $limit s"))"
  else
    note "pytest $name: exit $status ($("$PY" tests/gpu/report.py count /dev/null "$work/$name.xml" | tr '\n' ' '))"
  fi
}

# -- 1b. install offline -------------------------------------------------------------------------
step "install offline: a wheel with this Python's setuptools, no index"
setuptools_version="$("$PY" -c 'import setuptools; print(setuptools.__version__)' 2>/dev/null || echo none)"
torch_version="$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null || echo none)"
mkdir -p "$work/src"  # a copy: pip builds in the tree it is given
cp -r "$root/denseccl" "$root/setup.py" "$root/pyproject.toml" "$root/README.md" "$root/LICENSE" "$work/src/"
if timeout "$(cap 90)" "$PY" -m pip wheel --no-build-isolation --no-index --no-deps -q --disable-pip-version-check \
    -w "$work/wheel" "$work/src" >"$work/wheel.log" 2>&1; then
  record "PASS install offline: pip wheel --no-build-isolation --no-index with setuptools $setuptools_version"
else
  record "FAIL install offline with setuptools $setuptools_version: $(grep -v '^\s*$' "$work/wheel.log" | tail -n 1 | cut -c1-200)"
fi
if [ "$torch_version" != none ]; then
  if "$PY" -c "import sys, torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < (2, 11))"; then
    record "PASS denseccl[torch] admits this torch ($torch_version): pip keeps it"
  else
    record "FAIL denseccl[torch] requires torch>=2.11 but this machine has $torch_version"
  fi
fi

# -- 2. one rank ---------------------------------------------------------------------------------
step "GPU tests in this process (all of tests/gpu but the two-rank file)"
run_pytest single 200 tests/gpu --ignore=tests/gpu/test_gpu_ranks.py

# -- 2b. probes ----------------------------------------------------------------------------------
step "probes of the real stack: close, captures, a freed capture stream, torch's default stream"
for probe in destroy close close_untimed capture freed_stream default_stream stream_lifetime; do
  limit="$(cap 45)"
  if [ "$limit" -lt 20 ]; then record "SKIP probe $probe: not enough of the budget left"; continue; fi
  timeout -k 5 "$limit" "$PY" tests/gpu/probe.py "$probe" >"$work/probe.txt" 2>&1
  status=$?
  cat "$work/probe.txt"
  if grep -q '^SKIP probes' "$work/probe.txt"; then record "$(grep -m 1 '^SKIP probes' "$work/probe.txt")"; break; fi
  grep -E '^INFO probe' "$work/probe.txt" | while read -r line; do note "$line"; done
  grep -E '^(PASS|FAIL) probe' "$work/probe.txt" | while read -r line; do record "$line"; done
  if ! grep -qE '^(PASS|FAIL|INFO) probe' "$work/probe.txt"; then
    record "FAIL probe $probe: no verdict (exit $status$([ "$status" -ge 124 ] && echo ", killed at its cap of $limit s"))"
  fi
done

# -- 3. two ranks on one GPU ---------------------------------------------------------------------
step "two ranks on one GPU: plain, then NCCL_HOSTID per rank"
mode=no
if [ "$(cap 120)" -ge 60 ]; then
  DENSECCL_GPU_INNER_TIMEOUT=$(($(cap 120) - 15)) timeout -k 10 "$(cap 120)" "$PY" tests/gpu/two_ranks.py "$out/two-ranks.json" | tee "$work/two-ranks.txt"
  mode="$(grep '^MODE=' "$work/two-ranks.txt" | tail -n 1 | cut -d= -f2)"
  grep '^two ranks' "$work/two-ranks.txt" | while read -r line; do note "$line"; done
  if [ "$("$PY" -c 'import cupy; print(cupy.cuda.runtime.getDeviceCount())' 2>/dev/null)" = 1 ]; then
    # one GPU: the plain attempt must be refused by denseccl on both ranks, before NCCL is asked
    if grep -q '^two ranks on one GPU, plain: refused by denseccl before NCCL' "$work/two-ranks.txt"; then
      record "PASS two ranks on one GPU refused on every rank before NCCL"
    else
      record "FAIL two ranks on one GPU: $(grep -m 1 '^two ranks on one GPU, plain' "$work/two-ranks.txt")"
    fi
  fi
  [ -n "$mode" ] || { record "FAIL two-rank probe: did not finish"; mode=no; }
  note "two-rank mode for the tests: $mode"
else
  record "SKIP two-rank probe: not enough of the budget left"
fi
export DENSECCL_GPU_TWO_RANKS="$mode"

# -- 3b. DDP step time: torch's NCCL backend against denseccl's -------------------------------------
step "DDP step of a channels-last ResNet-18: torch's NCCL backend, then denseccl"
if ! has torch_cuda; then
  record "SKIP ddp step: torch has no CUDA here"
elif [ "$(cap 100)" -lt 40 ]; then
  record "SKIP ddp step: not enough of the budget left"
else
  timeout -k 10 "$(cap 100)" "$PY" tests/gpu/ddp_step.py "$mode" >"$work/ddp.txt" 2>&1
  status=$?
  cat "$work/ddp.txt"
  grep -E '^(INFO|SKIP) ddp' "$work/ddp.txt" | while read -r line; do note "$line"; done
  grep -E '^FAIL ddp' "$work/ddp.txt" | while read -r line; do record "$line"; done
  grep -qE '^(INFO|FAIL|SKIP) ddp' "$work/ddp.txt" || record "FAIL ddp step: no line (exit $status)"
fi

# -- 4. two ranks ---------------------------------------------------------------------------------
step "two-rank GPU tests"
if [ "$mode" = no ]; then
  record "SKIP pytest ranks: two ranks cannot run here (see two-ranks.json)"
else
  # one pytest per test, each with its own cap and summary line: an overrun hides nothing else
  run_pytest ranks-collectives 170 tests/gpu/test_gpu_ranks.py::test_two_ranks_collectives
  run_pytest ranks-faults 110 tests/gpu/test_gpu_ranks.py::test_two_ranks_faults
  run_pytest ranks-mpiexec 100 tests/gpu/test_gpu_ranks.py::test_two_ranks_under_mpiexec
fi

# -- 5. benchmark --------------------------------------------------------------------------------
step "GPU benchmark"
bench() {  # name, cap, ranks, bench arguments...
  local name="$1" limit ranks="$3"; limit="$(cap "$2")"; shift 3
  if [ "$limit" -lt 40 ]; then record "SKIP bench $name: not enough of the budget left"; return; fi
  local mpiexec_bin command
  mpiexec_bin="$(command -v mpiexec || true)"
  if [ "$ranks" = 1 ]; then
    command=("$PY" "$@")
  elif [ -z "$mpiexec_bin" ]; then
    record "SKIP bench $name: no mpiexec"; return
  elif [ "$mode" = hostid ]; then
    local split=(-env NCCL_SOCKET_IFNAME lo -env NCCL_IB_DISABLE 1)
    command=("$mpiexec_bin" -n 1 -env NCCL_HOSTID denseccl-rank0 "${split[@]}" "$PY" "$@" : -n 1 -env NCCL_HOSTID denseccl-rank1 "${split[@]}" "$PY" "$@")
  else
    command=("$mpiexec_bin" -n 2 "$PY" "$@")
  fi
  echo "+ ${command[*]}"
  { echo; echo "## $name: ${command[*]}"; } >>"$out/bench.txt"
  timeout -k 10 "$limit" "${command[@]}" 2>&1 | tee -a "$out/bench.txt"
  local status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ]; then
    record "PASS bench $name: $(grep -i 'avg bus bandwidth' "$out/bench.txt" | tail -n 1 | tr -s ' ')"
  else
    record "FAIL bench $name (exit $status$([ "$status" -ge 124 ] && echo ", killed at its cap of $limit s"))"
  fi
}
if ! has mpi; then
  record "SKIP bench: mpi4py has no MPI library here (the benchmark's job runs on MPI); carry mpich: tests/gpu/fetch_wheels.sh"
else
  common=(-m denseccl.bench --backend nccl --collective allreduce,allgather,reduce_scatter -n 10 -w 2 --rounds 2)
  bench one-rank 110 1 "${common[@]}" -b 4K -e 256M -f 4 --layouts all --json "$work/bench-1.json"
  if [ "$mode" = no ]; then
    record "SKIP bench two-ranks: two ranks cannot run here"
  else
    bench two-ranks 110 2 "${common[@]}" -b 4K -e 16M -f 4 --layouts contiguous,channels_last,transposed --json "$work/bench-2.json"
    if has torch_cuda; then
      bench ddp 70 2 examples/bench_ddp.py --rounds 3 --steps 10
    else
      record "SKIP bench ddp: torch has no CUDA here"
    fi
  fi
  "$PY" tests/gpu/report.py merge-json "$out/bench.json" one_rank="$work/bench-1.json" two_ranks="$work/bench-2.json"
fi
finish
