"""ferry.torch.offload_activations against PyTorch's own offload
(torch.autograd.graph.save_on_cpu) and no offload, side by side in one run, on CPU tensors
(through the CPU model of ferry's device runtime) or CUDA tensors (--device cuda:
ferry._cuda).

What it reports:

- step: a stack of Linear + GELU layers trained a step at a time (forward, backward),
  each variant's median step time over --repetitions, round-robin, and its ratio to no
  offload; ferry with no codec, "bf16" and "fp8", and the bytes each moved against no
  codec's;
- per tensor: the host time each saved tensor costs (pack + unpack), from a step that
  saves --tiny-tensors tensors of 4 KiB through a custom function, minus the same step
  without hooks: the issue's target is <= 20 us a tensor; of which ferry.torch's Python
  layer (the same step with the store's calls made no-ops) and what taking one tensor
  into the extension costs a call;
- on CUDA, the link floor: the step can be no faster than its forward pass or the D2H of
  what it saves, whichever is longer, plus its backward pass or the H2D of it back
  (each pass and each direction measured here: pinned copies of the step's bytes), and
  each variant's ratio to that floor. "ferry 1GiB" is ferry with at most 1 GiB of copies
  waiting for the link (device_bytes): the forward pass held back beyond it.

    python python/benchmarks/offload_activations.py [--device cpu|cuda] [--dtype float32|bfloat16]
        [--layers 8] [--hidden 1024] [--tokens 2048] [--repetitions 7] [--tiny-tensors 2000]
        [--json out.json]
    # the H200 shape of the anchors (8 GiB saved a step):
    python python/benchmarks/offload_activations.py --device cuda --dtype bfloat16 \
        --layers 16 --hidden 8192 --tokens 16384 --repetitions 5

On a CPU, "offloading" moves host memory to host memory: the figures are ferry's host
cost, not the link's (that needs a GPU, docs/python.md)."""

import argparse
import json
import statistics
import time

import torch

import ferry
import ferry.torch as ft


def stack(layers, hidden, device, dtype, seed=0):
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*mods).to(device=device, dtype=dtype)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step(model, x, ctx, device, parts=None):
    """One forward and backward pass; `parts` (a list) gets the forward's and the
    backward's seconds (each waited for on the device)."""
    t0 = time.perf_counter()
    with ctx():
        loss = model(x).float().square().mean()
    if parts is not None:
        sync(device)
    t1 = time.perf_counter()
    loss.backward()
    sync(device)
    if parts is not None:
        parts.append((t1 - t0, time.perf_counter() - t1))
    model.zero_grad(set_to_none=True)


def link_seconds(nbytes, device, repetitions=3):
    """Seconds to move `nbytes` D2H and H2D between device memory and pinned memory
    (torch's copies, one direction at a time; the median of `repetitions`)."""
    chunk = min(nbytes, 1 << 30)
    dev = torch.empty(chunk, dtype=torch.uint8, device=device)
    host = torch.empty(chunk, dtype=torch.uint8, pin_memory=True)
    out = []
    for src, dst in ((dev, host), (host, dev)):
        runs = []
        for _ in range(repetitions):
            sync(device)
            t0 = time.perf_counter()
            left = nbytes
            while left > 0:
                n = min(left, chunk)
                dst[:n].copy_(src[:n], non_blocking=True)
                left -= n
            sync(device)
            runs.append(time.perf_counter() - t0)
        out.append(statistics.median(runs))
    return out[0], out[1]


class Tiny(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, side):
        ctx.save_for_backward(side)
        return x

    @staticmethod
    def backward(ctx, g):
        (side,) = ctx.saved_tensors
        return g + 0 * side[0], None


def tiny_step(n, ctx, device):
    x = torch.zeros(1, requires_grad=True, device=device)
    sides = [torch.full((1024,), float(i), device=device) for i in range(n)]  # 4 KiB each
    sync(device)
    t0 = time.perf_counter()
    with ctx():
        y = x
        for s in sides:
            y = Tiny.apply(y, s)
    y.sum().backward()
    sync(device)
    return time.perf_counter() - t0


