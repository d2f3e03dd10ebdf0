"""ferry.torch.OffloadAdamW(nvme_path=...): states in a file through ferry's state_swapper,
against the same optimizer with its states in pinned memory (the same kernel: every bit
equal), parameters streamed and resident, param groups added late, checkpoints both ways,
and the faults: an I/O error in a step (each parameter keeps its states, the next step
finishes that step exactly once), in a load, full and shared files, copies refused; and
bfloat16 / float16 parameters with their float32 masters in the file, against the same
with the masters in pinned memory."""

import copy
import errno
import gc
import math
import os
import pickle

import pytest
import torch

import ferry.torch as ft
from ferry import _core

# Eight parameters of 1000 elements and two small ones: each copy of a 1000-element group
# is 2 sections of 4 KiB (exp_avg, exp_avg_sq), the ring 3 x 8 KiB = 24 KiB, so a budget of
# 28 KiB streams every parameter and one of 256 KiB keeps them all in pinned memory.
SHAPES = [(1000,)] * 4 + [(10, 100), (17,), (1000,), (25, 40), (3,), (1000,)]
STREAMED = 28 << 10
RESIDENT = 256 << 10
# With master arrays (a bfloat16 or float16 parameter), each copy is 3 sections: the ring
# 3 x 12 KiB = 36 KiB, so 40 KiB streams every parameter.
STREAMED_MASTER = 40 << 10


def _fresh(seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).requires_grad_() for s in SHAPES]


def _grads(steps, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [[torch.randn(s, generator=g) for s in SHAPES] for _ in range(steps)]


def _give(params, grads):
    for p, g in zip(params, grads):
        p.grad = g.clone()


def _lockstep(grads, *runs):
    """Each step's gradients to every (optimizer, parameters) run, then a step of each."""
    for gs in grads:
        for opt, params in runs:
            _give(params, gs)
            opt.step()


def _nvme(params, tmp_path, budget=STREAMED, name="states.bin", **kw):
    return ft.OffloadAdamW(params, pinned_bytes=budget, nvme_path=tmp_path / name, nvme_bytes=8 << 20, **kw)


def _same_states(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    keys = ("lr", "betas", "eps", "weight_decay", "params")
    assert [{k: g[k] for k in keys} for g in sa["param_groups"]] == [{k: g[k] for k in keys} for g in sb["param_groups"]]
    assert sorted(sa["state"]) == sorted(sb["state"])
    for i in sb["state"]:
        assert sorted(sa["state"][i]) == sorted(sb["state"][i]), i  # "master" for a bfloat16 / float16 one
        for key in sb["state"][i]:
            assert torch.equal(sa["state"][i][key], sb["state"][i][key]), (i, key)


def _mixed(dtype, seed=3):
    """SHAPES' parameters, every other one in `dtype` (the rest float32: their master
    arrays in the file unused)."""
    return [p.detach().to(dtype if i % 2 else torch.float32).requires_grad_() for i, p in enumerate(_fresh(seed))]


def _mixed_grads(params, steps, seed=5):
    return [[g.to(p.dtype) for p, g in zip(params, gs)] for gs in _grads(steps, seed)]


@pytest.mark.parametrize("budget", [STREAMED, 64 << 10, RESIDENT])
def test_states_on_nvme_step_every_bit_as_states_in_pinned_memory(tmp_path, budget):
    ours_p, ref_p = _fresh(), _fresh()
    ours = _nvme(ours_p, tmp_path, budget, lr=1e-2, weight_decay=0.1)
    ref = ft.OffloadAdamW(ref_p, lr=1e-2, weight_decay=0.1)
    _lockstep(_grads(5), (ours, ours_p), (ref, ref_p))
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)
    s = ours.nvme_stats
    assert s["groups"] == len(SHAPES) and s["steps"] == 5 and not s["pending"]
    assert s["host_bytes"] <= budget
    if budget == STREAMED:
        assert s["resident_groups"] == 0 and s["reads"] == 5 * len(SHAPES) and s["writes"] == s["reads"]
        assert s["bytes_written"] > 0 and s["undo_bytes"] == 3 * 1000 * 4
    elif budget == RESIDENT:
        assert s["spilled_groups"] == 0 and s["reads"] == 0 and s["writes"] == 0
    else:
        assert 0 < s["resident_groups"] < len(SHAPES) and s["reads"] > 0


def test_param_groups_a_scheduler_clipping_and_a_group_added_late(tmp_path):
    def build(params, factory):
        opt = factory([{"params": params[:5]}, {"params": params[5:8], "lr": 3e-3, "weight_decay": 0.0}])
        return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)

    ours_p, ref_p = _fresh(), _fresh()
    ours, ours_s = build(ours_p, lambda g: _nvme(g, tmp_path, lr=1e-2))
    ref, ref_s = build(ref_p, lambda g: ft.OffloadAdamW(g, lr=1e-2))
    for k, gs in enumerate(_grads(6)):
        if k == 3:  # the last two parameters join (their states and the others' move to a new layout)
            ours.add_param_group({"params": ours_p[8:], "lr": 1e-3})
            ref.add_param_group({"params": ref_p[8:], "lr": 1e-3})
        for opt, params, sched in ((ours, ours_p, ours_s), (ref, ref_p, ref_s)):
            _give(params, gs)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)
    assert ours.nvme_stats["groups"] == len(SHAPES)


