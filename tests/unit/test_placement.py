"""Placement (issue 34): every decision that depends on where tensors live, as a table over the
devices a run meets (``cpu``, ``cuda``, ``cuda:0``, ``cuda:1``, ``meta``), checked on the CPU
(torch.device objects for CUDA exist without a GPU). The crash of issue 34 is one row: a batch
drawn on ``cuda:0`` for a trainer on ``cuda`` was pinned (only dense CPU tensors can be)."""

import pytest
import torch

from attn_core import device as D

DEVICES = ("cpu", "cuda", "cuda:0", "cuda:1", "meta")

# same_device(a, b) with CUDA device 0 current: the rows and columns are DEVICES
SAME_WITH_0_CURRENT = {
    "cpu": (1, 0, 0, 0, 0),
    "cuda": (0, 1, 1, 0, 0),
    "cuda:0": (0, 1, 1, 0, 0),
    "cuda:1": (0, 0, 0, 1, 0),
    "meta": (0, 0, 0, 0, 1),
}

# copy_plan(source, target) of a dense tensor with CUDA device 0 current: (copy, pin, non_blocking)
N, PINNED, PLAIN = (0, 0, 0), (1, 1, 1), (1, 0, 0)
PLANS = {
    "cpu": (N, PINNED, PINNED, PINNED, PLAIN),
    "cuda": (PLAIN, N, N, PLAIN, PLAIN),
    "cuda:0": (PLAIN, N, N, PLAIN, PLAIN),  # to cuda: the crash of issue 34 (it was pinned)
    "cuda:1": (PLAIN, PLAIN, PLAIN, N, PLAIN),
    "meta": (PLAIN, PLAIN, PLAIN, PLAIN, N),
}


@pytest.mark.parametrize("a", DEVICES)
@pytest.mark.parametrize("b", DEVICES)
def test_same_device_table(a, b):
    assert D.same_device(torch.device(a), torch.device(b), current_cuda=0) == bool(
        SAME_WITH_0_CURRENT[a][DEVICES.index(b)]
    )
    assert D.same_device(a, b, current_cuda=0) == D.same_device(b, a, current_cuda=0)  # symmetric, strings too


def test_an_unindexed_cuda_is_the_current_device():
    assert D.same_device("cuda", "cuda:1", current_cuda=1) and not D.same_device("cuda", "cuda:0", current_cuda=1)
    assert D.same_device("cpu:0", "cpu", current_cuda=3)
    # torch's own comparison is what crashed: it says cuda:0 is not cuda
    assert torch.device("cuda:0") != torch.device("cuda")


@pytest.mark.parametrize("source", DEVICES)
@pytest.mark.parametrize("target", DEVICES)
def test_copy_plan_table(source, target):
    plan = D.copy_plan(torch.device(source), torch.device(target), current_cuda=0)
    assert tuple(map(int, plan)) == PLANS[source][DEVICES.index(target)]
    assert not plan.pin or torch.device(source).type == "cpu"  # only CPU tensors are ever pinned
    sparse = D.copy_plan(source, target, current_cuda=0, dense=False)
    assert not sparse.pin and not sparse.non_blocking and sparse.copy == plan.copy  # a sparse tensor is never pinned


def test_the_crash_row_neither_copies_nor_pins():
    """Issue 34: the zoo's batches drawn on the GPU (cuda:0) for a trainer on ``cuda``."""
    assert D.copy_plan("cuda:0", "cuda", current_cuda=0) == D.Copy(False, False, False)


def test_move_applies_the_plan_on_the_cpu_and_meta():
    t = torch.arange(6).reshape(2, 3)
    assert D.move(t, "cpu") is t and D.move(t, torch.device("cpu:0")) is t
    m = D.move(t, "meta")
    assert m.device.type == "meta" and m.shape == t.shape and m.dtype == t.dtype
    assert D.move(m, "meta") is m
    assert D.move(t.to_sparse(), "cpu").layout == torch.sparse_coo


@pytest.mark.parametrize("device", DEVICES)
def test_decisions_by_device_type(device):
    cuda = device.startswith("cuda")
    assert D.compile_mode(device) == ("reduce-overhead" if cuda else "default")
    assert D.reads_through_pinned(device) == cuda
    assert D.optimizer_options(device, compiled=False) == ({"fused": True} if cuda else {})
    assert D.optimizer_options(device, compiled=True) == ({"fused": True} if cuda else {"foreach": False})
    assert D.static_scoring(device, compiled=False) == (device != "cpu")
    assert D.static_scoring(device, compiled=True)
    assert D.batch_device(device, host_batches=True) == torch.device("cpu")
    assert D.batch_device(device, host_batches=False) == (torch.device(device) if cuda else torch.device("cpu"))
    amp = D.autocast_args(torch.device(device), D.autocast_dtype("bf16"))
    assert amp == (None if device == "meta" else (torch.device(device).type, torch.bfloat16))
    assert D.autocast_args(torch.device(device), D.autocast_dtype("fp32")) is None


def test_host_read_reads_cpu_values_and_raises_on_meta():
    assert D.host_read(torch.tensor([[1.0, 2.0]])) == [[1.0, 2.0]]
    with pytest.raises(NotImplementedError):
        D.host_read(torch.zeros(2, device="meta"))


# decomposition_device(device, op, m, n): "host" (the CPU) or "here" (the matrices' own device), by
# matrix size: 16 x 16 (cuSOLVER's batched solvers), 64 x 64 and 768 x 64 (head-sized), 512 x 512
SIZES = ((16, 16), (64, 64), (768, 64), (512, 512))
HOST_ROWS = {  # for svd and eigh; qr is always "here"
    "cpu": ("here",) * 4,
    "cuda": ("here", "host", "host", "here"),
    "cuda:0": ("here", "host", "host", "here"),
    "cuda:1": ("here", "host", "host", "here"),
    "meta": ("here",) * 4,
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("op", ["svd", "eigh", "qr"])
@pytest.mark.parametrize("size", SIZES, ids=[f"{m}x{n}" for m, n in SIZES])
def test_decomposition_device_table(device, op, size):
    where = D.decomposition_device(torch.device(device), op, *size)
    want = "here" if op == "qr" else HOST_ROWS[device][SIZES.index(size)]
    assert where == (torch.device("cpu") if want == "host" else torch.device(device))
    # a decomposition autograd records (a penalty's, in a training step) never leaves its device
    assert D.decomposition_device(device, op, *size, differentiable=True) == torch.device(device)
