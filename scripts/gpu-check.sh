#!/usr/bin/env bash
# ferry's whole GPU run, from the carry folder that scripts/gpu-build.sh made; builds nothing.
#   gpu-check.sh OUT            (build/gpu-carry/gpu-check.sh OUT, or scripts/gpu-check.sh OUT)
#
# Every step runs under its own `timeout`; the limits add up to at most 300 s (5 minutes
# on an H200, so that a second run fits in the 15 minutes a task may hold the machine).
# In order, so that the most important verdicts come first:
#   carry              the carry folder is whole (MANIFEST's sha256) and every binary loads
#   machine            nvidia-smi (GPU, PCIe link now and at most, memory, driver), CPU, RAM,
#                      ferry-bench probe (JSON)
#   gpu-tests          ferry-tests-gpu once, plain (JUnit XML)
#   example-*          stream_ordering, activation_offload, layer_streaming
#   bench-suite        ferry-bench --quick --suite gpu: link, codec, offload, stream (JSON, CSV,
#                      summary, the plots' data; plots where gnuplot is installed)
#   bench-overlap      ferry-bench --quick overlap (JSON)
#   bench-device-nvme  ferry-bench --quick device-nvme (fio as the disk reference where it is
#                      installed, else the tier's own host I/O)
#   memcheck           compute-sanitizer memcheck over the GPU tests, with the leak check and
#                      the races of stream-ordered allocations (use before alloc, use after
#                      free on another stream) tracked; API errors
#                      are not counted (tests provoke them on purpose: a copy from a null
#                      pointer, cudaSetDevice(1) on a one-GPU machine) and are checked by the
#                      tests themselves
#   racecheck          compute-sanitizer racecheck over the tests of the kernels with shared
#                      memory ([codec])
#   micro-schedule     ferry-micro-schedule: host cost per scheduled move (JSON)
# OUT gets summary.md (one line per step: passed / failed / timed out / skipped, with its
# time and limit), gpu-check.log (everything printed), a log per step and the JSON files.
# Exit status: 0 when no step failed or timed out, 1 otherwise, 2 for bad use.
#
# Without a GPU (here, and in CI) the same command is the dry run: every step runs from
# the carry folder and each that needs a GPU says so ("skipped (needs a GPU)"), which shows
# that the script, its paths and its limits are right before a GPU is spent on it. On a
# machine with a GPU, a step that finds none usable has failed.
#
# Environment (for a rerun after a fix, and for the script's own tests):
#   FERRY_GPU_CARRY          the carry folder (default: this script's folder when it holds
#                            bin/, else build/gpu-carry beside scripts/)
#   FERRY_GPU_CHECK_STEPS    comma-separated steps to run (default: all)
#   FERRY_GPU_CHECK_LIMITS   comma-separated step=seconds overrides, e.g. memcheck=90
#   FERRY_GPU_CHECK_BUDGET_S the most the limits may add up to (default 300)
#   FERRY_GPU_CHECK_MODE     gpu or dry-run (default: gpu when nvidia-smi lists a GPU)
#   FERRY_GPU_CHECK_SCRATCH  folder for the tests' and scenarios' files (default:
#                            $TMPDIR or /tmp, in a folder of its own, removed at the end)
set -uo pipefail

