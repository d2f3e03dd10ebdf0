#!/usr/bin/env bash
# The GPU run's dry run, as CI runs it on a machine without a GPU:
#   tests/gpu_check_dry_run.sh CARRY_DIR WORK_DIR
# 1. CARRY_DIR/gpu-check.sh runs every step from the carry folder that scripts/gpu-build.sh
#    made: each step passes or says it needs a GPU, the summary lists all of them, and the
#    limits add up to at most 300 s; memcheck's chosen test cases cover every pipeline and
#    NVMe path (its log lists them: listing needs no GPU).
# 2. The script's own logic, on a copy of the carry folder: a run that claims a GPU where
#    none is usable fails; a hanging step is stopped at its limit and reported as timed
#    out; a damaged carry folder is caught; limits over the budget and unknown steps are
#    refused before anything runs.
# Exit 77 (skipped) when there is no carry folder, unless FERRY_REQUIRE_GPU_CARRY=1
# (scripts/test.sh sets it after building one).
set -uo pipefail
carry=${1:?usage: gpu_check_dry_run.sh CARRY_DIR WORK_DIR}
work=${2:?usage: gpu_check_dry_run.sh CARRY_DIR WORK_DIR}
if [[ ! -x $carry/gpu-check.sh ]]; then
  echo "no carry folder at $carry: make it with scripts/gpu-build.sh"
  [[ ${FERRY_REQUIRE_GPU_CARRY:-0} == 1 ]] && exit 1
  exit 77
fi
if [[ -e /dev/nvidia0 ]]; then
  echo "this machine has a GPU: the dry run is for machines without one (run gpu-check.sh itself)"
  exit 77
fi
rm -rf "$work"
mkdir -p "$work"
problems=0
fail() { echo "FAIL: $*"; problems=$((problems + 1)); }
unset FERRY_GPU_CHECK_STEPS FERRY_GPU_CHECK_LIMITS FERRY_GPU_CHECK_MODE FERRY_GPU_CHECK_BUDGET_S FERRY_GPU_CARRY \
  FERRY_GPU_CHECK_LIMIT_SCALE FERRY_GPU_CHECK_MEMCHECK_CASES

# --- 1. the dry run itself ------------------------------------------------------------------
steps=(carry machine gpu-tests example-stream_ordering example-activation_offload example-layer_streaming
       example-kv_offload bench-suite bench-overlap bench-device-nvme memcheck racecheck micro)
no_gpu_needed=(carry machine micro)
sanitizer_steps=(memcheck racecheck)
# Limits 3x longer: they are the GPU machine's (16 cores, nothing else running), and this
# runs on a 2-core CI machine that may be busy (the micro step took 5.5 s of its 12 under
# load); the logic checks below run at 1x.
FERRY_GPU_CHECK_LIMIT_SCALE=3 "$carry/gpu-check.sh" "$work/dry" >"$work/dry.out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "the dry run exited $rc (want 0)"
summary=$work/dry/summary.md
if [[ ! -f $summary ]]; then
  fail "no summary.md"
