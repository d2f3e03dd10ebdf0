#!/usr/bin/env python3
"""ferry's eviction policies against libCacheSim's on the same Zipf traces.

Generates Zipf request traces as libCacheSim oracleGeneral files (24-byte records
{uint32 clock_time; uint64 obj_id; uint32 obj_size; int64 next_access_vtime}, the
next-access index filled in, -1 for none), runs libCacheSim (the `libcachesim` Python
package) LRU, FIFO, LFU, GDSF, LFUDA and Belady on each at cache sizes that are given
fractions of the working set, runs `ferry-bench advise --trace FILE --capacity-bytes C
--json ...` on the same file, and prints a side-by-side miss-ratio table (ferry's
`EVICTION + no_prefetch` candidates against libCacheSim's policy of the same name).

Usage:
  scripts/peers/cachesim_peers.py --ferry-bench BUILD/bench/ferry-bench \
      [--requests 1000000] [--objects 100000] [--alphas 0.8 0.9 1.0] \
      [--sizes unit varied] [--fractions 0.01 0.1] [--timeout 60] [--work DIR] [--markdown]

Where the two differ by definition (read in libCacheSim's sources; docs/benchmarks.md,
"Eviction policies against libCacheSim"):
- LFU: both evict the least used key, ties to the least recently used (libCacheSim's
  LFU.c keeps each count's keys in the order they reached it, which is the order of
  their last use); counts restart when a key is evicted. Same definition.
- GDSF: both H = L + uses / size (cost 1; libCacheSim scales by 1e6), uses from 1 at
  insert and restarting after eviction, ties to the least recently used. Same.
- LFUDA: ferry's lfu_da sets H = L + uses on every use (Arlitt et al.); libCacheSim's
  LFUDA.c inserts at L + 1 but adds the current L to the count on each hit (K += L), and
  moves L to the smallest count left when the last key of a count leaves: a different
  aging rule, so the two differ.
- Belady: both evict the key whose next use is furthest (ferry from the schedule it
  replays, libCacheSim from next_access_vtime), sizes ignored (libCacheSim's BeladySize
  weighs them). Same for unit sizes; with varied sizes neither is optimal.
- A key larger than the cache: libCacheSim does not admit it (a miss); ferry's
  simulator bypasses it (a miss, `bypassed` in the JSON). The traces here have none.
- FIFO, LRU: same. Compulsory (first) misses count in both.
- ferry's greedy_dual_size (GDS, no frequency) has no libCacheSim peer in the Python
  package; its row shows ferry's figure only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

RECORD = np.dtype([("clock_time", "<u4"), ("obj_id", "<u8"), ("obj_size", "<u4"), ("next_access_vtime", "<i8")])
assert RECORD.itemsize == 24

# ferry's eviction name -> libCacheSim's class name
PEERS = [("lru", "LRU"), ("fifo", "FIFO"), ("lfu", "LFU"), ("gdsf", "GDSF"), ("lfu_da", "LFUDA"),
         ("belady", "Belady"), ("greedy_dual_size", None)]


def zipf_trace(requests: int, objects: int, alpha: float, sizes: str, seed: int) -> np.ndarray:
    """Requests drawn from a Zipf(alpha) popularity over `objects` objects (rank r has
    weight 1 / r^alpha), object ids a random permutation of the ranks, one size per object
    (all 1 byte, or log-uniform over 64 B .. 64 KiB)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, objects + 1, dtype=np.float64) ** alpha
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(requests), side="right")
    ranks = np.minimum(ranks, objects - 1)
    ids = rng.permutation(objects).astype(np.uint64) + 1  # libCacheSim ids; 0 is fine too
    if sizes == "unit":
        size_of = np.ones(objects, dtype=np.uint32)
    else:
        size_of = np.exp(rng.uniform(np.log(64), np.log(65536), objects)).astype(np.uint32)
    rec = np.zeros(requests, dtype=RECORD)
    rec["clock_time"] = np.arange(requests, dtype=np.uint32)
    rec["obj_id"] = ids[ranks]
    rec["obj_size"] = size_of[ranks]
    # next_access_vtime: the index of the same object's next request, -1 for none.
    order = np.lexsort((np.arange(requests), ranks))  # by object, then by time
    nxt = np.full(requests, -1, dtype=np.int64)
    same = ranks[order[:-1]] == ranks[order[1:]]
    nxt[order[:-1][same]] = order[1:][same]
    rec["next_access_vtime"] = nxt
    return rec


def working_set_bytes(rec: np.ndarray) -> int:
    _, first = np.unique(rec["obj_id"], return_index=True)
    return int(rec["obj_size"][first].astype(np.uint64).sum())


LCS_CHILD = """
import sys, libcachesim as lcs
reader = lcs.TraceReader(sys.argv[1], lcs.TraceType.ORACLE_GENERAL_TRACE)
cache = getattr(lcs, sys.argv[2])(cache_size=int(sys.argv[3]))
omr, bmr = cache.process_trace(reader)
print(float(omr), float(bmr))
"""


