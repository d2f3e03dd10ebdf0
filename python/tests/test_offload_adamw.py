"""ferry.torch.OffloadAdamW against torch.optim.AdamW(foreach=False): moments bit for bit,
parameters within one rounding of the update per step (PyTorch's vectorised CPU sqrt is
not correctly rounded; ferry's is), param groups, an lr scheduler, gradient clipping, resuming from a state_dict
bit for bit, checkpoints moving between the two optimizers, and the errors."""

import copy
import io

import numpy as np
import pytest
import torch

import ferry.torch as ft


def _close(a, b, steps, lr):
    """|a - b| <= steps * (2**-23 |a| + 2**-20 lr) elementwise: a rounding of the parameter
    and of the update per step, the bound docs/python.md states."""
    a, b = a.detach(), b.detach()
    return bool(((a - b).abs() <= steps * (2.0**-23 * a.abs() + 2.0**-20 * lr)).all())


def _grads(shapes, steps, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in shapes] for _ in range(steps)]


def _run(opt_factory, params, grads, clip=None, scheduler=None):
    opt = opt_factory(params)
    sched = scheduler(opt) if scheduler else None
    for gs in grads:
        for p, g in zip(params, gs):
            p.grad = g.clone()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        if sched:
            sched.step()
    return opt


def _fresh(shapes, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in shapes]


SHAPES = [(257, 129), (4099,), (3, 5, 7), (1,)]


@pytest.mark.parametrize("hp", [dict(), dict(lr=3e-4, betas=(0.8, 0.95), weight_decay=0.1), dict(lr=1e-2, weight_decay=0.0, eps=1e-6)])
def test_moments_bit_for_bit_and_parameters_within_an_ulp_a_step(hp):
    steps = 6
    grads = _grads(SHAPES, steps)
    ref_p, our_p = _fresh(SHAPES), _fresh(SHAPES)
    ref = _run(lambda ps: torch.optim.AdamW(ps, foreach=False, **hp), ref_p, grads)
    ours = _run(lambda ps: ft.OffloadAdamW(ps, **hp), our_p, grads)
    for a, b in zip(ref_p, our_p):
        assert _close(a, b, steps, hp.get("lr", 1e-3))
        sa, sb = ref.state[a], ours.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"])
        assert torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert sa["step"].item() == sb["step"].item() == steps
    assert ours.state_bytes >= 8 * sum(p.numel() for p in our_p)


def test_param_groups_a_scheduler_and_clipping_as_torch():
    steps = 5
    grads = _grads(SHAPES, steps, seed=11)

    def groups(ps, cls, **kw):
        return cls([{"params": ps[:2]}, {"params": ps[2:], "lr": 5e-3, "weight_decay": 0.0}], lr=1e-3, **kw)

    sched = lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=2, gamma=0.5)  # noqa: E731
    ref_p, our_p = _fresh(SHAPES), _fresh(SHAPES)
    ref = _run(lambda ps: groups(ps, torch.optim.AdamW, foreach=False), ref_p, grads, clip=1.0, scheduler=sched)
    ours = _run(lambda ps: groups(ps, ft.OffloadAdamW), our_p, grads, clip=1.0, scheduler=sched)
    for a, b in zip(ref_p, our_p):
        assert _close(a, b, steps, 5e-3)
        assert torch.equal(ref.state[a]["exp_avg"], ours.state[b]["exp_avg"])
    assert [g["lr"] for g in ours.param_groups] == [g["lr"] for g in ref.param_groups]