def test_parameters_without_gradients_keep_their_values_and_get_no_state(tmp_path):
    params = _fresh()
    before = [p.detach().clone() for p in params]
    opt = _nvme(params, tmp_path)
    for gs in _grads(2):
        _give(params[::2], gs[::2])
        opt.step()
    for i, (p, b) in enumerate(zip(params, before)):
        assert torch.equal(p, b) == (i % 2 == 1)
        assert (p in opt.state) == (i % 2 == 0)
    assert sorted(opt.state_dict()["state"]) == list(range(0, len(SHAPES), 2))


def test_resuming_from_a_state_dict_is_bit_for_bit_and_checkpoints_move_both_ways(tmp_path):
    grads = _grads(6)
    straight_p = _fresh()
    straight = _nvme(straight_p, tmp_path, name="a.bin")
    _lockstep(grads, (straight, straight_p))

    first_p = _fresh()
    first = _nvme(first_p, tmp_path, name="b.bin")
    _lockstep(grads[:3], (first, first_p))
    # through torch.optim.AdamW's own load and save, and torch.save: the keys are AdamW's
    checkpoint = copy.deepcopy(first.state_dict())
    plain = torch.optim.AdamW([p.detach().clone().requires_grad_() for p in first_p], foreach=False)
    plain.load_state_dict(checkpoint)
    checkpoint = plain.state_dict()
    del first
    gc.collect()
    assert not (tmp_path / "b.bin").exists()  # the file goes with its optimizer

    resumed_p = [p.detach().clone().requires_grad_() for p in first_p]
    resumed = _nvme(resumed_p, tmp_path, name="c.bin")
    resumed.load_state_dict(checkpoint)
    _lockstep(grads[3:], (resumed, resumed_p))
    assert all(torch.equal(a, b) for a, b in zip(resumed_p, straight_p))
    _same_states(resumed, straight)


def _faulty(monkeypatch, plan):
    real = _core.NvmeStates
    monkeypatch.setattr(_core, "NvmeStates", lambda *args: real(*args, faults=plan))


