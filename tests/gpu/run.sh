#!/usr/bin/env bash
# tests/gpu/run.sh — everything that needs a GPU, in one call that fits 10 minutes.
#
#   bash tests/gpu/run.sh            (logs under $OUT if set, else ./gpu-results)
#
# 1. picks a Python that has (or can get) CuPy, NCCL, pytest; tries pip for what is missing
#    (from ./.whl with --no-index if that folder exists, else PyPI with short timeouts) into a
#    private prefix, and says exactly what failed;
# 2. runs the GPU tests of one process (all of tests/gpu but test_gpu_ranks.py);
# 3. tries two ranks on one GPU: plainly (NCCL is expected to say "Duplicate GPU detected") and
#    with a separate NCCL_HOSTID per rank over sockets on lo, and records what NCCL allows;
# 4. runs the two-rank GPU tests (tests/gpu/test_gpu_ranks.py) in the mode that worked;
# 5. runs the GPU benchmark (python -m denseccl.bench --backend nccl), if present.
# Each step has a time cap and the steps share one overall budget (DENSECCL_GPU_BUDGET, default
# 560 s); a step that no longer fits is skipped and reported. Exit status: 0 when every step
# that ran passed, 1 otherwise. summary.txt in the log folder says what happened.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
out="${OUT:-$root/gpu-results}"
mkdir -p "$out"
budget="${DENSECCL_GPU_BUDGET:-560}"
started=$SECONDS
summary="$out/summary.txt"
: >"$summary"
exec > >(tee -a "$out/run.log") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
failed=0

note() { echo "$*" | tee -a "$summary"; }
left() { echo $((budget - (SECONDS - started))); }
# cap SECONDS: the smaller of SECONDS and what is left of the budget minus a margin
cap() { local c="$1" l; l=$(($(left) - 15)); [ "$l" -lt "$c" ] && c="$l"; echo "$c"; }
step() { echo; echo "=== $* ($(left) s of the budget left)"; }

# -- 1. Python and packages ---------------------------------------------------------------------
step "environment"
nvidia-smi -L 2>&1 | head -8 || note "nvidia-smi: not found"
PY=""
for candidate in "${DENSECCL_PYTHON:-}" python3 /opt/torch/.venv/bin/python3 "$root/.venv/bin/python" python; do
  [ -n "$candidate" ] || continue
  command -v "$candidate" >/dev/null 2>&1 || [ -x "$candidate" ] || continue
  if "$candidate" -c "import cupy" >/dev/null 2>&1; then PY="$candidate"; break; fi
  [ -z "$PY" ] && "$candidate" -c "import numpy" >/dev/null 2>&1 && PY="$candidate"
done
if [ -z "$PY" ]; then
  note "FAIL: no Python with numpy found (tried \$DENSECCL_PYTHON, python3, /opt/torch/.venv/bin/python3, .venv/bin/python)"
  exit 1
fi
PY="$(command -v "$PY" || echo "$PY")"
note "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"

probe_env() {
  "$PY" - <<'EOF'
import importlib, json, warnings
found = {}
for name in ("numpy", "cupy", "pytest", "torch", "mpi4py"):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
        found[name] = getattr(module, "__version__", "?")
    except Exception as error:
        found[name] = None
        found[name + "_error"] = f"{type(error).__name__}: {error}"[:200]
try:
    import cupy
    found["gpu"] = bool(cupy.is_available())
    found["cuda_runtime"] = cupy.cuda.runtime.runtimeGetVersion() if found["gpu"] else None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cupy.cuda import nccl
    found["nccl"] = nccl.get_version() if nccl.available else None
except Exception as error:
    found.setdefault("gpu", False)
    found["nccl"] = None
try:
    from mpi4py import MPI
    found["mpi"] = MPI.Get_library_version().splitlines()[0][:80]
except Exception as error:
    found["mpi"] = None
    found["mpi_error"] = f"{type(error).__name__}: {error}"[:200]
try:
    import torch
    found["torch_cuda"] = bool(torch.cuda.is_available())
except Exception:
    found["torch_cuda"] = False
print(json.dumps(found))
EOF
}
has() { echo "$envjson" | "$PY" -c "import json,sys; v=json.load(sys.stdin).get('$1'); sys.exit(0 if v not in (None, False) else 1)"; }

