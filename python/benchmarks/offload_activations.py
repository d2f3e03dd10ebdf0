"""ferry.torch.offload_activations against PyTorch's own offload (torch.autograd.graph.
save_on_cpu) and no offload, side by side in one run, on the tensors of this build (CPU
tensors through the CPU model of ferry's device runtime):

- step: a stack of Linear + GELU layers trained a step at a time (forward, backward),
  each variant's median step time over --repetitions, round-robin, and its ratio to no
  offload; ferry with no codec, "bf16" and "fp8", and the bytes each moved against no
  codec's;
- per tensor: the host time each saved tensor costs (pack + unpack), from a step that
  saves --tiny-tensors tensors of 4 KiB through a custom function, minus the same step
  without hooks: the issue's target is <= 20 us a tensor.

    python python/benchmarks/offload_activations.py [--layers 8] [--hidden 1024]
        [--tokens 2048] [--repetitions 7] [--tiny-tensors 2000] [--json out.json]

On a CPU, "offloading" moves host memory to host memory: the figures are ferry's host
cost, not the link's (that needs a GPU, docs/python.md)."""

import argparse
import json
import statistics
import time

import torch

import ferry
import ferry.torch as ft


def stack(layers, hidden, seed=0):
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.GELU()]
    return torch.nn.Sequential(*mods)


def step(model, x, ctx):
    with ctx():
        loss = model(x).square().mean()
    loss.backward()
    model.zero_grad(set_to_none=True)


class Tiny(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, side):
        ctx.save_for_backward(side)
        return x

    @staticmethod
    def backward(ctx, g):
        (side,) = ctx.saved_tensors
        return g + 0 * side[0], None


def tiny_step(n, ctx):
    x = torch.zeros(1, requires_grad=True)
    sides = [torch.full((1024,), float(i)) for i in range(n)]  # 4 KiB each
    t0 = time.perf_counter()
    with ctx():
        y = x
        for s in sides:
            y = Tiny.apply(y, s)
    y.sum().backward()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--repetitions", type=int, default=7)
    ap.add_argument("--tiny-tensors", type=int, default=2000)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    model = stack(a.layers, a.hidden)
    x = torch.randn(a.tokens, a.hidden)
    offload = ft.offload_activations(min_bytes=1 << 16, keep_last=1)
    offload_bf16 = ft.offload_activations(min_bytes=1 << 16, keep_last=1, codec="bf16")
    offload_fp8 = ft.offload_activations(min_bytes=1 << 16, keep_last=1, codec="fp8")
    variants = {
        "none": lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t),
        "save_on_cpu": lambda: torch.autograd.graph.save_on_cpu(pin_memory=False),
        "ferry": lambda: offload,
        "ferry bf16": lambda: offload_bf16,
        "ferry fp8": lambda: offload_fp8,
    }
    for ctx in variants.values():  # warm up (ferry records its first step here)
        step(model, x, ctx)
    times = {k: [] for k in variants}
    for _ in range(a.repetitions):
        for k, ctx in variants.items():
            t0 = time.perf_counter()
            step(model, x, ctx)
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    spread = {k: (max(v) - min(v)) / statistics.median(v) for k, v in times.items()}
    saved_bytes = offload.stats()["offloaded_bytes"] // max(1, offload.stats()["steps"])
    moved = {"ferry": 1.0}  # bytes moved a step, against no codec's
    for name, o in (("ferry bf16", offload_bf16), ("ferry fp8", offload_fp8)):
        moved[name] = (o.stats()["offloaded_bytes"] / max(1, o.stats()["steps"])) / max(1, saved_bytes)

    tiny = ft.offload_activations(min_bytes=0, keep_last=0)
    plain = [tiny_step(a.tiny_tensors, lambda: torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
             for _ in range(3)]
    hooked = [tiny_step(a.tiny_tensors, lambda: tiny) for _ in range(3)]
    per_tensor_us = (statistics.median(hooked) - statistics.median(plain)) / a.tiny_tensors * 1e6

    print(f"offload_activations on {'CUDA' if ferry.has_cuda else 'the CPU model (CPU tensors)'}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"step: {a.layers} x (Linear {a.hidden} + GELU), {a.tokens} tokens, "
          f"{saved_bytes / 2**20:.1f} MiB offloaded a step by ferry; medians of {a.repetitions}")
    for k in variants:
        bytes_note = f"   {moved[k]:.3f}x the bytes moved" if k in moved else ""
        print(f"  {k:12s} {med[k]:8.2f} ms   {med[k] / med['none']:.3f}x none   spread {spread[k]:.1%}{bytes_note}")
    print(f"  ferry / save_on_cpu: {med['ferry'] / med['save_on_cpu']:.3f}")
    print(f"per saved tensor (4 KiB, pack + unpack): {per_tensor_us:.1f} us of host time (target <= 20)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"step_ms": med, "spread": spread, "offloaded_bytes_per_step": saved_bytes, "bytes_moved": moved,
                       "per_tensor_us": per_tensor_us, "args": vars(a), "torch": torch.__version__}, f, indent=1)


if __name__ == "__main__":
    main()