@pytest.mark.parametrize("call,skip", [("pwrite", 2), ("pwrite", 0), ("pread", 4), ("pread", 0)])
def test_an_io_error_in_a_step_loses_nothing_and_the_next_step_finishes_it_once(tmp_path, monkeypatch, call, skip):
    plan = _core.FaultPlan()
    _faulty(monkeypatch, plan)
    grads = _grads(3)
    ours_p, ref_p = _fresh(), _fresh()
    ours = _nvme(ours_p, tmp_path)
    ref = ft.OffloadAdamW(ref_p)
    _lockstep(grads[:1], (ours, ours_p), (ref, ref_p))

    before = [p.detach().clone() for p in ours_p]
    rule = plan.add(call, errno.EIO, skip=skip)
    _give(ours_p, grads[1])
    _give(ref_p, grads[1])
    ref.step()
    with pytest.raises(OSError) as e:
        ours.step()
    assert e.value.errno == errno.EIO and "states.bin" in str(e.value)
    assert plan.fired(rule) == 1 and ours.nvme_stats["pending"]
    # each parameter holds the step's result with step 2, or its value before with step 1
    for p, r, b in zip(ours_p, ref_p, before):
        step = int(ours.state[p]["step"])
        assert (step, torch.equal(p, r if step == 2 else b)) in ((2, True), (1, True))
    assert any(int(ours.state[p]["step"]) == 1 for p in ours_p)
    ours.step()  # finishes the step: the parameters it had stepped are not stepped again
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)
    _lockstep(grads[2:], (ours, ours_p), (ref, ref_p))
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)
    assert ours.nvme_stats["failed_steps"] == 1