def test_resuming_from_a_state_dict_is_bit_for_bit():
    grads = _grads(SHAPES, 6, seed=2)
    straight_p = _fresh(SHAPES)
    straight = _run(lambda ps: ft.OffloadAdamW(ps, lr=1e-2), straight_p, grads)

    first_p = _fresh(SHAPES)
    first = _run(lambda ps: ft.OffloadAdamW(ps, lr=1e-2), first_p, grads[:3])
    buf = io.BytesIO()
    torch.save({"params": [p.detach().clone() for p in first_p], "opt": first.state_dict()}, buf)
    del first
    buf.seek(0)
    saved = torch.load(buf)
    resumed_p = [p.clone().requires_grad_() for p in saved["params"]]
    resumed = ft.OffloadAdamW(resumed_p, lr=1e-2)
    resumed.load_state_dict(saved["opt"])
    assert resumed.state_bytes >= 8 * sum(p.numel() for p in resumed_p)  # the moments are in the pool again
    for gs in grads[3:]:
        for p, g in zip(resumed_p, gs):
            p.grad = g.clone()
        resumed.step()
    for a, b in zip(straight_p, resumed_p):
        assert torch.equal(a, b)
        assert torch.equal(straight.state[a]["exp_avg_sq"], resumed.state[b]["exp_avg_sq"])


def test_a_torch_adamw_checkpoint_loads_into_offload_adamw_and_back():
    grads = _grads(SHAPES, 4, seed=9)
    p_torch = _fresh(SHAPES)
    t_opt = _run(lambda ps: torch.optim.AdamW(ps, foreach=False), p_torch, grads[:2])
    p_ours = [p.detach().clone().requires_grad_() for p in p_torch]
    ours = ft.OffloadAdamW(p_ours)
    ours.load_state_dict(copy.deepcopy(t_opt.state_dict()))
    for gs in grads[2:]:
        for p, q, g in zip(p_torch, p_ours, gs):
            p.grad, q.grad = g.clone(), g.clone()
        t_opt.step()
        ours.step()
    for a, b in zip(p_torch, p_ours):
        assert _close(a, b, 2, 1e-3)
        assert torch.equal(t_opt.state[a]["exp_avg"], ours.state[b]["exp_avg"])
    back = torch.optim.AdamW(p_torch, foreach=False)
    back.load_state_dict(ours.state_dict())  # and the other way
    assert back.state[p_torch[0]]["step"].item() == 4


def test_thread_counts_give_the_same_bits():
    grads = _grads([(70001,)], 3, seed=4)
    results = []
    for threads in (1, 2, 3):
        ps = _fresh([(70001,)])
        _run(lambda q: ft.OffloadAdamW(q, threads=threads), ps, grads)
        results.append(ps[0].detach())
    assert torch.equal(results[0], results[1]) and torch.equal(results[0], results[2])


