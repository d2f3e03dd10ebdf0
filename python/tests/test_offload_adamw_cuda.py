"""OffloadAdamW with CUDA parameters: each step pulls the parameters and gradients into
pinned copies on a copy stream, steps them on the CPU and pushes them back. These cases
need a CUDA device (the GPU machine's gpu-check, step python-tests) and skip elsewhere.

The reference is the same optimizer on CPU copies of the parameters fed the same
gradients: the CPU kernel is the same, so the parameters and moments must be equal bit for
bit; what is checked is the staging (the copies, their order against the streams)."""

import pytest
import torch

import ferry
import ferry.torch as ft

gpu = ferry.has_cuda and ferry.cuda_device_count() > 0 and torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not gpu, reason="needs a CUDA device and the CUDA build (ferry.has_cuda)")


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.GELU(), torch.nn.Linear(512, 64)).cuda()


def _deep(seed=0):
    """Eight weights of 64 Ki elements or fewer: with states on NVMe, a budget of 2 MiB
    (float32: the ring 3 x 512 KiB) or 3 MiB (bfloat16, with masters: 3 x 768 KiB) keeps
    the biases and some weights in pinned memory and streams six weights."""
    torch.manual_seed(seed)
    inner = [m for _ in range(6) for m in (torch.nn.GELU(), torch.nn.Linear(256, 256))]
    return torch.nn.Sequential(torch.nn.Linear(64, 256), *inner, torch.nn.GELU(), torch.nn.Linear(256, 64)).cuda()


def _lockstep(steps, clip=None, nvme=None, side_stream=False, model=None, **kw):
    """Trains a CUDA model (`model`, else `_model()`) with OffloadAdamW and, beside it, CPU
    copies of its parameters with an OffloadAdamW of their own fed the CUDA gradients;
    returns both."""
    model = _model() if model is None else model
    cpu_params = [p.detach().cpu().clone().requires_grad_() for p in model.parameters()]
    opt = ft.OffloadAdamW(model.parameters(), lr=1e-2, **(nvme or {}), **kw)
    ref = ft.OffloadAdamW(cpu_params, lr=1e-2, **kw)
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    for i in range(steps):
        x = torch.randn(128, 64, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            opt.zero_grad()
            model(x).square().mean().backward()
            if clip is not None:
                torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            grads = [p.grad.detach().cpu() for p in model.parameters()]
            opt.step()
        torch.cuda.current_stream().wait_stream(stream)
        for c, g in zip(cpu_params, grads):
            c.grad = g
        ref.step()
    torch.cuda.synchronize()
    return model, opt, cpu_params, ref


def _assert_same(model, opt, cpu_params, ref):
    for p, c in zip(model.parameters(), cpu_params):
        assert torch.equal(p.detach().cpu(), c.detach())
    sa, sb = opt.state_dict(), ref.state_dict()
    for i in sa["state"]:
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sa["state"][i][key].cpu(), sb["state"][i][key])
        assert float(sa["state"][i]["step"]) == float(sb["state"][i]["step"])


def test_cuda_parameters_step_bit_for_bit_as_their_cpu_copies():
    _assert_same(*_lockstep(4))


def test_clipping_before_step_is_what_the_step_sees():
    _assert_same(*_lockstep(3, clip=0.05))


def test_gradients_made_on_a_side_stream_are_waited_for():
    _assert_same(*_lockstep(3, side_stream=True))


def test_cuda_parameters_with_states_on_nvme(tmp_path):
    nvme = dict(nvme_path=tmp_path / "states.bin", nvme_bytes=64 << 20, pinned_bytes=2 << 20)
    model, opt, cpu_params, ref = _lockstep(3, nvme=nvme, model=_deep())
    assert opt.nvme_stats["spilled_groups"] > 0
    _assert_same(model, opt, cpu_params, ref)


def test_a_change_to_a_cuda_parameter_between_steps_is_seen():
    model = _model()
    opt = ft.OffloadAdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
        with torch.no_grad():
            model[0].weight.fill_(0.5)  # as a user's own update would
    opt.zero_grad()
    model(torch.randn(8, 64, device="cuda")).sum().backward()
    before = model[0].weight.detach().clone()
    opt.step()
    torch.cuda.synchronize()
    moved = (model[0].weight.detach() - before).abs().max().item()
    assert torch.all(before == 0.5) and 0 < moved < 0.1


def test_a_checkpoint_moves_to_torch_adamw_and_back():
    model = _model()
    opt = ft.OffloadAdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        opt.zero_grad()
        model(torch.randn(8, 64, device="cuda")).sum().backward()
        opt.step()
    sd = opt.state_dict()
    plain = torch.optim.AdamW(model.parameters(), lr=1e-2)
    plain.load_state_dict(sd)
    assert plain.state[model[0].weight]["exp_avg"].device.type == "cuda"
    again = ft.OffloadAdamW(model.parameters(), lr=1e-2)
    again.load_state_dict(plain.state_dict())
    for i in sd["state"]:
        assert torch.equal(again.state_dict()["state"][i]["exp_avg"], sd["state"][i]["exp_avg"])


def test_bfloat16_cuda_parameters_step_their_host_master_as_bfloat16_cpu_copies_do():
    torch.manual_seed(0)
    model = _model().to(torch.bfloat16)
    cpu_params = [p.detach().cpu().clone().requires_grad_() for p in model.parameters()]
    opt = ft.OffloadAdamW(model.parameters(), lr=1e-2)
    ref = ft.OffloadAdamW(cpu_params, lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)).float().square().mean().backward()
        for c, p in zip(cpu_params, model.parameters()):
            c.grad = p.grad.cpu()
        opt.step()
        ref.step()
    torch.cuda.synchronize()
    for p, c in zip(model.parameters(), cpu_params):
        assert torch.equal(p.detach().cpu(), c.detach())
        assert torch.equal(opt.state[p]["master"], ref.state[c]["master"])


def test_bfloat16_cuda_parameters_with_their_masters_on_nvme_step_as_bfloat16_cpu_copies_do(tmp_path):
    model = _deep().to(torch.bfloat16)
    cpu_params = [p.detach().cpu().clone().requires_grad_() for p in model.parameters()]
    opt = ft.OffloadAdamW(model.parameters(), lr=1e-2, nvme_path=tmp_path / "states.bin", nvme_bytes=64 << 20,
                          pinned_bytes=3 << 20)
    ref = ft.OffloadAdamW(cpu_params, lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(32, 64, device="cuda", dtype=torch.bfloat16)).float().square().mean().backward()
        for c, p in zip(cpu_params, model.parameters()):
            c.grad = p.grad.cpu()
        opt.step()
        ref.step()
    torch.cuda.synchronize()
    assert opt.nvme_stats["keep_master"] and opt.nvme_stats["spilled_groups"] > 0
    sa, sb = opt.state_dict(), ref.state_dict()
    for p, c in zip(model.parameters(), cpu_params):
        assert torch.equal(p.detach().cpu(), c.detach())
    for i in sb["state"]:
        for key in ("master", "exp_avg", "exp_avg_sq"):
            assert torch.equal(sa["state"][i][key], sb["state"][i][key]), (i, key)
