#!/usr/bin/env python3
"""Per-request cost of libCacheSim's simulators on the trace of ferry-micro-policy's
trace/* benchmarks: Zipf(0.9) over 100 k keys of one size, 2 M requests, room for 10 k.

    python3 scripts/peers/policy_speed.py [--repeats 5] [--alpha 0.9]

The trace is drawn here with numpy (same distribution as ferry-micro-policy's, not the
same draws: the miss ratios agree to about 0.001), written as libCacheSim's
oracleGeneral binary format (uint32 time, uint64 id, uint32 size, int64 next access
vtime; -1 for none) so Belady can read its future, and each policy replays it with
process_trace. The time of each replay is the CPU time of the C++ loop (one Python call; CPU time, as
ferry-micro-policy's counters, so that a busy machine slows neither),
divided by the requests; the median and range over --repeats replays are printed.
Compare with `ferry-micro-policy --benchmark_filter=trace/ --benchmark_repetitions=5`.
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import libcachesim as lcs


def zipf_trace(keys, requests, alpha, seed):
    weights = 1.0 / np.power(np.arange(1, keys + 1, dtype=np.float64), alpha)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    rng = np.random.default_rng(seed)
    return np.searchsorted(cdf, rng.random(requests), side="right").astype(np.uint64)


def write_oracle_general(path, ids, size):
    n = len(ids)
    rec = np.zeros(n, dtype=np.dtype([("t", "<u4"), ("id", "<u8"), ("size", "<u4"), ("next", "<i8")]))
    rec["t"] = np.arange(n, dtype=np.uint32)
    rec["id"] = ids
    rec["size"] = size
    nxt = np.full(n, -1, dtype=np.int64)
    last = {}
    # next access (virtual time = request index) of each request's object
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    same = sorted_ids[1:] == sorted_ids[:-1]
    nxt[order[:-1][same]] = order[1:][same]
    rec["next"] = nxt
    rec.tofile(path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=100_000)
    ap.add_argument("--requests", type=int, default=2_000_000)
    ap.add_argument("--room", type=int, default=10_000)
    ap.add_argument("--alpha", type=float, default=0.9)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--hashpower", type=int, default=16,
                    help="log2 of the hash table buckets (libCacheSim default 24: 16 M buckets for 10 k objects)")
    args = ap.parse_args()
    ids = zipf_trace(args.keys, args.requests, args.alpha, args.seed)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "zipf.oracleGeneral")
        write_oracle_general(path, ids, 1)
        print(f"Zipf({args.alpha}) over {args.keys} keys, {args.requests} requests, room for {args.room} "
              f"(libcachesim {getattr(lcs, '__version__', '?')})")
        print(f"{'policy':8} {'miss ratio':>10} {'ns/request median':>18} {'range':>16}")
        for name in ["LRU", "FIFO", "LFU", "GDSF", "Belady"]:
            samples = []
            miss = None
            for _ in range(args.repeats):
                reader = lcs.TraceReader(path, lcs.TraceType.ORACLE_GENERAL_TRACE)
                cache = getattr(lcs, name)(args.room, hashpower=args.hashpower)
                t0 = time.process_time()
                miss, _ = cache.process_trace(reader)
                samples.append((time.process_time() - t0) * 1e9 / args.requests)
            print(f"{name:8} {miss:10.4f} {statistics.median(samples):18.1f} "
                  f"{min(samples):7.1f}-{max(samples):7.1f}")


if __name__ == "__main__":
    main()
