"""ferry.torch.stream_layers(nvme_path=...): frozen weights in a file, loaded into the slots
through the scheduler's bounce ring. Outputs and input gradients against the same layers
run as they are (bit for bit), the parameters as meta tensors, state_dict and
load_state_dict through the file, replaced parameters, and the faults: a read error in a
pass (the stack runs on), a failed write (the old weights stay), a failed write and
rollback (the layer is lost until a load), trainable weights and bad paths refused."""

import copy
import errno
import gc
import os
import pickle
import re
import weakref

import pytest
import torch

import ferry.torch as ft
from ferry import _core

from _models import _GPT


def _stack(n=4, d=32, dtype=torch.float32, seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        *[
            torch.nn.Sequential(
                torch.nn.LayerNorm(d),
                torch.nn.Linear(d, 2 * d + 3),  # odd sizes: layers of bytes not a multiple of 4 KiB
                torch.nn.GELU(),
                torch.nn.Dropout(0.1),
                torch.nn.Linear(2 * d + 3, d),
            )
            for _ in range(n)
        ]
    ).to(dtype).requires_grad_(False)


def _values(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _with_faults(monkeypatch, plan):
    real = _core.LayerStack
    monkeypatch.setattr(_core, "LayerStack", lambda *a, **k: real(*a, faults=plan, **k))


@pytest.mark.parametrize("slots", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_outputs_and_input_gradients_are_bit_for_bit_those_of_the_layers_run_as_they_are(tmp_path, slots, dtype):
    ref = _stack(dtype=dtype)
    path = tmp_path / "weights.bin"
    st = ft.stream_layers(list(copy.deepcopy(ref)), slots=slots, nvme_path=path)
    assert os.path.exists(path)
    x = torch.randn(8, 32, dtype=dtype, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    for step in range(3):
        torch.manual_seed(step)
        y = ref(x)
        y.square().sum().backward()
        torch.manual_seed(step)
        y2 = st(x2)
        y2.square().sum().backward()
        assert torch.equal(y, y2)
        assert torch.equal(x.grad, x2.grad)
    for p in st.parameters():
        assert p.is_meta and p.grad is None and not p.requires_grad
    s = st.stats()
    assert s["nvme"] and s["pinned_bytes"] == 0 and s["pushes"] == 0
    assert s["file_bytes"] == sum(-(-st._core.layer_bytes(i) // 4096) * 4096 for i in range(4))
    assert s["passes"] == 6 and s["loads"] == 6 * 4
    assert s["bytes_loaded"] == 6 * sum(st._core.layer_bytes(i) for i in range(4))
    del st, y2  # the output's graph holds the stack too
    gc.collect()
    assert not os.path.exists(path)  # the file goes with the stack


def test_inference_without_grad_and_a_small_transformer_frozen_under_a_trainable_head(tmp_path):
    ref = _GPT(vocab=61, d=32, layers=3)
    mine = _GPT(vocab=61, d=32, layers=3)
    ref.blocks.requires_grad_(False)
    mine.blocks.requires_grad_(False)
    mine.blocks = ft.stream_layers(list(mine.blocks), nvme_path=tmp_path / "blocks.bin")
    mine.forward = lambda tokens: mine.head(mine.ln(mine.blocks(mine.emb(tokens))))  # _GPT iterates its blocks
    tokens = torch.randint(0, 61, (4, 16))
    ref.eval()
    mine.eval()
    with torch.no_grad():
        assert torch.equal(ref(tokens), mine(tokens))
    ref.train()
    mine.train()
    opt_ref = ft.OffloadAdamW([p for p in ref.parameters() if p.requires_grad], lr=1e-2)
    opt = ft.OffloadAdamW([p for p in mine.parameters() if p.requires_grad], lr=1e-2)
    for step in range(3):
        losses = []
        for model, o in ((ref, opt_ref), (mine, opt)):
            o.zero_grad()
            torch.manual_seed(step)
            loss = torch.nn.functional.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert losses[0] == losses[1]
    for (name, a), b in zip(ref.named_parameters(), mine.parameters()):
        assert a.requires_grad == b.requires_grad, name
        if a.requires_grad:
            assert torch.equal(a, b), name


def test_state_dict_reads_the_file_and_load_state_dict_writes_it(tmp_path):
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), nvme_path=tmp_path / "w.bin")
    want = {k: v for k, v in ref.state_dict().items()}
    got = st.state_dict()
    assert set(got) == {f"layers.{k}" for k in want}
    for k, v in want.items():
        assert not got[f"layers.{k}"].is_meta and torch.equal(got[f"layers.{k}"], v), k
    for name, v in st.read_weights(2).items():
        assert torch.equal(v, want[f"2.{name}"]), name
    # A new checkpoint, in bfloat16 (cast as torch's load casts), then assign=True
    other = _stack(seed=7)
    st.load_state_dict({f"layers.{k}": v.to(torch.bfloat16) for k, v in other.state_dict().items()})
    for k, v in other.state_dict().items():
        assert torch.equal(st.state_dict()[f"layers.{k}"], v.to(torch.bfloat16).float()), k
    st.load_state_dict({f"layers.{k}": v for k, v in other.state_dict().items()}, assign=True)
    for p in st.parameters():
        assert p.is_meta
    x = torch.randn(8, 32)
    torch.manual_seed(0)
    want_y = other(x)
    torch.manual_seed(0)
    assert torch.equal(st(x), want_y)
    # Another shape is torch's own error, and the file keeps the weights
    bad = dict(st.state_dict())
    bad["layers.0.1.weight"] = torch.zeros(3, 3)
    with pytest.raises(RuntimeError, match="size mismatch"):
        st.load_state_dict(bad)
    assert torch.equal(st.state_dict()["layers.0.1.weight"], other.state_dict()["0.1.weight"])
    # The whole model's state_dict, with the stack inside it, keys and all
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), st)
    assert torch.equal(model.state_dict()["1.layers.3.4.bias"], other.state_dict()["3.4.bias"])


def test_a_replaced_parameter_is_written_into_the_file_at_the_next_pass(tmp_path):
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), nvme_path=tmp_path / "w.bin")
    new = torch.nn.Parameter(torch.randn(32, 2 * 32 + 3), requires_grad=False)
    with torch.no_grad():
        ref[1][4].weight.copy_(new)
    st.layers[1][4].weight = new
    x = torch.randn(8, 32)
    torch.manual_seed(0)
    want = ref(x)
    torch.manual_seed(0)
    assert torch.equal(st(x), want)
    assert new.is_meta  # the same object, its values now in the file
    assert torch.equal(st.read_weights(1)["4.weight"], ref[1][4].weight)