usage() { echo "usage: gpu-check.sh OUT (see the comment at the top of this script)" >&2; exit 2; }
[[ $# -eq 1 && -n $1 ]] || usage

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
if [[ -n ${FERRY_GPU_CARRY:-} ]]; then
  carry=$FERRY_GPU_CARRY
elif [[ -d $here/bin ]]; then
  carry=$here
else
  carry=$here/../build/gpu-carry
fi
[[ -d $carry/bin ]] || { echo "gpu-check: no carry folder at $carry (make it with scripts/gpu-build.sh)" >&2; exit 2; }
carry=$(cd "$carry" && pwd)
bin=$carry/bin

mkdir -p "$1" || exit 2
out=$(cd "$1" && pwd)
exec > >(tee "$out/gpu-check.log") 2>&1

# --- the steps and their limits (seconds) ---------------------------------------------
steps=(carry machine gpu-tests example-stream_ordering example-activation_offload example-layer_streaming
       bench-suite bench-overlap bench-device-nvme memcheck racecheck micro-schedule)
declare -A limit=(
  [carry]=5 [machine]=10 [gpu-tests]=50
  [example-stream_ordering]=10 [example-activation_offload]=20 [example-layer_streaming]=20
  [bench-suite]=70 [bench-overlap]=15 [bench-device-nvme]=20
  [memcheck]=45 [racecheck]=20 [micro-schedule]=10
)
budget=${FERRY_GPU_CHECK_BUDGET_S:-300}
IFS=',' read -r -a overrides <<<"${FERRY_GPU_CHECK_LIMITS:-}"
for o in "${overrides[@]}"; do
  [[ -z $o ]] && continue
  name=${o%%=*}
  value=${o#*=}
  [[ -n ${limit[$name]+x} ]] || { echo "gpu-check: FERRY_GPU_CHECK_LIMITS names no step '$name' (steps: ${steps[*]})" >&2; exit 2; }
  [[ $value =~ ^[1-9][0-9]*$ ]] || { echo "gpu-check: FERRY_GPU_CHECK_LIMITS: '$o' is not step=seconds" >&2; exit 2; }
  limit[$name]=$value
done
declare -A selected=()
if [[ -n ${FERRY_GPU_CHECK_STEPS:-} ]]; then
  IFS=',' read -r -a chosen <<<"$FERRY_GPU_CHECK_STEPS"
  for s in "${chosen[@]}"; do
    [[ -n ${limit[$s]+x} ]] || { echo "gpu-check: FERRY_GPU_CHECK_STEPS names no step '$s' (steps: ${steps[*]})" >&2; exit 2; }
    selected[$s]=1
  done
else
  for s in "${steps[@]}"; do selected[$s]=1; done
fi
planned=0
for s in "${steps[@]}"; do [[ -n ${selected[$s]:-} ]] && planned=$((planned + limit[$s])); done
if ((planned > budget)); then
  echo "gpu-check: the steps' limits add up to ${planned} s, over the budget of ${budget} s (FERRY_GPU_CHECK_BUDGET_S)" >&2
  exit 2
fi

# --- the machine: a GPU or the dry run ---------------------------------------------------
mode=${FERRY_GPU_CHECK_MODE:-}
if [[ -z $mode ]]; then
  # A GPU that nvidia-smi lists, or an NVIDIA device node or driver entry even where
  # nvidia-smi fails: on such a machine a step that finds no usable GPU has failed.
  mode=dry-run
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then mode=gpu; fi
  if [[ -e /dev/nvidia0 ]] || compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; then mode=gpu; fi
fi
[[ $mode == gpu || $mode == dry-run ]] || { echo "gpu-check: FERRY_GPU_CHECK_MODE must be gpu or dry-run, not '$mode'" >&2; exit 2; }

# Libraries: the carried ones, then cuBLAS 13 wherever the machine has it (the toolkit,
# or PyTorch's nvidia-* wheels).
libpath=$carry/lib
cublas_dir=""
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13 '; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | tr ' ' '\n' |
             sed 's|$|/nvidia/cublas/lib|; p; s|/cublas/lib$|/cu13/lib|'); do
    if [[ -f $d/libcublas.so.13 ]]; then cublas_dir=$d; break; fi
  done
  [[ -n $cublas_dir ]] && libpath=$libpath:$cublas_dir
fi
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# compute-sanitizer: on PATH, with the toolkit, or from PyPI's nvidia-cuda-sanitizer-api
# (scripts/deps.sh installs that one here, so the dry run checks the sanitizer's options).
if ! command -v compute-sanitizer >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer \
           $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null | tr ' ' '\n' |
             sed 's|$|/nvidia/cu13/bin|'); do
    if [[ -x $d/compute-sanitizer ]]; then export PATH=$PATH:$d; break; fi
  done
fi
scratch=${FERRY_GPU_CHECK_SCRATCH:-${TMPDIR:-/tmp}}/ferry-gpu-check.$$
mkdir -p "$scratch" || exit 2
trap 'rm -rf "$scratch"' EXIT
export FERRY_TEST_SCRATCH=$scratch

start=$(date +%s)
echo "== ferry gpu-check: mode $mode, carry $carry"
sed -n '2,3p' "$carry/MANIFEST" 2>/dev/null
echo "== ${#selected[@]} steps, limits adding up to ${planned} s (budget ${budget} s); output in $out"

# --- running a step ----------------------------------------------------------------------
summary_rows=()
failures=0
needs_gpu_pattern='needs a GPU and none is usable here|no CUDA device here|SKIPPED: no usable CUDA device'

# run_step NAME COMMAND...: the command under `timeout` (its whole process group is
# stopped at the limit, SIGKILL 5 s later), output in OUT/NAME.log; then its verdict.
run_step() {
  local name=$1; shift
  local log=$out/$name.log
  if [[ -z ${selected[$name]:-} ]]; then
    return
  fi
  echo "== [$(($(date +%s) - start)) s] $name (limit ${limit[$name]} s)"
  local t0 t1 rc verdict
  t0=$(date +%s.%N)
  if declare -F "$1" >/dev/null; then  # a step of this script: a bash of its own under timeout
    timeout --kill-after=5 "${limit[$name]}" bash -c '"$@"' "$name" "$@" >"$log" 2>&1
  else
    timeout --kill-after=5 "${limit[$name]}" "$@" >"$log" 2>&1
  fi
  rc=$?
  t1=$(date +%s.%N)
  local took
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    verdict="timed out"
  elif [[ $rc -eq 77 ]] || grep -qE "$needs_gpu_pattern" "$log"; then
    local why
    why=$(sed -n 's/^gpu-check skip: //p' "$log" | tail -n 1)
    if [[ $mode == dry-run ]]; then
      verdict="skipped (${why:-needs a GPU})"
    else
      verdict="failed (${why:-no GPU usable})"
    fi
  elif [[ $rc -eq 0 ]]; then
    verdict="passed"
  else
    verdict="failed (exit $rc)"
  fi
  if [[ $verdict == passed && -n ${STEP_CHECK:-} ]]; then  # a step's own check of what it wrote
    local why
    if ! why=$($STEP_CHECK 2>&1); then verdict="failed ($why)"; fi
  fi
  [[ $verdict == passed || $verdict == skipped* ]] || failures=$((failures + 1))
  echo "   $verdict in $took s; last lines of $name.log:"
  tail -n 6 "$log" | sed 's/^/   | /'
  summary_rows+=("| $name | $verdict | $took | ${limit[$name]} | $name.log |")
}

# --- the steps ---------------------------------------------------------------------------
step_carry() {
  local rc=0
  if [[ -f $carry/MANIFEST ]]; then
    (cd "$carry" && grep -E '^[0-9a-f]{64}  ' MANIFEST | sha256sum --check --quiet) || { echo "carry: files differ from MANIFEST"; rc=1; }
  else
    echo "carry: no MANIFEST in $carry"; rc=1
  fi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  for b in "$bin"/*; do
    local missing
    missing=$(ldd "$b" 2>&1 | grep 'not found')
    if [[ -n $missing ]]; then echo "carry: $(basename "$b") cannot load: $missing"; rc=1; else echo "loads: $(basename "$b")"; fi
  done
  return $rc
}

step_machine() {
  local rc=0
  uname -a
  echo "cpus $(nproc)"; free -g | head -n 2
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,memory.total,driver_version,clocks.max.sm \
      --format=csv || rc=1
    nvidia-smi topo -m 2>/dev/null | head -n 5
  else
    echo "nvidia-smi: not installed"
    [[ $mode == gpu ]] && rc=1
  fi
  command -v compute-sanitizer >/dev/null 2>&1 && compute-sanitizer --version | tail -n 1
  "$bin/ferry-bench" --scratch "$scratch" probe --json "$out/machine.json" >/dev/null || rc=1
  echo "probe: machine.json"
  return $rc
}

check_junit() {
  local xml=$out/gpu-tests.xml
  [[ -s $xml ]] || { echo "no JUnit XML"; return 1; }
  local tests
  tests=$(grep -o '<testsuite [^>]*tests="[0-9]*"' "$xml" | head -n 1 | sed 's/.*tests="\([0-9]*\)"/\1/')
  [[ ${tests:-0} -gt 0 ]] || { echo "the JUnit XML lists no test"; return 1; }
  echo "$tests test cases"
}

# compute-sanitizer ARGS...: without a GPU it cannot start the tests, but it still parses
# its options first, so the dry run catches a wrong one (it prints its usage and exits 255).
sanitizer() {
  if ! command -v compute-sanitizer >/dev/null 2>&1; then
    echo "gpu-check skip: compute-sanitizer not found"
    return 77
  fi
  local log rc
  log=$(mktemp)
  compute-sanitizer "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  if [[ $mode == dry-run && $rc -ne 0 ]] && grep -q 'Target application terminated before first instrumented API call' "$log"; then
    echo "gpu-check skip: needs a GPU; compute-sanitizer $(compute-sanitizer --version | sed -n 's/^Version \([^ ]*\).*/\1/p') took the options"
    rc=77
  fi
  rm -f "$log"
  return $rc
}

export carry bin out scratch mode
export -f step_carry step_machine sanitizer
plots=()
command -v gnuplot >/dev/null 2>&1 || plots=(--no-plots)

run_step carry step_carry
run_step machine step_machine
STEP_CHECK=check_junit run_step gpu-tests "$bin/ferry-tests-gpu" -r junit -o "$out/gpu-tests.xml"
run_step example-stream_ordering "$bin/stream_ordering"
run_step example-activation_offload "$bin/activation_offload"
run_step example-layer_streaming "$bin/layer_streaming"
run_step bench-suite "$bin/ferry-bench" --quick --suite gpu --scratch "$scratch" --json "$out/bench.json" \
  --out "$out/suite" "${plots[@]}"
run_step bench-overlap "$bin/ferry-bench" --quick --json "$out/bench-overlap.json" overlap
run_step bench-device-nvme "$bin/ferry-bench" --quick --scratch "$scratch" --json "$out/bench-device-nvme.json" device-nvme
run_step memcheck sanitizer --tool memcheck --leak-check full --report-api-errors no \
  --track-stream-ordered-races all --error-exitcode 99 "$bin/ferry-tests-gpu" -r compact
run_step racecheck sanitizer --tool racecheck --error-exitcode 99 "$bin/ferry-tests-gpu" -r compact "[codec]"
run_step micro-schedule "$bin/ferry-micro-schedule" --benchmark_min_time=0.05 --benchmark_format=json \
  --benchmark_out="$out/micro-schedule.json"

# --- the summary -------------------------------------------------------------------------
took=$(($(date +%s) - start))
verdict=$([[ $failures -eq 0 ]] && echo "passed" || echo "$failures failed")
{
  echo "# ferry gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo
  if [[ $mode == gpu ]]; then
    echo "Mode: **gpu** ($(nvidia-smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null | head -n 1))."
  else
    echo "Mode: **dry run** (no GPU here: the steps that need one say so)."
  fi
  echo "Carry: $(sed -n '2p' "$carry/MANIFEST" 2>/dev/null)."
  echo "Planned: ${planned} s of limits (budget ${budget} s); took ${took} s. Verdict: **${verdict}**."
  echo
  echo "| step | result | seconds | limit (s) | log |"
  echo "|---|---|---|---|---|"
  printf '%s\n' "${summary_rows[@]}"
} >"$out/summary.md"
echo "== summary ($out/summary.md)"
cat "$out/summary.md"
[[ $failures -eq 0 ]]
