#!/usr/bin/env bash
# ferry-bench's output folder end to end: a small nvme run writes results.json,
# results.csv, summary.md and PNG plots; a second run replaces the first whole; a run
# whose plotting fails exits non-zero and leaves the earlier result as it was; a folder
# that is not a ferry-bench result is refused before anything runs.
#   output_folder.sh FERRY_BENCH WORK_FOLDER
set -euo pipefail
bench=$1
work=$2
rm -rf "$work"
mkdir -p "$work/scratch"
out="$work/out"
small=(nvme --size-mib 8 --depths 1 4 --block-sizes-kib 256 1024 --block-depth 4 --cases seq-read --repetitions 1
       --sample-seconds 0.05 --ramp-seconds 0.02)
fail() { echo "output_folder.sh: $*" >&2; exit 1; }

"$bench" --scratch "$work/scratch" --out "$out" "${small[@]}" > "$work/first.log"
for f in results.json results.csv summary.md .ferry-bench plots/disk-queue-depth.png plots/disk-block-size.png; do
  [[ -s $out/$f ]] || fail "missing $f"
done
[[ $(head -c 4 "$out/plots/disk-queue-depth.png" | tail -c 3) == PNG ]] || fail "not a PNG"
python3 - "$out" <<'PY'
import csv, json, sys
out = sys.argv[1]
doc = json.load(open(out + "/results.json"))
rows = doc["rows"]
assert rows and all(r["scenario"] == "nvme" for r in rows), rows
assert all(set(r) >= {"case", "metric", "unit", "better", "ferry", "reference", "reference_name", "ratio", "params"} for r in rows)
assert all(r["spread"]["samples"] == 1 and r["spread"]["sample_seconds"] == 0.05 for r in rows), rows
assert {"chunk_size", "disk", "pinned_budget"} <= set(doc["advice"]), doc["advice"]
assert doc["advice"]["disk"]["status"] == "measured", doc["advice"]["disk"]
assert doc["machine"]["scratch"]["o_direct"] is True
records = list(csv.DictReader(open(out + "/results.csv")))
assert len(records) == len(rows)
assert all(r["samples"] == "1" and r["ratio_spread"] == "0" for r in records), records
assert [r["case"] for r in records] == [r["case"] for r in rows]
md = open(out + "/summary.md").read()
assert "## nvme" in md and "## Advice" in md and "plots/disk-queue-depth.png" in md
assert "## Sample spread" in md
PY
first_sum=$(sha256sum "$out/results.json")

# A run that fails while plotting: non-zero exit, the earlier result intact, no staging left.
if "$bench" --scratch "$work/scratch" --out "$out" --gnuplot /bin/false "${small[@]}" > "$work/fail.log" 2>&1; then
  fail "a run whose gnuplot failed exited 0"
fi
grep -q "gnuplot failed" "$work/fail.log" || fail "no gnuplot message: $(cat "$work/fail.log")"
[[ $(sha256sum "$out/results.json") == "$first_sum" ]] || fail "the earlier result changed"
ls -A "$work" | grep -q partial && fail "a staging folder was left behind"

# A second run replaces the first.
"$bench" --scratch "$work/scratch" --out "$out" "${small[@]}" > "$work/second.log"
[[ $(sha256sum "$out/results.json") != "$first_sum" ]] || fail "the second run did not replace the first"
ls -A "$work" | grep -Eq 'partial|old' && fail "a staging or old folder was left behind"
ls -A "$work/scratch" | grep -q . && fail "scenario files left in the scratch folder"

# A folder with other files is refused, before anything runs, and kept.
mkdir -p "$work/mine" && echo keep > "$work/mine/notes.txt"
if "$bench" --scratch "$work/scratch" --out "$work/mine" "${small[@]}" > "$work/refused.log" 2>&1; then
  fail "a folder with other files was accepted"
fi
grep -q "not an earlier ferry-bench result" "$work/refused.log" || fail "unclear refusal: $(cat "$work/refused.log")"
[[ $(cat "$work/mine/notes.txt") == keep ]] || fail "the refused folder was changed"
grep -q "seq-read" "$work/refused.log" && fail "the scenario ran although the folder was refused"
# Ctrl-C in the middle of a run: the scratch file and the staging folder are removed, the
# earlier result stays, and the process ends by the signal (exit status 130).
before=$(sha256sum "$out/results.json")
"$bench" --scratch "$work/scratch" --out "$out" nvme --size-mib 64 --repetitions 50 > "$work/int.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do  # wait (up to a minute) until the run is under way
  compgen -G "$work/scratch/ferry-bench-nvme-*" > /dev/null && break
  sleep 0.1
done
compgen -G "$work/scratch/ferry-bench-nvme-*" > /dev/null || fail "the interrupted run never made its scratch file"
kill -INT "$pid"
set +e; wait "$pid"; rc=$?; set -e
[[ $rc -eq 130 ]] || fail "an interrupted run exited $rc, not 130"
sleep 0.5  # its fio child, if any, stops on its own
ls -A "$work/scratch" | grep -q . && fail "scratch files left after Ctrl-C: $(ls -A "$work/scratch")"
ls -A "$work" | grep -q partial && fail "a staging folder was left after Ctrl-C"
[[ $(sha256sum "$out/results.json") == "$before" ]] || fail "Ctrl-C changed the earlier result"
rm -rf "$work"
echo "output folder: all checks passed"