def test_bad_paths_are_refused_before_anything_changes(tmp_path):
    layers = list(_stack())
    (tmp_path / "old.bin").write_bytes(b"x" * 10)
    with pytest.raises(FileExistsError):
        ft.stream_layers(layers, nvme_path=tmp_path / "old.bin")
    assert (tmp_path / "old.bin").read_bytes() == b"x" * 10
    with pytest.raises(OSError):
        ft.stream_layers(layers, nvme_path=tmp_path / "no" / "such" / "dir" / "w.bin")
    with pytest.raises(OSError):
        ft.stream_layers(layers, nvme_path=tmp_path)  # a folder
    ref = weakref.ref(layers[0][1].weight)
    with pytest.raises(ValueError, match="weak references"):
        ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    del ref
    assert not any(p.is_meta for lay in layers for p in lay.parameters())
    st = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")  # and then it works
    assert st.stats()["nvme"]


def test_requiring_grad_after_streaming_is_refused_at_the_next_pass_and_the_stack_runs_on(tmp_path):
    st = ft.stream_layers(list(_stack()), nvme_path=tmp_path / "w.bin")
    x = torch.randn(4, 32)
    st.layers[3][0].weight.requires_grad_(True)
    with pytest.raises(RuntimeError, match=r"'0.weight' of layer 3 requires grad; the stack's weights on NVMe are "
                       r"frozen \(it was made with every weight frozen"):
        st(x)
    st.layers[3][0].weight.requires_grad_(False)
    y = st(x.requires_grad_())
    # frozen again before the backward pass of a forward that saw it trainable
    st.layers[1][0].weight.requires_grad_(True)
    y.sum().backward()  # the forward saw it frozen: no gradient is asked for it
    st.layers[1][0].weight.requires_grad_(False)
    st(x).sum().backward()
    with pytest.raises(TypeError, match="cannot be deep-copied"):
        copy.deepcopy(st)


