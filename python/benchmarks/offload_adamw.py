"""ferry.torch.OffloadAdamW with its states in pinned memory and on NVMe, against
torch.optim.AdamW (its per-parameter loop, foreach and fused kernels), side by side in one
run: the step time of each over the same parameters and gradients, round-robin, median and
spread ((max - min) / median) over --repetitions, and ratios to torch's fastest.

The NVMe rows stream every parameter's states (pinned_bytes = the ring of three buffers
only: "nvme, 0/N resident"), keep about half of them in pinned memory (with 6 or fewer
parameters that budget holds all of them, and the row says so), or all of them ("N/N
resident": the file's path, its C++ loops, with no disk I/O in a step);
each step reads and writes 8 bytes per streamed element (exp_avg, exp_avg_sq),
so their rows also give the file's throughput (bytes read + written / step time).

With --dtype bfloat16 (or float16) the parameters and gradients are 16-bit: torch's AdamW
steps them as they are (no master), ferry's through a float32 master per parameter, in
its pool ("pinned") or in the file beside the moments (12 bytes per streamed element
read and written).

    python python/benchmarks/offload_adamw.py [--device cpu|cuda] [--params 16]
        [--elements 1048576] [--dtype float32|bfloat16|float16] [--repetitions 7]
        [--nvme-dir DIR] [--json out.json]

With --device cuda the parameters and gradients are CUDA tensors: torch's AdamW steps them
on the GPU with its states resident there (the reference), ferry's on the CPU from pinned
copies pulled and pushed each step (12 bytes per element cross the link: parameter and
gradient D2H, parameter H2D), with its states in pinned memory or on NVMe; each step is
timed to the device's completion.

Figures depend on the machine's disk: run it on the drive the states would use."""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch

import ferry
import ferry.torch as ft


