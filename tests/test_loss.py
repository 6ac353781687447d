"""The in-batch NLL loss: its meaning (against independent formulas), the row-chunked PyTorch fallback against the
float64 reference, gradients by gradcheck, argument checks and backend dispatch.  The Triton kernels have their
own file (test_kernels.py)."""
import math
import os
import secrets
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fastdpr.kernels import InBatchNLLLoss, inbatch_nll, resolve_backend


def fresh_seed() -> int:
    return secrets.randbits(31)


def make_batch(n_queries, n_hard, dim, seed, dtype=torch.float32, n_pad=0, duplicates=False, spread=1.0):
    """A batch in the training layout ``[pos_0, hn_0.., pos_1, ...]`` plus ``n_pad`` padded columns at the end.

    With ``duplicates``, a few passages appear twice: a hard negative of one query is another query's positive,
    and two queries may share their positive passage id."""
    gen = torch.Generator().manual_seed(seed)
    group = 1 + n_hard
    n_cols = n_queries * group + n_pad
    q = torch.randn(n_queries, dim, generator=gen, dtype=torch.float64) * (spread / math.sqrt(dim))
    p = torch.randn(n_cols, dim, generator=gen, dtype=torch.float64) * (spread / math.sqrt(dim)) + 0.3 * q.mean(0)
    targets = torch.arange(n_queries) * group
    column_ids = torch.randperm(10 * n_cols, generator=gen)[:n_cols]
    if duplicates and n_queries >= 3:
        if n_hard:
            column_ids[targets[0] + 1] = column_ids[targets[1]]  # query 0's hard negative is query 1's positive
        column_ids[targets[2]] = column_ids[targets[0]]  # queries 0 and 2 share a positive passage id
    column_valid = torch.ones(n_cols, dtype=torch.bool)
    column_valid[n_queries * group:] = False
    return q.to(dtype), p.to(dtype), targets, column_ids, column_valid


def loss_and_grads(q, p, targets, weights, **kwargs):
    """Per-row losses, and the gradients of Σ weights_i·loss_i (a non-uniform upstream gradient per row)."""
    q = q.detach().clone().requires_grad_()
    p = p.detach().clone().requires_grad_()
    losses = inbatch_nll(q, p, targets, reduction="none", **kwargs)
    (losses * weights.to(losses.dtype)).sum().backward()
    return losses.detach().double(), q.grad.double(), p.grad.double()


def assert_matches_reference(q, p, targets, kwargs, seed, rtol=1e-5, atol=1e-5, **backend_kwargs):
    weights = torch.rand(q.shape[0], generator=torch.Generator().manual_seed(seed), dtype=torch.float64) + 0.5
    want = loss_and_grads(q, p, targets, weights, backend="reference", **kwargs)
    got = loss_and_grads(q, p, targets, weights, **backend_kwargs, **kwargs)
    for name, g, w in zip(("loss", "dq", "dp"), got, want):
        assert torch.isfinite(g).all(), f"{name} not finite (seed {seed})"
        tol = atol * max(1.0, float(w.abs().max()))
        torch.testing.assert_close(g, w, rtol=rtol, atol=tol, msg=lambda m: f"{name}, seed {seed}: {m}")