def test_parameters_without_gradients_and_empty_ones_are_left_alone():
    a, b, e = torch.randn(10, requires_grad=True), torch.randn(10, requires_grad=True), torch.zeros(0, requires_grad=True)
    opt = ft.OffloadAdamW([a, b, e])
    before = b.detach().clone()
    a.grad, e.grad = torch.randn(10), torch.zeros(0)
    opt.step()
    assert torch.equal(b.detach(), before) and not opt.state.get(b)
    assert opt.state[e]["step"].item() == 1


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(lr=-1.0), "learning rate"),
        (dict(betas=(0.9, 1.0)), "beta parameter at index 1"),
        (dict(eps=0.0), "epsilon"),
        (dict(weight_decay=-0.1), "weight_decay"),
        (dict(amsgrad=True), "amsgrad"),
        (dict(pinned_bytes=-5), "pinned_bytes"),
    ],
)
def test_bad_hyper_parameters_are_value_errors_naming_them(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ft.OffloadAdamW([torch.randn(3, requires_grad=True)], **kwargs)


def test_parameters_ferry_cannot_step_are_refused_with_their_shape_and_dtype():
    with pytest.raises(ValueError, match="float32.*float64"):
        ft.OffloadAdamW([torch.randn(3, dtype=torch.float64, requires_grad=True)])
    with pytest.raises(ValueError, match="contiguous"):
        ft.OffloadAdamW([torch.randn(4, 4).t().requires_grad_()])
    with pytest.raises(ValueError, match="on the CPU or a CUDA device.*meta"):
        ft.OffloadAdamW([torch.randn(3, device="meta", requires_grad=True)])


def test_moments_that_do_not_fit_the_pool_are_a_memory_error_and_nothing_changes():
    small = torch.randn(1000, requires_grad=True)
    big = torch.randn(5 << 20, requires_grad=True)  # 40 MiB of moments
    opt = ft.OffloadAdamW([small, big], pinned_bytes=16 << 20)
    small.grad, big.grad = torch.randn(1000), torch.randn(5 << 20)
    before = (small.detach().clone(), big.detach().clone())
    for _ in range(2):  # and again: nothing stepped twice
        with pytest.raises(MemoryError):
            opt.step()
        assert torch.equal(small.detach(), before[0]) and torch.equal(big.detach(), before[1])
        assert not opt.state.get(small) and not opt.state.get(big)
        assert opt.state_bytes == 0


def test_the_documented_budget_holds_the_moments():
    sizes = [(5 << 20) + 3, 1, 777, 1 << 20]
    params = [torch.randn(n, requires_grad=True) for n in sizes]
    budget = 8 * sum(sizes) + 512 * len(sizes) + (16 << 20)
    opt = ft.OffloadAdamW(params, pinned_bytes=budget)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    assert all(opt.state[p]["step"].item() == 1 for p in params)


def test_a_step_that_fails_a_check_changes_nothing():
    p1, p2 = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(3))
    opt = ft.OffloadAdamW([{"params": [p1]}, {"params": [p2]}], lr=0.1)
    p1.grad = p2.grad = torch.ones(3)
    opt.param_groups[1]["lr"] = -1.0
    with pytest.raises(ValueError, match="learning rate"):
        opt.step()
    assert torch.equal(p1.detach(), torch.ones(3)) and not opt.state.get(p1)
    opt.param_groups[1]["lr"] = np.float32(0.1)  # numpy and torch numbers are taken
    opt.param_groups[0]["betas"] = (torch.tensor(0.9), np.float64(0.999))
    opt.step()
    assert opt.state[p1]["step"].item() == opt.state[p2]["step"].item() == 1


def test_a_group_added_with_a_bad_parameter_or_value_is_refused_and_not_added():
    opt = ft.OffloadAdamW([torch.randn(3, requires_grad=True)])
    for group, match in (
        ({"params": [torch.randn(3, dtype=torch.float64, requires_grad=True)]}, "float32"),
        ({"params": [torch.randn(4, 4).t().requires_grad_()]}, "contiguous"),
        ({"params": [torch.randn(3, requires_grad=True)], "lr": -1.0}, "learning rate"),
        ({"params": [torch.randn(3).to_sparse().requires_grad_()]}, "sparse"),
    ):
        with pytest.raises(ValueError, match=match):
            opt.add_param_group(group)
        assert len(opt.param_groups) == 1


def test_a_failed_load_keeps_the_optimizer_as_it_was():
    grads = _grads([(3,), (4,)], 2, seed=8)
    a_params = _fresh([(3,), (4,)])
    a = _run(lambda ps: ft.OffloadAdamW(ps), a_params, grads)
    snapshot = copy.deepcopy(a.state_dict())
    wrong = _run(lambda ps: torch.optim.AdamW(ps, foreach=False), _fresh([(4,), (3,)]), [[torch.randn(4), torch.randn(3)]])
    sgd = torch.optim.SGD(_fresh([(3,), (4,)]), lr=0.1, momentum=0.9)
    for p in sgd.param_groups[0]["params"]:
        p.grad = torch.ones_like(p)
    sgd.step()
    amsgrad = torch.optim.AdamW(_fresh([(3,), (4,)]), amsgrad=True)
    for bad, match in ((wrong.state_dict(), "shape"), (sgd.state_dict(), "not an AdamW state"), (amsgrad.state_dict(), "amsgrad")):
        with pytest.raises(ValueError, match=match):
            a.load_state_dict(bad)
        after = a.state_dict()
        for i in (0, 1):
            assert torch.equal(after["state"][i]["exp_avg"], snapshot["state"][i]["exp_avg"])
        assert after["param_groups"][0]["lr"] == snapshot["param_groups"][0]["lr"]
    for p, g in zip(a_params, grads[0]):
        p.grad = g.clone()
    a.step()  # still steps


