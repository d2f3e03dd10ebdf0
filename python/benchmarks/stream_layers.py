"""ferry.torch.stream_layers against the same layers resident and against PyTorch's own
recompute (torch.utils.checkpoint per layer, non-reentrant), side by side in one run, on
CPU tensors (through the CPU model of ferry's device runtime) or, with --device cuda, on a
GPU (the resident and checkpointed layers in its memory, ferry's K slots there and the
weights in pinned host slabs; each step timed to the device's completion).

What it reports:

- step: a stack of (Linear + GELU + Linear) blocks trained a step at a time (forward,
  backward, zero_grad), each variant's median step time over --repetitions, round-robin,
  and its ratios to resident and to checkpoint. stream_layers recomputes each block in
  the backward pass as checkpoint does, so ferry / checkpoint is the cost of streaming
  the weights (loads into slots, gradients pushed out and landed in the slabs);
- per layer: the host time one streamed layer costs a step (two acquires, a release each,
  a push), from a stack of --tiny-layers layers of 16 float32 weights, minus the same
  stack under checkpoint;
- with --nvme DIR, inference from NVMe: the same blocks frozen, a forward pass without
  grad, resident, streamed from pinned slabs and streamed from a file in DIR
  (stream_layers(nvme_path=...)), each variant's median; and the disk's own rate in the
  same run: the weights' bytes read back from a file of that size in DIR with O_DIRECT
  (where the file system allows it) in 1 MiB reads, round-robin with the passes; and a
  pass over one token, whose compute is next to nothing, so that the file's bytes over
  that pass are ferry's load rate, a ratio to what the disk gives;
- with --nvme DIR, training from NVMe too: a full step (forward, backward, clip with
  ferry.torch.clip_grad_norm_, OffloadAdamW.step, zero_grad) of the blocks streamed from
  pinned slabs with the states pinned and with the states on NVMe (all streamed through
  the ring), from a file (trainable: gradients in pinned slabs, each block read, stepped
  and written back by the optimizer) with the states pinned, and from a file with the
  states on NVMe too (ZeRO-Infinity's split), round-robin: each one's median,
  spread and ratio to the pinned stack, its optimizer step alone, and the host memory
  its slabs and states hold.

    python python/benchmarks/stream_layers.py [--layers 8] [--hidden 1024]
        [--tokens 1024] [--slots 2] [--repetitions 7] [--tiny-layers 200]
        [--nvme DIR] [--device cpu|cuda] [--json out.json]

On a CPU the "device" slots are host memory: the figures are ferry's host cost, not the
link's (that needs --device cuda and a GPU, docs/python.md)."""

import argparse
import copy
import json
import mmap
import os
import statistics
import time

import torch
import torch.utils.checkpoint

import ferry
import ferry.torch as ft

DEVICE = torch.device("cpu")  # --device


def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize(DEVICE)


def blocks(layers, hidden, seed=0):
    torch.manual_seed(seed)
    return [
        torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.GELU(), torch.nn.Linear(hidden, hidden))
        for _ in range(layers)
    ]


class Checkpointed(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x):
        for layer in self.layers:
            x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)
        return x


def step(model, x):
    model(x).square().mean().backward()
    model.zero_grad(set_to_none=True)


def timed(model, x, n):
    out = []
    for _ in range(n):
        sync()
        t0 = time.perf_counter()
        step(model, x)
        sync()
        out.append(time.perf_counter() - t0)
    return out


def disk_read_seconds(path, nbytes, chunk=1 << 20):
    """Seconds to read `nbytes` of `path` sequentially in `chunk` reads, with O_DIRECT
    where the file system takes it (else buffered, said by the second value)."""
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    direct = True
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        fd, direct = os.open(path, os.O_RDONLY), False
    try:
        t0 = time.perf_counter()
        done = 0
        while done < nbytes:
            n = os.preadv(fd, [buf], done)
            if n <= 0:
                break
            done += n
        return time.perf_counter() - t0, direct
    finally:
        os.close(fd)


