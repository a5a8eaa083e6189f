"""attn_core.linalg: the decompositions equal torch.linalg's (dense float64 references), return
on the device of the matrices given, keep autograd, and make nothing on the meta device but
meta tensors of the right shapes."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attn_core import linalg

shapes = st.tuples(st.integers(1, 3), st.integers(1, 40), st.integers(1, 40))


def _matrices(shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_singular_values_and_svd_match_the_dense_reference(shape, seed):
    A = _matrices(shape, seed)
    S = linalg.svdvals(A.float())
    ref = torch.linalg.svdvals(A)
    torch.testing.assert_close(S.double(), ref, rtol=1e-4, atol=1e-5)
    U, S2, Vh = linalg.svd(A)
    torch.testing.assert_close(U @ torch.diag_embed(S2) @ Vh, A, rtol=1e-9, atol=1e-9)
    U, S3, Vh = linalg.svd_full(A)
    assert U.shape[-1] == A.shape[-2] and Vh.shape[-2] == A.shape[-1]
    torch.testing.assert_close(S3, ref, rtol=1e-9, atol=1e-9)


@settings(max_examples=25, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_qr_and_symmetric_eigenvalues_match_the_dense_reference(shape, seed):
    A = _matrices(shape, seed)
    Q, R = linalg.qr(A)
    torch.testing.assert_close(Q @ R, A, rtol=1e-9, atol=1e-9)
    G = A @ A.mT
    ev = linalg.eigvalsh(G)
    torch.testing.assert_close(ev, torch.linalg.eigvalsh(G), rtol=1e-9, atol=1e-9)
    # the symmetric eigenvalues of A A^T are the squared singular values of A (and zeros)
    k = min(A.shape[-2], A.shape[-1])
    torch.testing.assert_close(ev.flip(-1)[..., :k], torch.linalg.svdvals(A) ** 2, rtol=1e-8, atol=1e-8)


def test_gradients_flow_through_the_singular_values():
    A = _matrices((2, 5, 4), 0).requires_grad_()
    linalg.svdvals(A).sum().backward()
    U, _, Vh = torch.linalg.svd(A.detach(), full_matrices=False)
    torch.testing.assert_close(A.grad, U @ Vh)  # d(nuclear norm)/dA = U V^T


@pytest.mark.parametrize(
    "fn", [linalg.svdvals, linalg.svd, linalg.svd_full, linalg.qr, lambda a: linalg.eigvalsh(a @ a.mT)]
)
def test_on_meta_everything_stays_meta(fn):
    A = torch.empty(3, 70, 64, device="meta")
    out = fn(A)
    for t in out if isinstance(out, tuple) else (out,):
        assert t.device.type == "meta"