else
  grep -q 'Mode: \*\*dry run\*\*' "$summary" || fail "summary.md does not say it was a dry run"
  grep -q 'Limits run 3x longer' "$summary" || fail "summary.md does not say the limits ran 3x longer"
  grep -qE '^== \[[0-9]+ s\] carry \(limit 30 s\)' "$work/dry.out" || fail "the carry step did not run under 3x its 10 s limit"
  for s in "${steps[@]}"; do
    line=$(grep "^| $s |" "$summary")
    [[ -n $line ]] || { fail "summary.md has no line for step $s"; continue; }
    result=$(echo "$line" | awk -F'|' '{gsub(/^ +| +$/, "", $3); print $3}')
    if [[ " ${no_gpu_needed[*]} " == *" $s "* ]]; then
      [[ $result == passed ]] || fail "step $s needs no GPU but is '$result'"
    elif [[ " ${sanitizer_steps[*]} " == *" $s "* ]]; then
      [[ $result == "skipped (needs a GPU"* || $result == "skipped (compute-sanitizer not found)" ]] ||
        fail "step $s is '$result'"
    else
      [[ $result == "skipped (needs a GPU)" ]] || fail "step $s is '$result'"
    fi
    [[ -f $work/dry/$s.log ]] || fail "no log for step $s"
  done
  planned=$(sed -n 's/^Planned: \([0-9]*\) s of limits.*/\1/p' "$summary")
  [[ -n $planned && $planned -le 300 ]] || fail "the planned total is '${planned}' s (want at most 300)"
  # memcheck runs chosen test cases, not the whole suite: they must still include each
  # pipeline and every NVMe path (the case names as tests/gpu/*.cu give them).
  for c in 'tensor_cache on a GPU: forward/backward' 'tensor_cache on a GPU: a small pinned budget spills to NVMe' \
           'tensor_cache on a GPU: with an FP8 codec' 'gpu kv_cache: blocks spill to pinned memory and NVMe' \
           'layer_streamer: an MLP with streamed weights' 'layer_streamer: gradients pushed' \
           'stream_scheduler: device -> pinned -> NVMe -> pinned -> device' 'stream_scheduler: scattered blocks go D2H' \
           'device_arena: stream order'; do
    grep -qF "  case: $c" "$work/dry/memcheck.log" || fail "memcheck's cases do not include '$c'"
  done
  grep -qF '  case: codec kernels equal the host implementation' "$work/dry/memcheck.log" &&
    fail "memcheck runs the codec kernel sweeps (racecheck's; they do not fit its limit)"
  [[ -f $work/dry/machine.json ]] || fail "the machine step wrote no machine.json"
  for j in micro-schedule micro-memory; do
    grep -q '"name": "BM_' "$work/dry/$j.json" 2>/dev/null || fail "the micro step wrote no $j.json with benchmarks"
  done
  # What a skipped GPU step said, so a reader sees why.
  grep -qE 'needs a GPU and none is usable here' "$work/dry/bench-suite.log" || fail "bench-suite.log does not say it needs a GPU"
  grep -q 'SKIPPED: no usable CUDA device' "$work/dry/gpu-tests.log" || fail "gpu-tests.log does not say it needs a GPU"
fi
[[ -f $work/dry/gpu-check.log ]] || fail "no gpu-check.log"

# --- 2. the script's own logic on a copy of the carry folder ----------------------------------
fake=$work/carry-copy
cp -a "$carry" "$fake"

# A machine that claims a GPU but has none usable: the GPU tests fail there.
FERRY_GPU_CHECK_MODE=gpu FERRY_GPU_CHECK_STEPS=gpu-tests,example-stream_ordering \
  "$fake/gpu-check.sh" "$work/claims-gpu" >"$work/claims-gpu.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "claiming a GPU without one exited $rc (want 1)"
grep -q '^| gpu-tests | failed (no GPU usable) |' "$work/claims-gpu/summary.md" 2>/dev/null ||
  fail "claiming a GPU: gpu-tests is not 'failed (no GPU usable)'"
grep -q '^| example-stream_ordering | failed (no GPU usable) |' "$work/claims-gpu/summary.md" 2>/dev/null ||
  fail "claiming a GPU: example-stream_ordering is not 'failed (no GPU usable)'"
grep -q '^| carry |' "$work/claims-gpu/summary.md" 2>/dev/null && fail "a step that was not chosen ran"

# A step that hangs is stopped at its limit (2 s here), and the run goes on to the next.
hang=$work/carry-hang
cp -a "$carry" "$hang"
printf '#!/bin/sh\nsleep 300\n' >"$hang/bin/stream_ordering"
t0=$(date +%s)
FERRY_GPU_CHECK_STEPS=example-stream_ordering,micro FERRY_GPU_CHECK_LIMITS=example-stream_ordering=2 \
  "$hang/gpu-check.sh" "$work/hang" >"$work/hang.out" 2>&1
rc=$?
took=$(($(date +%s) - t0))
[[ $rc -eq 1 ]] || fail "a hanging step: exit $rc (want 1)"
grep -q '^| example-stream_ordering | timed out |' "$work/hang/summary.md" 2>/dev/null ||
  fail "a hanging step is not reported as timed out"
grep -q '^| micro | passed |' "$work/hang/summary.md" 2>/dev/null || fail "the step after a hang did not run"
((took < 60)) || fail "a 2 s limit took ${took} s to stop the step"
pgrep -f "$hang/bin/stream_ordering" >/dev/null && fail "the hanging step's process outlived its limit"