def inference_from_nvme(base, x, a):
    """Forward passes without grad of the frozen blocks: resident, pinned, NVMe; and the
    disk's read rate over the same bytes, round-robin."""
    frozen = [copy.deepcopy(b).requires_grad_(False) for b in base]
    weights = os.path.join(a.nvme, f"ferry-bench-weights-{os.getpid()}.bin")
    probe = os.path.join(a.nvme, f"ferry-bench-disk-{os.getpid()}.bin")
    variants = {
        "resident": torch.nn.Sequential(*copy.deepcopy(frozen)).to(DEVICE),
        "ferry pinned": ft.stream_layers(copy.deepcopy(frozen), slots=a.slots, device=DEVICE),
        "ferry nvme": ft.stream_layers(copy.deepcopy(frozen), slots=a.slots, nvme_path=weights, device=DEVICE),
    }
    file_bytes = variants["ferry nvme"].stats()["file_bytes"]
    chunk = 1 << 20
    with open(probe, "wb") as f:
        for _ in range(-(-file_bytes // chunk)):
            f.write(os.urandom(chunk))
        f.flush()
        os.fsync(f.fileno())
    try:
        with torch.no_grad():
            for m in variants.values():  # warm up
                m(x)
            times = {k: [] for k in variants}
            one = []
            disk = []
            direct = True
            for _ in range(a.repetitions):
                for k, m in variants.items():
                    sync()
                    t0 = time.perf_counter()
                    m(x)
                    sync()
                    times[k].append(time.perf_counter() - t0)
                sync()
                t0 = time.perf_counter()
                variants["ferry nvme"](x[:1])
                sync()
                one.append(time.perf_counter() - t0)
                t, direct = disk_read_seconds(probe, file_bytes)
                disk.append(t)
        st = variants["ferry nvme"].stats()
    finally:
        os.unlink(probe)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    disk_gbs = [file_bytes / t / 1e9 for t in disk]
    one_gbs = [file_bytes / t / 1e9 for t in one]
    return {"forward_ms": med, "spread": spread, "file_bytes": file_bytes, "direct_io": st["direct_io"],
            "disk_direct": direct, "disk_gbs_median": statistics.median(disk_gbs),
            "disk_gbs_min": min(disk_gbs), "disk_gbs_max": max(disk_gbs),
            "one_token_gbs_median": statistics.median(one_gbs), "one_token_gbs_min": min(one_gbs),
            "one_token_gbs_max": max(one_gbs)}


def train_step(model, opt, x):
    model(x).square().mean().backward()
    ft.clip_grad_norm_(model.parameters(), 1.0)
    sync()
    t0 = time.perf_counter()
    opt.step()
    sync()
    t = time.perf_counter() - t0
    opt.zero_grad(set_to_none=True)
    return t


def training_from_nvme(base, x, a):
    """Training steps of the blocks (trainable): pinned slabs, weights on NVMe with the
    states pinned, weights and states on NVMe; round-robin."""
    def path(what):
        return os.path.join(a.nvme, f"ferry-bench-train-{what}-{os.getpid()}.bin")
    numel = sum(p.numel() for b in base for p in b.parameters())
    variants = {}
    pinned = ft.stream_layers(copy.deepcopy(base), slots=a.slots, device=DEVICE)
    variants["ferry pinned"] = (pinned, ft.OffloadAdamW(pinned.parameters(), lr=1e-4))
    s0 = ft.stream_layers(copy.deepcopy(base), slots=a.slots, device=DEVICE)
    largest = max(p.numel() for p in s0.parameters())
    variants["states nvme"] = (s0, ft.OffloadAdamW(s0.parameters(), lr=1e-4, nvme_path=path("s0"),
                                                   nvme_bytes=2 * 16 * numel + (64 << 20),
                                                   pinned_bytes=24 * largest + (1 << 20)))
    w1 = ft.stream_layers(copy.deepcopy(base), slots=a.slots, device=DEVICE, nvme_path=path("w1"))
    variants["weights nvme"] = (w1, ft.OffloadAdamW(w1.parameters(), lr=1e-4))
    w2 = ft.stream_layers(copy.deepcopy(base), slots=a.slots, device=DEVICE, nvme_path=path("w2"))
    variants["weights+states nvme"] = (w2, ft.OffloadAdamW(w2.parameters(), lr=1e-4, nvme_path=path("s2"),
                                                           nvme_bytes=2 * 16 * numel + (64 << 20),
                                                           pinned_bytes=24 * largest + (1 << 20)))
    for m, o in variants.values():  # warm up
        train_step(m, o, x)
    steps = {k: [] for k in variants}
    opt_s = {k: [] for k in variants}
    for _ in range(a.repetitions):
        for k, (m, o) in variants.items():
            sync()
            t0 = time.perf_counter()
            opt_s[k].append(train_step(m, o, x))
            sync()
            steps[k].append(time.perf_counter() - t0)
    return {"step_ms": {k: statistics.median(v) * 1e3 for k, v in steps.items()},
            "spread": {k: (max(v) - min(v)) / statistics.median(v) for k, v in steps.items()},
            "optimizer_ms": {k: statistics.median(v) * 1e3 for k, v in opt_s.items()},
            "weights_bytes": 4 * numel, "direct_io": w1.stats()["direct_io"],
            "pinned_bytes": {k: m.stats()["pinned_bytes"] for k, (m, _) in variants.items()},
            "host_state_bytes": {k: o.state_bytes for k, (_, o) in variants.items()}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument("--tiny-layers", type=int, default=200)
    ap.add_argument("--nvme", default=None, metavar="DIR",
                    help="also run inference and training with the weights on NVMe, files in DIR (made and removed)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (the CUDA build and a device)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    global DEVICE
    try:
        DEVICE = torch.device(a.device)
    except RuntimeError:
        ap.error(f"--device {a.device!r} is not a device (cpu or cuda)")
    if DEVICE.type not in ("cpu", "cuda"):
        ap.error(f"--device {a.device}: the CPU or a CUDA device")
    if DEVICE.type == "cuda" and not (ferry.has_cuda and ferry.cuda_device_count() > 0):
        ap.error(f"--device cuda needs the CUDA build (ferry.has_cuda: {ferry.has_cuda}) and a CUDA device "
                 f"({ferry.cuda_device_count()} seen)")
    if DEVICE.type == "cuda" and DEVICE.index is None:
        DEVICE = torch.device("cuda", torch.cuda.current_device())
    if a.nvme is not None and not os.path.isdir(a.nvme):
        ap.error(f"--nvme {a.nvme!r} is not a folder")

    base = blocks(a.layers, a.hidden)
    x = torch.randn(a.tokens, a.hidden, device=DEVICE, requires_grad=True)
    variants = {
        "resident": torch.nn.Sequential(*copy.deepcopy(base)).to(DEVICE),
        "checkpoint": Checkpointed(copy.deepcopy(base)).to(DEVICE),
        "ferry": ft.stream_layers(copy.deepcopy(base), slots=a.slots, device=DEVICE),
    }
    for m in variants.values():  # warm up
        step(m, x)
    times = {k: [] for k in variants}
    for _ in range(a.repetitions):
        for k, m in variants.items():
            times[k] += timed(m, x, 1)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    weight_bytes = sum(p.numel() * p.element_size() for p in variants["ferry"].parameters())

    tiny = [torch.nn.Linear(4, 4) for _ in range(a.tiny_layers)]  # 20 weights each
    tx = torch.randn(1, 4, device=DEVICE, requires_grad=True)
    ck = Checkpointed(copy.deepcopy(tiny)).to(DEVICE)
    st = ft.stream_layers(copy.deepcopy(tiny), slots=a.slots, device=DEVICE)
    step(ck, tx)
    step(st, tx)
    ck_t = statistics.median(timed(ck, tx, 5))
    st_t = statistics.median(timed(st, tx, 5))
    per_layer_us = (st_t - ck_t) / a.tiny_layers * 1e6

    where = (f"CUDA ({torch.cuda.get_device_name(DEVICE)})" if DEVICE.type == "cuda"
             else "the CPU model (CPU tensors)")
    print(f"stream_layers on {where} (spread = (max - min) / median), "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"step: {a.layers} x (Linear {a.hidden} + GELU + Linear {a.hidden}), {a.tokens} tokens, "
          f"{weight_bytes / 2**20:.1f} MiB of weights through {a.slots} slots; medians of {a.repetitions}")
    for k in variants:
        print(f"  {k:11s} {med[k]:8.2f} ms   {med[k] / med['resident']:.3f}x resident   "
              f"{med[k] / med['checkpoint']:.3f}x checkpoint   spread {spread[k]:.1%}")
    print(f"per streamed layer (two loads, a gradient push, over checkpoint's recompute): "
          f"{per_layer_us:.1f} us of host time a step")
    nvme = None
    if a.nvme is not None:
        nvme = inference_from_nvme(base, x.detach(), a)
        nvme["device"] = str(DEVICE)
        fm = nvme["forward_ms"]
        print(f"inference from NVMe: the blocks frozen, a forward pass without grad; {nvme['file_bytes'] / 2**20:.1f} "
              f"MiB file in {a.nvme} (O_DIRECT: {nvme['direct_io']}); medians of {a.repetitions}")
        for k in fm:
            print(f"  {k:13s} {fm[k]:8.2f} ms   {fm[k] / fm['resident']:.3f}x resident   "
                  f"spread {nvme['spread'][k]:.1%}")
        print(f"  load rate (the file's bytes over a one-token pass from NVMe): median "
              f"{nvme['one_token_gbs_median']:.2f} GB/s (min {nvme['one_token_gbs_min']:.2f}, max "
              f"{nvme['one_token_gbs_max']:.2f}); the disk, the same bytes in 1 MiB reads (O_DIRECT: "
              f"{nvme['disk_direct']}): median {nvme['disk_gbs_median']:.2f} GB/s (min {nvme['disk_gbs_min']:.2f}, "
              f"max {nvme['disk_gbs_max']:.2f}); ferry / disk "
              f"{nvme['one_token_gbs_median'] / nvme['disk_gbs_median']:.3f}")
        tr = training_from_nvme(base, x.detach(), a)
        nvme["training"] = tr
        ref = tr["step_ms"]["ferry pinned"]
        print(f"training from NVMe: a step (forward, backward, clip, OffloadAdamW.step), "
              f"{tr['weights_bytes'] / 2**20:.1f} MiB of weights (O_DIRECT: {tr['direct_io']}); medians of "
              f"{a.repetitions}")
        for k, v in tr["step_ms"].items():
            print(f"  {k:20s} {v:9.2f} ms (spread {tr['spread'][k]:.1%}), {v / ref:.3f}x the pinned stack; optimizer "
                  f"step {tr['optimizer_ms'][k]:.2f} ms; host: {tr['pinned_bytes'][k] / 2**20:.1f} MiB of slabs, "
                  f"{tr['host_state_bytes'][k] / 2**20:.1f} MiB of states")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"step_ms": med, "spread": spread, "weight_bytes": weight_bytes,
                       "per_layer_us": per_layer_us, "nvme": nvme, "device": where, "args": vars(a),
                       "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
