#!/usr/bin/env python3
"""ferry's FP8 conversions against ml_dtypes, PyTorch and CUDA's host functions.

For every bf16 and every fp16 pattern, and N random fp32 values (default 10 million:
random bit patterns, log-uniform magnitudes, the neighbourhoods of the rounding
boundaries near each format's top and bottom, values past the range, +-inf, NaNs with
random payloads and signs, fp32 subnormals), it converts to E4M3 and E5M2 with

  ferry       fp8_overflow::saturate and ::non_finite (tests/oracle/fp8_convert.cpp,
              built here with the C++ compiler, unless --convert names a built one)
  cuda        __nv_cvt_*_to_fp8 with __NV_SATFINITE and __NV_NOSAT (host functions of
              cuda_fp8.h; columns present when the toolkit's headers were found)
  ml_dtypes   x.astype(float8_e4m3fn / float8_e5m2) (non-saturating), and
              np.clip(x, -max, max).astype(...) as the saturating peer
  torch       x.to(torch.float8_e4m3fn / float8_e5m2), and x.clamp(-max, max).to(...)
              (when `import torch` works; --torch-site DIR appends a site-packages
              folder that has it to sys.path)

and prints, for each pair compared, the mismatch counts by class of input: in range
(finite, rounds to a finite code), overflow (finite, rounds past max), inf, NaN; a
NaN mismatch where both codes are NaN is split into "sign" (codes differ in the sign
bit only) and "code" (another NaN encoding). Exit status 0 whatever the counts (it
measures; tests/codec/test_fp8_modes.cpp and tests/oracle/ are the tests).

  python3 scripts/peers/fp8_peers.py [--fp32-count N] [--seed S] [--convert PATH]
                                     [--torch-site DIR] [--cuda-include DIR]
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

try:
    import ml_dtypes
except ImportError:  # pragma: no cover
    sys.exit("fp8_peers: needs ml_dtypes (pip install ml_dtypes numpy)")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FORMATS = {
    # name: (ml_dtypes type, torch dtype name, max finite, smallest |x| that rounds past max)
    "e4m3": (ml_dtypes.float8_e4m3fn, "float8_e4m3fn", 448.0, np.nextafter(np.float32(464.0), np.float32(np.inf))),
    "e5m2": (ml_dtypes.float8_e5m2, "float8_e5m2", 57344.0, np.float32(61440.0)),
}


def build_convert(out_dir, cuda_include):
    """Builds tests/oracle/fp8_convert.cpp; returns the program's path."""
    exe = os.path.join(out_dir, "fp8_convert")
    cmd = [os.environ.get("CXX", "c++"), "-std=c++20", "-O2", "-I", os.path.join(ROOT, "include"),
           "-DFERRY_HAS_CUDA=0", "-DFERRY_HAS_URING=0"]
    if cuda_include and os.path.isdir(cuda_include):
        cmd += ["-isystem", cuda_include]
    cmd += [os.path.join(ROOT, "tests", "oracle", "fp8_convert.cpp"), "-o", exe]
    subprocess.run(cmd, check=True)
    return exe


def run_convert(exe, kind, bits, work):
    """Runs fp8_convert on raw elements `bits`; returns {column name: uint8 codes}."""
    src = os.path.join(work, kind + ".in")
    dst = os.path.join(work, kind + ".out")
    bits.tofile(src)
    names = subprocess.run([exe, kind, src, dst], check=True, capture_output=True, text=True).stdout.split()
    rows = np.fromfile(dst, dtype=np.uint8).reshape(len(bits), len(names))
    return {name: rows[:, i].copy() for i, name in enumerate(names)}


def fp32_inputs(count, seed):
    """`count` fp32 values of every class (see the module docstring), as uint32 bits."""
    rng = np.random.default_rng(seed)
    parts = []
    n = count

    def take(share):
        return max(1, int(n * share))

    parts.append(rng.integers(0, 2**32, take(0.40), dtype=np.uint64).astype(np.uint32))
    mags = np.exp2(rng.uniform(-30, 30, take(0.20))).astype(np.float32)
    parts.append(mags.view(np.uint32) | (rng.integers(0, 2, mags.size, dtype=np.uint32) << 31))
    anchors = np.array([448, 464, 480, 416, 57344, 61440, 65536, 49152, 2**-6, 2**-9, 2**-10, 2**-14, 2**-16,
                        2**-17, np.finfo(np.float32).max], dtype=np.float32).view(np.uint32)
    k = take(0.20)
    near = anchors[rng.integers(0, anchors.size, k)].astype(np.int64) + rng.integers(-(2**16), 2**16 + 1, k)
    near = np.clip(near, 0, 0x7F800000).astype(np.uint32)
    parts.append(near | (rng.integers(0, 2, k, dtype=np.uint32) << 31))
    k = take(0.10)
    nan = 0x7F800000 | rng.integers(1, 2**23, k, dtype=np.uint32)
    parts.append(nan | (rng.integers(0, 2, k, dtype=np.uint32) << 31))
    k = take(0.05)
    parts.append(rng.integers(0, 2**23, k, dtype=np.uint32) | (rng.integers(0, 2, k, dtype=np.uint32) << 31))
    k = take(0.04)
    big = np.exp2(rng.uniform(np.log2(464.0), 128, k)).astype(np.float32)  # past E4M3's range, some past E5M2's
    big = np.where(np.isfinite(big), big, np.float32(3e38)).astype(np.float32)
    parts.append(big.view(np.uint32) | (rng.integers(0, 2, k, dtype=np.uint32) << 31))
    used = sum(p.size for p in parts)
    k = max(0, count - used)
    infs = np.where(rng.integers(0, 2, k) == 0, np.uint32(0x7F800000), np.uint32(0xFF800000)).astype(np.uint32)
    parts.append(infs)
    out = np.concatenate(parts)[:count]
    rng.shuffle(out)
    return out


