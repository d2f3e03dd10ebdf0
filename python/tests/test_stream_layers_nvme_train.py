"""ferry.torch.stream_layers(nvme_path=...) with trainable weights: the weights (and
OffloadAdamW's states, with its own nvme_path) on NVMe, the gradients in host slabs, each
``.grad`` a SlabGradient. Against the same layers streamed from pinned memory with the
same optimizer (bit for bit: gradients, clipping, steps, accumulation, zero_grad, a
bfloat16 stack, a frozen part, a scheduler, resume), against plain torch (gradients bit
for bit), the faults of a step (a failed write keeps the new weights in host memory; a
failed read is finished by the next step; nothing stepped twice) and the refusals (torch's
own clip and optimizers, hooks, a step during a pass)."""

import copy
import errno
import pickle

import pytest
import torch

import ferry.torch as ft
from ferry import _core


def _layers(n=3, d=24, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return [
        torch.nn.Sequential(
            torch.nn.LayerNorm(d),
            torch.nn.Linear(d, 2 * d + 5),  # odd sizes: layers of bytes not a multiple of 4 KiB
            torch.nn.GELU(),
            torch.nn.Dropout(0.1),
            torch.nn.Linear(2 * d + 5, d),
        ).to(dtype)
        for _ in range(n)
    ]


def _with_faults(monkeypatch, plan):
    real = _core.LayerStack
    monkeypatch.setattr(_core, "LayerStack", lambda *a, **k: real(*a, faults=plan, **k))


def _fail_read_of(st, layer, monkeypatch):
    """The optimizer's read of ``layer`` fails once with EIO (at the stack's read, not by
    counting the file's pread calls: a layer is several of them, in an order the engine's
    threads pick)."""
    real = st._read_layer
    left = [1]

    def read(i):
        if i == layer and left[0]:
            left[0] -= 1
            raise OSError(errno.EIO, f"injected: the read of layer {layer} failed")
        return real(i)

    monkeypatch.setattr(st, "_read_layer", read)


def _weights(st):
    return {f"{i}.{k}": v for i in range(len(st)) for k, v in st.read_weights(i).items()}


def _pair(tmp_path, dtype=torch.float32, states_on_nvme=False, **opt):
    """The same layers streamed from pinned memory and from a file, each with its OffloadAdamW."""
    layers = _layers(dtype=dtype)
    pinned = ft.stream_layers(copy.deepcopy(layers))
    on_file = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    extra = dict(nvme_path=tmp_path / "states.bin", nvme_bytes=1 << 22) if states_on_nvme else {}
    return (pinned, ft.OffloadAdamW(pinned.parameters(), **opt),
            on_file, ft.OffloadAdamW(on_file.parameters(), **extra, **opt))


def _step(st, opt, x, seed, clip=None, zero=True):
    torch.manual_seed(seed)
    st(x).square().mean().backward()
    if clip is not None:
        ft.clip_grad_norm_(st.parameters(), clip)
    opt.step()
    if zero:
        opt.zero_grad()


@pytest.mark.parametrize("states_on_nvme", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_training_from_the_file_is_bit_for_bit_training_from_pinned_memory(tmp_path, states_on_nvme, dtype):
    pinned, opt_p, on_file, opt_f = _pair(tmp_path, dtype, states_on_nvme, lr=1e-2, weight_decay=0.1)
    sched_p = torch.optim.lr_scheduler.StepLR(opt_p, 2, 0.5)
    sched_f = torch.optim.lr_scheduler.StepLR(opt_f, 2, 0.5)
    assert on_file._core.trainable and on_file.stats()["nvme"]
    assert all(p.is_meta and p.requires_grad for p in on_file.parameters())
    x = torch.randn(6, 24, dtype=dtype)
    for step in range(4):
        for st, opt, sched in ((pinned, opt_p, sched_p), (on_file, opt_f, sched_f)):
            _step(st, opt, x, step, clip=0.5, zero=False)
            sched.step()
        for a, b in zip(pinned.parameters(), on_file.parameters()):
            assert isinstance(b.grad, ft.SlabGradient)
            assert torch.equal(a.grad, b.grad.values())
        opt_p.zero_grad()
        opt_f.zero_grad()
        assert all(p.grad is None for p in on_file.parameters())
        got = _weights(on_file)
        for name, want in pinned.state_dict().items():
            if name.startswith("layers."):
                assert torch.equal(got[name[len("layers."):]], want), (step, name)
    for (a, sa), (b, sb) in zip(opt_p.state.items(), opt_f.state.items()):
        assert torch.equal(sa["step"], sb["step"])
    sd_p, sd_f = opt_p.state_dict(), opt_f.state_dict()
    for k in sd_p["state"]:
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(sd_p["state"][k][key], sd_f["state"][k][key])


def test_gradients_are_bit_for_bit_plain_torch_and_accumulate_as_autograd_does(tmp_path):
    layers = _layers()
    ref = torch.nn.Sequential(*copy.deepcopy(layers))
    st = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    x = torch.randn(5, 24)
    for micro in range(3):  # accumulated over micro-batches, no zero_grad between
        torch.manual_seed(micro)
        ref(x).sum().backward()
        torch.manual_seed(micro)
        st(x).sum().backward()
        for a, b in zip(ref.parameters(), st.parameters()):
            assert torch.equal(a.grad, b.grad.values())
    # zero_grad(set_to_none=False) zeroes the slabs, as torch zeroes .grad; then adds into them
    ref.zero_grad(set_to_none=False)
    st.zero_grad(set_to_none=False)
    assert all(isinstance(p.grad, ft.SlabGradient) and not p.grad.values().any() for p in st.parameters())
    torch.manual_seed(7)
    ref(x).sum().backward()
    torch.manual_seed(7)
    st(x).sum().backward()
    for a, b in zip(ref.parameters(), st.parameters()):
        assert torch.equal(a.grad, b.grad.values())
    # torch's norm and clip over the same gradients, bit for bit
    want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.25)
    got = ft.clip_grad_norm_(st.parameters(), 0.25)
    assert torch.equal(want, got)
    for a, b in zip(ref.parameters(), st.parameters()):
        assert torch.equal(a.grad, b.grad.values())


def test_a_frozen_part_gets_no_gradient_and_keeps_its_weights(tmp_path):
    layers = _layers()
    layers[1].requires_grad_(False)
    layers[2][1].weight.requires_grad_(False)
    frozen = {k: v.clone() for k, v in layers[1].state_dict().items()}
    st = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    opt = ft.OffloadAdamW(st.parameters(), lr=1e-1)
    x = torch.randn(4, 24)
    before = st.read_weights(2)["1.weight"].clone()
    bias = st.read_weights(2)["1.bias"].clone()
    for step in range(2):
        _step(st, opt, x, step, zero=False)
        assert all(p.grad is None for p in st.layers[1].parameters())
        assert st.layers[2][1].weight.grad is None and st.layers[2][1].bias.grad is not None
        opt.zero_grad()
    assert all(torch.equal(v, st.read_weights(1)[k]) for k, v in frozen.items())
    assert torch.equal(st.read_weights(2)["1.weight"], before)
    assert not torch.equal(st.read_weights(2)["1.bias"], bias)  # trainable beside it: stepped


def test_resuming_from_a_checkpoint_goes_on_bit_for_bit(tmp_path):
    a = ft.stream_layers(_layers(), nvme_path=tmp_path / "a.bin")
    opt_a = ft.OffloadAdamW(a.parameters(), lr=1e-2)
    x = torch.randn(4, 24)
    for step in range(2):
        _step(a, opt_a, x, step, clip=1.0)
    model_sd, opt_sd = a.state_dict(), copy.deepcopy(opt_a.state_dict())
    b = ft.stream_layers(_layers(seed=5), nvme_path=tmp_path / "b.bin")
    b.load_state_dict(model_sd)
    opt_b = ft.OffloadAdamW(b.parameters(), lr=1e-2, nvme_path=tmp_path / "s.bin", nvme_bytes=1 << 22)
    opt_b.load_state_dict(opt_sd)
    for step in range(2, 4):
        _step(a, opt_a, x, step, clip=1.0)
        _step(b, opt_b, x, step, clip=1.0)
    assert all(torch.equal(v, _weights(b)[k]) for k, v in _weights(a).items())
    sa, sb = opt_a.state_dict()["state"], opt_b.state_dict()["state"]  # the file's moments read back
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k][m], sb[k][m]) for k in sa for m in sa[k])


