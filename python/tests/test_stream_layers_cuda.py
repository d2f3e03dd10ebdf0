"""ferry.torch.stream_layers with its slots on a CUDA device (ferry._cuda.LayerStack):
outputs and gradients against the same layers run on the GPU as they are, dropout
recomputed with the device's generator, a side stream, and training with OffloadAdamW
(the streamed weights live in pinned host slabs, so the optimizer steps them on the
host). These cases need a CUDA device (the GPU machine's gpu-check, step python-tests)
and skip elsewhere; the stack's stream logic is the CPU model's (test_stream_layers.py)."""

import copy

import pytest
import torch

import ferry
import ferry.torch as ft

gpu = ferry.has_cuda and ferry.cuda_device_count() > 0 and torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not gpu, reason="needs a CUDA device and the CUDA build (ferry.has_cuda)")


def _stack(n=4, d=64, dropout=0.1, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(*[
        torch.nn.Sequential(torch.nn.LayerNorm(d), torch.nn.Linear(d, 2 * d + 3), torch.nn.GELU(),
                            torch.nn.Dropout(dropout), torch.nn.Linear(2 * d + 3, d))
        for _ in range(n)
    ])


@pytest.mark.parametrize("slots", [1, 2, 3])
def test_cuda_slots_give_the_outputs_and_gradients_of_the_layers_on_the_gpu(slots):
    ref = _stack().cuda()
    st = ft.stream_layers(list(copy.deepcopy(_stack())), slots=slots, device="cuda")
    assert st.device.type == "cuda" and all(p.device.type == "cpu" for p in st.parameters())
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    for step in range(3):
        torch.manual_seed(step)
        y = ref(x)
        y.square().sum().backward()
        torch.manual_seed(step)
        y2 = st(x2)
        y2.square().sum().backward()
        torch.cuda.synchronize()
        assert torch.equal(y, y2)
        assert torch.equal(x.grad, x2.grad)
        for (name, a), b in zip(ref.named_parameters(), st.parameters()):
            assert torch.equal(a.grad.cpu(), b.grad), name
    s = st.stats()
    assert s["passes"] == 6 and s["pushes"] == 12 == s["landed"]


def test_parameters_on_the_gpu_move_into_pinned_slabs_and_the_slots_follow_them():
    layers = list(_stack(n=2).cuda())
    st = ft.stream_layers(layers)
    assert st.device == torch.device("cuda", torch.cuda.current_device())
    assert all(p.device.type == "cpu" and p.is_pinned() for p in st.parameters())


def test_a_forward_and_backward_on_a_side_stream():
    ref = _stack(dropout=0.0).cuda()
    st = ft.stream_layers(list(copy.deepcopy(_stack(dropout=0.0))), device="cuda")
    x = torch.randn(256, 64, device="cuda")
    ref(x).square().sum().backward()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        busy = torch.randn(4096, 4096, device="cuda")
        for _ in range(4):
            busy = busy @ busy / 64  # the side stream is busy when the stack orders its work after it
        st(x).square().sum().backward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for a, b in zip(ref.parameters(), st.parameters()):
        assert torch.equal(a.grad.cpu(), b.grad)


def test_training_with_offload_adamw_matches_the_layers_on_the_gpu_with_offload_adamw_on_their_cpu_copies():
    ref_layers = _stack(dropout=0.0).cuda()
    st = ft.stream_layers(list(copy.deepcopy(_stack(dropout=0.0))), slots=2, device="cuda")
    ref_cpu = [p.detach().cpu().clone().requires_grad_() for p in ref_layers.parameters()]
    opt = ft.OffloadAdamW(st.parameters(), lr=1e-2)
    ref_opt = ft.OffloadAdamW(ref_cpu, lr=1e-2)
    for step in range(3):
        x = torch.randn(16, 64, device="cuda")
        opt.zero_grad()
        st(x).square().mean().backward()
        opt.step()
        ref_layers.zero_grad()
        ref_layers(x).square().mean().backward()
        for c, p in zip(ref_cpu, ref_layers.parameters()):
            c.grad = p.grad.cpu()
        ref_opt.step()
        with torch.no_grad():
            for c, p in zip(ref_cpu, ref_layers.parameters()):
                p.copy_(c)
    for a, b in zip(ref_cpu, st.parameters()):
        assert torch.equal(a.detach(), b.detach())


@pytest.mark.parametrize("slots", [1, 2])
def test_frozen_weights_on_nvme_load_into_cuda_slots_and_give_the_gpus_outputs_and_input_gradients(tmp_path, slots):
    ref = _stack().cuda().requires_grad_(False)
    layers = list(copy.deepcopy(_stack()).requires_grad_(False))
    st = ft.stream_layers(layers, slots=slots, device="cuda", nvme_path=tmp_path / "w.bin")
    assert all(p.is_meta for p in st.parameters()) and st.stats()["pinned_bytes"] == 0
    x = torch.randn(32, 64, device="cuda", requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    for step in range(2):
        torch.manual_seed(step)
        y = ref(x)
        y.square().sum().backward()
        torch.manual_seed(step)
        y2 = st(x2)
        y2.square().sum().backward()
        torch.testing.assert_close(y2, y, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(x2.grad, x.grad, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(st(x), ref(x), rtol=1e-5, atol=1e-5)
    for k, v in ref.state_dict().items():
        assert torch.equal(st.state_dict()[f"layers.{k}"], v.cpu()), k


@pytest.mark.parametrize("states_on_nvme", [False, True])
def test_trainable_weights_on_nvme_train_in_cuda_slots_as_from_pinned_slabs(tmp_path, states_on_nvme):
    """The CUDA stack with its weights on NVMe and trainable: the gradients pushed D2H into
    pinned slabs (each .grad a SlabGradient), clipped, stepped by OffloadAdamW through the
    file; bit for bit the same stack's training from pinned slabs."""
    pinned = ft.stream_layers(list(copy.deepcopy(_stack())), slots=2, device="cuda")
    on_file = ft.stream_layers(list(copy.deepcopy(_stack())), slots=2, device="cuda", nvme_path=tmp_path / "w.bin")
    extra = dict(nvme_path=tmp_path / "s.bin", nvme_bytes=1 << 24) if states_on_nvme else {}
    opt_p = ft.OffloadAdamW(pinned.parameters(), lr=1e-2)
    opt_f = ft.OffloadAdamW(on_file.parameters(), lr=1e-2, **extra)
    x = torch.randn(32, 64, device="cuda")
    for step in range(3):
        for st, opt in ((pinned, opt_p), (on_file, opt_f)):
            torch.manual_seed(step)
            st(x).square().mean().backward()
            ft.clip_grad_norm_(st.parameters(), 0.5)
        for a, b in zip(pinned.parameters(), on_file.parameters()):
            assert isinstance(b.grad, ft.SlabGradient) and torch.equal(a.grad, b.grad.values())
        for opt in (opt_p, opt_f):
            opt.step()
            opt.zero_grad()
        for i in range(len(pinned)):
            want, got = pinned.read_weights(i), on_file.read_weights(i)
            assert all(torch.equal(want[k], got[k]) for k in want), (step, i)
