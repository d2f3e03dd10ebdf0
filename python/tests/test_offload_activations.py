"""ferry.torch.offload_activations on CPU tensors, through the CPU model of ferry's device
runtime: gradients and losses against the same steps without offload (bit for bit), what
is offloaded and what stays, the cache's record replayed from the second step, graphs
freed without a backward pass, and the errors."""

import copy
import gc

import numpy as np

import pytest
import torch

import ferry
import ferry.torch as ft

from _models import _GPT


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256),
        torch.nn.GELU(),
        torch.nn.LayerNorm(256),
        torch.nn.Linear(256, 64),
    )


def _train(model, batches, offload=None, lr=1e-2):
    """A few AdamW steps; returns the losses and the gradients of the last step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    grads = None
    for i, (x, y) in enumerate(batches):
        torch.manual_seed(1000 + i)  # the same dropout masks with and without offload
        opt.zero_grad()
        if offload is None:
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        else:
            with offload:
                loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        losses.append(loss.item())
    return losses, grads


def test_cpu_tensors_go_to_the_store_of_the_cpu_model():
    off = ft.offload_activations(min_bytes=0, keep_last=0, device="cpu")
    x = torch.randn(8, 8, requires_grad=True)
    with off:
        y = (x * 2).sin().sum()
    assert off.stats()["offloaded"] >= 1 and off.stats()["devices"] == ["cpu"]
    y.backward()


def test_an_mlp_step_gives_the_same_gradients_bit_for_bit():
    x = torch.randn(32, 64)
    ref_model, model = _mlp(), _mlp()
    ref_loss = ref_model(x).square().mean()
    ref_loss.backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        loss = model(x).square().mean()
    s = off.stats()
    assert s["offloaded"] == s["stored"] > 0
    assert s["held"] == s["stored"]
    loss.backward()
    assert loss.item() == ref_loss.item()
    for a, b in zip(ref_model.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    s = off.stats()
    assert s["fetched"] == s["offloaded"] and s["held"] == 0
    assert s["kept"]["parameter"] > 0  # the weights stay where they are


def test_a_small_transformer_trains_the_same_with_activations_offloaded():
    torch.manual_seed(7)
    batches = [(torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16))) for _ in range(4)]
    ref_losses, ref_grads = _train(_GPT(), batches)
    off = ft.offload_activations(min_bytes=4096, keep_last=1)
    losses, grads = _train(_GPT(), batches, off)
    assert losses == ref_losses
    for a, b in zip(ref_grads, grads):
        assert torch.equal(a, b)
    s = off.stats()
    assert s["steps"] == 4
    assert s["offloaded"] > 0 and s["held"] == 0
    assert s["prefetched"] > 0  # steps 2-4 replay the record of step 1
    assert s["kept"]["small"] > 0


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.uint8]
)
def test_saved_tensors_of_every_dtype_come_back_exact(dtype):
    # A custom function saves a tensor of `dtype` and checks it in its backward pass.
    class Keep(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, side):
            ctx.save_for_backward(side)
            return x * 2

        @staticmethod
        def backward(ctx, g):
            (side,) = ctx.saved_tensors
            assert side.dtype == dtype
            assert torch.equal(side, expected)
            return g * 2, None

    torch.manual_seed(3)
    expected = (torch.randn(1000, 3) * 50).to(dtype)
    x = torch.randn(5, requires_grad=True)
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        y = Keep.apply(x, expected.clone())
    assert off.stats()["offloaded"] == 1
    y.sum().backward()
    assert torch.equal(x.grad, torch.full((5,), 2.0))
    assert off.stats()["fetched"] == 1


def test_marked_small_leaf_and_overlapping_tensors_stay_as_autograd_saved_them():
    off = ft.offload_activations(min_bytes=1024)
    w = torch.randn(64, 64, requires_grad=True)
    x = torch.randn(64, 64, requires_grad=True)
    with off:
        a = ft.keep_on_device(torch.tanh(x))  # tanh saves its output: marked
        b = a @ w  # saves a (marked) and w (a leaf that requires grad)
        c = torch.sigmoid(torch.randn(4) + 0 * b.sum())  # 16 bytes saved: small
        e = torch.exp(x[:1].expand(64, 64))  # exp saves its output; its input is x (a leaf)
        f = (e.sum(0, keepdim=True).expand(64, 64) * 1.0).sigmoid()  # not overlapping: fine
    kept = off.stats()["kept"]
    assert kept["marked"] >= 1 and kept["parameter"] >= 1 and kept["small"] >= 1
    (b.sum() + c.sum() + f.sum()).backward()
    ref_x, ref_w = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    ra = torch.tanh(ref_x)
    rb = ra @ ref_w
    rc = torch.sigmoid(torch.randn(4) + 0 * rb.sum())
    re = torch.exp(ref_x[:1].expand(64, 64))
    rf = (re.sum(0, keepdim=True).expand(64, 64) * 1.0).sigmoid()
    (rb.sum() + rc.sum() + rf.sum()).backward()
    assert torch.equal(x.grad, ref_x.grad) and torch.equal(w.grad, ref_w.grad)


def test_channels_last_and_transposed_activations_come_back_with_their_strides():
    torch.manual_seed(2)
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU())
    conv = conv.to(memory_format=torch.channels_last)
    ref = copy.deepcopy(conv)
    x = torch.randn(4, 3, 16, 16).to(memory_format=torch.channels_last)
    proj = torch.randn(8 * 14 * 14, 5) / 100

    def loss_of(net):
        y = net(x)
        t = (y.flatten(1) @ proj).t().contiguous().t()  # transposed: dense, not contiguous
        return y.square().sum() + torch.tanh(t).sum()

    loss_of(ref).backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        loss = loss_of(conv)
    assert off.stats()["kept"]["not_dense"] == 0
    assert off.stats()["offloaded"] > 0
    loss.backward()
    for a, b in zip(ref.parameters(), conv.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_a_tensor_saved_three_times_is_offloaded_once():
    torch.manual_seed(4)
    q, k, v = (torch.nn.Linear(256, 256) for _ in range(3))
    x = torch.randn(512, 256, requires_grad=True)
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        h = torch.nn.functional.gelu(x)
        out = (q(h) + k(h) + v(h)).sum()
    s = off.stats()
    assert s["deduplicated"] == 2
    assert s["offloaded"] == s["stored"]
    out.backward()
    gx = x.grad.clone()
    x.grad = None
    h = torch.nn.functional.gelu(x)
    (q(h) + k(h) + v(h)).sum().backward()
    assert torch.equal(gx, x.grad)


def test_a_saved_tensor_changed_in_place_is_refused_as_autograd_refuses_it():
    for min_bytes in (0, 1 << 30):  # offloaded, and kept where it was
        x = torch.randn(1000, requires_grad=True)
        with ft.offload_activations(min_bytes=min_bytes, keep_last=0):
            y = x.exp()
            z = y.sin()
        y.mul_(2)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()


def test_conjugate_and_negative_views_come_back_as_their_values():
    z0 = torch.randn(64, 64, dtype=torch.complex64, requires_grad=True)
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        z = torch.fft.fft(z0)
        power = (z * z.conj()).real.mean()
        n = torch._neg_view(z) * z
    (power + n.real.sum()).backward()
    ref = z0.detach().clone().requires_grad_()
    rz = torch.fft.fft(ref)
    ((rz * rz.conj()).real.mean() + (torch._neg_view(rz) * rz).real.sum()).backward()
    assert torch.equal(z0.grad, ref.grad)
    assert off.stats()["offloaded"] > 0


def test_a_graph_freed_without_its_backward_pass_leaves_nothing_held():
    model = _mlp()
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        loss = model(torch.randn(8, 64)).sum()
    assert off.stats()["held"] > 0
    del loss
    gc.collect()
    assert off.stats()["held"] == 0
    with off:  # the next step starts clean
        loss = model(torch.randn(8, 64)).sum()
    loss.backward()
    assert off.stats()["held"] == 0


def test_retain_graph_unpacks_twice():
    model = _mlp()
    x = torch.randn(8, 64)
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        loss = model(x).square().sum()
    loss.backward(retain_graph=True)
    first = [p.grad.clone() for p in model.parameters()]
    loss.backward()
    for g, p in zip(first, model.parameters()):
        assert torch.equal(p.grad, 2 * g)


def test_a_tensor_larger_than_the_pinned_budget_stays_and_is_counted():
    off = ft.offload_activations(min_bytes=0, keep_last=0, pinned_bytes=1 << 20)
    x = torch.randn(1 << 19, requires_grad=True)  # 2 MiB saved by exp
    with off:
        y = torch.exp(x)
    assert off.stats()["kept"]["no_room"] == 1
    y.sum().backward()
    assert torch.equal(x.grad, torch.exp(x.detach()))


def test_a_graph_kept_across_steps_does_not_collide_with_the_next():
    model = _mlp()
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        first = model(torch.ones(4, 64)).sum()
    with off:  # step 2 begins while step 1's graph is alive
        second = model(torch.zeros(4, 64)).sum()
    second.backward()
    g2 = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    first.backward()
    ref = _mlp()
    ref(torch.ones(4, 64)).sum().backward()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)
    assert any(g.abs().sum() > 0 for g in g2)
    assert off.stats()["held"] == 0


@pytest.mark.parametrize(
    "kwargs",
    [{"min_bytes": -1}, {"keep_last": 1.5}, {"pinned_bytes": "1G"}, {"prefetch_bytes": True}, {"min_bytes": 2**64}],
)
def test_bad_arguments_are_value_errors_naming_the_argument(kwargs):
    (name,) = kwargs
    with pytest.raises(ValueError, match=name):
        ft.offload_activations(**kwargs)


def test_numpy_and_torch_integers_are_taken():
    off = ft.offload_activations(min_bytes=np.int64(4096), keep_last=torch.tensor(2))
    assert off.min_bytes == 4096


def test_entering_twice_is_refused_and_the_hooks_come_off():
    off = ft.offload_activations(min_bytes=0)
    with off:
        with pytest.raises(RuntimeError, match="already entered"):
            off.__enter__()
    x = torch.randn(100, requires_grad=True)
    torch.exp(x).sum().backward()  # outside: no hook, nothing offloaded
    assert off.stats()["stored"] == 0


def test_keep_on_device_refuses_what_is_not_a_tensor():
    with pytest.raises(TypeError, match="list"):
        ft.keep_on_device([1, 2])


def test_the_extension_names_the_key_and_the_sizes_in_its_errors():
    store = ferry._core.ActivationStore(0, 0, 0, 1 << 20)
    store.offload(5, torch.arange(100, dtype=torch.uint8))
    with pytest.raises(KeyError, match="already"):
        store.offload(5, torch.arange(100, dtype=torch.uint8))
    with pytest.raises(ValueError, match="99 bytes, the stored one 100"):
        store.fetch(5, torch.empty(99, dtype=torch.uint8))
    assert store.contains(5)  # a refused fetch keeps the bytes
    out = torch.empty(100, dtype=torch.uint8)
    store.fetch(5, out)
    assert torch.equal(out, torch.arange(100, dtype=torch.uint8))
    with pytest.raises(KeyError, match="key = 5"):
        store.fetch(5, out)
    with pytest.raises(ValueError, match="empty"):
        store.offload(6, torch.empty(0, dtype=torch.uint8))
    with pytest.raises(TypeError):
        store.offload(7, torch.arange(10)[::2])  # not C-contiguous: refused by the binding, never copied
    with pytest.raises(TypeError):
        store.fetch(5, torch.empty(200, dtype=torch.uint8)[::2])
    assert len(store) == 0


def test_dropping_the_object_loses_nothing_a_graph_still_needs():
    model = _mlp()
    x = torch.randn(8, 64)

    def forward():
        off = ft.offload_activations(min_bytes=0, keep_last=0)
        with off:
            return model(x).square().sum()

    loss = forward()  # the object is gone; the graph holds what it saved
    gc.collect()
    loss.backward()
    ref = _mlp()
    ref(x).square().sum().backward()
    for a, b in zip(ref.parameters(), model.parameters()):
        assert torch.equal(a.grad, b.grad)


def test_weights_and_their_views_are_never_offloaded():
    torch.manual_seed(6)
    frozen = torch.nn.Linear(256, 256).requires_grad_(False)
    layer = torch.nn.Linear(256, 512)
    x = torch.randn(32, 256, requires_grad=True)
    off = ft.offload_activations(min_bytes=0, keep_last=0)
    with off:
        h = torch.tanh(frozen(x) @ frozen.weight)  # saves frozen.weight.t(), frozen.weight and h
        out = layer(h).sum()  # saves h again and layer.weight.t()
    s = off.stats()
    assert s["kept"]["parameter"] == 3
    assert s["deduplicated"] == 1
    assert s["offloaded_bytes"] == h.numel() * 4  # the activation, once
    out.backward()
    ref = x.detach().clone().requires_grad_()
    layer(torch.tanh(frozen(ref) @ frozen.weight)).sum().backward()
    assert torch.equal(ref.grad, x.grad)


class _SaveSide(torch.autograd.Function):
    """Saves `side` and hands back, in its backward pass, what autograd unpacked."""

    got = None

    @staticmethod
    def forward(ctx, x, side):
        ctx.save_for_backward(side)
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        (side,) = ctx.saved_tensors
        _SaveSide.got = side.clone()
        return g, None


def _round_trip(codec, side):
    off = ft.offload_activations(min_bytes=0, keep_last=0, codec=codec)
    x = torch.zeros(1, requires_grad=True)
    with off:
        y = _SaveSide.apply(x, side)
    y.sum().backward()
    return _SaveSide.got, off.stats()


def _specials(n, dtype):
    torch.manual_seed(n)
    t = torch.randn(n) * torch.logspace(-30, 30, n)  # magnitudes far apart within a block of 128
    t[:4] = torch.tensor([0.0, -0.0, float("inf"), -float("inf")])
    t[4] = 1e-40  # a float32 subnormal
    return t.to(dtype)


def test_the_bf16_codec_rounds_float32_to_nearest_even_and_keeps_other_dtypes_exact():
    t = _specials(1000, torch.float32)
    got, s = _round_trip("bf16", t)
    assert torch.equal(got, t.to(torch.bfloat16).to(torch.float32))  # torch rounds to nearest even too
    assert got.dtype == torch.float32 and s["codec"] == "bf16"
    assert s["encoded"] == 1 and s["encoded_bytes"] == 4000 and s["offloaded_bytes"] == 2000
    nan, _ = _round_trip("bf16", torch.full((64,), float("nan")))
    assert torch.isnan(nan).all()
    for exact in (t.to(torch.bfloat16), t.to(torch.float16), torch.arange(100), torch.rand(50) < 0.5, t.double()):
        back, s = _round_trip("bf16", exact)
        assert torch.equal(back, exact) or (exact.is_floating_point() and torch.equal(back.isnan(), exact.isnan()))
        assert s["encoded"] == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [1, 127, 128, 129, 1000])
def test_the_fp8_codec_keeps_each_element_within_its_blocks_error_bound(dtype, n):
    torch.manual_seed(n)
    t = (torch.randn(n) * torch.exp(torch.randn(n) * 3)).to(dtype)
    if n >= 128:
        t[128 - 7 : 128] = 0.0  # a block's tail of zeros
    got, s = _round_trip("fp8", t)
    assert got.dtype == dtype
    if n == 1:  # 16 bytes of padded payload and a scale are more than the tensor: stored exactly
        assert s["encoded"] == 0 and torch.equal(got, t)
        return
    assert s["encoded"] == 1
    assert s["offloaded_bytes"] < t.numel() * t.element_size()  # one byte an element and a scale per 128
    x, d = t.double(), got.double()
    for k in range(0, n, 128):
        blk, dec = x[k : k + 128], d[k : k + 128]
        amax = blk.abs().max().item()
        # E4M3: 3 mantissa bits (2^-4 relative), subnormals below 2^-6 of the scaled range,
        # and the source dtype's own rounding of the decoded value
        bound = (2.0**-4 + 2.0**-7) * blk.abs() + amax * 2.0**-17
        assert ((dec - blk).abs() <= bound).all(), (k, (dec - blk).abs().max().item())
        assert (dec[blk == 0] == 0).all()


def test_codecs_train_a_small_transformer_close_to_no_offload():
    torch.manual_seed(7)
    batches = [(torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16)))] * 5
    ref_losses, _ = _train(_GPT(), batches)
    for codec, tolerance in (("bf16", 0.01), ("fp8", 0.05)):
        off = ft.offload_activations(min_bytes=4096, keep_last=0, codec=codec)
        losses, _ = _train(_GPT(), batches, off)
        assert losses[0] == ref_losses[0]  # the first forward does not read what was saved
        assert all(abs(a - b) <= tolerance * abs(a) for a, b in zip(ref_losses, losses)), (codec, losses, ref_losses)
        assert losses[-1] < losses[0]
        s = off.stats()
        assert s["encoded"] > 0 and s["offloaded_bytes"] < s["encoded_bytes"] and s["held"] == 0


def test_an_unknown_codec_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match="codec must be None, 'bf16' or 'fp8', not 'fp4'"):
        ft.offload_activations(codec="fp4")


def test_keep_last_counts_the_steps_last_saves_whatever_codec_takes_them():
    for codec in (None, "fp8"):
        off = ft.offload_activations(min_bytes=0, keep_last=2, codec=codec)
        x = torch.randn(4096, requires_grad=True)
        with off:
            ys = [(x * 2).exp(), (x * 2).to(torch.bfloat16).exp(), (x * 2).to(torch.float16).exp(),
                  (x * 2).double().exp(), (x * 3).exp()]
        s = off.stats()
        # each exp() saves its output: the last two stay, the first three are offloaded
        assert s["kept"]["last"] == 2 and s["offloaded"] == 3, (codec, s)
        assert s["encoded"] == (3 if codec == "fp8" else 0)
        sum(y.double().sum() for y in ys).backward()
        assert off.stats()["held"] == 0


def test_fp8_turns_an_infinity_into_nan_and_keeps_the_finite_values_of_its_block():
    t = torch.tensor([float("inf"), -float("inf"), 1.0, 0.5] * 64)
    got, s = _round_trip("fp8", t)
    assert s["encoded"] == 1
    assert torch.isnan(got[0::4]).all() and torch.isnan(got[1::4]).all()  # an overflow stays visible
    assert torch.equal(got[2::4], t[2::4]) and torch.equal(got[3::4], t[3::4])  # the scale is the finite amax's


def test_an_nvme_tier_takes_what_the_pinned_pool_cannot_and_gradients_stay_exact(tmp_path):
    torch.manual_seed(7)
    batches = [(torch.randint(0, 97, (4, 16)), torch.randint(0, 97, (4, 16))) for _ in range(3)]
    ref_losses, ref_grads = _train(_GPT(), batches)
    off = ft.offload_activations(min_bytes=4096, keep_last=0, pinned_bytes=64 << 10,
                                 nvme_path=tmp_path / "activations.bin", nvme_bytes=64 << 20)
    losses, grads = _train(_GPT(), batches, off)
    assert losses == ref_losses
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, grads))
    s = off.stats()
    assert s["nvme"] and s["spilled"] > 0 and s["read_back"] == s["spilled"] and s["held"] == 0
    assert s["kept"]["no_room"] == 0  # the disk took what the pool could not


def test_nvme_arguments_are_checked_and_a_folder_is_an_os_error_naming_it(tmp_path):
    import errno

    with pytest.raises(ValueError, match="nvme_path and nvme_bytes > 0 together"):
        ft.offload_activations(nvme_path=tmp_path / "a.bin")
    with pytest.raises(ValueError, match="nvme_path and nvme_bytes > 0 together"):
        ft.offload_activations(nvme_bytes=1 << 20)
    with pytest.raises(OSError) as e:
        ft.offload_activations(nvme_path=tmp_path, nvme_bytes=1 << 20)
    assert e.value.errno == errno.EISDIR and str(tmp_path) in str(e.value)
    with pytest.raises(TypeError, match="nvme_path must be"):
        ft.offload_activations(nvme_path=b"/tmp/x", nvme_bytes=1 << 20)


@pytest.mark.parametrize("device_bytes", [1, 100 << 10])
def test_a_bound_on_copies_waiting_for_the_link_keeps_gradients_exact(device_bytes):
    x = torch.randn(64, 64)
    ref_model, model = _mlp(), _mlp()
    ref_model(x).square().mean().backward()
    off = ft.offload_activations(min_bytes=0, keep_last=0, device_bytes=device_bytes)
    for _ in range(2):
        model.zero_grad()
        with off:
            loss = model(x).square().mean()
        s = off.stats()
        assert s["offloaded"] > 0 and s["in_flight_bytes"] <= device_bytes  # each offload drained down to the bound
        loss.backward()
        for a, b in zip(ref_model.parameters(), model.parameters()):
            assert torch.equal(a.grad, b.grad)
    unbounded = ft.offload_activations(min_bytes=0, keep_last=0)
    with unbounded:
        model(x).sum().backward()
    assert unbounded.stats()["throttled"] == 0 and unbounded.stats()["in_flight_bytes"] == 0
    with pytest.raises(ValueError, match="device_bytes"):
        ft.offload_activations(device_bytes=-1)


def test_the_nvme_file_is_removed_at_exit_while_a_graph_still_holds_saved_tensors(tmp_path):
    import os
    import subprocess
    import sys

    path = tmp_path / "act.bin"
    script = (
        "import os, torch, ferry.torch as ft\n"
        f"off = ft.offload_activations(min_bytes=0, keep_last=0, pinned_bytes=1 << 20, nvme_path={str(path)!r}, "
        "nvme_bytes=64 << 20)\n"
        "lin = torch.nn.Linear(512, 512)\n"
        "with off:\n"
        "    y = lin(torch.randn(1024, 512, requires_grad=True)).relu().sum()  # no backward: the graph lives on\n"
        f"assert os.path.exists({str(path)!r})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(os.environ))
    assert not path.exists()


def _bytes_of(t):
    return t.detach().contiguous().reshape(-1).view(torch.uint8).clone()


def test_the_extension_takes_tensors_by_the_dlpack_exchange_table_and_by_dlpack_alike():
    # torch >= 2.10 publishes DLPack's C exchange table; the extension then takes a tensor
    # without calling __dlpack__. Either path must hand the store the same bytes.
    assert ferry._core.dlpack_exchange(torch.empty(1)) == hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
    assert ferry._core.dlpack_exchange(torch.nn.Parameter(torch.empty(1))) == ferry._core.dlpack_exchange(
        torch.empty(1))
    assert not ferry._core.dlpack_exchange(np.zeros(4))
    assert not ferry._core.dlpack_exchange(3)
    store = ferry._core.ActivationStore(0, 0, 0, 1 << 20)
    base = torch.arange(64, dtype=torch.float32)
    cases = [
        base[5:21],  # an offset into its storage
        base.view(4, 16)[1:3],  # rows of a matrix: contiguous, offset
        torch.arange(8.0).view(8, 1).expand(8, 1),  # a dimension of size 1 takes any stride
        torch.arange(12.0).view(3, 4).t().contiguous().t().t(),  # contiguous again after two transposes
        torch.tensor(3.5, dtype=torch.float64),  # zero dimensions
        torch.arange(-7, 9, dtype=torch.int16),
        torch.tensor([True, False, True]),
        torch.randn(33, dtype=torch.float32).to(torch.bfloat16),
        torch.nn.Parameter(torch.randn(6)),  # another type (a subclass): its own table lookup
    ]
    for key, t in enumerate(cases):
        expected = _bytes_of(t)
        store.offload(key, t.detach())
        out = torch.empty(expected.numel(), dtype=torch.uint8)
        store.fetch(key, out)
        assert torch.equal(out, expected), (key, t)
        typed = torch.empty_like(t.detach())  # fetched into a tensor of the dtype too
        store.offload(key, t.detach())
        store.fetch(key, typed)
        assert torch.equal(_bytes_of(typed), expected), key
    array = np.arange(10, dtype=np.int32)  # no table: through __dlpack__ / the buffer protocol
    store.offload(100, array)
    back = np.zeros(10, dtype=np.int32)
    store.fetch(100, back)
    assert np.array_equal(back, array)
    for bad in (torch.arange(12.0).view(3, 4).t(), torch.arange(10.0)[::3], torch.empty(4, 4)[:, 1:]):
        with pytest.raises(TypeError):
            store.offload(200, bad)  # not C-contiguous: refused, never copied
        assert not store.contains(200)
    store.offload(201, torch.arange(8, dtype=torch.uint8))
    with pytest.raises(TypeError):
        store.fetch(201, torch.empty(16, dtype=torch.uint8)[::2])  # a strided destination is refused
    with pytest.raises(TypeError):
        store.fetch(201, [0] * 8)  # not a tensor
    assert store.contains(201)  # the refused fetches kept the bytes
    assert len(store) == 1


def test_a_sparse_tensor_stays_and_a_tensor_of_65_dimensions_is_offloaded_with_exact_gradients():
    # torch raises on `nbytes` of a sparse COO tensor: the hooks size it another way and
    # keep it (not dense); past 64 dimensions the identity order is made on the spot.
    s = torch.randn(4, 4).to_sparse()
    w = torch.randn(4, 3, requires_grad=True)
    torch.sparse.mm(s, w).square().sum().backward()
    expected = w.grad.clone()
    w.grad = None
    off = ft.offload_activations(min_bytes=0, keep_last=0, device="cpu")
    with off:
        y = torch.sparse.mm(s, w)
        loss = y.square().sum()
    loss.backward()
    assert torch.equal(w.grad, expected)
    assert off.stats()["kept"]["not_dense"] >= 1

    x = torch.randn([1] * 64 + [4], requires_grad=True)
    (x * 2).exp().sum().backward()
    expected = x.grad.clone()
    x.grad = None
    off = ft.offload_activations(min_bytes=0, keep_last=0, device="cpu")
    with off:
        loss = (x * 2).exp().sum()
    loss.backward()
    assert torch.equal(x.grad, expected)
    assert off.stats()["offloaded"] >= 1


def test_tensors_without_storage_or_of_sub_byte_elements_are_refused_by_the_extension():
    # A fake tensor has elements and a null data pointer: refused (a TypeError), never read
    # or written. Sub-byte elements would be counted short by DLPack's byte count: refused
    # (offload_activations sends them as a uint8 view).
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fake = torch.empty(8)
    store = ferry._core.ActivationStore(0, 0, 0, 1 << 20)
    with pytest.raises(TypeError):
        store.offload(1, fake)
    store.offload(2, torch.arange(32, dtype=torch.uint8))
    with pytest.raises(TypeError):
        store.fetch(2, fake.view(torch.uint8))
    assert store.contains(2)
    hyper = dict(lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.0, step=1)
    arrays = [torch.randn(8), torch.randn(8), torch.zeros(8), torch.zeros(8)]
    for i in range(4):
        args = list(arrays)
        args[i] = fake
        with pytest.raises(TypeError):
            ferry._core.AdamW(1, False).step(*args, **hyper)
    if hasattr(torch, "float4_e2m1fn_x2"):
        packed = torch.arange(16, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
        with pytest.raises(TypeError):
            store.offload(3, packed)
        assert not store.contains(3)