# A damaged carry folder (one byte of a binary changed) is caught by the carry step.
printf 'x' >>"$hang/bin/ferry-micro-memory"
FERRY_GPU_CHECK_STEPS=carry "$hang/gpu-check.sh" "$work/damaged" >"$work/damaged.out" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "a damaged carry folder: exit $rc (want 1)"
grep -q 'ferry-micro-memory: FAILED' "$work/damaged/carry.log" 2>/dev/null || fail "the damaged file is not named"

# A sanitizer option that compute-sanitizer does not know fails the dry run already.
if grep -q 'took the options' "$work/dry/memcheck.log"; then
  bad=$work/carry-bad-option
  cp -a "$carry" "$bad"
  sed -i 's/--tool memcheck --leak-check full/--tool memcheck --leak-check sometimes/' "$bad/gpu-check.sh"
  FERRY_GPU_CHECK_STEPS=memcheck "$bad/gpu-check.sh" "$work/bad-option" >"$work/bad-option.out" 2>&1
  rc=$?
  [[ $rc -eq 1 ]] || fail "a bad compute-sanitizer option: exit $rc (want 1)"
  grep -q '^| memcheck | failed (exit 255) |' "$work/bad-option/summary.md" 2>/dev/null ||
    fail "a bad compute-sanitizer option is not a failed memcheck step"
else
  echo "note: no compute-sanitizer here (scripts/deps.sh installs it from PyPI); its options were not checked"
fi

# The PyTorch package's steps: not in the default run (its summary has none of them), run
# as a group (`python`: carry, machine and the three, within the budget) from the source
# the carry folder holds; without nanobind here, python-build says what it lacks and the
# two after it that nothing was built.
for s in python-build python-tests python-bench; do
  grep -q "^| $s |" "$summary" 2>/dev/null && fail "the default run ran $s"
done
[[ -f $carry/src/python/pyproject.toml && -f $carry/src/include/ferry/ferry.hpp && -f $carry/src/docs/python.md ]] ||
  fail "the carry folder has no src/ with the PyTorch package, ferry's headers and docs/python.md"
grep -qE '^[0-9a-f]{64}  src/python/src/activation_store.hpp$' "$carry/MANIFEST" || fail "MANIFEST does not list src/"
FERRY_GPU_CHECK_STEPS=python FERRY_GPU_CHECK_LIMIT_SCALE=3 "$carry/gpu-check.sh" "$work/python" >"$work/python.out" 2>&1
rc=$?
[[ $rc -eq 0 ]] || fail "the python group's dry run exited $rc (want 0): $(tail -n 5 "$work/python.out")"
for s in carry machine python-build python-tests python-bench; do
  grep -q "^| $s |" "$work/python/summary.md" 2>/dev/null || fail "the python group did not run $s"
done
planned=$(sed -n 's/^Planned: \([0-9]*\) s of limits.*/\1/p' "$work/python/summary.md" 2>/dev/null)
[[ -n $planned && $planned -le 300 ]] || fail "the python group plans '${planned}' s (want at most 300)"

# Refused before anything runs: limits over the budget, unknown steps, bad limits, no OUT.
FERRY_GPU_CHECK_LIMITS=memcheck=400 "$fake/gpu-check.sh" "$work/over" >"$work/over.out" 2>&1
rc=$?
[[ $rc -eq 2 ]] || fail "limits over the budget: exit $rc (want 2)"
grep -qE 'add up to [0-9]+ s, over the budget of 300 s' "$work/over.out" || fail "over the budget: message: $(cat "$work/over.out")"
[[ -e $work/over/summary.md ]] && fail "over the budget, steps ran anyway"
FERRY_GPU_CHECK_STEPS=no-such-step "$fake/gpu-check.sh" "$work/unknown" >"$work/unknown.out" 2>&1
[[ $? -eq 2 ]] && grep -q "names no step 'no-such-step'" "$work/unknown.out" || fail "an unknown step is not refused"
FERRY_GPU_CHECK_LIMITS=memcheck=ten "$fake/gpu-check.sh" "$work/bad-limit" >"$work/bad-limit.out" 2>&1
[[ $? -eq 2 ]] && grep -q "'memcheck=ten' is not step=seconds" "$work/bad-limit.out" || fail "a bad limit is not refused"
"$fake/gpu-check.sh" >"$work/no-out.out" 2>&1
[[ $? -eq 2 ]] || fail "no OUT argument is not refused"
FERRY_GPU_CHECK_LIMIT_SCALE=0 "$fake/gpu-check.sh" "$work/bad-scale" >"$work/bad-scale.out" 2>&1
[[ $? -eq 2 ]] && grep -q "is not a whole factor from 1 to 20" "$work/bad-scale.out" || fail "a limit scale of 0 is not refused"