def test_a_failed_write_keeps_the_stepped_weights_in_host_memory_until_written(tmp_path, monkeypatch):
    plan = _core.FaultPlan()
    _with_faults(monkeypatch, plan)
    pinned, opt_p, on_file, opt_f = _pair(tmp_path, lr=1e-2)
    x = torch.randn(4, 24)
    _step(pinned, opt_p, x, 0)
    torch.manual_seed(0)
    on_file(x).square().mean().backward()
    rule = plan.add("pwrite", errno.ENOSPC, skip=0, times=0)  # every write fails (and the rollback's)
    with pytest.raises(OSError) as e:
        opt_f.step()
    assert e.value.errno == errno.ENOSPC
    assert on_file._pending and plan.fired(rule) > 0
    # what reads the layer sees the stepped weights; nothing is stepped twice
    want = {k[len("layers."):]: v for k, v in pinned.state_dict().items() if k.startswith("layers.")}
    got = _weights(on_file)
    assert torch.equal(got["0.1.weight"], want["0.1.weight"])
    with pytest.raises(OSError):
        on_file.flush()  # still failing: kept
    with pytest.raises(OSError):
        on_file(x)  # a pass writes it first: refused while it cannot
    assert on_file._pending
    plan.clear()
    opt_f.step()  # writes it, then finishes the step: the layers not reached are stepped, the rest not again
    opt_f.zero_grad()
    assert not on_file._pending and not any(on_file._core.lost(i) for i in range(len(on_file)))
    assert all(torch.equal(v, _weights(on_file)[k]) for k, v in want.items())
    _step(pinned, opt_p, x, 1)
    _step(on_file, opt_f, x, 1)
    assert all(torch.equal(v[1], _weights(on_file)[v[0][len("layers."):]])
               for v in pinned.state_dict().items() if v[0].startswith("layers."))


