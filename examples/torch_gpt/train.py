"""A GPT-style model trained with ferry from PyTorch: its transformer blocks are streamed
through K device slots from ferry's pinned slabs (ferry.torch.stream_layers), the
activations autograd saves go to ferry's tensor_cache (ferry.torch.offload_activations)
and AdamW's moments live in ferry's pinned pool (or, with --states-nvme DIR, in a file
there, streamed through three pinned buffers), stepped by ferry's CPU AdamW
(ferry.torch.OffloadAdamW); with --weights-nvme DIR the blocks' weights live in a file
there instead of pinned slabs and are trained from it (their gradients in pinned slabs,
each block read, stepped and written back by the optimizer: ZeRO-Infinity's split). The
same steps run
first with plain PyTorch (no offload, torch.optim.AdamW); the script prints both runs'
losses and step times, what ferry moved, and the memory it kept out of the way. With
--eval-nvme DIR it then evaluates the trained model with its blocks' weights in a file
in DIR instead (frozen, stream_layers(nvme_path=...): inference from NVMe, no pinned
memory holding them) and checks that the loss is the trained model's, bit for bit.

    pip install ./python            # from the repository root, once
    python examples/torch_gpt/train.py [--layers 4] [--width 256] [--tokens 128]
                                       [--batch 8] [--steps 5] [--slots 2]
                                       [--states-nvme DIR] [--weights-nvme DIR]
                                       [--eval-nvme DIR] [--device cpu|cuda]

On the CPU (the default) the model's tensors go through the CPU model of ferry's device
runtime, so the "device" is host memory too: the point is the API and its exactness. With
--device cuda (a build with ferry._cuda, and a GPU) the saved bytes, the slots and the
embedding and head are in the GPU's memory, and the script also prints the peak of
torch's device memory in both runs (docs/python.md)."""

import argparse
import contextlib
import copy
import math
import os
import time

import torch

import ferry
import ferry.torch as ft


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.reshape(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)
        att = att.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool, device=x.device), 1),
                              float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, d))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self, vocab, d, layers, heads, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = torch.nn.Embedding(vocab, d)
        self.blocks = torch.nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln, self.head = torch.nn.LayerNorm(d), torch.nn.Linear(d, vocab)

    def forward(self, tokens):
        return self.head(self.ln(self.blocks(self.emb(tokens))))


def train(model, opt, offload, batches, device, clip=torch.nn.utils.clip_grad_norm_):
    losses, times = [], []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    for x, y in batches:
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with offload:
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        clip(model.parameters(), 1.0)
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return losses, times, peak