def test_a_load_stopped_by_an_io_error_refuses_to_step_until_a_load_succeeds(tmp_path, monkeypatch):
    plan = _core.FaultPlan()
    _faulty(monkeypatch, plan)
    params = _fresh()
    opt = _nvme(params, tmp_path)
    _give(params, _grads(1)[0])
    opt.step()
    checkpoint = copy.deepcopy(opt.state_dict())
    plan.add("pwrite", errno.ENOSPC, skip=3)
    with pytest.raises(OSError) as e:
        opt.load_state_dict(checkpoint)
    assert e.value.errno == errno.ENOSPC
    for what in (opt.step, opt.state_dict):
        with pytest.raises(RuntimeError, match="load_state_dict again"):
            what()
    opt.load_state_dict(checkpoint)  # the dict it was given is intact: loading again works
    after = opt.state_dict()
    for i in checkpoint["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(after["state"][i][key], checkpoint["state"][i][key])
    opt.step()


def test_nvme_arguments_are_checked_and_file_problems_are_os_errors_naming_the_path(tmp_path):
    params = _fresh()
    with pytest.raises(ValueError, match="nvme_path and nvme_bytes"):
        ft.OffloadAdamW(params, nvme_path=tmp_path / "x.bin")
    with pytest.raises(ValueError, match="nvme_path and nvme_bytes"):
        ft.OffloadAdamW(params, nvme_bytes=1 << 20)
    with pytest.raises(TypeError, match="nvme_path"):
        ft.OffloadAdamW(params, nvme_path=3, nvme_bytes=1 << 20)
    with pytest.raises(OSError) as e:
        ft.OffloadAdamW(params, nvme_path=tmp_path, nvme_bytes=1 << 20)  # a folder
    assert e.value.errno == errno.EISDIR and str(tmp_path) in str(e.value)
    held = _nvme(params, tmp_path)
    with pytest.raises(FileExistsError) as e:  # the first optimizer's file (locked, too)
        _nvme(_fresh(), tmp_path)
    assert e.value.errno == errno.EEXIST and "states.bin" in str(e.value)
    del held
    (tmp_path / "data.bin").write_bytes(b"precious")
    with pytest.raises(FileExistsError, match="8 bytes"):  # never emptied and removed
        _nvme(_fresh(), tmp_path, name="data.bin")
    assert (tmp_path / "data.bin").read_bytes() == b"precious"
    for bad in ("", "st\0ates.bin"):
        with pytest.raises(ValueError, match="NUL"):
            ft.OffloadAdamW(_fresh(), nvme_path=bad, nvme_bytes=1 << 20)


def test_a_relative_path_is_the_file_removed_after_a_chdir(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opt = ft.OffloadAdamW(_fresh(), pinned_bytes=STREAMED, nvme_path="rel.bin", nvme_bytes=8 << 20)
    assert (tmp_path / "rel.bin").exists()
    (tmp_path / "elsewhere").mkdir()
    os.chdir(tmp_path / "elsewhere")
    del opt
    gc.collect()
    assert not (tmp_path / "rel.bin").exists()


def test_a_file_too_small_or_a_budget_below_the_ring_is_a_memory_error_and_nothing_changes(tmp_path):
    for kwargs in (dict(nvme_bytes=32 << 10), dict(nvme_bytes=32 << 10, pinned_bytes=RESIDENT),
                   dict(nvme_bytes=8 << 20, pinned_bytes=16 << 10)):
        params = _fresh()
        before = [p.detach().clone() for p in params]
        opt = ft.OffloadAdamW(params, **{"pinned_bytes": STREAMED, **kwargs}, nvme_path=tmp_path / "s.bin")
        _give(params, _grads(1)[0])
        with pytest.raises(MemoryError, match="bytes"):
            opt.step()
        assert all(torch.equal(p, b) for p, b in zip(params, before)) and not opt.state
        del opt
        gc.collect()


def test_an_optimizer_on_nvme_refuses_copies_and_pickles_naming_state_dict(tmp_path):
    opt = _nvme(_fresh(), tmp_path)
    for copier in (copy.deepcopy, pickle.dumps):
        with pytest.raises(TypeError, match="state_dict"):
            copier(opt)


def _fail_once_then_finish(tmp_path, monkeypatch, shapes_added=()):
    """Steps an optimizer on NVMe and the same one in pinned memory once, then fails the
    second step's second write; returns both, their parameters and the gradients."""
    plan = _core.FaultPlan()
    _faulty(monkeypatch, plan)
    ours_p, ref_p = _fresh(), _fresh()
    ours, ref = _nvme(ours_p, tmp_path), ft.OffloadAdamW(ref_p)
    grads = _grads(3)
    for opt, params in ((ours, ours_p), (ref, ref_p)):
        _give(params, grads[0])
        opt.step()
        _give(params, grads[1])
    ref.step()
    plan.add("pwrite", errno.EIO, skip=1)
    with pytest.raises(OSError):
        ours.step()
    plan.clear()
    return ours, ref, ours_p, ref_p, grads


def test_a_group_added_after_a_failed_step_does_not_step_a_parameter_twice(tmp_path, monkeypatch):
    ours, ref, ours_p, ref_p, grads = _fail_once_then_finish(tmp_path, monkeypatch)
    extra = [torch.randn(1000).requires_grad_() for _ in range(2)]
    extra_ref = [p.detach().clone().requires_grad_() for p in extra]
    ours.add_param_group({"params": extra})
    ref.add_param_group({"params": extra_ref})
    for p, q in zip(extra, extra_ref):
        g = torch.randn(1000)
        p.grad, q.grad = g.clone(), g.clone()
    # ours finishes the failed step (the new group's first step with it); ref steps the
    # new group alone, as the finished step does
    ref_groups = ref.param_groups
    ref.param_groups = [ref_groups[-1]]
    ref.step()
    ref.param_groups = ref_groups
    ours.step()
    assert all(torch.equal(a, b) for a, b in zip(ours_p + extra, ref_p + extra_ref))
    _same_states(ours, ref)
    assert all(int(ours.state[p]["step"]) == 2 for p in ours_p) and all(int(ours.state[p]["step"]) == 1 for p in extra)


def test_a_zero_size_parameter_counts_one_step_however_often_the_step_is_tried(tmp_path, monkeypatch):
    plan = _core.FaultPlan()
    _faulty(monkeypatch, plan)
    params = _fresh() + [torch.zeros(0, requires_grad=True)]
    opt = _nvme(params, tmp_path)
    _give(params, [torch.randn(p.shape) for p in params])
    plan.add("pwrite", errno.EIO, skip=1, times=2)
    for _ in range(2):
        with pytest.raises(OSError):
            opt.step()
    opt.step()
    assert [int(opt.state[p]["step"]) for p in params] == [1] * len(params)


def test_an_empty_group_steps_as_nothing_until_parameters_come(tmp_path):
    opt = ft.OffloadAdamW([{"params": []}], pinned_bytes=STREAMED, nvme_path=tmp_path / "s.bin", nvme_bytes=8 << 20)
    opt.step()
    assert opt.state_dict()["state"] == {}
    params, ref_p = _fresh(), _fresh()
    opt.add_param_group({"params": params})
    ref = ft.OffloadAdamW(ref_p)
    _lockstep(_grads(2), (opt, params), (ref, ref_p))
    assert all(torch.equal(a, b) for a, b in zip(params, ref_p))


def test_a_parameter_twice_in_a_group_is_refused(tmp_path):
    p = torch.randn(10, requires_grad=True)
    with pytest.warns(UserWarning, match="duplicate"), pytest.raises(ValueError, match="twice"):  # torch warns first
        _nvme([p, p], tmp_path)


def test_a_group_added_without_room_for_both_layouts_is_a_memory_error_and_the_states_stay(tmp_path):
    params = [torch.randn(1000, requires_grad=True) for _ in range(6)]
    opt = ft.OffloadAdamW(params[:4], pinned_bytes=24576, nvme_path=tmp_path / "s.bin", nvme_bytes=98304)
    _give(params[:4], [torch.randn(1000) for _ in range(4)])
    opt.step()
    saved = copy.deepcopy(opt.state_dict())
    opt.add_param_group({"params": params[4:]})
    with pytest.raises(MemoryError, match="bytes"):
        opt.step()
    after = opt.state_dict()  # still readable: the states did not move
    for i in saved["state"]:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(after["state"][i][key], saved["state"][i][key])


def test_a_failed_load_puts_the_groups_back_and_a_closure_does_not_run_on_a_broken_optimizer(tmp_path, monkeypatch):
    plan = _core.FaultPlan()
    _faulty(monkeypatch, plan)
    params = _fresh()
    opt = _nvme(params, tmp_path, lr=1e-3)
    _give(params, _grads(1)[0])
    opt.step()
    checkpoint = copy.deepcopy(opt.state_dict())
    checkpoint["param_groups"][0]["lr"] = 0.5
    plan.add("pwrite", errno.EIO, skip=2)
    with pytest.raises(OSError):
        opt.load_state_dict(checkpoint)
    assert opt.param_groups[0]["lr"] == 1e-3
    ran = []
    with pytest.raises(RuntimeError, match="load_state_dict again"):
        opt.step(lambda: ran.append(1))
    assert not ran


def test_a_step_while_another_thread_steps_is_refused(tmp_path):
    import threading

    params = _fresh()
    opt = _nvme(params, tmp_path)
    _give(params, _grads(1)[0])
    seen = []

    def other():
        try:
            opt.step()
        except RuntimeError as e:
            seen.append(str(e))

    def closure():  # runs inside step, with the optimizer busy
        t = threading.Thread(target=other)
        t.start()
        t.join()
        return 0.0

    opt.step(closure)
    assert len(seen) == 1 and "another thread" in seen[0]


@pytest.mark.parametrize("flag", ["amsgrad", "maximize"])
def test_amsgrad_or_maximize_in_a_group_is_refused_however_it_comes(tmp_path, flag):
    params = _fresh()
    with pytest.raises(ValueError, match=flag):
        ft.OffloadAdamW([{"params": params, flag: True}])
    opt = ft.OffloadAdamW(params[:5])
    with pytest.raises(ValueError, match=flag):
        opt.add_param_group({"params": params[5:], flag: True})
    assert len(opt.param_groups) == 1
    _give(params[:5], _grads(1)[0][:5])
    before = [p.detach().clone() for p in params[:5]]
    opt.param_groups[0][flag] = True  # set later: the step refuses it and changes nothing
    with pytest.raises(ValueError, match=flag):
        opt.step()
    assert all(torch.equal(p, b) for p, b in zip(params[:5], before))


def test_all_three_together_train_a_small_gpt_as_with_the_states_in_pinned_memory(tmp_path):
    """Blocks streamed, activations offloaded, states on NVMe (every one streamed): the
    same losses and weights, bit for bit, as the same model with its states pinned."""
    import sys

    sys.path.insert(0, os.path.dirname(__file__))
    from _models import _GPT

    torch.manual_seed(7)
    batch = (torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16)))

    def train(make_opt):
        model = _GPT()
        model.blocks = ft.stream_layers(list(model.blocks), slots=2)
        model.forward = lambda tokens: model.head(model.ln(model.blocks(model.emb(tokens))))
        opt = make_opt(list(model.parameters()))
        off = ft.offload_activations(min_bytes=4096)
        losses = []
        for i in range(4):
            torch.manual_seed(1000 + i)
            opt.zero_grad()
            with off:
                loss = torch.nn.functional.cross_entropy(model(batch[0]).flatten(0, 1), batch[1].flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        return losses, [p.detach().clone() for p in model.parameters()], opt

    def on_nvme(params):
        largest = max(p.numel() for p in params)
        return ft.OffloadAdamW(params, lr=3e-3, pinned_bytes=24 * largest + 4096 * 6,
                               nvme_path=tmp_path / "gpt.bin", nvme_bytes=64 << 20)

    ref_losses, ref_weights, _ = train(lambda ps: ft.OffloadAdamW(ps, lr=3e-3))
    losses, weights, opt = train(on_nvme)
    assert losses == ref_losses and losses[-1] < losses[0]
    assert all(torch.equal(a, b) for a, b in zip(weights, ref_weights))
    assert opt.nvme_stats["spilled_groups"] > 0 and opt.nvme_stats["bytes_written"] > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("budget", [STREAMED_MASTER, RESIDENT])
def test_low_precision_parameters_with_masters_in_the_file_step_every_bit_as_in_pinned_memory(tmp_path, dtype, budget):
    ours_p, ref_p = _mixed(dtype), _mixed(dtype)
    ours = _nvme(ours_p, tmp_path, budget, lr=1e-2, weight_decay=0.1)
    ref = ft.OffloadAdamW(ref_p, lr=1e-2, weight_decay=0.1)
    grads = _mixed_grads(ours_p, 5)
    _lockstep(grads[:2], (ours, ours_p), (ref, ref_p))
    # a change between steps (a checkpoint of the model loaded, say) re-seeds the master in both
    with torch.no_grad():
        for a, b in zip(ours_p[1::4], ref_p[1::4]):
            a.mul_(0.5)
            b.mul_(0.5)
    _lockstep(grads[2:], (ours, ours_p), (ref, ref_p))
    for a, b in zip(ours_p, ref_p):
        assert a.dtype == b.dtype and torch.equal(a, b)
    _same_states(ours, ref)
    s = ours.nvme_stats
    assert s["keep_master"] and s["bytes_per_element"] == 12 and s["steps"] == 5
    if budget == STREAMED_MASTER:
        assert s["resident_groups"] == 0 and s["undo_bytes"] == 3 * 1000 * 4
    else:
        assert s["spilled_groups"] == 0


def test_low_precision_runs_resume_bit_for_bit_from_either_kind_of_checkpoint(tmp_path):
    grads = _mixed_grads(_mixed(torch.bfloat16), 6)
    straight_p = _mixed(torch.bfloat16)
    straight = _nvme(straight_p, tmp_path, STREAMED_MASTER, name="a.bin")
    _lockstep(grads, (straight, straight_p))
    for source in ("nvme", "pinned"):
        first_p = _mixed(torch.bfloat16)
        first = _nvme(first_p, tmp_path, STREAMED_MASTER, name="b.bin") if source == "nvme" else ft.OffloadAdamW(first_p)
        _lockstep(grads[:3], (first, first_p))
        checkpoint = copy.deepcopy(first.state_dict())
        assert all("master" in checkpoint["state"][i] for i in range(1, len(SHAPES), 2))
        del first
        gc.collect()
        resumed_p = [p.detach().clone().requires_grad_() for p in first_p]
        resumed = _nvme(resumed_p, tmp_path, STREAMED_MASTER, name="c.bin")
        resumed.load_state_dict(checkpoint)
        _lockstep(grads[3:], (resumed, resumed_p))
        assert all(torch.equal(a, b) for a, b in zip(resumed_p, straight_p)), source
        _same_states(resumed, straight)
        # and the file's checkpoint resumes in pinned memory too
        back_p = [p.detach().clone().requires_grad_() for p in first_p]
        back = ft.OffloadAdamW(back_p)
        back.load_state_dict(checkpoint)
        _lockstep(grads[3:], (back, back_p))
        assert all(torch.equal(a, b) for a, b in zip(back_p, straight_p)), source
        del resumed
        gc.collect()


def test_a_parameter_converted_to_bfloat16_after_steps_gets_a_master_in_a_new_layout(tmp_path):
    ours_p, ref_p = _fresh(), _fresh()
    ours = _nvme(ours_p, tmp_path, STREAMED_MASTER)
    ref = ft.OffloadAdamW(ref_p)
    _lockstep(_grads(2), (ours, ours_p), (ref, ref_p))
    assert not ours.nvme_stats["keep_master"]
    for a, b in zip(ours_p[:3], ref_p[:3]):  # model.bfloat16() on part of a model
        a.data = a.data.bfloat16()
        b.data = b.data.bfloat16()
    for gs in _grads(3, seed=8):
        for params in (ours_p, ref_p):
            _give(params, [g.to(p.dtype) for p, g in zip(params, gs)])
        ours.step()
        ref.step()
    assert ours.nvme_stats["keep_master"]
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)