def test_a_copy_of_the_optimizer_has_its_own_pool_and_steps_the_same():
    import pickle

    grads = _grads(SHAPES, 4, seed=12)
    params = _fresh(SHAPES)
    opt = _run(lambda ps: ft.OffloadAdamW(ps, threads=1), params, grads[:2])
    for twin_of in (copy.deepcopy, lambda o: pickle.loads(pickle.dumps(o))):
        twin = twin_of({"params": params, "opt": opt})
        tp, to = twin["params"], twin["opt"]
        assert to.state_bytes == opt.state_bytes and to.threads == 1
        for p, q, g in zip(params, tp, grads[2]):
            q.grad = g.clone()
        to.step()
        assert opt.state[params[0]]["step"].item() == 2  # the original is untouched
        ref_params = [p.detach().clone().requires_grad_() for p in params]
        ref = ft.OffloadAdamW(ref_params, threads=1)
        ref.load_state_dict(opt.state_dict())
        for p, g in zip(ref_params, grads[2]):
            p.grad = g.clone()
        ref.step()
        for a, b in zip(ref_params, tp):
            assert torch.equal(a, b)


def test_a_gradient_sharing_its_parameters_memory_is_read_before_the_update():
    # p.grad = p.detach(): ferry reads the gradient as it was at the call (torch's in-place
    # weight decay changes such a gradient before its moments read it).
    p = torch.randn(100, requires_grad=True)
    q = p.detach().clone().requires_grad_()
    p.grad = p.detach()
    q.grad = q.detach().clone()
    mine, ref = ft.OffloadAdamW([p]), ft.OffloadAdamW([q])
    mine.step()
    ref.step()
    assert torch.equal(p, q)
    assert torch.equal(mine.state[p]["exp_avg"], ref.state[q]["exp_avg"])


def test_settings_take_numpy_integers_and_refuse_what_does_not_fit():
    assert ft.OffloadAdamW([torch.randn(2, requires_grad=True)], pinned_bytes=np.int64(1 << 20), threads=np.int32(1)).threads == 1
    with pytest.raises(ValueError, match="pinned_bytes"):
        ft.OffloadAdamW([torch.randn(2, requires_grad=True)], pinned_bytes=2**64)


def test_a_small_transformer_trains_with_offloaded_activations_and_states():
    from test_offload_activations import _GPT

    torch.manual_seed(7)
    batch = (torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16)))
    batches = [batch] * 6  # one batch, learnt: the loss must fall

    def train(model, opt, offload):
        losses = []
        for i, (x, y) in enumerate(batches):
            torch.manual_seed(1000 + i)
            opt.zero_grad()
            with offload:
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        return losses

    import contextlib

    ref_model = _GPT()
    ref = train(ref_model, torch.optim.AdamW(ref_model.parameters(), lr=3e-3, foreach=False), contextlib.nullcontext())
    model = _GPT()
    off = ft.offload_activations(min_bytes=4096)
    ours = train(model, ft.OffloadAdamW(model.parameters(), lr=3e-3), off)
    assert ours[0] == ref[0]  # the first forward pass sees the same weights
    assert ours == pytest.approx(ref, rel=1e-4)  # then ulps of the parameters, no more
    assert ours[-1] < ours[0]
    assert off.stats()["offloaded"] > 0


