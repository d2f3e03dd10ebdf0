#!/usr/bin/env bash
# ferry's whole GPU run, from the carry folder that scripts/gpu-build.sh made; builds nothing.
#   gpu-check.sh OUT            (build/gpu-carry/gpu-check.sh OUT, or scripts/gpu-check.sh OUT)
#
# Every step runs under its own `timeout` (SIGTERM at its limit, SIGKILL 2 s later); the
# limits plus those 2 s per step add up to at most 300 s (5 minutes on an H200, so that a
# second run fits in the 15 minutes a task may hold the machine). Each limit is about twice
# the step's time on the H200 of 2026-12-04 (docs/gpu-runs.md, "The steps and their
# limits"). In order, so that the most important verdicts come first:
#   carry              the carry folder is whole (MANIFEST's sha256) and every binary loads
#   machine            nvidia-smi (GPU, PCIe link now and at most, memory, driver), CPU, RAM,
#                      ferry-bench probe (machine.json)
#   gpu-tests          ferry-tests-gpu once, plain (gpu-tests.xml, JUnit)
#   example-*          stream_ordering, activation_offload, layer_streaming, kv_offload (its NVMe tier in the scratch folder)
#   bench-suite        ferry-bench --quick --suite gpu: link, kv, codec, offload, stream (bench.json,
#                      and suite/: results.json, results.csv, summary.md, the advice; plots
#                      where gnuplot is installed, else `scripts/bench-plot.sh` cannot redraw
#                      them later: run the suite here with gnuplot for plots)
#   bench-overlap      ferry-bench --quick overlap (bench-overlap.json)
#   bench-device-nvme  ferry-bench --quick device-nvme (fio as the disk reference where it is
#                      installed, else the tier's own host I/O) (bench-device-nvme.json)
#   memcheck           compute-sanitizer memcheck over the GPU test cases of every pipeline
#                      and every NVMe path (memcheck_cases below: tensor_cache, kv_cache,
#                      layer_streamer, the scheduler with its NVMe staging, block moves,
#                      pinned pool, device arena; not the codec kernel sweeps, which
#                      racecheck runs, nor the device_tier size sweep: the whole suite
#                      needs well over 60 s under memcheck), with the leak check and the
#                      races of stream-ordered allocations (use before alloc, use after
#                      free on another stream) tracked; the log lists the cases first and
#                      each case's time. CUDA API errors are not counted: tests provoke
#                      them on purpose (a copy from a null pointer, cudaSetDevice(1) on a
#                      one-GPU machine) and check each themselves
#   racecheck          compute-sanitizer racecheck over the codec kernel tests (the kernels
#                      with shared memory), each case's time in the log
#   micro              ferry-micro-schedule (host cost per scheduled move) and
#                      ferry-micro-memory (pinned allocation per call) (micro-*.json)
# and, only when FERRY_GPU_CHECK_STEPS names them (or `python`: carry, machine and these
# three; their limits do not fit the default run's budget beside the others):
#   python-build       ferry-torch built there from the carry's src/ (pip, offline, with the
#                      machine's nvcc, nanobind and scikit-build-core: an extension is built
#                      for one Python version, and this one's is not the building machine's)
#   python-tests       its pytest suite, the CUDA cases included (python-tests.xml, JUnit),
#                      then examples/torch_gpt on the GPU (--device cuda)
#   python-bench       python/benchmarks/offload_activations.py --device cuda at the H200
#                      shape (16 x Linear 8192 + GELU, 16384 tokens, bf16: 8 GiB saved a step)
#                      against save_on_cpu, no offload and the link floor (python-bench.json);
#                      offload_adamw.py --device cuda: OffloadAdamW with CUDA parameters
#                      against torch's AdamW resident on the GPU (python-bench-adamw.json);
#                      stream_layers.py --device cuda --nvme: layers streamed through CUDA
#                      slots against them resident and checkpointed, and inference from
#                      NVMe against the disk's own reads (python-bench-layers.json)
# OUT gets summary.md (one line per step: passed / failed / timed out / skipped /
# interrupted, with its time and limit; rewritten after every step, so a run stopped from
# outside still leaves one), gpu-check.log (everything printed), a log per step and the
# JSON files. OUT must be new, empty, or the OUT of an earlier run (replaced).
# Exit status: 0 when no step failed or timed out, 1 otherwise, 2 for bad use, 128+N when
# stopped by signal N (the step running then is stopped too).
#
# Without a GPU (here, and in CI) the same command is the dry run: every step runs from
# the carry folder and each that needs a GPU says so ("skipped (needs a GPU)"); the
# sanitizer steps still have compute-sanitizer check their options. That shows that the
# script, its paths and its limits are right before a GPU is spent on it. On a machine
# with a GPU (nvidia-smi lists one, or /dev/nvidia0 exists), a step that finds none
# usable has failed.
#
# Environment (for a rerun after a fix, and for the script's own tests):
#   FERRY_GPU_CARRY          the carry folder (default: this script's folder when it holds
#                            bin/, else build/gpu-carry beside scripts/)
#   FERRY_GPU_CHECK_STEPS    comma-separated steps to run (default: all)
#   FERRY_GPU_CHECK_LIMITS   comma-separated step=seconds overrides, e.g. memcheck=90
#   FERRY_GPU_CHECK_BUDGET_S the most the limits (plus 2 s a step) may add up to (default 300)
#   FERRY_GPU_CHECK_LIMIT_SCALE  a whole factor (1-20, default 1) the limits are run with,
#                            for a machine slower than the GPU machine (the dry run in CI,
#                            2 busy cores); the budget check and the summary's limit column
#                            keep the GPU machine's limits
#   FERRY_GPU_CHECK_MEMCHECK_CASES  the Catch2 test spec memcheck runs (default: memcheck_cases
#                            below; '*' for the whole suite, which took over 60 s on the
#                            H200: raise memcheck's limit with it, FERRY_GPU_CHECK_LIMITS)
#   FERRY_GPU_CHECK_MODE     gpu or dry-run (default: gpu where a GPU is seen)
#   FERRY_GPU_CHECK_SCRATCH  folder for the tests' files (default: the first of $TMPDIR,
#                            /var/tmp, /tmp that exists; a folder of its own in it, removed
#                            at the end). ferry-bench picks its own (O_DIRECT-capable) one.
set -uo pipefail