envjson="$(probe_env)"
echo "found: $envjson"
cuda_major="$("$PY" -c 'import cupy; print(cupy.cuda.runtime.runtimeGetVersion() // 1000)' 2>/dev/null || echo 12)"
[ "$cuda_major" -ge 13 ] 2>/dev/null && suffix=13 || suffix=12
wanted=()
has numpy || wanted+=(numpy)
has cupy || wanted+=("cupy-cuda${suffix}x")
has nccl || wanted+=("nvidia-nccl-cu${suffix}")
has pytest || wanted+=(pytest)
has mpi || wanted+=(mpich)
prefix=/tmp/denseccl-prefix
if [ "${#wanted[@]}" -gt 0 ]; then
  note "missing: ${wanted[*]} — trying pip (a failure here is reported, and the steps that need it skip)"
  if [ -d "$root/.whl" ]; then
    source_args=(--no-index --find-links "$root/.whl")
  else
    source_args=(--timeout 5 --retries 0)
  fi
  for package in "${wanted[@]}"; do
    if timeout "$(cap 60)" "$PY" -m pip install --disable-pip-version-check -q --prefix "$prefix" "${source_args[@]}" "$package" >"$out/pip.tmp" 2>&1; then
      note "pip: installed $package"
    else
      note "pip: could not install $package: $(grep -v '^\s*$' "$out/pip.tmp" | tail -n 2 | tr '\n' ' ' | cut -c1-300)"
    fi
  done
  rm -f "$out/pip.tmp"
  site="$("$PY" -c "import sysconfig; print(sysconfig.get_path('purelib', vars={'base': '$prefix', 'platbase': '$prefix'}))")"
  export PYTHONPATH="$site:$PYTHONPATH" PATH="$prefix/bin:$PATH" LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  envjson="$(probe_env)"
  echo "after pip: $envjson"
fi
echo "$envjson" >"$out/env.json"
if ! has gpu || ! has nccl; then
  note "FAIL: CuPy with a GPU and NCCL is needed: $("$PY" -c 'from denseccl.nccl_bootstrap import nccl_missing; print(nccl_missing())' 2>&1 | tail -n 1)"
  exit 1
fi
if ! has pytest; then
  note "FAIL: pytest is missing and could not be installed"
  exit 1
fi
note "environment: $("$PY" -c 'from denseccl.nccl_bootstrap import describe_environment as d; print(d())' 2>&1 | tail -n 1); torch CUDA: $(has torch_cuda && echo yes || echo no); MPI: $(has mpi && echo yes || echo no)"

run_pytest() {  # name, cap, files...
  local name="$1" limit="$2"; shift 2
  if [ "$(cap "$limit")" -lt 30 ]; then note "SKIP $name: not enough of the budget left"; return; fi
  timeout -k 10 "$(cap "$limit")" "$PY" -m pytest -q -rs -p no:cacheprovider "$@" 2>&1 | tee "$out/$name.log"
  local status=${PIPESTATUS[0]}
  local last; last="$(grep -E '(passed|failed|skipped|error)' "$out/$name.log" | tail -n 1)"
  if [ "$status" -eq 0 ]; then note "PASS $name: $last"; elif [ "$status" -eq 124 ]; then note "FAIL $name: timed out"; failed=1; else note "FAIL $name (exit $status): $last"; failed=1; fi
}

# -- 2. one rank ---------------------------------------------------------------------------------
step "GPU tests in this process (all of tests/gpu but the two-rank file)"
run_pytest pytest-single 260 tests/gpu --ignore=tests/gpu/test_gpu_ranks.py

# -- 3. two ranks on one GPU ---------------------------------------------------------------------
step "two ranks on one GPU: plain, then NCCL_HOSTID per rank"
if [ "$(cap 200)" -ge 60 ]; then
  timeout -k 10 "$(cap 200)" "$PY" tests/gpu/two_ranks.py "$out/two-ranks.json" | tee "$out/two-ranks.tmp"
  mode="$(grep '^MODE=' "$out/two-ranks.tmp" | tail -n 1 | cut -d= -f2)"
  grep '^two ranks' "$out/two-ranks.tmp" | while read -r line; do note "$line"; done
  rm -f "$out/two-ranks.tmp"
  export DENSECCL_GPU_TWO_RANKS="${mode:-no}"
  note "two-rank mode for the tests: ${mode:-no (the probe did not finish)}"
