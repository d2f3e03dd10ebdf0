"""ferry.torch.offload_activations on CUDA tensors (ferry._cuda, the CUDA build's store),
and what a build or a machine without CUDA says when asked for it.

The CUDA cases run where a GPU is (the GPU machine's ``gpu-check``: step python-tests)
and skip elsewhere; the others run everywhere: the store of CUDA tensors is the one of
CPU tensors on another runtime (python/src/activation_store.hpp), whose stream logic the
CPU model runs in every other test of offload_activations."""

import gc
import importlib.util

import pytest
import torch

import ferry
import ferry.torch as ft

from _models import _GPT

gpu = ferry.has_cuda and ferry.cuda_device_count() > 0 and torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not gpu, reason="needs a CUDA device and the CUDA build (ferry.has_cuda)")


# --- everywhere ---------------------------------------------------------------------------


def test_has_cuda_says_whether_the_cuda_module_is_there():
    present = importlib.util.find_spec("ferry._cuda") is not None
    assert ferry.has_cuda is present
    assert ferry.cuda_device_count() >= 0
    if not present:
        assert ferry.cuda_device_count() == 0


@pytest.mark.skipif(gpu, reason="a CUDA device is here")
def test_without_a_usable_cuda_device_the_default_is_the_cpu_and_cuda_is_refused_clearly():
    off = ft.offload_activations()
    assert off.device == torch.device("cpu")
    with pytest.raises(ValueError, match="cuda"):
        ft.offload_activations(device="cuda")
    with pytest.raises(ValueError, match="cuda:1"):
        ft.offload_activations(device=torch.device("cuda", 1))


@pytest.mark.skipif(not ferry.has_cuda or gpu, reason="needs the CUDA build on a machine without a CUDA device")
def test_the_cuda_store_refuses_a_device_that_is_not_there_naming_the_count():
    from ferry import _cuda

    assert _cuda.device_count() == 0
    with pytest.raises(ValueError, match=r"CUDA device 0 does not exist \(this process sees 0\)"):
        _cuda.ActivationStore(0, 0, 0, 0, 1 << 20)
    with pytest.raises(ValueError, match="CUDA device -1 does not exist"):
        _cuda.ActivationStore(-1, 0, 0, 0, 1 << 20)


@pytest.mark.parametrize("device", ["tpu", "meta", "not a device", 3.5])
def test_a_device_that_is_not_the_cpu_or_cuda_is_a_value_error_naming_it(device):
    with pytest.raises(ValueError, match="device"):
        ft.offload_activations(device=device)


# --- on a GPU ---------------------------------------------------------------------------


def _mlp(device, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(256, 1024), torch.nn.GELU(), torch.nn.LayerNorm(1024), torch.nn.Linear(1024, 256)
    ).to(device)


def _grads(model):
    return [p.grad.clone() for p in model.parameters()]


@needs_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cuda_gradients_are_bit_for_bit_those_without_offload(dtype):
    x = torch.randn(64, 256, device="cuda", dtype=dtype)
    ref, model = _mlp("cuda").to(dtype), _mlp("cuda").to(dtype)
    ref(x).float().square().mean().backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    assert off.device == torch.device("cuda", torch.cuda.current_device())
    with off:
        loss = model(x).float().square().mean()
    s = off.stats()
    assert s["offloaded"] >= 3 and s["devices"] == [str(off.device)]
    loss.backward()
    for a, b in zip(_grads(ref), _grads(model)):
        assert torch.equal(a, b)
    assert off.stats()["held"] == 0


@needs_gpu
def test_a_cuda_transformer_trains_the_same_over_steps_with_prefetch_replayed():
    tokens = torch.randint(0, 97, (4, 32, 48), device="cuda")
    losses = {}
    for mode in ("plain", "ferry"):
        model = _GPT(d=64, layers=2).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        off = ft.offload_activations(min_bytes=0, keep_last=1)
        out = []
        for i in range(4):
            torch.manual_seed(100 + i)
            opt.zero_grad()
            x, y = tokens[i, :, :-1], tokens[i, :, 1:]
            if mode == "plain":
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            else:
                with off:
                    loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[mode] = out
        if mode == "ferry":
            assert off.stats()["steps"] == 4 and off.stats()["fetched"] > 0
    assert losses["plain"] == losses["ferry"]