@pytest.mark.parametrize("skip", [0, 2, 5, 9, 13])
def test_a_read_error_fails_the_pass_with_the_errno_and_the_stack_runs_on(tmp_path, monkeypatch, skip):
    """Each load is a few reads (the aligned part and the tail): the failed one lands in
    the forward pass or the backward pass, in the first layer or a later one; the pass
    raises it either way (a layer that ran from a slot the read did not fill never
    passes as done), and the next step is bit for bit."""
    plan = _core.FaultPlan()
    _with_faults(monkeypatch, plan)
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), nvme_path=tmp_path / "w.bin")
    rule = plan.add("pread", errno.EIO, skip=skip)
    x = torch.randn(4, 32, requires_grad=True)
    with pytest.raises(OSError) as e:
        st(x).sum().backward()
    assert e.value.errno == errno.EIO and "w.bin" in str(e.value) and plan.fired(rule) == 1
    assert not st._core.in_pass
    x2 = x.detach().clone().requires_grad_()
    x.grad = None
    torch.manual_seed(0)
    y = ref(x)
    y.sum().backward()
    torch.manual_seed(0)
    y2 = st(x2)
    y2.sum().backward()
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad)


def test_a_failed_write_keeps_the_old_weights_and_a_failed_rollback_loses_the_layer_until_a_load(tmp_path,
                                                                                                 monkeypatch):
    plan = _core.FaultPlan()
    _with_faults(monkeypatch, plan)
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), nvme_path=tmp_path / "w.bin")
    before = _values(st)
    other = {f"layers.{k}": v for k, v in _stack(seed=9).state_dict().items()}
    plan.add("pwrite", errno.ENOSPC, times=1)  # the write fails, the rollback succeeds (one pwrite fails)
    with pytest.raises(OSError) as e:
        st.load_state_dict(other)
    assert e.value.errno == errno.ENOSPC
    after = _values(st)
    for k in before:
        assert torch.equal(before[k], after[k]), k
    assert not any(st._core.lost(i) for i in range(4))
    x = torch.randn(4, 32)
    torch.manual_seed(0)
    want = ref(x)
    torch.manual_seed(0)
    assert torch.equal(st(x), want)
    # the write and its rollback both fail: layer 0 is lost, and said so, until a load
    plan.add("pwrite", errno.EIO, times=0)  # every write fails (a layer's write is several pwrites)
    with pytest.raises(OSError):
        st.load_state_dict(other)
    plan.clear()
    assert st._core.lost(0) and not st._core.lost(1)
    with pytest.raises(RuntimeError, match=r"layer 0's weights in .* were lost"):
        st(x)
    with pytest.raises(ValueError, match="lost layer"):
        st.state_dict()
    st.load_state_dict(other)  # the whole layer again
    assert not st._core.lost(0)
    new = _stack(seed=9)
    torch.manual_seed(0)
    want = new(x)
    torch.manual_seed(0)
    assert torch.equal(st(x), want)


def test_weights_written_between_forward_and_backward_fail_the_backward_as_an_in_place_change(tmp_path):
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), nvme_path=tmp_path / "w.bin")
    x = torch.randn(4, 32, requires_grad=True)
    y = st(x)
    st.load_state_dict({f"layers.{k}": v for k, v in _stack(seed=4).state_dict().items()})
    with pytest.raises(RuntimeError, match=r"modified by an inplace operation.*layer 3 were written"):
        y.sum().backward()
    assert not st._core.in_pass
    x2 = x.detach().clone().requires_grad_()
    new = _stack(seed=4)
    torch.manual_seed(0)
    y = new(x)
    y.sum().backward()
    torch.manual_seed(0)
    y2 = st(x2)
    y2.sum().backward()
    assert torch.equal(y, y2) and torch.equal(x.grad, x2.grad)