class _NoStore:
    """A store whose calls do nothing (the Python layer's share of the host time)."""

    def __init__(self):
        self.keys = set()

    def contains(self, key):
        return key in self.keys

    def offload(self, key, src, element, stream=None):
        self.keys.add(key)
        return "none"

    def fetch(self, key, dst, stream=None):
        self.keys.discard(key)

    def discard(self, key):
        self.keys.discard(key)

    def end_iteration(self):
        pass


def tensor_crossing_us(device, calls=20000):
    """Host time to take a 4 KiB tensor into the extension, per call: a fetch of a key the
    store does not hold (the tensor taken, then the KeyError) less the same call's
    KeyError with no tensor to take (``tier_of``), medians of three."""
    store = ft.offload_activations(min_bytes=0, device=device)._stores[device]
    out = torch.empty(4096, dtype=torch.uint8, device=device)
    stream = [torch.cuda.current_stream(device).cuda_stream] if device.type == "cuda" else []

    def timed(call):
        runs = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(calls):
                try:
                    call()
                except KeyError:
                    pass
            runs.append(time.perf_counter() - t0)
        return statistics.median(runs) / calls * 1e6

    return timed(lambda: store.fetch(1 << 40, out, *stream)) - timed(lambda: store.tier_of(1 << 40))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--device", default="cpu", help="cpu or cuda (ferry._cuda and a CUDA device needed)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument("--tiny-tensors", type=int, default=2000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    device = torch.device(a.device)
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"offload_activations benchmark: --device {a.device}: the CPU or a CUDA device")
    if device.type == "cuda" and not (ferry.has_cuda and ferry.cuda_device_count() > 0):
        raise SystemExit("offload_activations benchmark: --device cuda needs the CUDA build (ferry.has_cuda: "
                         f"{ferry.has_cuda}) and a CUDA device ({ferry.cuda_device_count()} seen)")
    dtype = getattr(torch, a.dtype)
    model = stack(a.layers, a.hidden, device, dtype)
    x = torch.randn(a.tokens, a.hidden, device=device, dtype=dtype)
    offload = ft.offload_activations(min_bytes=1 << 16, keep_last=1, device=device)
    offload_bf16 = ft.offload_activations(min_bytes=1 << 16, keep_last=1, codec="bf16", device=device)
    offload_fp8 = ft.offload_activations(min_bytes=1 << 16, keep_last=1, codec="fp8", device=device)
    # at most 1 GiB of copies waiting for the link: the forward pass held back beyond it
    offload_bounded = ft.offload_activations(min_bytes=1 << 16, keep_last=1, device=device, device_bytes=1 << 30)
    variants = {
        "none": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
        "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=device.type == "cuda"),
        "ferry": lambda: offload,
        "ferry bf16": lambda: offload_bf16,
        "ferry fp8": lambda: offload_fp8,
        "ferry 1GiB": lambda: offload_bounded,
    }
    if dtype != torch.float32:
        del variants["ferry bf16"]  # the bf16 codec takes float32 tensors only
    for ctx in variants.values():  # warm up (ferry records its first step here)
        step(model, x, ctx, device)
    times = {k: [] for k in variants}
    parts = []
    for _ in range(a.repetitions):
        for k, ctx in variants.items():
            t0 = time.perf_counter()
            step(model, x, ctx, device)
            times[k].append(time.perf_counter() - t0)
        step(model, x, variants["none"], device, parts)  # the forward and backward apart
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    saved_bytes = offload.stats()["offloaded_bytes"] // max(1, offload.stats()["steps"])
    moved = {"ferry": 1.0}  # bytes moved a step, against no codec's
    for name, o in (("ferry bf16", offload_bf16), ("ferry fp8", offload_fp8)):
        if name not in variants:
            continue
        moved[name] = (o.stats()["offloaded_bytes"] / max(1, o.stats()["steps"])) / max(1, saved_bytes)

    floor_ms = None
    link = None
    if device.type == "cuda":
        fwd = statistics.median(p[0] for p in parts)
        bwd = statistics.median(p[1] for p in parts)
        d2h, h2d = link_seconds(saved_bytes, device)
        floor_ms = (max(fwd, d2h) + max(bwd, h2d)) * 1e3
        link = {"forward_ms": fwd * 1e3, "backward_ms": bwd * 1e3, "d2h_ms": d2h * 1e3, "h2d_ms": h2d * 1e3,
                "d2h_gbps": saved_bytes / d2h / 1e9, "h2d_gbps": saved_bytes / h2d / 1e9, "floor_ms": floor_ms}

    tiny = ft.offload_activations(min_bytes=0, keep_last=0, device=device)
    plain_hooks = lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)  # noqa: E731
    tiny_step(a.tiny_tensors, plain_hooks, device)  # warm up
    tiny_step(a.tiny_tensors, lambda: tiny, device)
    plain = [tiny_step(a.tiny_tensors, plain_hooks, device) for _ in range(3)]
    hooked = [tiny_step(a.tiny_tensors, lambda: tiny, device) for _ in range(3)]
    per_tensor_us = (statistics.median(hooked) - statistics.median(plain)) / a.tiny_tensors * 1e6
    # The same with the store's calls made no-ops: what ferry.torch's own Python layer costs
    # (the checks, the bookkeeping, the fetch's allocation), which a GPU's host pays alike.
    layer = ft.offload_activations(min_bytes=0, keep_last=0, device=device)
    layer._stores[device] = _NoStore()
    tiny_step(a.tiny_tensors, lambda: layer, device)  # warm up
    layered = [tiny_step(a.tiny_tensors, lambda: layer, device) for _ in range(5)]
    layer_us = (statistics.median(layered) - statistics.median(plain)) / a.tiny_tensors * 1e6
    crossing_us = tensor_crossing_us(device)
    exchange = getattr(ferry._core, "dlpack_exchange", lambda t: False)(torch.empty(0))

    where = (f"CUDA ({torch.cuda.get_device_name(device)})" if device.type == "cuda"
             else "the CPU model (CPU tensors)")
    print(f"offload_activations on {where}, torch {torch.__version__}, {torch.get_num_threads()} threads "
          "(spread = (max - min) / median)")
    print(f"step: {a.layers} x (Linear {a.hidden} + GELU), {a.tokens} tokens, {a.dtype}, "
          f"{saved_bytes / 2**20:.1f} MiB offloaded a step by ferry; medians of {a.repetitions}")
    for k in variants:
        bytes_note = f"   {moved[k]:.3f}x the bytes moved" if k in moved else ""
        floor_note = f"   {med[k] / floor_ms:.3f}x the link floor" if floor_ms else ""
        print(f"  {k:12s} {med[k]:8.2f} ms   {med[k] / med['none']:.3f}x none   spread {spread[k]:.1%}"
              f"{floor_note}{bytes_note}")
    print(f"  ferry / save_on_cpu: {med['ferry'] / med['save_on_cpu']:.3f}")
    if link:
        print(f"link floor {floor_ms:.2f} ms: forward {link['forward_ms']:.2f} ms or D2H {link['d2h_ms']:.2f} ms "
              f"({link['d2h_gbps']:.1f} GB/s), then backward {link['backward_ms']:.2f} ms or H2D "
              f"{link['h2d_ms']:.2f} ms ({link['h2d_gbps']:.1f} GB/s), whichever is longer")
    target = ("target <= 20" if device.type == "cuda"
              else "the <= 20 us target is for CUDA tensors; the CPU model hands work between threads")
    print(f"per saved tensor (4 KiB, pack + unpack): {per_tensor_us:.1f} us of host time ({target})")
    print(f"  of which ferry.torch's Python layer (the store's calls made no-ops): {layer_us:.1f} us; "
          f"a tensor into the extension: {crossing_us:.2f} us a call, two calls a tensor "
          f"(DLPack exchange table: {exchange})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"step_ms": med, "spread": spread, "offloaded_bytes_per_step": saved_bytes, "bytes_moved": moved,
                       "per_tensor_us": per_tensor_us, "layer_us": layer_us, "crossing_us": crossing_us,
                       "link": link, "args": vars(a), "torch": torch.__version__,
                       "device": where}, f, indent=1)


if __name__ == "__main__":
    main()