usage() { echo "usage: gpu-check.sh OUT (see the comment at the top of this script)" >&2; exit 2; }
[[ $# -eq 1 && -n $1 ]] || usage
case $1 in -*) echo "gpu-check: OUT '$1' looks like an option; give a folder (./$1 if you mean it)" >&2; usage ;; esac

# --- the steps and their limits (seconds) ---------------------------------------------
steps=(carry machine gpu-tests example-stream_ordering example-activation_offload example-layer_streaming
       example-kv_offload bench-suite bench-overlap bench-device-nvme memcheck racecheck micro
       python-build python-tests python-bench)
default_steps=(carry machine gpu-tests example-stream_ordering example-activation_offload example-layer_streaming
               example-kv_offload bench-suite bench-overlap bench-device-nvme memcheck racecheck micro)
python_steps=(carry machine python-build python-tests python-bench)
# Set from the H200 run of 2026-12-04 (seconds there -> limit; docs/gpu-runs.md): carry
# 0.2 -> 10 (the CI dry run's busy cores need it), machine 1.2 -> 8, gpu-tests 15.1 -> 30,
# the examples 1.1-1.4 -> 8 and activation_offload ~13 -> 30, bench-suite 3.8 to its
# failure in the 4th of 5 scenarios (offload and stream took 1-3 s each alone) -> 30,
# bench-overlap 0.8 -> 8, bench-device-nvme 5.6 -> 15, racecheck 20.0 -> 40, micro 3.5 ->
# 10; memcheck, over memcheck_cases rather than the whole suite (which passed 60 s), 65.
declare -A limit=(
  [carry]=10 [machine]=8 [gpu-tests]=30
  [example-stream_ordering]=8 [example-activation_offload]=30 [example-layer_streaming]=8 [example-kv_offload]=8
  [bench-suite]=30 [bench-overlap]=8 [bench-device-nvme]=15
  [memcheck]=65 [racecheck]=40 [micro]=10
  [python-build]=100 [python-tests]=50 [python-bench]=120
)
kill_after=2
number() { [[ $1 =~ ^[1-9][0-9]{0,4}$ ]]; }  # 1 .. 99999
budget=${FERRY_GPU_CHECK_BUDGET_S:-300}
number "$budget" || { echo "gpu-check: FERRY_GPU_CHECK_BUDGET_S '$budget' is not a number of seconds (1-99999)" >&2; exit 2; }
IFS=',' read -r -a overrides <<<"${FERRY_GPU_CHECK_LIMITS:-}"
for o in "${overrides[@]}"; do
  [[ -z $o ]] && continue
  name=${o%%=*}
  value=${o#*=}
  [[ -n $name && -n ${limit[$name]+x} ]] || { echo "gpu-check: FERRY_GPU_CHECK_LIMITS names no step '$name' (steps: ${steps[*]})" >&2; exit 2; }
  [[ $o == *=* ]] && number "$value" || { echo "gpu-check: FERRY_GPU_CHECK_LIMITS: '$o' is not step=seconds (1-99999)" >&2; exit 2; }
  limit[$name]=$value
done
declare -A selected=()
if [[ -n ${FERRY_GPU_CHECK_STEPS:-} ]]; then
  IFS=',' read -r -a chosen <<<"$FERRY_GPU_CHECK_STEPS"
  for s in "${chosen[@]}"; do
    [[ -z $s ]] && continue
    if [[ $s == python ]]; then
      for p in "${python_steps[@]}"; do selected[$p]=1; done
      continue
    fi
    [[ -n ${limit[$s]+x} ]] || { echo "gpu-check: FERRY_GPU_CHECK_STEPS names no step '$s' (steps: ${steps[*]})" >&2; exit 2; }
    selected[$s]=1
  done
  ((${#selected[@]} > 0)) || { echo "gpu-check: FERRY_GPU_CHECK_STEPS names no step (steps: ${steps[*]})" >&2; exit 2; }
else
  for s in "${default_steps[@]}"; do selected[$s]=1; done
fi
scale=${FERRY_GPU_CHECK_LIMIT_SCALE:-1}
[[ $scale =~ ^([1-9]|1[0-9]|20)$ ]] || { echo "gpu-check: FERRY_GPU_CHECK_LIMIT_SCALE '$scale' is not a whole factor from 1 to 20" >&2; exit 2; }
planned=0
for s in "${steps[@]}"; do [[ -n ${selected[$s]:-} ]] && planned=$((planned + limit[$s] + kill_after)); done
if ((planned > budget)); then
  echo "gpu-check: the steps' limits (plus ${kill_after} s each to stop a step) add up to ${planned} s, over the budget of ${budget} s (FERRY_GPU_CHECK_BUDGET_S)" >&2
  exit 2
fi
mode=${FERRY_GPU_CHECK_MODE:-}
[[ -z $mode || $mode == gpu || $mode == dry-run ]] || { echo "gpu-check: FERRY_GPU_CHECK_MODE must be gpu or dry-run, not '$mode'" >&2; exit 2; }

# --- the carry folder and OUT --------------------------------------------------------------
here=$(dirname -- "$(readlink -f -- "${BASH_SOURCE[0]}")")
if [[ -n ${FERRY_GPU_CARRY:-} ]]; then
  carry=$FERRY_GPU_CARRY
elif [[ -d $here/bin ]]; then
  carry=$here
else
  carry=$here/../build/gpu-carry
fi
[[ -d $carry/bin ]] || { echo "gpu-check: no carry folder at $carry (make it with scripts/gpu-build.sh)" >&2; exit 2; }
carry=$(cd -- "$carry" && pwd) || exit 2
bin=$carry/bin

if [[ -e $1 && ! -d $1 ]]; then echo "gpu-check: OUT '$1' is not a folder" >&2; exit 2; fi
mkdir -p -- "$1" || { echo "gpu-check: cannot make OUT '$1'" >&2; exit 2; }
out=$(cd -- "$1" && pwd) || { echo "gpu-check: cannot enter OUT '$1'" >&2; exit 2; }
[[ -w $out ]] || { echo "gpu-check: OUT '$out' is not writable" >&2; exit 2; }
if [[ -n $(ls -A -- "$out") ]]; then
  [[ -f $out/gpu-check.log ]] || { echo "gpu-check: OUT '$out' holds files that are not an earlier gpu-check's; choose a new folder" >&2; exit 2; }
fi
exec 9>"$out/.gpu-check.lock"
flock -n 9 || { echo "gpu-check: another gpu-check is writing into '$out'" >&2; exit 2; }
find "$out" -mindepth 1 -maxdepth 1 ! -name .gpu-check.lock -exec rm -rf -- {} +  # an earlier run's files
exec > >(tee "$out/gpu-check.log") 2>&1

# --- the machine: a GPU or the dry run ---------------------------------------------------
smi() { timeout --kill-after=1 10 nvidia-smi "$@"; }
if [[ -z $mode ]]; then
  # A GPU that nvidia-smi lists, or an NVIDIA device node or driver entry even where
  # nvidia-smi fails: on such a machine a step that finds no usable GPU has failed.
  mode=dry-run
  if command -v nvidia-smi >/dev/null 2>&1 && smi -L 2>/dev/null | grep -q '^GPU '; then mode=gpu; fi
  if [[ -e /dev/nvidia0 ]] || compgen -G '/proc/driver/nvidia/gpus/*' >/dev/null; then mode=gpu; fi
fi

# Libraries: the carried ones, then cuBLAS 13 wherever the machine has it (the toolkit,
# or PyTorch's nvidia-* wheels).
sites=$(timeout 10 python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null || true)
libpath=$carry/lib
if ! ldconfig -p 2>/dev/null | grep -q 'libcublas\.so\.13 '; then
  for d in /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
           $(for p in $sites; do echo "$p/nvidia/cublas/lib $p/nvidia/cu13/lib"; done); do
    if [[ -f $d/libcublas.so.13 ]]; then libpath=$libpath:$d; break; fi
  done
fi
export LD_LIBRARY_PATH=$libpath${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# compute-sanitizer: on PATH, with the toolkit, or from PyPI's nvidia-cuda-sanitizer-api
# (scripts/deps.sh installs that one on the CPU machine, so the dry run checks the options).
if ! command -v compute-sanitizer >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda/compute-sanitizer $(for p in $sites; do echo "$p/nvidia/cu13/bin"; done); do
    if [[ -x $d/compute-sanitizer ]]; then export PATH=$PATH:$d; break; fi
  done
fi
scratch_base=${FERRY_GPU_CHECK_SCRATCH:-}
if [[ -z $scratch_base ]]; then
  for d in "${TMPDIR:-}" /var/tmp /tmp; do
    if [[ -n $d && -d $d && -w $d ]]; then scratch_base=$d; break; fi
  done
fi
[[ -d $scratch_base && -w $scratch_base ]] || { echo "gpu-check: no writable scratch folder ('$scratch_base')" >&2; exit 2; }
scratch=$(mktemp -d "$(cd -- "$scratch_base" && pwd)/ferry-gpu-check.XXXXXX") || exit 2
export FERRY_TEST_SCRATCH=$scratch TMPDIR=$scratch  # compute-sanitizer and mktemp need a TMPDIR that exists

start=$(date +%s)
echo "== ferry gpu-check: mode $mode, carry $carry"
sed -n '2,3p' "$carry/MANIFEST" 2>/dev/null
if [[ $here != "$carry" && -f $carry/gpu-check.sh ]] && ! cmp -s "$here/gpu-check.sh" "$carry/gpu-check.sh"; then
  echo "== note: this gpu-check.sh ($here) differs from the carry folder's copy; running this one"
fi
echo "== ${#selected[@]} steps, limits adding up to ${planned} s with ${kill_after} s a step to stop it (budget ${budget} s); output in $out"
if ((scale > 1)); then
  echo "== limits run ${scale}x longer here (FERRY_GPU_CHECK_LIMIT_SCALE=$scale)"
  [[ $mode == gpu ]] && echo "== warning: on a GPU machine this run may take ${scale}x the ${budget} s budget: the scale is for machines slower than it"
fi

# --- the summary, rewritten after every step -------------------------------------------------
summary_rows=()
failures=0
write_summary() {  # write_summary STATE
  local took=$(($(date +%s) - start)) verdict
  if [[ $1 == interrupted ]]; then
    verdict="interrupted"
  elif [[ $1 == running ]]; then
    verdict="running ($failures failed so far)"
  else
    verdict=$([[ $failures -eq 0 ]] && echo "passed" || echo "$failures failed")
  fi
  {
    echo "# ferry gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo
    if [[ $mode == gpu ]]; then
      echo "Mode: **gpu** (${gpu_line:-GPU not described by nvidia-smi})."
    else
      echo "Mode: **dry run** (no GPU here: the steps that need one say so)."
    fi
    echo "Carry: $(sed -n '2p' "$carry/MANIFEST" 2>/dev/null)."
    echo "Planned: ${planned} s of limits (budget ${budget} s); took ${took} s. Verdict: **${verdict}**."
    ((scale > 1)) && echo "Limits run ${scale}x longer on this machine (FERRY_GPU_CHECK_LIMIT_SCALE)."
    echo
    echo "| step | result | seconds | limit (s) | log |"
    echo "|---|---|---|---|---|"
    printf '%s\n' "${summary_rows[@]}"
  } >"$out/summary.md.tmp" && mv -f "$out/summary.md.tmp" "$out/summary.md"
}
gpu_line=""
[[ $mode == gpu ]] && gpu_line=$(smi --query-gpu=name,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null | head -n 1)

# --- running a step ----------------------------------------------------------------------
needs_gpu_pattern='needs a GPU and none is usable here|no CUDA device here|SKIPPED: no usable CUDA device'
step_pid=""
step_name=""
on_signal() {
  local sig=$1 code=$2
  trap - INT TERM HUP
  if [[ -n $step_pid ]]; then
    kill -TERM -- "-$step_pid" 2>/dev/null; kill -TERM "$step_pid" 2>/dev/null
    sleep 1
    kill -KILL -- "-$step_pid" 2>/dev/null; kill -KILL "$step_pid" 2>/dev/null
    summary_rows+=("| $step_name | interrupted (SIG$sig) | | ${limit[$step_name]} | $step_name.log |")
    failures=$((failures + 1))
  fi
  write_summary interrupted
  echo "== stopped by SIG$sig; summary in $out/summary.md"
  rm -rf -- "$scratch"
  exit "$code"
}
trap 'on_signal INT 130' INT
trap 'on_signal TERM 143' TERM
trap 'on_signal HUP 129' HUP
trap 'rm -rf -- "$scratch"' EXIT

# run_step NAME COMMAND...: the command under `timeout` in a process group of its own,
# output in OUT/NAME.log; then its verdict. The script waits with `wait`, so a signal
# to the script is handled at once (the step's group is stopped with it).
run_step() {
  local name=$1; shift
  local log=$out/$name.log
  [[ -n ${selected[$name]:-} ]] || return 0
  local run_limit=$((limit[$name] * scale))
  echo "== [$(($(date +%s) - start)) s] $name (limit ${run_limit} s)"
  local t0 t1 rc verdict why took
  t0=$(date +%s.%N)
  if declare -F "$1" >/dev/null; then  # a step of this script: a bash of its own under timeout
    timeout --kill-after="$kill_after" "$run_limit" bash -c '"$@"' "$name" "$@" >"$log" 2>&1 </dev/null &
  else
    timeout --kill-after="$kill_after" "$run_limit" "$@" >"$log" 2>&1 </dev/null &
  fi
  step_pid=$!
  step_name=$name
  wait "$step_pid"
  rc=$?
  step_pid=""
  t1=$(date +%s.%N)
  took=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')
  local reached
  reached=$(awk -v t="$took" -v l="$run_limit" 'BEGIN { print (t + 0.5 >= l) ? 1 : 0 }')
  if [[ ($rc -eq 124 || $rc -eq 137) && $reached -eq 1 ]]; then
    verdict="timed out"
  elif [[ $rc -eq 77 ]] || grep -qE "$needs_gpu_pattern" "$log"; then
    why=$(sed -n 's/^gpu-check skip: //p' "$log" | tail -n 1)
    if [[ $mode == dry-run ]]; then verdict="skipped (${why:-needs a GPU})"; else verdict="failed (${why:-no GPU usable})"; fi
  elif [[ $rc -eq 0 ]]; then
    verdict="passed"
  elif [[ $rc -gt 128 && $rc -lt 160 ]]; then  # 128 + a signal: killed (SIGKILL by the OOM killer, SIGSEGV, ...)
    verdict="failed (exit $rc, SIG$(kill -l $((rc - 128)) 2>/dev/null || echo $((rc - 128))))"
  else
    verdict="failed (exit $rc)"
  fi
  if [[ $verdict == passed && -n ${STEP_CHECK:-} ]]; then  # a step's own check of what it wrote
    if ! why=$($STEP_CHECK 2>&1); then verdict="failed ($why)"; fi
  fi
  [[ $verdict == passed || $verdict == skipped* ]] || failures=$((failures + 1))
  echo "   $verdict in $took s; last lines of $name.log:"
  tail -n 6 "$log" | sed 's/^/   | /'
  summary_rows+=("| $name | $verdict | $took | ${limit[$name]} | $name.log |")
  write_summary running
}

# --- the steps ---------------------------------------------------------------------------
step_carry() {
  local rc=0
  if [[ -f $carry/MANIFEST ]]; then
    local t0=$SECONDS
    (cd "$carry" && grep -E '^[0-9a-f]{64}  ' MANIFEST | sha256sum --check --quiet) || { echo "carry: files differ from MANIFEST"; rc=1; }
    echo "sha256 of the carry folder checked in $((SECONDS - t0)) s"
    local extra
    extra=$(cd "$carry" && find bin lib -type f | sort | while read -r f; do grep -q "  $f\$" MANIFEST || echo "$f"; done)
    [[ -z $extra ]] || echo "carry: note: files not in MANIFEST (not checked): $extra"
  else
    echo "carry: no MANIFEST in $carry"; rc=1
  fi
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  local t1=$SECONDS
  for b in "$bin"/*; do
    local missing
    if ! readelf -h "$b" >/dev/null 2>&1; then echo "carry: $(basename "$b") is not an ELF binary"; rc=1; continue; fi
    missing=$(ldd "$b" 2>&1 | grep 'not found')
    if [[ -n $missing ]]; then echo "carry: $(basename "$b") cannot load: $missing"; rc=1; else echo "loads: $(basename "$b") (at $((SECONDS - t1)) s)"; fi
  done
  return $rc
}

step_machine() {
  local rc=0
  uname -a
  echo "cpus $(nproc)"; free -g | head -n 2
  if command -v nvidia-smi >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,pci.bus_id,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current,pcie.link.width.max,memory.total,driver_version,clocks.max.sm \
      --format=csv || { echo "nvidia-smi failed"; [[ $mode == gpu ]] && rc=1; }
    nvidia-smi topo -m 2>/dev/null | head -n 5
  else
    echo "nvidia-smi: not installed"
    [[ $mode == gpu ]] && rc=1
  fi
  command -v compute-sanitizer >/dev/null 2>&1 && compute-sanitizer --version | tail -n 1
  "$bin/ferry-bench" probe --json "$out/machine.json" >/dev/null || rc=1
  echo "probe: machine.json"
  return $rc
}

check_junit() {
  local xml=$out/gpu-tests.xml
  [[ -s $xml ]] || { echo "no JUnit XML"; return 1; }
  local cases
  cases=$(grep -c '<testcase ' "$xml")
  [[ ${cases:-0} -gt 0 ]] || { echo "the JUnit XML lists no test case"; return 1; }
  echo "$cases test cases"
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

# The GPU test cases memcheck runs (a Catch2 test spec: tags and names, comma = or): each
# pipeline with its NVMe path ([tensor_cache] with its NVMe spill and FP8 codec cases,
# [kv] spilling to pinned memory and NVMe, [layer_streamer]), the scheduler's moves
# ([scheduler]: the device -> pinned -> NVMe staging, capture, 2D; [blocks]: batched and
# kernel block moves), the pinned pool and the device arena's stream-ordered allocations.
memcheck_cases=${FERRY_GPU_CHECK_MEMCHECK_CASES:-'[tensor_cache],[kv],[layer_streamer],[scheduler],[blocks],[pinned_pool],device_arena:*'}

# memcheck over memcheck_cases: first the cases it selects (listing needs no GPU, so the
# dry run shows them too; none selected is a failure), then the sanitizer.
memcheck_suite() {
  local listed
  listed=$("$bin/ferry-tests-gpu" --list-test-names-only "$memcheck_cases" 2>&1 | grep -v '^ *$')
  echo "memcheck cases ($memcheck_cases): $(echo "$listed" | grep -c .)"
  [[ -n $listed ]] || { echo "memcheck: '$memcheck_cases' selects no test case"; return 1; }
  echo "$listed" | sed 's/^/  case: /'
  sanitizer --tool memcheck --leak-check full --report-api-errors no \
    --track-stream-ordered-races all --error-exitcode 99 "$bin/ferry-tests-gpu" -r compact --durations yes "$memcheck_cases"
}

micro() {
  local rc=0
  "$bin/ferry-micro-schedule" --benchmark_min_time=0.05 --benchmark_format=json \
    --benchmark_out="$out/micro-schedule.json" || rc=1
  "$bin/ferry-micro-memory" --benchmark_min_time=0.02 --benchmark_format=json \
    --benchmark_out="$out/micro-memory.json" || rc=1
  return $rc
}

# The PyTorch package: built from the carry's src/ into the scratch folder, then its tests
# and the benchmark at the H200 shape with it. Each needs python3 with torch; the build
# needs nanobind, scikit-build-core, cmake, ninja and nvcc there (pip installs nothing:
# --no-index, --no-build-isolation).
python_site=$scratch/python-site
python_build() {
  [[ -f $carry/src/python/pyproject.toml ]] || { echo "python-build: no src/python in the carry folder"; return 1; }
  if ! python3 -c 'import torch, nanobind, scikit_build_core' 2>/dev/null; then
    echo "gpu-check skip: python3 here lacks torch, nanobind or scikit-build-core (the GPU machine has them)"
    return 77
  fi
  python3 --version
  local arch=()
  [[ $mode == gpu ]] && arch=(-C cmake.define.FERRY_PYTHON_CUDA=ON)
  python3 -m pip install --no-index --no-build-isolation --no-deps --no-compile -q --target "$python_site" \
    -C build-dir="$scratch/python-build" "${arch[@]}" "$carry/src/python" || return 1
  PYTHONPATH=$python_site python3 -c 'import ferry, torch; print("ferry-torch", ferry.__version__, "CUDA module", ferry.has_cuda, "devices", ferry.cuda_device_count(), "torch", torch.__version__)'
}
python_ready() {
  [[ -d $python_site/ferry ]] && return 0
  echo "gpu-check skip: ferry-torch was not built (step python-build)"
  return 77
}
python_tests() {
  python_ready || return $?
  # The CUDA cases skip without a GPU; on a GPU machine a skip of them is a failure.
  PYTHONPATH=$python_site PYTHONDONTWRITEBYTECODE=1 python3 -m pytest -q -p no:cacheprovider -rs \
    --junitxml "$out/python-tests.xml" "$carry/src/python/tests" || return 1
  if [[ $mode == gpu ]] && grep -q 'needs a CUDA device' "$out/python-tests.xml"; then
    echo "python-tests: CUDA cases were skipped on a GPU machine"
    return 1
  fi
  # The example, on the GPU: blocks streamed, activations offloaded, states pinned; its
  # losses against plain PyTorch's, and both runs' peak device memory; then the trained
  # model evaluated with its blocks' weights on NVMe (loaded into CUDA slots).
  if [[ $mode == gpu ]]; then
    PYTHONPATH=$python_site PYTHONUNBUFFERED=1 python3 "$carry/src/examples/torch_gpt/train.py" --device cuda \
      --layers 8 --width 1024 --tokens 512 --batch 8 --steps 5 --eval-nvme "${TMPDIR:-/tmp}" || return 1
  fi
}
python_bench() {
  python_ready || return $?
  if [[ $mode != gpu ]]; then echo "gpu-check skip: needs a GPU and none is usable here"; return 77; fi
  PYTHONPATH=$python_site PYTHONUNBUFFERED=1 python3 "$carry/src/python/benchmarks/offload_activations.py" \
    --device cuda --dtype bfloat16 --layers 16 --hidden 8192 --tokens 16384 --repetitions 5 --tiny-tensors 2000 \
    --json "$out/python-bench.json" || return 1
  # OffloadAdamW with CUDA parameters against torch's AdamW resident on the GPU: 16 x 16 Mi
  # float32 (1 GiB of parameters; 3 GiB cross the link a step).
  PYTHONPATH=$python_site PYTHONUNBUFFERED=1 python3 "$carry/src/python/benchmarks/offload_adamw.py" \
    --device cuda --params 16 --elements 16777216 --repetitions 3 --nvme-dir "$scratch" \
    --json "$out/python-bench-adamw.json" || return 1
  # stream_layers with CUDA slots against the layers resident on the GPU and checkpointed:
  # 8 x (Linear 4096 + GELU + Linear 4096), 1 GiB of float32 weights through 2 slots; then
  # inference with the weights in a file on the scratch disk, its load rate against the
  # disk's own O_DIRECT reads.
  PYTHONPATH=$python_site PYTHONUNBUFFERED=1 python3 "$carry/src/python/benchmarks/stream_layers.py" \
    --device cuda --layers 8 --hidden 4096 --tokens 4096 --slots 2 --repetitions 3 --tiny-layers 200 \
    --nvme "$scratch" --json "$out/python-bench-layers.json"
}

export carry bin out scratch mode memcheck_cases python_site
export -f step_carry step_machine sanitizer memcheck_suite micro python_build python_ready python_tests python_bench
plots=()
command -v gnuplot >/dev/null 2>&1 || plots=(--no-plots)

run_step carry step_carry
run_step machine step_machine
STEP_CHECK=check_junit run_step gpu-tests "$bin/ferry-tests-gpu" -r junit -o "$out/gpu-tests.xml"
run_step example-stream_ordering "$bin/stream_ordering"
run_step example-activation_offload "$bin/activation_offload"
run_step example-layer_streaming "$bin/layer_streaming"
run_step example-kv_offload "$bin/kv_offload" "$scratch"
run_step bench-suite "$bin/ferry-bench" --quick --suite gpu --json "$out/bench.json" --out "$out/suite" "${plots[@]}"
run_step bench-overlap "$bin/ferry-bench" --quick --json "$out/bench-overlap.json" overlap
run_step bench-device-nvme "$bin/ferry-bench" --quick --json "$out/bench-device-nvme.json" device-nvme
run_step memcheck memcheck_suite
run_step racecheck sanitizer --tool racecheck --error-exitcode 99 "$bin/ferry-tests-gpu" -r compact --durations yes "codec kernels*"
run_step micro micro
run_step python-build python_build
run_step python-tests python_tests
run_step python-bench python_bench

write_summary done
echo "== summary ($out/summary.md)"
cat "$out/summary.md"
[[ $failures -eq 0 ]]