@pytest.mark.parametrize("states_on_nvme", [False, True])
def test_offload_adamw_over_all_the_parameters_leaves_the_frozen_meta_ones_alone(tmp_path, states_on_nvme):
    torch.manual_seed(0)
    head_ref, head = torch.nn.Linear(32, 5), None
    head = copy.deepcopy(head_ref)
    ref = torch.nn.Sequential(_stack(), head_ref)
    stack = ft.stream_layers(list(_stack()), nvme_path=tmp_path / "w.bin")
    mine = torch.nn.Sequential(stack, head)
    kw = dict(nvme_path=tmp_path / "s.bin", nvme_bytes=1 << 20) if states_on_nvme else {}
    opt = ft.OffloadAdamW(mine.parameters(), lr=1e-2, **kw)  # the stack's meta parameters among them
    opt_ref = ft.OffloadAdamW(head_ref.parameters(), lr=1e-2)
    x, y = torch.randn(8, 32), torch.randint(0, 5, (8,))
    for step in range(3):
        for model, o in ((ref, opt_ref), (mine, opt)):
            o.zero_grad()
            torch.manual_seed(step)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            o.step()
    assert torch.equal(head.weight, head_ref.weight) and torch.equal(head.bias, head_ref.bias)
    assert len(opt.state_dict()["state"]) == 2  # the head's two parameters
    if states_on_nvme:
        assert opt.nvme_stats["groups"] == 2


def test_a_parameter_torch_cannot_swap_fails_the_stack_before_any_parameter_changes(tmp_path):
    layers = [torch.nn.Linear(8, 8).requires_grad_(False) for _ in range(3)]
    layers[1].weight.tensor_model_parallel = True  # an attribute of the caller's: kept
    before = [p.detach().clone() for lay in layers for p in lay.parameters()]
    x = torch.randn(2, 8, requires_grad=True)
    y = layers[2](x)  # a live graph saved layer 2's weight: torch cannot swap it
    with pytest.raises(ValueError, match=r"'weight' of layer 2 cannot become a meta tensor in place"):
        ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    after = [p for lay in layers for p in lay.parameters()]
    assert not any(p.is_meta for p in after)
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert not os.path.exists(tmp_path / "w.bin")
    del y
    st = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")  # the graph gone, it works
    assert layers[1].weight.is_meta and layers[1].weight.tensor_model_parallel is True


def test_in_place_changes_to_the_meta_parameters_and_ties_are_refused_at_the_next_pass(tmp_path):
    ref = _stack()
    st = ft.stream_layers(list(copy.deepcopy(ref)), nvme_path=tmp_path / "w.bin")
    x = torch.randn(4, 32)
    with torch.no_grad():
        st.layers[1][4].bias.fill_(100.0)  # a no-op on a meta tensor: said, not lost silently
    with pytest.raises(RuntimeError, match=r"'4.bias' of layer 1 was changed in place"):
        st(x)
    st.load_state_dict({f"layers.{k}": v for k, v in ref.state_dict().items()})  # the way to write weights
    torch.manual_seed(0)
    want = ref(x)
    torch.manual_seed(0)
    assert torch.equal(st(x), want)
    tied = torch.nn.Parameter(torch.eye(32), requires_grad=False)
    st.layers[0][1].weight, st.layers[1][1].weight = torch.nn.Parameter(torch.zeros(67, 32), requires_grad=False), None
    st.layers[1][1].weight = st.layers[0][1].weight
    with pytest.raises(RuntimeError, match=r"'1.weight' of layer 1 is also '1.weight' of layer 0"):
        st(x)
    st.layers[1][1].weight = torch.nn.Parameter(torch.empty(67, 32, device="meta"), requires_grad=False)
    with pytest.raises(RuntimeError, match="replaced by a meta tensor, which has no values"):
        st(x)
    del tied


def test_a_layer_called_on_its_own_is_refused_and_pickle_names_the_file(tmp_path):
    st = ft.stream_layers(list(_stack()), nvme_path=tmp_path / "w.bin")
    with pytest.raises(RuntimeError, match="called on its own; its parameters are meta tensors"):
        st.layers[0](torch.randn(2, 32))
    with pytest.raises(TypeError, match="in its file"):
        pickle.dumps(st)
    assert st(torch.randn(2, 32)).shape == (2, 32)  # the stack itself runs them