# --------------------------------------------------------------------------------------------------------------
# What the loss means, checked against formulas written independently of the implementations
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_unmasked_loss_equals_cross_entropy_over_the_score_matrix(backend):
    seed = fresh_seed()
    q, p, targets, _, _ = make_batch(7, 2, 13, seed, dtype=torch.float64)
    got = inbatch_nll(q, p, targets, scale=3.5, backend=backend)
    want = torch.nn.functional.cross_entropy(3.5 * q @ p.T, targets)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12, msg=f"seed {seed}")


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_two_columns_give_the_logistic_loss(backend):
    q = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    p = torch.tensor([[0.5, -1.0], [2.0, 0.25]], dtype=torch.float64)
    scale = 0.7
    s_pos, s_neg = scale * (q[0] @ p[0]), scale * (q[0] @ p[1])
    want = math.log1p(math.exp(float(s_neg - s_pos)))
    got = inbatch_nll(q, p, torch.tensor([0]), scale=scale, backend=backend)
    assert float(got) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_masked_columns_count_as_if_removed(backend):
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(5, 1, 9, seed, dtype=torch.float64, n_pad=3, duplicates=True)
    losses = inbatch_nll(q, p, targets, scale=2.0, column_ids=ids, column_valid=valid, reduction="none",
                         backend=backend)
    for i in range(q.shape[0]):
        y = int(targets[i])
        kept = [j for j in range(p.shape[0]) if valid[j] and (j == y or ids[j] != ids[y])]
        scores = 2.0 * p[kept] @ q[i]
        want = torch.logsumexp(scores, 0) - scores[kept.index(y)]
        assert float(losses[i]) == pytest.approx(float(want), rel=1e-12), f"row {i}, seed {seed}"
    # the duplicates did remove something: query 0 lost its hard negative (= query 1's positive) and query 2's
    # positive (= its own passage); without the ids both would be in its softmax
    unmasked = inbatch_nll(q, p, targets, scale=2.0, column_valid=valid, reduction="none", backend=backend)
    assert float(unmasked[0]) > float(losses[0])


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_bidirectional_adds_the_passage_to_query_direction(backend):
    seed = fresh_seed()
    q, p, targets, ids, _ = make_batch(6, 1, 11, seed, dtype=torch.float64, duplicates=True)
    scale = 1.7
    got = inbatch_nll(q, p, targets, scale=scale, column_ids=ids, bidirectional=True, reduction="none",
                      backend=backend)
    forward = inbatch_nll(q, p, targets, scale=scale, column_ids=ids, reduction="none", backend="reference")
    pos_ids = ids[targets]
    for i in range(q.shape[0]):
        others = [k for k in range(q.shape[0]) if k == i or pos_ids[k] != pos_ids[i]]
        scores = scale * q[others] @ p[targets[i]]
        reverse = torch.logsumexp(scores, 0) - scores[others.index(i)]
        want = 0.5 * (forward[i] + reverse)
        assert float(got[i]) == pytest.approx(float(want), rel=1e-12), f"row {i}, seed {seed}"


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_reductions(reduction):
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(9, 2, 5, seed, dtype=torch.float64, n_pad=2)
    per_row = inbatch_nll(q, p, targets, column_ids=ids, column_valid=valid, reduction="none", backend="torch")
    got = inbatch_nll(q, p, targets, column_ids=ids, column_valid=valid, reduction=reduction, backend="torch")
    want = {"mean": per_row.mean(), "sum": per_row.sum(), "none": per_row}[reduction]
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    assert got.shape == want.shape