@needs_gpu
def test_saves_under_a_side_stream_come_back_for_a_backward_on_it():
    # The forward on a side stream with work queued behind a long kernel: the copy of each
    # saved tensor must wait for the stream that made it, and the backward (on the same
    # stream, as autograd replays the forward's streams) must see the bytes back.
    side = torch.cuda.Stream()
    x = torch.randn(2048, 256, device="cuda")
    ref, model = _mlp("cuda"), _mlp("cuda")
    ref(x).square().mean().backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        big = torch.randn(4096, 4096, device="cuda")
        for _ in range(4):
            big = big @ big / 64  # keeps the side stream busy while the hooks run
        with off:
            loss = model(x).square().mean()
        loss.backward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for a, b in zip(_grads(ref), _grads(model)):
        assert torch.equal(a, b)


@needs_gpu
def test_memory_freed_after_a_save_is_not_overwritten_before_the_copy_reads_it():
    # Each saved tensor is dropped by the forward at once and its memory reused by the next
    # op on the same stream: had the store's copy not ordered the stream after it, the
    # bytes it read would be the next op's.
    x = torch.randn(1024, 1024, device="cuda")
    keep = []
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        h = x.requires_grad_()
        for i in range(8):
            h = torch.sin(h + i)
            keep.append(torch.full((1024, 1024), float(i), device="cuda"))  # reuses freed blocks
        loss = h.sum()
    loss.backward()
    ref = x.detach().clone().requires_grad_()
    h = ref
    for i in range(8):
        h = torch.sin(h + i)
    h.sum().backward()
    assert torch.equal(x.grad, ref.grad)


@needs_gpu
@pytest.mark.parametrize("codec", ["bf16", "fp8"])
def test_cuda_codecs_stay_close_and_move_fewer_bytes(codec):
    x = torch.randn(256, 256, device="cuda")
    ref, model = _mlp("cuda"), _mlp("cuda")
    ref(x).square().mean().backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0, codec=codec)
    with off:
        loss = model(x).square().mean()
    s = off.stats()
    assert s["encoded"] > 0 and s["offloaded_bytes"] < s["encoded_bytes"]
    loss.backward()
    tol = 2e-2 if codec == "bf16" else 2e-1
    for a, b in zip(_grads(ref), _grads(model)):
        assert torch.allclose(a, b, rtol=tol, atol=tol * a.abs().max().item())


@needs_gpu
def test_cuda_tensors_spill_to_nvme_and_come_back_exact(tmp_path):
    x = torch.randn(512, 256, device="cuda")
    ref, model = _mlp("cuda"), _mlp("cuda")
    ref(x).square().mean().backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0, pinned_bytes=1 << 20, nvme_path=tmp_path / "acts.bin",
                                 nvme_bytes=64 << 20)
    with off:
        loss = model(x).square().mean()
    assert off.stats()["spilled"] > 0
    loss.backward()
    for a, b in zip(_grads(ref), _grads(model)):
        assert torch.equal(a, b)
    del off
    gc.collect()


@needs_gpu
def test_cpu_and_cuda_tensors_in_one_step_each_go_to_their_devices_store(tmp_path):
    off = ft.offload_activations(min_bytes=0, keep_last=0, nvme_path=tmp_path / "a.bin", nvme_bytes=8 << 20)
    a = torch.randn(64, 64, device="cuda", requires_grad=True)
    b = torch.randn(64, 64, requires_grad=True)
    with off:
        loss = (a.sin() * 2).sum() + (b.sin() * 2).sum()
    s = off.stats()
    assert sorted(s["devices"]) == sorted([str(off.device), "cpu"])
    assert [f.name for f in tmp_path.iterdir()] == ["a.bin"]  # the first store's file only
    loss.backward()
    assert torch.equal(a.grad, 2 * a.detach().cos()) and torch.equal(b.grad, 2 * b.detach().cos())
