#!/usr/bin/env python3
"""AdamW step rate of ferry's peers on the CPU, on one set of parameters, threads and
hyper-parameters: DeepSpeedCPUAdam (adamw_mode=True) and torch.optim.AdamW with
foreach=False and foreach=True. Optionally dumps inputs and torch's states after
--check-steps steps (foreach=False) as raw little-endian fp32 files, for a bitwise
comparison with ferry (`ferry-bench adam` reads them).

  python3 scripts/peers/adam_peers.py --elements 268435456 --threads 2 --steps 5 \
      [--dump DIR --check-elements 4194304 --check-steps 10] [--json FILE] [--peers ...]

Prints one JSON object (also to --json): for each peer the seconds of every timed step
and the median steps/s. The hyper-parameters are float32 values given to torch as the
doubles of those floats, as ferry receives them (lr 1e-3, betas 0.9 0.999, eps 1e-8,
weight decay 0.01). A peer whose package is missing is reported as {"error": ...}.
"""
import argparse
import json
import os
import statistics
import sys
import time


def f32(x):
    import numpy as np
    return float(np.float32(x))


def hyper():
    return dict(lr=f32(1e-3), betas=(f32(0.9), f32(0.999)), eps=f32(1e-8), weight_decay=f32(0.01))


def make_inputs(torch, n, seed):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, generator=g) * 4 - 2
    grad = torch.rand(n, generator=g) * 2 - 1
    return p, grad


def time_steps(step, warmup, steps):
    for _ in range(warmup):
        step()
    samples = []
    for _ in range(steps):
        t = time.perf_counter()
        step()
        samples.append(time.perf_counter() - t)
    return samples


def run_torch(torch, n, foreach, warmup, steps):
    p, grad = make_inputs(torch, n, 1)
    param = torch.nn.Parameter(p)
    param.grad = grad
    opt = torch.optim.AdamW([param], foreach=foreach, **hyper())
    return time_steps(opt.step, warmup, steps)


def run_deepspeed(torch, n, warmup, steps):
    from deepspeed.ops.adam import DeepSpeedCPUAdam
    p, grad = make_inputs(torch, n, 1)
    param = torch.nn.Parameter(p)
    param.grad = grad
    h = hyper()
    opt = DeepSpeedCPUAdam([param], lr=h["lr"], betas=h["betas"], eps=h["eps"], weight_decay=h["weight_decay"],
                           adamw_mode=True)
    return time_steps(opt.step, warmup, steps)


def dump(torch, directory, n, steps):
    os.makedirs(directory, exist_ok=True)
    p, grad = make_inputs(torch, n, 2)
    p.numpy().tofile(os.path.join(directory, "p0.f32"))
    grad.numpy().tofile(os.path.join(directory, "g.f32"))
    param = torch.nn.Parameter(p.clone())
    param.grad = grad
    opt = torch.optim.AdamW([param], foreach=False, **hyper())
    for _ in range(steps):
        opt.step()
    state = opt.state[param]
    param.detach().numpy().tofile(os.path.join(directory, "p.f32"))
    state["exp_avg"].numpy().tofile(os.path.join(directory, "m.f32"))
    state["exp_avg_sq"].numpy().tofile(os.path.join(directory, "v.f32"))
    return {"directory": directory, "elements": n, "steps": steps, "same_gradient_every_step": True}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--elements", type=int, default=1 << 28)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per peer")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--peers", nargs="*", default=["deepspeed", "torch-foreach-false", "torch-foreach-true"])
    ap.add_argument("--dump", help="folder for inputs and torch's states after --check-steps steps")
    ap.add_argument("--check-elements", type=int, default=1 << 22)
    ap.add_argument("--check-steps", type=int, default=10)
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", str(a.threads))
    import torch
    torch.set_num_threads(a.threads)
    out = {"elements": a.elements, "threads": a.threads, "torch": torch.__version__,
           "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "hyper": hyper(), "peers": {}}
    runners = {
        "deepspeed": lambda: run_deepspeed(torch, a.elements, a.warmup, a.steps),
        "torch-foreach-false": lambda: run_torch(torch, a.elements, False, a.warmup, a.steps),
        "torch-foreach-true": lambda: run_torch(torch, a.elements, True, a.warmup, a.steps),
    }
    for name in a.peers:
        try:
            samples = runners[name]()
            out["peers"][name] = {"seconds": samples, "steps_per_s": 1.0 / statistics.median(samples)}
        except Exception as e:  # a missing package or a failed JIT build: reported, not fatal
            out["peers"][name] = {"error": f"{type(e).__name__}: {e}"}
        print(f"adam_peers: {name}: {out['peers'][name]}", file=sys.stderr, flush=True)
    if a.dump:
        out["dump"] = dump(torch, a.dump, a.check_elements, a.check_steps)
    text = json.dumps(out)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