def test_a_load_keeps_the_optimizers_own_settings():
    params = _fresh(SHAPES)
    opt = ft.OffloadAdamW(params, threads=1, fused_rounding=False, pinned_bytes=64 << 20)
    for p, g in zip(params, _grads(SHAPES, 1)[0]):
        p.grad = g
    opt.step()
    opt.load_state_dict(opt.state_dict())
    assert opt.threads == 1 and opt._pool.budget == 64 << 20
    assert opt._settings["fused_rounding"] is False


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_step_their_fp32_master_and_are_its_rounding(dtype):
    torch.manual_seed(0)
    params = [torch.randn(257, dtype=dtype, requires_grad=True), torch.randn(8, 33, dtype=dtype, requires_grad=True)]
    masters = [p.detach().float().clone().requires_grad_() for p in params]
    opt = ft.OffloadAdamW(params, lr=1e-2, weight_decay=0.1)
    ref = ft.OffloadAdamW(masters, lr=1e-2, weight_decay=0.1)
    for _ in range(4):
        for p, m in zip(params, masters):
            p.grad = torch.randn(p.shape).to(dtype)
            m.grad = p.grad.float()
        opt.step()
        ref.step()
        for p, m in zip(params, masters):
            assert torch.equal(opt.state[p]["master"], m.detach())
            assert torch.equal(p.detach(), m.detach().to(dtype))  # rounded to nearest even
            assert torch.equal(opt.state[p]["exp_avg"], ref.state[m]["exp_avg"])


def test_a_low_precision_run_resumes_bit_for_bit_through_state_dict():
    torch.manual_seed(1)
    p = torch.randn(100, dtype=torch.bfloat16, requires_grad=True)
    grads = [torch.randn(100).bfloat16() for _ in range(4)]
    q = p.detach().clone().requires_grad_()
    straight = ft.OffloadAdamW([q], lr=1e-2)
    for g in grads:
        q.grad = g
        straight.step()
    first = ft.OffloadAdamW([p], lr=1e-2)
    for g in grads[:2]:
        p.grad = g
        first.step()
    sd = copy.deepcopy(first.state_dict())
    assert sd["state"][0]["master"].dtype == torch.float32
    second = ft.OffloadAdamW([p], lr=1e-2)
    second.load_state_dict(sd)  # torch's load casts to bfloat16; the master and moments stay float32
    assert torch.equal(second.state[p]["master"], first.state[p]["master"])
    for g in grads[2:]:
        p.grad = g
        second.step()
    assert torch.equal(p.detach(), q.detach())
    assert torch.equal(second.state[p]["master"], straight.state[q]["master"])


def test_a_change_to_a_low_precision_parameter_between_steps_reseeds_its_master():
    p = torch.randn(64, dtype=torch.bfloat16, requires_grad=True)
    opt = ft.OffloadAdamW([p], lr=1e-3)
    p.grad = torch.ones(64, dtype=torch.bfloat16)
    opt.step()
    opt.step()  # no change between: the master goes on (it is not the rounded parameter)
    with torch.no_grad():
        p.fill_(0.5)
    opt.step()
    master = opt.state[p]["master"]
    assert torch.all((master - 0.5).abs() < 0.01) and torch.equal(p.detach(), master.to(torch.bfloat16))
    p.data = torch.full((64,), 2.0, dtype=torch.bfloat16)  # a new .data: re-seeded too
    opt.step()
    assert torch.all((opt.state[p]["master"] - 2.0).abs() < 0.01)
    p.data.clamp_(-0.01, 0.01)  # in place through .data (no version bump): re-seeded too
    opt.step()
    assert torch.all(opt.state[p]["master"].abs() < 0.02)
    for _ in range(3):  # and the same memory written twice (p.data = p.data * 2 may reuse its address)
        p.data = p.data * 2
    opt.step()
    assert torch.all((opt.state[p]["master"].abs() - 0.08).abs() < 0.01)
    p.data = p.data.float()  # made float32: its own master
    p.grad = torch.ones(64)
    opt.step()
    assert "master" not in opt.state[p]