def classes(values, threshold):
    """Class of each fp32 value: 0 in range, 1 overflow, 2 inf, 3 NaN."""
    a = np.abs(values)
    cls = np.zeros(values.size, dtype=np.int8)
    cls[np.isfinite(values) & (a >= threshold)] = 1
    cls[np.isinf(values)] = 2
    cls[np.isnan(values)] = 3
    return cls


def is_nan_code(codes, fmt):
    m = codes & 0x7F
    return m == 0x7F if fmt == "e4m3" else m > 0x7C


CLASS_NAMES = ["in range", "overflow", "inf", "NaN"]


def report(dataset, fmt, mode, peer, ours, theirs, cls):
    cells = []
    total_bad = 0
    for c, name in enumerate(CLASS_NAMES):
        sel = cls == c
        count = int(sel.sum())
        bad = sel & (ours != theirs)
        nbad = int(bad.sum())
        total_bad += nbad
        cell = f"{name} {nbad}/{count}"
        if c == 3 and nbad:
            both_nan = bad & is_nan_code(ours, fmt) & is_nan_code(theirs, fmt)
            sign = both_nan & ((ours ^ theirs) == 0x80)
            cell += f" (sign {int(sign.sum())}, code {int(both_nan.sum() - sign.sum())})"
        if nbad:
            i = int(np.flatnonzero(bad)[0])
            cell += f" [e.g. #{i}: ferry 0x{int(ours[i]):02x}, {peer.split()[0]} 0x{int(theirs[i]):02x}]"
        cells.append(cell)
    print(f"{dataset:5} {fmt} {mode:10} vs {peer:22} mismatches {total_bad:8}: " + "; ".join(cells))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fp32-count", type=int, default=10_000_000, help="random fp32 values (default 10 M)")
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--convert", help="a built tests/oracle/fp8_convert (default: build it here)")
    ap.add_argument("--torch-site", help="a site-packages folder with torch, appended to sys.path")
    ap.add_argument("--cuda-include", default="/usr/local/cuda/include",
                    help="CUDA toolkit include folder, for the cuda columns (default /usr/local/cuda/include)")
    args = ap.parse_args()

    if args.torch_site:
        sys.path.append(args.torch_site)
    try:
        import torch
    except ImportError:
        torch = None
    print(f"ml_dtypes {ml_dtypes.__version__}, numpy {np.__version__}, "
          f"torch {torch.__version__ if torch else 'not importable (skipped)'}")

    with tempfile.TemporaryDirectory(prefix="fp8_peers.") as work:
        exe = args.convert or build_convert(work, args.cuda_include)
        all16 = np.arange(65536, dtype=np.uint32).astype(np.uint16)
        datasets = [
            ("bf16", all16, all16.view(ml_dtypes.bfloat16)),
            ("f16", all16, all16.view(np.float16)),
            ("f32", fp32_inputs(args.fp32_count, args.seed), None),
        ]
        for name, bits, typed in datasets:
            if typed is None:
                typed = bits.view(np.float32)
            ferry = run_convert(exe, name, bits, work)
            values = typed.astype(np.float32)  # exact widening
            if torch is not None:
                if name == "bf16":
                    t_in = torch.from_numpy(bits.view(np.int16).copy()).view(torch.bfloat16)
                elif name == "f16":
                    t_in = torch.from_numpy(typed.copy())
                else:
                    t_in = torch.from_numpy(typed.copy())
            print(f"\n{name}: {bits.size} inputs")
            for fmt, (md_type, torch_name, fmax, threshold) in FORMATS.items():
                cls = classes(values, threshold)
                ours = {m: ferry[f"ferry.{fmt}.{m}"] for m in ("saturate", "non_finite")}
                peers_nf = {"ml_dtypes astype": typed.astype(md_type).view(np.uint8)}
                clipped = np.clip(typed, typed.dtype.type(-fmax), typed.dtype.type(fmax))
                peers_sat = {"ml_dtypes clip+astype": clipped.astype(md_type).view(np.uint8)}
                if torch is not None:
                    td = getattr(torch, torch_name)
                    peers_nf["torch .to"] = t_in.to(td).view(torch.uint8).numpy()
                    peers_sat["torch clamp+.to"] = t_in.clamp(-fmax, fmax).to(td).view(torch.uint8).numpy()
                if f"cuda.{fmt}.nosat" in ferry:
                    peers_nf["cuda __NV_NOSAT"] = ferry[f"cuda.{fmt}.nosat"]
                    peers_sat["cuda __NV_SATFINITE"] = ferry[f"cuda.{fmt}.satfinite"]
                for peer, theirs in peers_sat.items():
                    report(name, fmt, "saturate", peer, ours["saturate"], theirs, cls)
                for peer, theirs in peers_nf.items():
                    report(name, fmt, "non_finite", peer, ours["non_finite"], theirs, cls)
                if torch is not None:  # torch's plain cast against ferry's saturating mode too
                    report(name, fmt, "saturate", "torch .to", ours["saturate"], peers_nf["torch .to"], cls)


if __name__ == "__main__":
    main()