@pytest.mark.parametrize("call,skip", [("pwrite", 1), ("pwrite", 2), ("pread", 4)])
def test_an_io_error_in_a_low_precision_step_puts_the_16_bit_parameters_back(tmp_path, monkeypatch, call, skip):
    plan = _core.FaultPlan()
    _faulty(monkeypatch, plan)
    ours_p, ref_p = _mixed(torch.float16), _mixed(torch.float16)
    ours = _nvme(ours_p, tmp_path, STREAMED_MASTER)
    ref = ft.OffloadAdamW(ref_p)
    grads = _mixed_grads(ours_p, 3)
    _lockstep(grads[:1], (ours, ours_p), (ref, ref_p))
    before = [p.detach().clone() for p in ours_p]
    rule = plan.add(call, errno.EIO, skip=skip)
    _give(ours_p, grads[1])
    _give(ref_p, grads[1])
    ref.step()
    with pytest.raises(OSError):
        ours.step()
    assert plan.fired(rule) == 1
    for p, r, b in zip(ours_p, ref_p, before):
        step = int(ours.state[p]["step"])
        assert torch.equal(p, r if step == 2 else b)
    assert any(int(ours.state[p]["step"]) == 1 for p in ours_p if p.dtype == torch.float16)  # one put back
    ours.step()
    _lockstep(grads[2:], (ours, ours_p), (ref, ref_p))
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)