def test_a_torch_adamw_state_of_low_precision_parameters_loads_with_the_master_from_the_parameter():
    p = torch.randn(32, dtype=torch.bfloat16, requires_grad=True)
    plain = torch.optim.AdamW([p], lr=1e-2)
    p.grad = torch.randn(32).bfloat16()
    plain.step()
    opt = ft.OffloadAdamW([p], lr=1e-2)
    opt.load_state_dict(plain.state_dict())
    assert "master" not in opt.state[p]  # taken from the parameter at the next step
    assert opt.state[p]["exp_avg"].dtype == torch.float32
    weights = torch.randn(32).bfloat16()
    with torch.no_grad():
        p.copy_(weights)  # the model's own checkpoint, loaded after the optimizer's
    before = weights.float()
    opt.step()
    assert torch.equal(p.detach(), opt.state[p]["master"].bfloat16())
    assert (opt.state[p]["master"] - before).abs().max() < 0.05  # stepped from the loaded weights


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_a_nan_in_a_low_precision_parameter_does_not_reseed_the_rest_of_its_master(dtype):
    """AdamW steps each element on its own: the elements beside a NaN keep the master they
    have without it (a value comparison would find NaN != NaN and re-seed the whole master
    from the rounded parameter at every step)."""
    g = torch.Generator().manual_seed(2)
    values = torch.randn(256, generator=g)
    clean = values.to(dtype).requires_grad_()
    dirty = values.clone()
    dirty[0] = float("nan")
    dirty = dirty.to(dtype).requires_grad_()
    opts = [ft.OffloadAdamW([p], lr=1e-3) for p in (clean, dirty)]
    for _ in range(4):
        grad = torch.randn(256, generator=g).to(dtype)
        for p, opt in zip((clean, dirty), opts):
            p.grad = grad.clone()
            opt.step()
    a, b = opts[0].state[clean]["master"], opts[1].state[dirty]["master"]
    assert torch.equal(a[1:], b[1:]) and b[0].isnan()
    assert torch.equal(clean[1:], dirty[1:])
    assert not torch.equal(a[1:], clean[1:].float())  # the master holds more than the parameter


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reseed", [False, True])
def test_the_16_bit_step_in_one_call_equals_the_same_passes_as_torch_ops(dtype, reseed):
    """`_core.AdamW.step_low` (the pinned path's one call) against compare, widen, step and
    round written as torch ops around the float32 step: bit for bit, with ties to even,
    subnormals, infinities and a NaN among the elements (NaN: any NaN)."""
    from ferry import _core

    g = torch.Generator().manual_seed(3 + reseed)
    n = 4099  # not a multiple of any vector width
    master = torch.randn(n, generator=g) * 4
    master[:8] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-40, -3e-39, 65504.0, 1.0 + 2**-8])
    master[8] = float("nan")
    low = master.to(dtype)
    if reseed:
        low[100:200] = torch.randn(100, generator=g).to(dtype)  # changed since the master was rounded
    grad = (torch.randn(n, generator=g) * 1e-2).to(dtype)
    moments = (torch.randn(n, generator=g) * 1e-3, torch.rand(n, generator=g) * 1e-5)
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, step=3)
    adamw = _core.AdamW(1, True)

    ref_low, ref_master, ref_m, ref_v = low.clone(), master.clone(), moments[0].clone(), moments[1].clone()
    changed = not torch.equal(ref_low.view(torch.int16), ref_master.to(dtype).view(torch.int16))
    assert changed == reseed  # both branches: the master re-seeded, or stepped on
    if changed:
        ref_master.copy_(ref_low)
    adamw.step(ref_master, grad.float(), ref_m, ref_v, **hyper)
    ref_low.copy_(ref_master)

    got_low, got_master, got_m, got_v = low.clone(), master.clone(), moments[0].clone(), moments[1].clone()
    adamw.step_low(str(dtype)[6:], got_low.view(torch.int16), grad.view(torch.int16), got_master, got_m, got_v, **hyper)

    nan = ref_master.isnan()
    assert torch.equal(nan, got_master.isnan()) and torch.equal(ref_low.isnan(), got_low.isnan())
    assert torch.equal(ref_master[~nan].view(torch.int32), got_master[~nan].view(torch.int32))
    keep = ~ref_low.isnan()
    assert torch.equal(ref_low[keep].view(torch.int16), got_low[keep].view(torch.int16))
    assert torch.equal(ref_m[~nan], got_m[~nan]) and torch.equal(ref_v[~nan], got_v[~nan])