def test_a_stack_built_on_meta_is_loaded_layer_by_layer_from_a_memory_mapped_checkpoint(tmp_path):
    """A stack larger than host memory: the layers made on the meta device (no values
    anywhere), streamed to the file, and their weights loaded from a checkpoint that
    torch.load maps rather than reads."""
    ref = _stack()
    torch.save({f"layers.{k}": v for k, v in ref.state_dict().items()}, tmp_path / "ckpt.pt")
    with torch.device("meta"):
        layers = list(_stack())
    st = ft.stream_layers(layers, nvme_path=tmp_path / "w.bin")
    x = torch.randn(4, 32)
    with pytest.raises(RuntimeError, match=r"layer 0's weights \['0.weight', .*\] were never given"):
        st(x)
    part = {k: v for k, v in torch.load(tmp_path / "ckpt.pt", mmap=True).items() if not k.startswith("layers.3.")}
    st.load_state_dict(part, strict=False)
    with pytest.raises(RuntimeError, match=r"layer 3's weights .* were never given"):
        st(x)
    assert st.read_weights(3)["1.weight"].is_meta and "layers.3.1.weight" in st.state_dict()
    st.load_state_dict(torch.load(tmp_path / "ckpt.pt", mmap=True))
    torch.manual_seed(0)
    want = ref(x)
    torch.manual_seed(0)
    assert torch.equal(st(x), want)


def test_a_load_stopped_by_an_io_error_names_the_layers_it_wrote(tmp_path, monkeypatch):
    plan = _core.FaultPlan()
    _with_faults(monkeypatch, plan)
    st = ft.stream_layers(list(_stack()), nvme_path=tmp_path / "w.bin")
    other = _stack(seed=9)
    plan.add("pwrite", errno.ENOSPC, skip=2, times=1)  # a write after the first ones fails
    with pytest.raises(OSError, match=r"layers \[[0-9, ]*\] hold the loaded weights, layer [0-9] and those after") as e:
        st.load_state_dict({f"layers.{k}": v for k, v in other.state_dict().items()})
    assert e.value.errno == errno.ENOSPC
    failed = int(re.search(r"layer ([0-9]) and those after", str(e.value)).group(1))
    assert 0 < failed < 4 and f"layers {list(range(failed))} hold" in str(e.value)
    got = st.state_dict()
    for k, v in other.state_dict().items():
        if k.endswith(("1.weight", "4.weight")):  # the Linear weights (the layer norms' are alike in both)
            assert torch.equal(got[f"layers.{k}"], v) == (int(k.split(".")[0]) < failed), k


def test_loads_and_passes_on_two_threads_never_mix_two_checkpoints_in_one_pass(tmp_path):
    import threading

    layer = torch.nn.Linear(512, 512, bias=False).requires_grad_(False)
    st = ft.stream_layers([layer], slots=1, nvme_path=tmp_path / "w.bin")
    ones = {"layers.0.weight": torch.ones(512, 512)}
    twos = {"layers.0.weight": torch.full((512, 512), 2.0)}
    st.load_state_dict(ones)
    stop = threading.Event()
    errors = []

    def loads():
        try:
            while not stop.is_set():
                for sd in (twos, ones):
                    try:
                        st.load_state_dict(sd)
                    except RuntimeError as e:  # a pass in progress: refused, retried
                        assert "in progress" in str(e)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=loads)
    t.start()
    try:
        x = torch.ones(1, 512)
        for _ in range(60):
            with torch.no_grad():
                y = st(x)
            assert torch.all(y == 512.0) or torch.all(y == 1024.0), y.unique()
    finally:
        stop.set()
        t.join()
    assert not errors


def test_the_file_is_removed_at_exit_while_a_graph_still_holds_the_stack(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "w.bin"
    script = (
        "import torch, ferry.torch as ft\n"
        f"st = ft.stream_layers([torch.nn.Linear(8, 8).requires_grad_(False)], nvme_path={str(path)!r})\n"
        "loss = st(torch.randn(1, 8, requires_grad=True)).sum()\n"
        "loss.backward()\n"
        f"import os; assert os.path.exists({str(path)!r})\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, env=dict(os.environ))
    assert not path.exists()


def test_after_a_failed_load_the_next_one_reports_every_missing_key(tmp_path, monkeypatch):
    plan = _core.FaultPlan()
    _with_faults(monkeypatch, plan)
    st = ft.stream_layers(list(_stack()), nvme_path=tmp_path / "w.bin")
    plan.add("pwrite", errno.EIO, skip=1, times=1)
    with pytest.raises(OSError):
        st.load_state_dict({f"layers.{k}": v for k, v in _stack(seed=9).state_dict().items()})
    result = st.load_state_dict({}, strict=False)
    assert sorted(result.missing_keys) == sorted(st.state_dict())  # layer 0's keys too
    with pytest.raises(RuntimeError, match="layers.0.1.weight"):
        st.load_state_dict({})