def test_a_file_too_small_for_the_masters_is_a_memory_error_naming_the_arrays(tmp_path):
    params = _mixed(torch.bfloat16)
    before = [p.detach().clone() for p in params]
    # room for two arrays per copy, not three
    opt = ft.OffloadAdamW(params, nvme_path=tmp_path / "s.bin", nvme_bytes=sum(2 * 2 * -(-p.numel() * 4 // 4096) * 4096
                                                                          for p in params))
    _give(params, _mixed_grads(params, 1)[0])
    with pytest.raises(MemoryError, match="the master, exp_avg and exp_avg_sq"):
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(params, before))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_masters_in_the_file_round_every_binade_as_torch_rounds(tmp_path, dtype):
    """Parameters from the smallest subnormals to the top of the range (float16: 65504,
    steps that carry it past 65520 to inf, and then to NaN), zeros of both signs: the C++
    rounding of the file's path gives torch's bits (Tensor.to of a float32 master stepped
    on its own), and NaN where torch gives NaN."""
    info = torch.finfo(dtype)
    g = torch.Generator().manual_seed(11)
    exps = torch.linspace(math.log2(info.smallest_normal) - 8, math.log2(info.max), 4000)
    values = torch.exp2(exps) * torch.where(torch.rand(4000, generator=g) < 0.5, -1.0, 1.0)
    values = torch.cat([values, torch.tensor([0.0, -0.0, info.max, -info.max, info.tiny])])
    ours_p = [values.to(dtype).requires_grad_()]
    ref_p = [values.to(dtype).float().requires_grad_()]  # the master, stepped as float32, rounded by torch
    ours = _nvme(ours_p, tmp_path, RESIDENT, lr=0.5, weight_decay=0.0)
    ref = ft.OffloadAdamW(ref_p, lr=0.5, weight_decay=0.0)
    for step in range(3):
        grad = (torch.randn(values.shape, generator=g) * values.abs().clamp(min=1e-30)).to(dtype)
        ours_p[0].grad = grad.clone()
        ref_p[0].grad = grad.float()
        ours.step()
        ref.step()
        a, b = ours_p[0].detach(), ref_p[0].detach().to(dtype)
        assert torch.equal(a.isnan(), b.isnan()), step  # NaN where the other has NaN (its bits are torch's
        keep = ~a.isnan()                               # vectorised conversion's own), every other bit equal
        assert torch.equal(a[keep].view(torch.int16), b[keep].view(torch.int16)), step
    if dtype == torch.float16:
        assert ours_p[0].isnan().any()  # the test reaches the top: past 65520 to inf, then NaN
    ref_state = dict(ref.state_dict()["state"][0], master=ref_p[0].detach())
    for key in ("exp_avg", "exp_avg_sq", "master"):  # NaN where the other has NaN, every other bit equal
        a, b = ours.state_dict()["state"][0][key], ref_state[key]
        assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), key