def test_the_16_bit_step_refuses_other_dtypes_and_arrays_of_different_lengths():
    from ferry import _core

    adamw = _core.AdamW(1, True)
    low = torch.zeros(8, dtype=torch.int16)
    f = [torch.zeros(8) for _ in range(3)]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1)
    with pytest.raises(ValueError, match="'bfloat16' or 'float16', not 'float32'"):
        adamw.step_low("float32", low, low.clone(), *f, **hyper)
    with pytest.raises(ValueError, match=r"different lengths \[param = 8, grad = 7, master = 8"):
        adamw.step_low("bfloat16", low, low[:7].clone(), *f, **hyper)
    before = [t.clone() for t in f]
    with pytest.raises(TypeError):
        adamw.step_low("bfloat16", low, low.clone(), f[0][::2], f[1][:4], f[2][:4], **hyper)  # strided master
    assert all(torch.equal(a, b) for a, b in zip(before, f))


def test_the_step_takes_its_arrays_by_the_exchange_table_or_by_dlpack_alike_and_refuses_the_wrong_ones():
    """torch tensors cross into the step through DLPack's C exchange table (where torch has
    it), numpy arrays through DLPack / the buffer protocol: the same step, bit for bit; a
    strided, two-dimensional or float64 array is a TypeError that changes nothing."""
    import numpy as np

    from ferry import _core

    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.01, step=3)
    g = torch.Generator().manual_seed(7)
    arrays = [torch.randn(37, generator=g) for _ in range(2)] + [torch.rand(37, generator=g) for _ in range(2)]
    as_torch = [t.clone() for t in arrays]
    as_numpy = [t.clone().numpy() for t in arrays]
    base = torch.randn(40, generator=g)
    _core.AdamW(1, True).step(*as_torch, **hyper)
    _core.AdamW(1, True).step(*as_numpy, **hyper)
    for a, b in zip(as_torch, as_numpy):
        assert torch.equal(a, torch.from_numpy(b))
    shifted = base.clone()  # a parameter at an offset into its storage: shifted[3:]
    view_args = [shifted[3:], arrays[1].clone(), arrays[2].clone(), arrays[3].clone()]
    view_args[0].copy_(arrays[0])
    _core.AdamW(1, True).step(*view_args, **hyper)
    assert torch.equal(shifted[3:], as_torch[0]) and torch.equal(shifted[:3], base[:3])  # its own elements only
    adamw = _core.AdamW(1, True)
    for bad in (torch.randn(74)[::2], torch.randn(37, 1), torch.randn(37, dtype=torch.float64),
                torch.randn(37).to(torch.bfloat16)):
        kept = [t.clone() for t in arrays]
        with pytest.raises(TypeError):
            adamw.step(bad, *kept[1:], **hyper)
        with pytest.raises(TypeError):
            adamw.step(*kept[:3], bad, **hyper)
        assert all(torch.equal(a, b) for a, b in zip(kept, arrays))


def test_the_16_bit_step_from_two_threads_on_one_runner_equals_the_steps_one_after_the_other():
    """Each thread widens the gradient into a buffer of its own: two threads stepping other
    arrays of different lengths through one `_core.AdamW` at once (the GIL released) give
    what the same calls give one after the other."""
    import threading

    from ferry import _core

    g = torch.Generator().manual_seed(5)
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.1, step=1)

    def arrays(n):
        master = torch.randn(n, generator=g)
        return [master.bfloat16(), (torch.randn(n, generator=g) * 1e-2).bfloat16(), master, torch.zeros(n),
                torch.zeros(n)]

    def run(adamw, a, times):
        for _ in range(times):
            adamw.step_low("bfloat16", a[0].view(torch.int16), a[1].view(torch.int16), *a[2:], **hyper)

    big, small = arrays(1 << 20), arrays(5)
    alone = [[t.clone() for t in big], [t.clone() for t in small]]
    run(_core.AdamW(1, True), alone[0], 6)
    run(_core.AdamW(1, True), alone[1], 600)
    shared = _core.AdamW(1, True)
    other = threading.Thread(target=run, args=(shared, small, 600))
    other.start()
    run(shared, big, 6)
    other.join()
    for got, want in zip(big + small, alone[0] + alone[1]):
        assert torch.equal(got, want)