# --------------------------------------------------------------------------------------------------------------
# The row-chunked fallback against the float64 reference
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_queries,n_hard,dim", [(1, 0, 1), (7, 0, 37), (13, 1, 384), (29, 3, 768), (33, 2, 1)])
@pytest.mark.parametrize("masks", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_fallback_matches_reference_fp32(n_queries, n_hard, dim, masks, bidirectional):
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(n_queries, n_hard, dim, seed, n_pad=3 if masks else 0, duplicates=masks)
    kwargs = dict(scale=1.9, bidirectional=bidirectional)
    if masks:
        kwargs.update(column_ids=ids, column_valid=valid)
    assert_matches_reference(q, p, targets, kwargs, seed, backend="torch", chunk_rows=5)


def test_fallback_half_inputs_accumulate_in_fp32_and_return_grads_in_input_dtype():
    seed = fresh_seed()
    for dtype in (torch.float16, torch.bfloat16):
        q, p, targets, ids, valid = make_batch(11, 1, 37, seed, dtype=dtype, n_pad=2, duplicates=True)
        qg, pg = q.clone().requires_grad_(), p.clone().requires_grad_()
        loss = inbatch_nll(qg, pg, targets, column_ids=ids, column_valid=valid, backend="torch")
        loss.backward()
        assert loss.dtype == torch.float32
        assert qg.grad.dtype == dtype and pg.grad.dtype == dtype
        # the reference sees the same rounded inputs, so only the gradient's final rounding differs
        assert_matches_reference(q, p, targets, dict(column_ids=ids, column_valid=valid), seed,
                                 rtol=1e-2, atol=1e-2, backend="torch")


@pytest.mark.parametrize("bidirectional", [False, True])
def test_fallback_gradcheck_float64(bidirectional):
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(5, 1, 3, seed, dtype=torch.float64, n_pad=2, duplicates=True)
    q.requires_grad_()
    p.requires_grad_()

    def loss(q_, p_):
        return inbatch_nll(q_, p_, targets, scale=1.3, column_ids=ids, column_valid=valid,
                           bidirectional=bidirectional, reduction="none", backend="torch", chunk_rows=2)

    assert torch.autograd.gradcheck(loss, (q, p), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_fallback_chunk_rows_do_not_change_the_result():
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(17, 2, 23, seed, dtype=torch.float64, n_pad=4, duplicates=True)
    weights = torch.rand(17, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    results = []
    for chunk in (1, 3, 8, 17, 1000):
        results.append(loss_and_grads(q, p, targets, weights, column_ids=ids, column_valid=valid, scale=2.5,
                                      bidirectional=True, backend="torch", chunk_rows=chunk))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13, msg=f"seed {seed}")


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_extreme_logits_stay_finite_and_correct(backend):
    # cosine scores at scale 1e4: logits up to ±1e4, far beyond what exp() holds
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(12, 1, 16, seed, n_pad=1, duplicates=True)
    q = torch.nn.functional.normalize(q, dim=1)
    p = torch.nn.functional.normalize(p, dim=1)
    kwargs = dict(scale=1e4, column_ids=ids, column_valid=valid, bidirectional=True)
    weights = torch.ones(12, dtype=torch.float64)
    got = loss_and_grads(q, p, targets, weights, backend=backend, **kwargs)
    assert all(torch.isfinite(t).all() for t in got)
    assert float(got[0].max()) > 100  # really extreme: some rows are far from their positive
    if backend == "torch":
        want = loss_and_grads(q, p, targets, weights, backend="reference", **kwargs)
        # fp32 scores of size 1e4 carry ~1e-3 absolute rounding; the softmax there is one-hot
        torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=5e-3)
        torch.testing.assert_close(got[1], want[1], rtol=1e-4, atol=1e-3 * float(want[1].abs().max()))
        torch.testing.assert_close(got[2], want[2], rtol=1e-4, atol=1e-3 * float(want[2].abs().max()))


@settings(max_examples=25, deadline=None)
@given(n_queries=st.integers(1, 12), n_hard=st.integers(0, 3), dim=st.integers(1, 20), n_pad=st.integers(0, 3),
       duplicates=st.booleans(), bidirectional=st.booleans(), scale=st.floats(0.05, 50.0),
       chunk=st.integers(1, 15), seed=st.integers(0, 2**31 - 1))
def test_fallback_property(n_queries, n_hard, dim, n_pad, duplicates, bidirectional, scale, chunk, seed):
    q, p, targets, ids, valid = make_batch(n_queries, n_hard, dim, seed, dtype=torch.float64, n_pad=n_pad,
                                           duplicates=duplicates)
    kwargs = dict(scale=scale, column_ids=ids if duplicates else None, column_valid=valid,
                  bidirectional=bidirectional)
    assert_matches_reference(q, p, targets, kwargs, seed, rtol=1e-10, atol=1e-10, backend="torch",
                             chunk_rows=chunk)


def test_module_wraps_the_function():
    seed = fresh_seed()
    q, p, targets, ids, valid = make_batch(6, 1, 8, seed, n_pad=2, duplicates=True)
    module = InBatchNLLLoss(scale=4.0, bidirectional=True, reduction="sum", backend="torch")
    got = module(q, p, targets, column_ids=ids, column_valid=valid)
    want = inbatch_nll(q, p, targets, scale=4.0, column_ids=ids, column_valid=valid, bidirectional=True,
                       reduction="sum", backend="reference")
    assert float(got) == pytest.approx(float(want), rel=1e-5)
    assert "bidirectional=True" in repr(module)


# --------------------------------------------------------------------------------------------------------------
# Softmax groups (group_size): fewer negatives at the same batch
# --------------------------------------------------------------------------------------------------------------

def grouped_batch(n_queries, n_hard, dim, seed, dtype=torch.float64):
    """The training layout with no trailing padding (groups need N = B·g) but a few padded hard-negative slots, as
    a question with fewer negatives than asked leaves them."""
    q, p, targets, ids, valid = make_batch(n_queries, n_hard, dim, seed, dtype=dtype, duplicates=True)
    if n_hard:
        valid[targets[1::3] + n_hard] = False
    return q, p, targets, ids, valid


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_groups_score_each_row_against_its_group_only(backend, bidirectional):
    seed = fresh_seed()
    n, h, group, scale = 11, 2, 4, 1.6
    q, p, targets, ids, valid = grouped_batch(n, h, 7, seed)
    got = inbatch_nll(q, p, targets, scale=scale, column_ids=ids, column_valid=valid, bidirectional=bidirectional,
                      reduction="none", group_size=group, backend=backend)
    slots = 1 + h
    for i in range(n):
        members = [k for k in range(n) if k // group == i // group]
        y = int(targets[i])
        kept = [j for j in range(members[0] * slots, (members[-1] + 1) * slots)
                if valid[j] and (j == y or ids[j] != ids[y])]
        scores = scale * p[kept] @ q[i]
        want = torch.logsumexp(scores, 0) - scores[kept.index(y)]
        if bidirectional:
            others = [k for k in members if k == i or ids[targets[k]] != ids[y]]
            rev = scale * q[others] @ p[y]
            want = 0.5 * (want + torch.logsumexp(rev, 0) - rev[others.index(i)])
        assert float(got[i]) == pytest.approx(float(want), rel=1e-12), f"row {i}, seed {seed}"


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_groups_of_one_without_hard_negatives_leave_only_the_positive(backend):
    q, p, targets, _, _ = make_batch(6, 0, 5, fresh_seed(), dtype=torch.float64)
    losses = inbatch_nll(q, p, targets, group_size=1, reduction="none", backend=backend)
    torch.testing.assert_close(losses, torch.zeros_like(losses), rtol=0, atol=1e-14)  # logsumexp of one score


@pytest.mark.parametrize("n_queries,n_hard,group", [(1, 0, 1), (9, 1, 2), (13, 3, 5), (16, 1, 16), (16, 1, 40),
                                                    (31, 2, 8)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_grouped_fallback_matches_grouped_reference(n_queries, n_hard, group, bidirectional):
    seed = fresh_seed()
    q, p, targets, ids, valid = grouped_batch(n_queries, n_hard, 19, seed, dtype=torch.float32)
    kwargs = dict(scale=3.1, column_ids=ids, column_valid=valid, bidirectional=bidirectional, group_size=group)
    assert_matches_reference(q, p, targets, kwargs, seed, backend="torch", chunk_rows=3)


def test_grouped_fallback_gradcheck_float64():
    seed = fresh_seed()
    q, p, targets, ids, valid = grouped_batch(7, 1, 3, seed)
    q.requires_grad_()
    p.requires_grad_()

    def loss(q_, p_):
        return inbatch_nll(q_, p_, targets, scale=1.3, column_ids=ids, column_valid=valid, bidirectional=True,
                           reduction="none", backend="torch", group_size=3)

    assert torch.autograd.gradcheck(loss, (q, p), eps=1e-6, atol=1e-8, rtol=1e-6)


def test_group_as_large_as_the_batch_is_the_plain_loss():
    seed = fresh_seed()
    q, p, targets, ids, valid = grouped_batch(10, 1, 6, seed)
    plain = inbatch_nll(q, p, targets, column_ids=ids, column_valid=valid, backend="torch")
    for group in (10, 11, 10_000):
        assert float(inbatch_nll(q, p, targets, column_ids=ids, column_valid=valid, backend="torch",
                                 group_size=group)) == float(plain)
    # and a smaller group removes negatives: the loss can only fall
    assert float(inbatch_nll(q, p, targets, column_ids=ids, column_valid=valid, backend="torch",
                             group_size=2)) < float(plain)


@pytest.mark.parametrize("group,p_rows,targets,message", [
    (0, 4, [0, 2], "group_size must be a positive integer"),
    (True, 4, [0, 2], "group_size must be a positive integer"),
    (1.5, 4, [0, 2], "group_size must be a positive integer"),
    (1, 5, [0, 2], "same number of columns per query row"),
    (1, 4, [0, 1], r"positive of query row 1 \(column 1\) lies outside its group"),
])
def test_bad_group_size_is_named(group, p_rows, targets, message):
    with pytest.raises(ValueError, match=message):
        inbatch_nll(torch.randn(2, 3), torch.randn(p_rows, 3), torch.tensor(targets), group_size=group)


# --------------------------------------------------------------------------------------------------------------
# Argument checks and dispatch
# --------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("change,message", [
    (dict(targets=torch.tensor([0, 9])), r"targets must lie in \[0, 6\)"),
    (dict(targets=torch.tensor([0, -1])), r"targets must lie in"),
    (dict(targets=torch.tensor([0.0, 2.0])), "integer column indices"),
    (dict(targets=torch.tensor([0, 2, 4])), r"shape \(2,\)"),
    (dict(p=torch.randn(6, 5)), "same width"),
    (dict(q=torch.randn(2, 4, dtype=torch.float64)), "one dtype"),
    (dict(scale=0.0), "scale must be a finite positive"),
    (dict(scale=float("nan")), "scale must be a finite positive"),
    (dict(column_valid=torch.tensor([True, True, False, True, True, True])), "query row 1 .column 2."),
    (dict(column_valid=torch.ones(5, dtype=torch.bool)), r"column_valid must be a bool tensor of shape \(6,\)"),
    (dict(column_ids=torch.zeros(6)), "integer passage ids"),
    (dict(reduction="avg"), "reduction must be"),
    (dict(backend="cuda"), "backend must be one of"),
])
def test_bad_arguments_are_named(change, message):
    args = dict(q=torch.randn(2, 4), p=torch.randn(6, 4), targets=torch.tensor([0, 2]))
    args.update(change)
    with pytest.raises((ValueError, TypeError), match=message):
        inbatch_nll(**args)


def test_auto_backend_on_cpu(monkeypatch):
    x32 = torch.zeros(2, 3)
    assert resolve_backend("auto", x32.double()) == "torch"  # float64 always goes to the fallback
    assert resolve_backend("auto", x32.bfloat16()) == "torch"  # bf16 is unreliable in the interpreter
    assert resolve_backend("torch", x32) == "torch"
    assert resolve_backend("reference", x32) == "reference"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert resolve_backend("auto", x32) == "torch"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        resolve_backend("triton", x32)


def test_auto_backend_uses_the_interpreter_when_asked(monkeypatch):
    pytest.importorskip("triton")
    from fastdpr.kernels import loss

    kernels = loss._load_triton_kernels()
    if kernels is None or not kernels.INTERPRETED:
        pytest.skip("this process compiled the kernels for the GPU (TRITON_INTERPRET was not 1 at import)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert resolve_backend("auto", torch.zeros(2, 3)) == "triton"
    assert resolve_backend("auto", torch.zeros(2, 3, dtype=torch.float16)) == "triton"
    with pytest.raises(ValueError, match="bfloat16"):
        resolve_backend("triton", torch.zeros(2, 3, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="float64"):
        resolve_backend("triton", torch.zeros(2, 3, dtype=torch.float64))


def test_import_and_loss_work_without_triton():
    code = (
        "import sys\n"
        "import fastdpr.kernels\n"
        "assert 'triton' not in sys.modules, 'importing fastdpr.kernels must not import triton'\n"
        "sys.modules['triton'] = None\n"
        "import torch\n"
        "from fastdpr.errors import MissingDependency\n"
        "from fastdpr.kernels import inbatch_nll, resolve_backend\n"
        "q = torch.randn(3, 4, requires_grad=True); p = torch.randn(6, 4)\n"
        "assert resolve_backend('auto', q) == 'torch'\n"
        "inbatch_nll(q, p, torch.tensor([0, 2, 4])).backward()\n"
        "assert q.grad is not None\n"
        "try:\n"
        "    inbatch_nll(q, p, torch.tensor([0, 2, 4]), backend='triton')\n"
        "except MissingDependency as e:\n"
        "    print('missing:', e)\n"
    )
    env = dict(os.environ, TRITON_INTERPRET="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "missing: backend='triton': triton is not installed" in out.stdout


def test_chunk_size_is_the_deprecated_name_of_chunk_rows():
    q, p = torch.randn(6, 8, dtype=torch.float64), torch.randn(12, 8, dtype=torch.float64)
    targets = torch.arange(6) * 2
    want = inbatch_nll(q, p, targets, backend="torch", chunk_rows=4)
    with pytest.warns(DeprecationWarning, match="chunk_rows"):
        got = inbatch_nll(q, p, targets, backend="torch", chunk_size=4)
    assert torch.equal(got, want)
    with pytest.warns(DeprecationWarning):
        assert InBatchNLLLoss(chunk_size=3).chunk_rows == 3
    with pytest.raises(TypeError, match="not both"):
        inbatch_nll(q, p, targets, backend="torch", chunk_rows=2, chunk_size=4)