def evaluate_from_nvme(model, a, batch, device):
    """The trained model's loss on `batch` without grad, then the same model with copies of
    its blocks frozen and streamed from a file in --eval-nvme (their weights on NVMe:
    stream_layers(nvme_path=...)); True when the two losses are bit for bit equal."""
    x, y = batch
    model.eval()
    with torch.no_grad():
        trained = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).item()
    frozen = GPT(a.vocab, a.width, a.layers, a.heads).to(device).eval()
    for name in ("emb", "ln", "head"):
        getattr(frozen, name).load_state_dict(getattr(model, name).state_dict())
    if model.blocks.stats()["nvme"]:  # trained from a file (meta parameters): new blocks with its values
        blocks = [Block(a.width, a.heads) for _ in model.blocks.layers]
        for i, blk in enumerate(blocks):
            blk.load_state_dict(model.blocks.read_weights(i))
            blk.requires_grad_(False)
    else:
        blocks = [copy.deepcopy(b).requires_grad_(False) for b in model.blocks.layers]  # copies of the slabs' weights
    path = os.path.join(a.eval_nvme, f"torch_gpt-weights-{os.getpid()}.bin")
    frozen.blocks = ft.stream_layers(blocks, slots=a.slots, device=device, nvme_path=path)
    with torch.no_grad():
        times = []
        for _ in range(3):  # the first pass warms the file's engine and the scheduler
            t0 = time.perf_counter()
            loss = torch.nn.functional.cross_entropy(frozen(x).flatten(0, 1), y.flatten()).item()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - t0)
    st = frozen.blocks.stats()
    print(f"evaluation from NVMe: {len(blocks)} frozen blocks in {path} ({st['file_bytes'] / 2**20:.1f} MiB, "
          f"{'O_DIRECT' if st['direct_io'] else 'buffered'}; {st['pinned_bytes']} bytes of pinned slabs), "
          f"{st['loads']} loads ({st['bytes_loaded'] / 2**20:.1f} MiB) in 3 passes of "
          f"{', '.join(f'{t * 1e3:.1f}' for t in times)} ms; loss {loss:.6f}, "
          f"the trained model's {trained:.6f}: equal {loss == trained}")
    return loss == trained


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--slots", type=int, default=2, help="device slots the blocks are streamed through")
    ap.add_argument("--states-nvme", metavar="DIR", default=None,
                    help="keep the optimizer's states in a file in DIR (streamed through 3 pinned buffers)")
    ap.add_argument("--weights-nvme", metavar="DIR", default=None,
                    help="train the blocks with their weights in a file in DIR (gradients in pinned slabs)")
    ap.add_argument("--eval-nvme", metavar="DIR", default=None,
                    help="then evaluate the trained model with its blocks' weights in a file in DIR (frozen)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (a build with ferry._cuda and a GPU)")
    a = ap.parse_args()
    try:
        device = torch.device(a.device)
    except RuntimeError:
        raise SystemExit(f"torch_gpt: --device {a.device!r} is not a device (cpu or cuda)") from None
    if device.type == "cuda" and not (ferry.has_cuda and ferry.cuda_device_count() > 0):
        raise SystemExit(f"torch_gpt: --device cuda needs ferry._cuda (ferry.has_cuda: {ferry.has_cuda}) and a GPU "
                         f"({ferry.cuda_device_count()} seen)")
    if device.type not in ("cpu", "cuda"):
        raise SystemExit(f"torch_gpt: --device {a.device}: the CPU or a CUDA device")

    torch.manual_seed(1)
    batch = (torch.randint(0, a.vocab, (a.batch, a.tokens)).to(device),
             torch.randint(0, a.vocab, (a.batch, a.tokens)).to(device))
    batches = [batch] * a.steps  # one batch, learnt: the loss falls

    ref_model = GPT(a.vocab, a.width, a.layers, a.heads).to(device)
    ref = train(ref_model, torch.optim.AdamW(ref_model.parameters(), lr=3e-3, foreach=False),
                contextlib.nullcontext(), batches, device)

    model = GPT(a.vocab, a.width, a.layers, a.heads).to(device)
    # before the optimizer sees them: the blocks' weights move into pinned host slabs (or a file)
    weights_file = (os.path.join(a.weights_nvme, f"torch_gpt-weights-trained-{os.getpid()}.bin")
                    if a.weights_nvme else None)
    model.blocks = ft.stream_layers(list(model.blocks), slots=a.slots, device=device, nvme_path=weights_file)
    offload = ft.offload_activations(min_bytes=64 << 10, keep_last=1, device=device)
    if a.states_nvme:
        largest = max(p.numel() for p in model.parameters())
        states = sum(p.numel() for p in model.parameters()) * 8
        opt = ft.OffloadAdamW(model.parameters(), lr=3e-3,
                              pinned_bytes=24 * largest + (64 << 10),  # the ring of 3 buffers: every state streamed
                              nvme_path=os.path.join(a.states_nvme, f"torch_gpt-states-{os.getpid()}.bin"),
                              nvme_bytes=2 * states + (16 << 20))
    else:
        opt = ft.OffloadAdamW(model.parameters(), lr=3e-3)
    # ferry's clip: torch's arithmetic, over the slab gradients of weights on NVMe too
    ours = train(model, opt, offload, batches, device, clip=ft.clip_grad_norm_)

    s = offload.stats()
    params = sum(p.numel() for p in model.parameters())
    print(f"torch_gpt: {a.layers} blocks of width {a.width}, {params / 1e6:.2f} M parameters, "
          f"batch {a.batch} x {a.tokens} tokens, {a.steps} steps; ferry-torch {ferry.__version__} "
          f"on {'CUDA, ' + torch.cuda.get_device_name(device) if device.type == 'cuda' else 'the CPU model'}, "
          f"torch {torch.__version__}")
    print("step  loss (torch)   loss (ferry)   ms (torch)  ms (ferry)")
    for i, (lr_, lf, tr, tf) in enumerate(zip(ref[0], ours[0], ref[1], ours[1])):
        print(f"{i:4d}  {lr_:12.6f}   {lf:12.6f}   {tr * 1e3:10.1f}  {tf * 1e3:10.1f}")
    per_step = s["offloaded_bytes"] / max(1, s["steps"])
    print(f"activations: {s['offloaded']} tensors offloaded ({per_step / 2**20:.1f} MiB a step kept off the "
          f"device), {s['fetched']} fetched ({s['prefetched']} prefetched), {s['deduplicated']} saves shared a copy, "
          f"kept where they were: {s['kept']}")
    ls = model.blocks.stats()
    weights = sum(p.numel() * p.element_size() for p in model.blocks.parameters())
    where = (f"in {weights_file} ({ls['file_bytes'] / 2**20:.1f} MiB, {'O_DIRECT' if ls['direct_io'] else 'buffered'}"
             f"; {ls['pinned_bytes'] / 2**20:.1f} MiB of pinned gradient slabs)" if weights_file else "in pinned slabs")
    print(f"layers: {a.layers} blocks streamed through {a.slots} slots ({ls['slot_bytes'] / 2**20:.1f} MiB on the "
          f"device for {weights / 2**20:.1f} MiB of weights {where}), {ls['loads']} loads "
          f"({ls['bytes_loaded'] / 2**20:.1f} MiB), {ls['pushes']} gradient pushes "
          f"({ls['bytes_pushed'] / 2**20:.1f} MiB) in {ls['passes']} passes")
    if opt.nvme_stats is not None:
        n = opt.nvme_stats
        print(f"optimizer: AdamW states of {n['groups']} parameters in {a.states_nvme} ({n['spilled_groups']} "
              f"streamed through {n['host_bytes'] / 2**20:.1f} MiB of pinned buffers, {n['resident_groups']} resident; "
              f"{n['bytes_read'] / 2**20:.1f} MiB read, {n['bytes_written'] / 2**20:.1f} MiB written, "
              f"{n['engine']}, {'O_DIRECT' if n['direct_io'] else 'buffered'}), ferry's {opt.isa} kernel "
              f"on {opt.threads} threads")
    else:
        print(f"optimizer: {opt.state_bytes / 2**20:.1f} MiB of AdamW moments in ferry's pinned pool "
              f"(kept off the device), ferry's {opt.isa} kernel on {opt.threads} threads")
    if device.type == "cuda":
        print(f"device memory (torch's allocator, peak over the steps): {ref[2] / 2**20:.1f} MiB with plain "
              f"PyTorch, {ours[2] / 2**20:.1f} MiB with ferry (its own device memory, slots and copies waiting "
              f"for the link, is beside it: {ls['slot_bytes'] / 2**20:.1f} MiB of slots)")
    worst = max(abs(x - y) / abs(x) for x, y in zip(ref[0], ours[0]))
    ok = ours[0][0] == ref[0][0] and worst < 1e-4 and ours[0][-1] < ours[0][0]
    if a.eval_nvme:
        ok = evaluate_from_nvme(model, a, batch, device) and ok
    print(f"losses: first equal {ours[0][0] == ref[0][0]}, largest relative difference {worst:.2e} "
          f"(parameters within an ulp a step of torch's AdamW), falling {ours[0][-1] < ours[0][0]}")
    print("torch_gpt: ok" if ok else "torch_gpt: FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