def test_a_parameter_stepped_as_float32_between_bfloat16_steps_gets_a_new_master_as_in_pinned_memory(tmp_path):
    """bfloat16, then float32 for a step (its own master: the pinned path drops the master),
    then bfloat16 again (a new master from the parameter): the file's master array, stale
    since the float32 step, is re-seeded the same way."""
    ours_p, ref_p = _mixed(torch.bfloat16), _mixed(torch.bfloat16)
    ours = _nvme(ours_p, tmp_path, STREAMED_MASTER, lr=1e-2)
    ref = ft.OffloadAdamW(ref_p, lr=1e-2)
    grads = _grads(7, seed=21)

    def step(gs, lr):
        for opt, params in ((ours, ours_p), (ref, ref_p)):
            for group in opt.param_groups:
                group["lr"] = lr
            _give(params, [g.to(p.dtype) for p, g in zip(params, gs)])
            opt.step()

    for gs in grads[:3]:
        step(gs, 1e-2)
    for params in (ours_p, ref_p):
        params[1].data = params[1].data.float()
    step(grads[3], 0.0)  # stepped, unchanged: its old master still rounds to it
    for params in (ours_p, ref_p):
        params[1].data = params[1].data.bfloat16()
    for gs in grads[4:]:
        step(gs, 1e-2)
    assert all(torch.equal(a, b) for a, b in zip(ours_p, ref_p))
    _same_states(ours, ref)