# Stopped from outside (SIGTERM, as a device tool's time limit does) in the middle of a
# step: the step's processes go with it, and the summary says what ran.
mkdir -p "$work/scratch-stopped"
FERRY_GPU_CHECK_STEPS=carry,example-stream_ordering,micro FERRY_GPU_CHECK_LIMITS=example-stream_ordering=60 \
  FERRY_GPU_CHECK_SCRATCH="$work/scratch-stopped" "$hang/gpu-check.sh" "$work/stopped" >"$work/stopped.out" 2>&1 &
runner=$!
for _ in $(seq 1 600); do  # up to a minute for the carry step before it, on a busy machine
  grep -q 'example-stream_ordering (limit' "$work/stopped.out" 2>/dev/null && break
  sleep 0.1
done
sleep 0.5
kill -TERM "$runner"
wait "$runner"
rc=$?
[[ $rc -eq 143 ]] || fail "a run stopped by SIGTERM: exit $rc (want 143)"
grep -q '^| example-stream_ordering | interrupted (SIGTERM) |' "$work/stopped/summary.md" 2>/dev/null ||
  fail "a run stopped by SIGTERM: the summary does not say the step was interrupted"
grep -q 'Verdict: \*\*interrupted\*\*' "$work/stopped/summary.md" 2>/dev/null || fail "a stopped run's verdict is not 'interrupted'"
grep -q '^| micro |' "$work/stopped/summary.md" 2>/dev/null && fail "a step after the stop ran"
sleep 0.5
pgrep -f "$hang/bin/stream_ordering" >/dev/null && fail "the interrupted step's process outlived the run"
[[ -z $(ls -A "$work/scratch-stopped" 2>/dev/null) ]] || fail "a stopped run left its scratch folder"

# OUT: an option-like name, a file, a folder of someone else's files: refused, untouched.
"$fake/gpu-check.sh" --help >"$work/dash.out" 2>&1
[[ $? -eq 2 ]] && grep -q "looks like an option" "$work/dash.out" || fail "an OUT like --help is not refused"
touch "$work/a-file"
"$fake/gpu-check.sh" "$work/a-file" >"$work/file.out" 2>&1
[[ $? -eq 2 ]] && grep -q "is not a folder" "$work/file.out" || fail "an OUT that is a file is not refused"
mkdir -p "$work/theirs" && echo keep >"$work/theirs/notes.txt"
"$fake/gpu-check.sh" "$work/theirs" >"$work/theirs.out" 2>&1
[[ $? -eq 2 ]] && grep -q "not an earlier gpu-check" "$work/theirs.out" || fail "an OUT of other files is not refused"
[[ $(cat "$work/theirs/notes.txt" 2>/dev/null) == keep && $(ls -A "$work/theirs" | wc -l) -eq 1 ]] ||
  fail "a refused OUT was changed"
# gpu-build.sh does not replace a folder of someone else's files with a carry folder.
source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$source_dir/scripts/gpu-build.sh" "$work/theirs" >"$work/build-theirs.out" 2>&1
[[ $? -eq 2 ]] && grep -q "is not an earlier carry folder" "$work/build-theirs.out" ||
  fail "gpu-build.sh into a folder of other files is not refused: $(cat "$work/build-theirs.out")"
[[ $(cat "$work/theirs/notes.txt" 2>/dev/null) == keep ]] || fail "gpu-build.sh changed a folder it refused"
# An earlier run's OUT is replaced whole.
FERRY_GPU_CHECK_STEPS=carry "$fake/gpu-check.sh" "$work/claims-gpu" >"$work/again.out" 2>&1
[[ $? -eq 0 ]] && ! grep -q '^| gpu-tests |' "$work/claims-gpu/summary.md" && [[ ! -e $work/claims-gpu/gpu-tests.log ]] ||
  fail "an earlier OUT is not replaced whole"

if ((problems > 0)); then
  echo "gpu-check dry run: $problems problem(s); the dry run printed:"
  cat "$work/dry.out"
  exit 1
fi
echo "gpu-check dry run: all checks passed"
cat "$summary"
