"""ferry.torch.stream_layers on CPU tensors, through the CPU model of ferry's device runtime:
outputs, input and weight gradients against the same layers run as they are (bit for
bit), gradient accumulation in every dtype, frozen weights, the optimizer writing
through to the slabs, all three of ferry.torch's APIs in one training loop, and the
errors (after each, the stack still runs)."""

import copy

import pytest
import torch

import ferry
import ferry.torch as ft

from _models import _GPT, _Block


def _stack(n=4, d=32, dtype=torch.float32, seed=0, dropout=0.1):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        *[
            torch.nn.Sequential(
                torch.nn.LayerNorm(d),
                torch.nn.Linear(d, 2 * d + 3),  # odd sizes: parameters at unaligned byte counts
                torch.nn.GELU(),
                torch.nn.Dropout(dropout),
                torch.nn.Linear(2 * d + 3, d),
            )
            for _ in range(n)
        ]
    ).to(dtype)


def _same_grads(ref, mine):
    for (name, a), b in zip(ref.named_parameters(), mine.parameters()):
        assert (a.grad is None) == (b.grad is None), name
        if a.grad is not None:
            assert torch.equal(a.grad, b.grad), name


@pytest.mark.parametrize("slots", [1, 2, 3, 6])
def test_outputs_and_gradients_are_bit_for_bit_those_of_the_layers_run_as_they_are(slots):
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=slots)
    x = torch.randn(8, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    for step in range(3):  # no zero_grad: .grad accumulates over the steps, in both
        torch.manual_seed(step)
        y = ref(x)
        y.square().sum().backward()
        torch.manual_seed(step)
        y2 = st(x2)
        y2.square().sum().backward()
        assert torch.equal(y, y2)
        assert torch.equal(x.grad, x2.grad)
        _same_grads(ref, st)
    s = st.stats()
    assert s["passes"] == 6 and s["loads"] == 6 * 4 and s["pushes"] == 3 * 4 == s["landed"]
    assert s["slot_bytes"] >= min(slots, 4) * max(st._core.layer_bytes(i) for i in range(4))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_gradients_accumulate_in_the_parameters_dtype_as_autograd_accumulates_them(dtype):
    ref = _stack(dtype=dtype, dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    for micro in range(3):
        x = torch.randn(4, 32, dtype=dtype)
        ref(x).float().square().sum().backward()
        st(x).float().square().sum().backward()
        _same_grads(ref, st)
    assert st.stats()["landed"] == 3 * 4


def test_zero_grad_to_zeros_to_none_and_a_grad_of_the_callers_own():
    ref = _stack(dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    x = torch.randn(4, 32)
    for mode in ["none", "zeros", "accumulate", "own", "mixed"]:
        for net in (ref, st):
            if mode == "none":
                net.zero_grad(set_to_none=True)
            elif mode == "zeros":
                net.zero_grad(set_to_none=False)
            elif mode == "own":
                for p in net.parameters():
                    p.grad = torch.full_like(p, 0.25)
            elif mode == "mixed":
                for k, p in enumerate(net.parameters()):
                    if k % 3 == 0:
                        p.grad = None
                    elif k % 3 == 1:
                        p.grad = torch.full_like(p, -1.5)
            net(x).square().sum().backward()
        _same_grads(ref, st)


def test_frozen_weights_get_no_gradient_and_an_input_without_grad_needs_none():
    ref = _stack(dropout=0.0)
    mine = copy.deepcopy(ref)
    for net in (ref, mine):
        for name, p in net.named_parameters():
            if name.startswith("1.") or name.endswith("bias"):
                p.requires_grad_(False)
    st = ft.stream_layers(list(mine), slots=2)
    x = torch.randn(4, 32)  # no grad
    ref(x).square().sum().backward()
    st(x).square().sum().backward()
    _same_grads(ref, st)
    assert st.layers[1][1].weight.grad is None


def test_every_layer_frozen_but_the_input_needs_a_gradient():
    ref = _stack(dropout=0.0)
    mine = copy.deepcopy(ref)
    for p in list(ref.parameters()) + list(mine.parameters()):
        p.requires_grad_(False)
    st = ft.stream_layers(list(mine), slots=2)
    x = torch.randn(4, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    ref(x).sum().backward()
    st(x2).sum().backward()
    assert torch.equal(x.grad, x2.grad)


def test_the_optimizer_writes_through_to_the_slabs_and_the_next_pass_loads_it():
    torch.manual_seed(3)
    batches = [torch.randn(8, 32) for _ in range(4)]
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    opts = [torch.optim.AdamW(ref.parameters(), lr=1e-2), torch.optim.AdamW(st.parameters(), lr=1e-2)]
    for i, x in enumerate(batches):
        for net, opt in zip((ref, st), opts):
            torch.manual_seed(100 + i)
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
        for a, b in zip(ref.parameters(), st.parameters()):
            assert torch.equal(a, b)
    # load_state_dict writes into the slabs too: the next forward runs the loaded weights
    fresh = _stack(seed=9)
    st.layers.load_state_dict(fresh.state_dict())
    fresh.eval()
    st.eval()
    with torch.no_grad():
        assert torch.equal(fresh(batches[0]), st(batches[0]))


def test_a_small_transformer_trains_the_same_with_all_three_apis():
    torch.manual_seed(7)
    batches = [(torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16))) for _ in range(4)]

    def train(model, opt, offload):
        losses = []
        for i, (x, y) in enumerate(batches):
            torch.manual_seed(1000 + i)
            opt.zero_grad()
            with offload if offload is not None else torch.enable_grad():
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            losses.append(loss.item())
        return losses

    ref = _GPT(layers=3)
    ref_losses = train(ref, ft.OffloadAdamW(ref.parameters(), lr=1e-2), None)
    model = _GPT(layers=3)
    model.blocks = ft.stream_layers(list(model.blocks), slots=2)  # _GPT runs `for blk in self.blocks`
    model.forward = lambda tokens: model.head(model.ln(model.blocks(model.emb(tokens))))
    off = ft.offload_activations(min_bytes=1024, keep_last=0)
    losses = train(model, ft.OffloadAdamW(model.parameters(), lr=1e-2), off)
    assert losses == ref_losses
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a, b)
    assert off.stats()["offloaded"] > 0  # the layers' inputs went through the cache
    assert model.blocks.stats()["passes"] == 8


def test_extra_inputs_go_to_every_layer_and_one_needing_a_gradient_is_refused():
    class Masked(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, x, mask):
            return self.lin(x).masked_fill(mask, 0.0)

    torch.manual_seed(0)
    ref = torch.nn.ModuleList(Masked() for _ in range(3))
    st = ft.stream_layers(list(copy.deepcopy(ref)))
    x = torch.randn(4, 16)
    mask = torch.rand(4, 16) < 0.3
    y = x
    for layer in ref:
        y = layer(y, mask)
    y.sum().backward()
    st(x, mask).sum().backward()
    _same_grads(ref, st)
    with pytest.raises(ValueError, match="extra input requires grad"):
        st(x, torch.zeros(4, 16, requires_grad=True))
    st(x, mask).sum().backward()  # still runs


def test_a_layer_that_returns_its_own_weight_gets_a_copy_not_the_slot():
    class Weight(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            return self.w if x is None else self.w * 0 + x

    class First(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(8))

        def forward(self, x):
            return self.w.view(8)  # a view of the slot

    st = ft.stream_layers([First(), Weight(), Weight()], slots=1)
    with torch.no_grad():
        y = st(torch.zeros(8))
    assert torch.equal(y, st.layers[0].w)


def test_layers_that_cannot_be_streamed_are_refused_by_name():
    with pytest.raises(ValueError, match="at least one layer"):
        ft.stream_layers([])
    with pytest.raises(ValueError, match="no parameters"):
        ft.stream_layers([torch.nn.Linear(2, 2), torch.nn.GELU()])
    with pytest.raises(TypeError, match="dtype torch.int64"):
        lin = torch.nn.Linear(2, 2)
        lin.register_parameter("steps", torch.nn.Parameter(torch.zeros(2, dtype=torch.int64), requires_grad=False))
        ft.stream_layers([lin])
    shared = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="also 'weight' of layer 0"):
        ft.stream_layers([shared, torch.nn.Sequential(shared)])
    with pytest.raises(TypeError, match="not a torch.nn.Module"):
        ft.stream_layers([torch.nn.Linear(2, 2), "layer"])
    with pytest.raises(TypeError, match="sequence of modules"):
        ft.stream_layers(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="slots must be at least 1"):
        ft.stream_layers([torch.nn.Linear(2, 2)], slots=0)
    with pytest.raises(ValueError, match="slots must be an integer"):
        ft.stream_layers([torch.nn.Linear(2, 2)], slots=1.5)


def test_a_layer_that_raises_or_returns_a_tuple_leaves_the_stack_usable():
    class Flaky(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.mode = "ok"
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.mode == "raise":
                raise ArithmeticError("flaky layer")
            if self.mode == "tuple":
                return self.lin(x), x
            if self.mode == "raise-in-backward" and self.calls % 2 == 0:
                raise KeyError("recompute failed")
            return self.lin(x)

    torch.manual_seed(0)
    layers = [Flaky() for _ in range(3)]
    st = ft.stream_layers(layers, slots=2)
    x = torch.randn(2, 8, requires_grad=True)
    layers[1].mode = "raise"
    with pytest.raises(ArithmeticError):
        st(x)
    layers[1].mode = "tuple"
    with pytest.raises(TypeError, match="layer 1 returned a tuple"):
        st(x)
    layers[1].mode = "raise-in-backward"  # the forward's call is odd: only the recompute raises
    layers[1].calls = 0
    y = st(x)
    with pytest.raises(KeyError, match="recompute failed"):
        y.sum().backward()
    layers[1].mode = "ok"
    assert not st._core.in_pass
    ref = copy.deepcopy(torch.nn.Sequential(*layers))
    for p in ref.parameters():
        p.grad = None
    st.zero_grad()
    x2 = x.detach().clone().requires_grad_(True)
    ref(x).sum().backward()
    st(x2).sum().backward()
    _same_grads(ref, st)


def test_the_stack_used_twice_in_one_graph_runs_one_backward_pass_per_use():
    # autograd runs the later use's nodes first (higher sequence numbers), each use's
    # layers in order: two whole passes, and the gradients summed in autograd's order
    ref = _stack(n=3, dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    x = torch.randn(4, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    (ref(x) + ref(x * 2)).sum().backward()
    (st(x2) + st(x2 * 2)).sum().backward()
    assert torch.equal(x.grad, x2.grad)
    _same_grads(ref, st)
    assert st.stats()["passes"] == 4


def test_a_dtype_change_is_refused_and_a_device_move_keeps_the_slabs():
    st = ft.stream_layers(list(_stack(n=2)), slots=1)
    with pytest.raises(RuntimeError, match="keep their dtype"):
        st.double()
    ptrs = [p.data_ptr() for p in st.parameters()]
    st.to("cpu")
    assert ptrs == [p.data_ptr() for p in st.parameters()]


def test_eval_under_no_grad_between_training_steps():
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    x = torch.randn(4, 32)
    for net in (ref, st):
        net.eval()
    with torch.no_grad():
        assert torch.equal(ref(x), st(x))
    with torch.inference_mode():
        assert torch.equal(ref(x), st(x))
    for net in (ref, st):
        net.train()
        torch.manual_seed(5)
        net(x).sum().backward()
    _same_grads(ref, st)


def test_blocks_of_a_transformer_with_attention_stream_bit_for_bit():
    torch.manual_seed(1)
    blocks = [_Block(32, heads=4) for _ in range(3)]
    ref = torch.nn.Sequential(*copy.deepcopy(blocks))
    st = ft.stream_layers(blocks, slots=2)
    x = torch.randn(2, 8, 32, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    torch.manual_seed(2)
    ref(x).square().mean().backward()
    torch.manual_seed(2)
    st(x2).square().mean().backward()
    assert torch.equal(x.grad, x2.grad)
    _same_grads(ref, st)


def test_autograd_grad_and_backward_inputs_get_what_plain_torch_gives():
    ref = _stack(n=3, dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    x = torch.randn(4, 32, requires_grad=True)
    # only the input's gradient: no weight gets a .grad
    (gx,) = torch.autograd.grad(ref(x).sum(), x)
    (gx2,) = torch.autograd.grad(st(x).sum(), x)
    assert torch.equal(gx, gx2)
    st(x).sum().backward(inputs=[x])
    assert all(p.grad is None for p in st.parameters())
    # the weights' gradients, returned by autograd
    want = torch.autograd.grad(ref(x).sum(), list(ref.parameters()))
    got = torch.autograd.grad(st(x).sum(), list(st.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(want, got))
    assert all(p.grad is None for p in st.parameters())
    assert not st._core.in_pass


def test_hooks_on_weights_run_with_their_gradient_as_in_plain_torch():
    ref = _stack(n=3, dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    seen = {"ref": [], "st": []}
    for key, net in (("ref", ref), ("st", st)):
        for k, p in enumerate(net.parameters()):
            p.register_post_accumulate_grad_hook(lambda p, k=k, key=key: seen[key].append((k, p.grad.clone())))
    x = torch.randn(4, 32)
    ref(x).sum().backward()
    st(x).sum().backward()
    want, got = dict(seen["ref"]), dict(seen["st"])  # each weight's hook once, with its gradient
    assert len(seen["st"]) == len(got) == len(want) == len(list(st.parameters()))
    assert all(torch.equal(want[k], got[k]) for k in want)
    _same_grads(ref, st)


def test_a_weight_the_layer_does_not_use_gets_no_gradient():
    class Partial(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)
            self.spare = torch.nn.Parameter(torch.randn(3))

        def forward(self, x):
            return x * 2  # no weight used

    torch.manual_seed(0)
    ref = torch.nn.Sequential(Partial(), torch.nn.Linear(8, 8))
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=1)
    x = torch.randn(4, 8)  # no grad: layer 0's output needs none either
    for _ in range(2):
        ref(x).sum().backward()
        st(x).sum().backward()
        _same_grads(ref, st)
    assert st.layers[0].spare.grad is None


def test_changes_between_forward_and_backward_are_refused_or_replayed():
    ref = _stack(n=2)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=1)
    x = torch.randn(4, 32)
    y = st(x)
    with torch.no_grad():
        st.layers[1][1].weight.add_(1.0)  # a weight changed in place before the backward pass
    with pytest.raises(RuntimeError, match="modified by an inplace operation.*weight '1.weight' of layer 1"):
        y.sum().backward()
    assert not st._core.in_pass
    ref2 = copy.deepcopy(st)  # eval() between the passes: the recompute runs as the forward ran
    for net in (st, ref2):
        torch.manual_seed(4)
        out = net(x)
        net.eval()
        out.sum().backward()
        net.train()
    _same_grads(ref2, st)


def test_a_saved_input_changed_in_place_leaves_the_stack_usable():
    st = ft.stream_layers([torch.nn.Linear(8, 8) for _ in range(3)])
    x = torch.randn(4, 8, requires_grad=True)
    h = x * 1
    y = st(h)
    h.add_(1)
    with pytest.raises(RuntimeError, match="inplace"):
        y.sum().backward()
    assert not st._core.in_pass
    st(torch.randn(4, 8)).sum().backward()


def test_transposed_and_channels_last_weights_keep_their_layout():
    class T(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(16, 16).t())
            self.conv = torch.nn.Conv2d(4, 4, 3, padding=1).to(memory_format=torch.channels_last)

        def forward(self, x):
            return self.conv(x @ self.w)

    torch.manual_seed(0)
    ref = torch.nn.Sequential(T(), T())
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=1)
    assert st.layers[0].w.stride() == (1, 16)
    assert st.layers[0].conv.weight.is_contiguous(memory_format=torch.channels_last)
    x = torch.randn(2, 4, 16, 16)
    assert torch.equal(ref(x), st(x))
    ref(x).sum().backward()
    st(x).sum().backward()
    _same_grads(ref, st)
    assert st.layers[0].w.grad.stride() == ref[0].w.grad.stride()


def test_replaced_weights_are_taken_into_the_slabs():
    ref = _stack(n=2, dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=1)
    x = torch.randn(4, 32)
    new = _stack(n=2, dropout=0.0, seed=5)
    st.layers.load_state_dict(new.state_dict(), assign=True)
    with torch.no_grad():
        assert torch.equal(st(x), new(x))
    st.layers[0][1].weight = torch.nn.Parameter(torch.zeros(67, 32))
    new[0][1].weight = torch.nn.Parameter(torch.zeros(67, 32))
    with torch.no_grad():
        assert torch.equal(st(x), new(x))
    st.layers[0][1].weight = torch.nn.Parameter(torch.zeros(3, 3))
    with pytest.raises(RuntimeError, match="replaced by one of shape"):
        st(x)


def test_deepcopy_gives_a_stack_of_its_own_and_pickle_is_refused_with_what_to_do():
    import pickle

    st = ft.stream_layers(list(_stack(n=2, dropout=0.0)), slots=1)
    twin = copy.deepcopy(st)
    x = torch.randn(4, 32)
    with torch.no_grad():
        assert torch.equal(st(x), twin(x))
        st.layers[0][1].weight.add_(1.0)
        assert not torch.equal(st(x), twin(x))
    with pytest.raises(TypeError, match="state_dict"):
        pickle.dumps(st)


def test_double_backward_is_refused_and_the_stack_stays_usable():
    st = ft.stream_layers(list(_stack(n=2, dropout=0.0)), slots=1)
    x = torch.randn(4, 32, requires_grad=True)
    with pytest.raises(RuntimeError, match="create_graph"):
        torch.autograd.grad(st(x).sum(), x, create_graph=True)
    assert not st._core.in_pass
    st(x).sum().backward()


def test_a_backward_pass_that_stops_above_layer_0_ends_the_pass_with_plain_torchs_gradients():
    torch.manual_seed(0)
    ref = torch.nn.Sequential(*[torch.nn.Linear(16, 16) for _ in range(3)])
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    x = torch.randn(8, 16)
    rp, sp = list(ref.parameters()), list(st.parameters())
    ref(x).sum().backward(inputs=[rp[3]])  # the middle layer's bias only
    st(x).sum().backward(inputs=[sp[3]])
    _same_grads(ref, st)
    assert not st._core.in_pass
    (want,) = torch.autograd.grad(ref(x).sum(), [rp[4]])
    (got,) = torch.autograd.grad(st(x).sum(), [sp[4]])
    assert torch.equal(want, got) and not st._core.in_pass
    ref(x).sum().backward()
    st(x).sum().backward()
    _same_grads(ref, st)


def test_iterating_over_the_stack_is_refused_with_what_to_do():
    st = ft.stream_layers([torch.nn.Linear(2, 2)])
    assert len(st) == 1
    with pytest.raises(TypeError, match="call it"):
        for _ in st:
            pass


@pytest.mark.parametrize("device", ["tpu", "meta", "not a device", 2.5])
def test_a_slot_device_that_is_not_the_cpu_or_cuda_is_a_value_error_naming_it(device):
    with pytest.raises(ValueError, match="device"):
        ft.stream_layers([torch.nn.Linear(4, 4)], device=device)


def test_cuda_slots_without_a_usable_device_are_refused_saying_what_is_missing():
    if ferry.has_cuda and ferry.cuda_device_count() > 0 and torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    with pytest.raises(ValueError, match="cuda"):
        ft.stream_layers([torch.nn.Linear(4, 4)], device="cuda")
    layer = torch.nn.Linear(4, 4)
    weight = layer.weight.detach().clone()
    with pytest.raises(ValueError, match="meta"):
        ft.stream_layers([torch.nn.Linear(4, 4, device="meta")])
    assert torch.equal(layer.weight.detach(), weight)  # nothing moved


def test_an_input_on_another_device_than_the_slots_is_refused_naming_both():
    stack = ft.stream_layers([torch.nn.Linear(4, 4)])
    assert stack.device == torch.device("cpu")
    with pytest.raises(ValueError, match="input is on meta.*slots are on cpu"):
        stack(torch.empty(2, 4, device="meta"))
    assert stack(torch.ones(2, 4)).shape == (2, 4)  # and the stack runs on


def test_a_bfloat16_stack_trains_with_offload_adamw_as_the_layers_do():
    ref = _stack(dtype=torch.bfloat16, dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    opt_ref = ft.OffloadAdamW(ref.parameters(), lr=1e-2)
    opt = ft.OffloadAdamW(st.parameters(), lr=1e-2)
    for step in range(3):
        x = torch.randn(8, 32, dtype=torch.bfloat16)
        for model, o in ((ref, opt_ref), (st, opt)):
            o.zero_grad()
            model(x).float().square().sum().backward()
            o.step()
    for a, b in zip(ref.parameters(), st.parameters()):
        assert torch.equal(a.detach(), b.detach())


def test_a_stack_made_on_one_thread_runs_its_passes_on_another():
    import threading

    ref = _stack(dropout=0.0)
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=2)
    x = torch.randn(8, 32)
    ref(x).square().sum().backward()
    errors = []

    def run():
        try:
            st(x).square().sum().backward()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert not errors, errors
    _same_grads(ref, st)


def test_two_threads_on_one_stack_get_a_clear_error_and_the_stack_runs_on():
    import threading

    st = ft.stream_layers(list(_stack(n=6, dropout=0.0)), slots=2)
    x = torch.randn(64, 32)
    barrier = threading.Barrier(2)
    results = []

    def run():
        barrier.wait()
        try:
            for _ in range(3):
                st(x).square().sum().backward()
            results.append("ok")
        except Exception as e:  # noqa: BLE001 - each checked below
            results.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 2
    assert all(r == "ok" or (r.startswith("RuntimeError") and "one pass at a time" in r) for r in results), results
    y = st(x)  # afterwards, the stack runs a whole step
    y.square().sum().backward()
    assert not st._core.in_pass


def test_more_slots_than_layers_make_one_slot_per_layer():
    st = ft.stream_layers([torch.nn.Linear(64, 64)], slots=8)
    assert st.slots == 1 and st.stats()["slot_bytes"] < 2 * st._core.layer_bytes(0)