def run_libcachesim(path: str, policy: str, cache_bytes: int, timeout: float) -> tuple[float, float]:
    """libCacheSim's (object, byte) miss ratios, in a child process; NaN past `timeout` s."""
    try:
        out = subprocess.run([sys.executable, "-c", LCS_CHILD, path, policy, str(cache_bytes)], check=True,
                             capture_output=True, text=True, timeout=timeout).stdout.split()
    except subprocess.TimeoutExpired:
        print(f"# libCacheSim {policy} on {path} at {cache_bytes} B: over {timeout:g} s, not counted", file=sys.stderr)
        return float("nan"), float("nan")
    return float(out[0]), float(out[1])


def run_ferry(ferry_bench: str, path: str, cache_bytes: int, out_json: str) -> dict:
    cmd = [ferry_bench, "advise", "--trace", path, "--capacity-bytes", str(cache_bytes), "--json", out_json]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(out_json) as f:
        doc = json.load(f)
    return {c["eviction"]: c for c in doc["candidates"] if c["prefetch"] == "no_prefetch"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ferry-bench", required=True, help="the ferry-bench executable")
    ap.add_argument("--requests", type=int, default=1_000_000)
    ap.add_argument("--objects", type=int, default=100_000)
    ap.add_argument("--alphas", type=float, nargs="+", default=[0.8, 0.9, 1.0])
    ap.add_argument("--sizes", nargs="+", choices=["unit", "varied"], default=["unit", "varied"])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.01, 0.1],
                    help="cache sizes as fractions of the working set's bytes")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--timeout", type=float, default=60,
                    help="seconds one libCacheSim run may take (its LFUDA can take far longer on varied sizes)")
    ap.add_argument("--work", default="/tmp/cachesim-peers", help="folder for the traces and JSON files")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)

    rows = []
    for sizes in args.sizes:
        for alpha in args.alphas:
            rec = zipf_trace(args.requests, args.objects, alpha, sizes, args.seed)
            path = os.path.join(args.work, f"zipf-{alpha}-{sizes}.oracleGeneral")
            rec.tofile(path)
            ws = working_set_bytes(rec)
            total = int(rec["obj_size"].astype(np.uint64).sum())
            for frac in args.fractions:
                cache = max(1, int(ws * frac))
                t0 = time.monotonic()
                ferry = run_ferry(args.ferry_bench, path, cache, os.path.join(args.work, "advise.json"))
                tf = time.monotonic() - t0
                for ev, peer in PEERS:
                    c = ferry[ev]
                    f_mr = c["misses"] / c["accesses"]
                    f_bmr = c["bytes_up"][0] / total
                    if peer is None:
                        l_mr = l_bmr = float("nan")
                    else:
                        l_mr, l_bmr = run_libcachesim(path, peer, cache, args.timeout)
                    rows.append((sizes, alpha, frac, cache, ev, peer or "-", f_mr, l_mr, f_bmr, l_bmr))
                print(f"# {sizes} alpha={alpha} cache={frac:g} of {ws} B = {cache} B: ferry-bench advise {tf:.1f} s",
                      file=sys.stderr)

    with open(os.path.join(args.work, "rows.json"), "w") as f:
        keys = ["sizes", "alpha", "fraction", "cache_bytes", "ferry", "libcachesim", "ferry_miss_ratio",
                "libcachesim_miss_ratio", "ferry_byte_miss_ratio", "libcachesim_byte_miss_ratio"]
        json.dump([dict(zip(keys, [None if isinstance(v, float) and v != v else v for v in r])) for r in rows], f,
                  indent=1)
    if args.markdown:
        print("| sizes | alpha | cache | policy | ferry miss ratio | libCacheSim | ferry byte miss ratio | libCacheSim |")
        print("|---|---|---|---|---|---|---|---|")
        for s, a, fr, c, ev, peer, fm, lm, fb, lb in rows:
            lm_t = ("—" if peer == "-" else "timeout") if lm != lm else f"{lm:.4f}"
            lb_t = ("—" if peer == "-" else "timeout") if lb != lb else f"{lb:.4f}"
            print(f"| {s} | {a} | {fr:.0%} ({c} B) | `{ev}` / {peer} | {fm:.4f} | {lm_t} | {fb:.4f} | {lb_t} |")
    else:
        print(f"{'sizes':7} {'alpha':>5} {'cache':>6} {'ferry':17} {'libCacheSim':11} {'ferry mr':>9} {'lcs mr':>9} "
              f"{'diff':>8} {'ferry bmr':>9} {'lcs bmr':>9}")
        for s, a, fr, c, ev, peer, fm, lm, fb, lb in rows:
            print(f"{s:7} {a:5} {fr:6.0%} {ev:17} {peer:11} {fm:9.4f} {lm:9.4f} {fm - lm:+8.4f} {fb:9.4f} {lb:9.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