else
  note "SKIP two-rank probe: not enough of the budget left"
  export DENSECCL_GPU_TWO_RANKS=no
fi

# -- 4. two ranks ---------------------------------------------------------------------------------
step "two-rank GPU tests"
if [ "$DENSECCL_GPU_TWO_RANKS" = no ]; then
  note "SKIP two-rank GPU tests: two ranks cannot run here (see two-ranks.json)"
else
  run_pytest pytest-ranks 260 tests/gpu/test_gpu_ranks.py
fi

# -- 5. benchmark --------------------------------------------------------------------------------
step "GPU benchmark"
if ! "$PY" -c "import denseccl.bench" >/dev/null 2>&1; then
  note "SKIP bench: denseccl.bench is not there ($("$PY" -c 'import denseccl.bench' 2>&1 | tail -n 1))"
elif [ "$(cap 150)" -lt 40 ]; then
  note "SKIP bench: not enough of the budget left"
else
  bench_args=(-m denseccl.bench --backend nccl -b 4K -e 16M -f 16 -c allreduce,allgather,reduce_scatter --layouts all -n 10 -w 2 --rounds 2 --json "$out/bench.json")
  mpiexec_bin="$(dirname "$PY")/mpiexec"
  [ -x "$mpiexec_bin" ] || mpiexec_bin="$(command -v mpiexec || true)"
  two_ranks() {  # the command line that runs "$PY $@" on two ranks in the mode that worked
    if [ "$DENSECCL_GPU_TWO_RANKS" = hostid ]; then
      local split=(-env NCCL_SOCKET_IFNAME lo -env NCCL_IB_DISABLE 1)
      command=("$mpiexec_bin" -n 1 -env NCCL_HOSTID denseccl-rank0 "${split[@]}" "$PY" "$@" : -n 1 -env NCCL_HOSTID denseccl-rank1 "${split[@]}" "$PY" "$@")
    else
      command=("$mpiexec_bin" -n 2 "$PY" "$@")
    fi
  }
  if has mpi && [ -n "$mpiexec_bin" ] && [ "$DENSECCL_GPU_TWO_RANKS" != no ]; then
    two_ranks "${bench_args[@]}"
  else
    command=("$PY" "${bench_args[@]}")
    note "bench: one rank (MPI: $(has mpi && echo yes || echo no), mpiexec: ${mpiexec_bin:-none}, two ranks: $DENSECCL_GPU_TWO_RANKS)"
  fi
  echo "+ ${command[*]}"
  timeout -k 10 "$(cap 150)" "${command[@]}" 2>&1 | tee "$out/bench.log"
  status=${PIPESTATUS[0]}
  if [ "$status" -eq 0 ]; then note "PASS bench: $(grep -i 'avg bus bandwidth' "$out/bench.log" | tail -n 1)"; else note "FAIL bench (exit $status): $(tail -n 1 "$out/bench.log")"; failed=1; fi
  # DDP step time of a channels-last ConvNet: denseccl vs gloo vs nccl (two ranks only)
  if has mpi && has torch_cuda && [ -n "$mpiexec_bin" ] && [ "$DENSECCL_GPU_TWO_RANKS" != no ] && [ "$(cap 90)" -ge 40 ]; then
    two_ranks examples/bench_ddp.py --rounds 3 --steps 10
    echo "+ ${command[*]}"
    timeout -k 10 "$(cap 90)" "${command[@]}" 2>&1 | tee "$out/bench-ddp.log"
    status=${PIPESTATUS[0]}
    if [ "$status" -eq 0 ]; then note "PASS DDP bench (table in bench-ddp.log)"; else note "FAIL DDP bench (exit $status): $(tail -n 1 "$out/bench-ddp.log")"; failed=1; fi
  else
    note "SKIP DDP bench: needs MPI, torch with CUDA and two ranks on the GPU"
  fi
fi

echo
note "done in $((SECONDS - started)) s; $([ "$failed" -eq 0 ] && echo 'every step that ran passed' || echo 'some steps FAILED')"
echo "--- summary"; cat "$summary"
exit "$failed"