def test_a_failed_read_is_finished_by_the_next_step_without_stepping_twice(tmp_path, monkeypatch):
    pinned, opt_p, on_file, opt_f = _pair(tmp_path, lr=1e-2)
    x = torch.randn(4, 24)
    _step(pinned, opt_p, x, 0)
    torch.manual_seed(0)
    on_file(x).square().mean().backward()
    _fail_read_of(on_file, 1, monkeypatch)  # layer 0 read and stepped; layer 1's read fails
    with pytest.raises(OSError) as e:
        opt_f.step()
    assert e.value.errno == errno.EIO
    opt_f.step()
    opt_f.zero_grad()
    for k, v in pinned.state_dict().items():
        if k.startswith("layers."):
            assert torch.equal(v, _weights(on_file)[k[len("layers."):]]), k
    assert [int(s["step"]) for s in opt_f.state.values()] == [1] * len(opt_f.state)


def test_torch_own_clip_and_optimizers_and_hooks_are_refused_with_what_to_call(tmp_path):
    st = ft.stream_layers(_layers(), nvme_path=tmp_path / "w.bin")
    x = torch.randn(4, 24, requires_grad=True)
    st(x).sum().backward()
    g = st.layers[0][1].weight.grad
    assert isinstance(g, ft.SlabGradient) and g.shape == (53, 24) and g.dtype == torch.float32
    with pytest.raises(RuntimeError, match=r"'0.weight' of layer 0 .*linalg_vector_norm.*ferry.torch.clip_grad_norm_"):
        torch.nn.utils.clip_grad_norm_(st.parameters(), 1.0)
    with pytest.raises(RuntimeError, match="in the stack's host gradient slab"):
        g * 2
    # torch.autograd.grad: the input's gradient; the weights (meta) get none
    (gx,) = torch.autograd.grad(st(x).sum(), x)
    assert gx.shape == x.shape
    h = st.layers[1][1].weight.register_hook(lambda g: g)
    with pytest.raises(RuntimeError, match="has a hook"):
        st(x).sum().backward()
    h.remove()
    y = st(x)
    ft.OffloadAdamW(st.parameters()).step()  # between the forward and backward passes: as an in-place change
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*written into"):
        y.sum().backward()
    raw = st._read_layer(0)
    with pytest.raises(ValueError, match=r"old bytes of a layer are 3 bytes, not its"):
        st._core.write_weights(0, raw, torch.zeros(3, dtype=torch.uint8))  # the rollback's bytes: the layer's size
    layers = [torch.nn.Linear(4, 4).double() for _ in range(2)]
    st64 = ft.stream_layers(layers, nvme_path=tmp_path / "w64.bin")
    st64(torch.randn(2, 4, dtype=torch.float64)).sum().backward()
    with pytest.raises(ValueError, match=r"float32, bfloat16 or float16 .*layer 0.*float64"):
        ft.OffloadAdamW(st64.parameters()).step()
    # torch's AdamW: refused at the first gradient it reads; its weight decay ran in place
    # on the meta parameter before (a change that went nowhere): the next pass names it
    with pytest.raises(RuntimeError, match="OffloadAdamW"):
        torch.optim.AdamW(st.parameters()).step()
    with pytest.raises(RuntimeError, match="was changed in place"):
        st(x)