def make(n_params, elements, device, dtype=torch.float32, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    params = [torch.randn(elements, generator=g, device=device).to(dtype).requires_grad_() for _ in range(n_params)]
    for p in params:
        p.grad = (torch.randn(elements, generator=g, device=device) * 1e-3).to(dtype)
    return params


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def ring_bytes(elements, arrays=2):
    """The swapper's ring: three copies of one parameter's states, [exp_avg | exp_avg_sq]
    (and the master first, with `arrays` 3)."""
    section = -(-elements * 4 // 4096) * 4096
    return 3 * arrays * section


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--device", default="cpu", help="cpu or cuda (the CUDA build and a device)")
    ap.add_argument("--params", type=int, default=16)
    ap.add_argument("--elements", type=int, default=1 << 20)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument("--nvme-dir", default=tempfile.gettempdir())
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    device = torch.device(a.device)
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"offload_adamw benchmark: --device {a.device}: the CPU or a CUDA device")
    if device.type == "cuda" and not (ferry.has_cuda and ferry.cuda_device_count() > 0):
        raise SystemExit("offload_adamw benchmark: --device cuda needs the CUDA build (ferry.has_cuda: "
                         f"{ferry.has_cuda}) and a CUDA device ({ferry.cuda_device_count()} seen)")

    dtype = getattr(torch, a.dtype)
    arrays = 2 if dtype == torch.float32 else 3  # with a master
    total = a.params * a.elements
    nvme_bytes = 2 * a.params * ring_bytes(a.elements, arrays) // 3 + (16 << 20)  # two copies of each array
    ring = ring_bytes(a.elements, arrays)
    half = ring + (a.params // 2) * (ring // 3)  # resident: what fits beside the ring (all of them if few)
    every = ring + a.params * (ring // 3)  # all resident: the file's path with no disk I/O in a step
    variants = {}
    files = []
    for name, factory in {
        "torch AdamW (for-loop)": lambda ps: torch.optim.AdamW(ps, foreach=False),
        "torch AdamW (foreach)": lambda ps: torch.optim.AdamW(ps, foreach=True),
        "torch AdamW (fused)": lambda ps: torch.optim.AdamW(ps, fused=True),
        "ferry, pinned": lambda ps: ft.OffloadAdamW(ps),
        "ferry, nvme, all": lambda ps: ft.OffloadAdamW(
            ps, pinned_bytes=every, nvme_path=files[-1], nvme_bytes=nvme_bytes),
        "ferry, nvme, half": lambda ps: ft.OffloadAdamW(
            ps, pinned_bytes=half, nvme_path=files[-1], nvme_bytes=nvme_bytes),
        "ferry, nvme, streamed": lambda ps: ft.OffloadAdamW(
            ps, pinned_bytes=ring, nvme_path=files[-1], nvme_bytes=nvme_bytes),
    }.items():
        files.append(os.path.join(a.nvme_dir, f"ferry-bench-adamw-{os.getpid()}-{len(files)}.bin"))
        params = make(a.params, a.elements, device, dtype)
        try:
            opt = factory(params)
            opt.step()  # warm up: states made, the file written once
            sync(device)
        except (RuntimeError, TypeError) as e:  # e.g. a torch without fused CPU AdamW
            print(f"  {name}: skipped ({e})")
            continue
        if isinstance(opt, ft.OffloadAdamW) and opt.nvme_stats is not None:  # name it by what it does
            st = opt.nvme_stats
            name = f"ferry, nvme, {st['resident_groups']}/{st['groups']} resident"
            if name in variants:  # "half" of 6 or fewer parameters holds them all: the row above
                continue
        variants[name] = opt

    times = {k: [] for k in variants}
    for _ in range(a.repetitions):
        for k, opt in variants.items():
            sync(device)
            t0 = time.perf_counter()
            opt.step()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    torch_best = min(v for k, v in med.items() if k.startswith("torch"))

    where = f"CUDA ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else "the CPU"
    print(f"OffloadAdamW, parameters on {where}, torch {torch.__version__}, {torch.get_num_threads()} torch threads; "
          f"{a.params} parameters of {a.elements} {a.dtype} ({total * dtype.itemsize / 2**20:.0f} MiB), "
          f"states {total * 4 * arrays / 2**20:.0f} MiB (ferry's; {'the moments' if arrays == 2 else 'master and moments'}); "
          f"file in {a.nvme_dir}; medians of {a.repetitions} steps")
    rows = {}
    for k, opt in variants.items():
        extra = ""
        row = {"step_ms": med[k], "spread": spread[k], "vs_torch_best": med[k] / torch_best}
        if isinstance(opt, ft.OffloadAdamW) and opt.nvme_stats is not None:
            s = opt.nvme_stats
            moved = (s["bytes_read"] + s["bytes_written"]) / s["steps"]
            row.update(file_gb_s=moved / (med[k] / 1e3) / 1e9, resident=s["resident_groups"],
                       engine=s["engine"], direct_io=s["direct_io"], host_bytes=s["host_bytes"])
            extra = (f"   file {row['file_gb_s']:.2f} GB/s r+w ({s['engine']}, "
                     f"{'O_DIRECT' if s['direct_io'] else 'buffered'}), {s['resident_groups']}/{s['groups']} "
                     f"resident, {s['host_bytes'] / 2**20:.1f} MiB pinned")
        if device.type == "cuda" and k.startswith("ferry"):
            crossing = 3 * dtype.itemsize  # parameter + gradient D2H, parameter H2D
            row["link_gb_s"] = total * crossing / (med[k] / 1e3) / 1e9
            extra += f"   link {row['link_gb_s']:.1f} GB/s ({crossing} B per element)"
        rows[k] = row
        print(f"  {k:27s} {med[k]:9.2f} ms   {med[k] / torch_best:6.3f}x torch's fastest   "
              f"spread {spread[k]:.1%}{extra}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "args": vars(a), "torch": torch.__version__, "device": where}, f, indent=1)


if __name__ == "__main__":
    main()