def test_old_idioms_on_grad_data_reach_the_slab_or_are_refused(tmp_path):
    st = ft.stream_layers(_layers(), nvme_path=tmp_path / "w.bin")
    st(torch.randn(3, 24)).sum().backward()
    g = st.layers[0][1].weight.grad
    assert g.data is g  # .data: the SlabGradient itself, not a meta tensor whose changes go nowhere
    with pytest.raises(RuntimeError, match="mul_ would compute nothing"):
        g.data.mul_(0.5)
    for view in ("T", "mT"):  # views of the values: a meta tensor's changes would go nowhere
        with pytest.raises(RuntimeError, match="would compute nothing"):
            getattr(g, view)
    with pytest.raises(TypeError, match="is not copied or pickled.*p.grad.values"):
        pickle.dumps(g)
    with pytest.raises(TypeError, match="is not copied or pickled"):
        copy.deepcopy(g)
    assert g.values().any()
    g.data.zero_()
    assert not g.values().any()
    # a parameter pickles (a meta tensor that refers to no stack)
    q = pickle.loads(pickle.dumps(st.layers[0][1].bias))
    assert q.is_meta and q._ferry_stack() is None


def test_layers_streamed_already_are_refused_and_a_replaced_parameter_leaves_the_optimizer(tmp_path):
    layers = _layers(n=2)
    st = ft.stream_layers(layers, nvme_path=tmp_path / "a.bin")
    with pytest.raises(ValueError, match=r"'0.weight' of layer 0 is streamed already .*a.bin"):
        ft.stream_layers(layers, nvme_path=tmp_path / "b.bin")
    x = torch.randn(3, 24)
    opt = ft.OffloadAdamW(st.parameters(), lr=1e-1)
    st(x).sum().backward()
    opt.step()
    opt.zero_grad(set_to_none=False)
    old = st.layers[0][1].weight
    st.layers[0][1].weight = torch.nn.Parameter(torch.full(old.shape, 0.5))  # held by no optimizer
    st(x).sum().backward()  # written into the file first; its gradient in the slab
    assert old.grad is None and isinstance(st.layers[0][1].weight.grad, ft.SlabGradient)
    opt.step()  # steps the parameters it holds: not the new one (as torch)
    assert bool((st.read_weights(0)["1.weight"] == 0.5).all())


class _Gate(torch.nn.Module):
    """A layer that waits, inside a pass, until the test lets it go on."""

    def __init__(self, entered, go):
        super().__init__()
        self.lin = torch.nn.Linear(24, 24)
        self.entered, self.go = entered, go

    def forward(self, x):
        if not torch.is_grad_enabled():
            self.entered.set()
            assert self.go.wait(30)
        return self.lin(x)


def test_an_optimizer_step_during_a_pass_on_another_thread_is_refused_and_changes_nothing(tmp_path):
    import threading

    entered, go = threading.Event(), threading.Event()
    layers = _layers(n=2) + [_Gate(entered, go)]
    st = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    opt = ft.OffloadAdamW(st.parameters(), lr=1e-2)
    x = torch.randn(3, 24)
    st(x).sum().backward()
    before = _weights(st)
    out = []

    def evaluate():
        with torch.no_grad():  # a forward without grad: it blocks in the last layer
            out.append(st(x))

    t = threading.Thread(target=evaluate)
    t.start()
    assert entered.wait(30)
    with pytest.raises(RuntimeError, match="a pass over the StreamedLayers is in progress"):
        opt.step()
    go.set()
    t.join(30)
    assert out and not any(int(s["step"]) for s in opt.state.values())
    assert all(torch.equal(v, _weights(st)[k]) for k, v in before.items())
    opt.step()  # between passes: stepped
    assert all(int(s["step"]) == 1 for s in opt.state.values())


@pytest.mark.parametrize("states_on_nvme", [False, True])
def test_a_failed_step_is_not_finished_over_the_gradients_of_a_new_backward_pass(tmp_path, monkeypatch,
                                                                                  states_on_nvme):
    """A loop that catches the step's OSError and goes on to the next batch: the next step
    steps every parameter with the new gradients (a RuntimeWarning says the failed step's
    rest went without its update), instead of finishing the failed step over them."""
    st = ft.stream_layers(_layers(), nvme_path=tmp_path / "w.bin")
    extra = dict(nvme_path=tmp_path / "s.bin", nvme_bytes=1 << 22) if states_on_nvme else {}
    opt = ft.OffloadAdamW(st.parameters(), lr=1e-2, **extra)
    x = torch.randn(4, 24)
    st(x).square().mean().backward()
    _fail_read_of(st, 1, monkeypatch)  # layer 0 read (and stepped); layer 1's read fails
    with pytest.raises(OSError):
        opt.step()
    first = {id(p) for p in st.layers[0].parameters()}
    assert all(int(opt.state[p]["step"]) == 1 for p in st.layers[0].parameters())
    assert not any(opt.state.get(p) for p in st.layers[2].parameters())
    opt.zero_grad()
    st(x).square().mean().backward()  # the next batch
    with pytest.warns(RuntimeWarning, match="the gradients changed since"):
        opt.step()
    for p in st.parameters():
        assert int(opt.state[p]["step"]) == (2 if id(p) in first else 1)
