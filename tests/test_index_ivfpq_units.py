"""Each part of the compiled IVF-PQ search on its own (fastdpr._C.ivfpq_stages, csrc/ivfpq_search.h): the list
store (rows, room, layout, file sections), a scanner over the (codes, ids, n) its caller hands it, the registry of
scanners by code type, the probe order, and the re-rank chain over given candidates. No index is built around
them: what each stage does is checked against numpy on small random inputs."""
from __future__ import annotations

import numpy as np
import pytest
from compiled_extension import extension

from fastdpr.errors import InputError
from fastdpr.index import fileformat, numpy_pq4
from fastdpr.index import load_index

_C = extension("IVFPQ")
pytestmark = pytest.mark.skipif(_C is None or not hasattr(_C, "ivfpq_stages"), reason="compiled extension not built")
S = _C.ivfpq_stages if _C is not None and hasattr(_C, "ivfpq_stages") else None


def random_lists(rng, nlist, m, nbits, n):
    """An IVFLists with n random rows (ids 3 i + 1) in two batches, and the (list, code row, id) of each."""
    lists = S.IVFLists(nlist, m, nbits)
    rows = []
    for batch in (range(n // 2), range(n // 2, n)):
        which = rng.integers(0, nlist, len(batch))
        codes = rng.integers(0, 2 ** nbits, (len(batch), m)).astype(np.uint8)
        lists.make_room(np.bincount(which, minlength=nlist))
        for i, l, c in zip(batch, which, codes):
            lists.append(int(l), c, 3 * i + 1)
            rows.append((int(l), c, 3 * i + 1))
    return lists, rows


# --- the list store ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("nbits", (8, 4))
def test_lists_hold_each_row_in_its_list_in_order(nbits):
    rng = np.random.default_rng(nbits)
    lists, rows = random_lists(rng, 7, 5, nbits, 300)
    assert lists.total == 300 and lists.code_type == f"pq{nbits}"
    for l in range(7):
        mine = [(c, i) for (ll, c, i) in rows if ll == l]
        assert lists.size(l) == len(mine) <= lists.room(l)
        np.testing.assert_array_equal(lists.ids(l), [i for _, i in mine])
        np.testing.assert_array_equal(lists.codes(l), np.array([c for c, _ in mine]).reshape(-1, 5))
        want = len(mine) * 5 if nbits == 8 else numpy_pq4.packed_bytes(len(mine), 5)
        assert lists.code_bytes(l) == want == len(S.code_rows(lists, l))


def test_room_is_exact_at_first_then_grows_by_half_and_only_when_a_list_runs_out():
    lists = S.IVFLists(3, 4, 8)
    lists.make_room(np.array([4, 0, 2]))
    assert [lists.room(l) for l in range(3)] == [4, 0, 2]
    for l, n in ((0, 4), (2, 2)):
        for i in range(n):
            lists.append(l, np.full(4, i, np.uint8), i)
    lists.make_room(np.array([0, 0, 0]))  # fits: nothing moves
    assert [lists.room(l) for l in range(3)] == [4, 0, 2]
    lists.make_room(np.array([1, 2, 0]))  # lists 0 and 1 run out: everything half as much again
    assert [lists.room(l) for l in range(3)] == [7, 3, 3]
    np.testing.assert_array_equal(lists.codes(0)[:, 0], [0, 1, 2, 3])  # the rows moved with the layout
    np.testing.assert_array_equal(lists.ids(2), [0, 1])


@pytest.mark.parametrize("nbits", (8, 4))
def test_append_past_the_room_and_a_room_below_the_size_are_refused(nbits):
    lists = S.IVFLists(2, 3, nbits)
    with pytest.raises(RuntimeError, match="list 1 has no room left"):
        lists.append(1, np.zeros(3, np.uint8), 0)
    lists.relayout(np.array([0, 2]))
    lists.append(1, np.ones(3, np.uint8), 5)
    with pytest.raises(ValueError, match="room of list 1 is below its size"):
        lists.relayout(np.array([0, 0]))
    with pytest.raises(ValueError, match="m codes"):
        lists.append(1, np.ones(4, np.uint8), 6)
    with pytest.raises(IndexError):
        lists.size(2)
    with pytest.raises(ValueError, match="nbits=5"):
        S.IVFLists(2, 3, 5)


@pytest.mark.parametrize("nbits", (8, 4))
def test_lists_save_and_load_their_sections(tmp_path, nbits):
    rng = np.random.default_rng(10 + nbits)
    lists, _ = random_lists(rng, 5, 6, nbits, 90)
    # ids must be the positions 0..n-1 for a file: renumber through a second store
    positions = S.IVFLists(5, 6, nbits)
    positions.make_room(np.array([lists.size(l) for l in range(5)]))
    order = iter(rng.permutation(90))
    for l in range(5):
        for c in lists.codes(l):
            positions.append(l, c, int(next(order)))
    w = fileformat.open_writer(tmp_path / "lists.fdpr", "ivfpq", compiled=True)
    positions.save(w.raw)
    w.commit()
    r = fileformat.open_reader(tmp_path / "lists.fdpr")
    assert sorted(r.names()) == ["codes", "list_offsets", "list_pos"]
    back = S.IVFLists.load(r.raw, 5, 6, nbits, 90)
    for l in range(5):
        np.testing.assert_array_equal(back.codes(l), positions.codes(l))
        np.testing.assert_array_equal(back.ids(l), positions.ids(l))
        assert back.room(l) == back.size(l)
    with pytest.raises(ValueError, match="list offsets do not cover the vectors"):
        S.IVFLists.load(r.raw, 5, 6, nbits, 91)


def test_lists_load_refuses_repeated_or_out_of_range_ids(tmp_path):
    for name, pos, match in (("rep", [0, 0, 2], "repeat a vector"), ("far", [0, 1, 3], "out of range")):
        w = fileformat.PyWriter(tmp_path / f"{name}.fdpr", "ivfpq")
        w.add("list_offsets", np.array([0, 2, 3], np.int64))
        w.add("codes", np.zeros(6, np.uint8))
        w.add("list_pos", np.array(pos, np.int64))
        w.commit()
        with pytest.raises(ValueError, match=match):
            S.IVFLists.load(fileformat.open_reader(tmp_path / f"{name}.fdpr").raw, 2, 2, 8, 3)


# --- scanners ------------------------------------------------------------------------------------------------------

def pq_setup(rng, nbits, m=4, dsub=3, n=150):
    ksub = 2 ** nbits
    books = rng.standard_normal((m, ksub, dsub)).astype(np.float32)
    lists = S.IVFLists(1, m, nbits)
    lists.make_room(np.array([n]))
    codes = rng.integers(0, ksub, (n, m)).astype(np.uint8)
    for i, c in enumerate(codes):
        lists.append(0, c, i)
    return books, codes, S.code_rows(lists, 0), rng.standard_normal(m * dsub).astype(np.float32)


def test_8bit_scanner_scores_are_the_table_sums_under_the_callers_ids():
    rng = np.random.default_rng(1)
    books, codes, raw, q = pq_setup(rng, 8)
    ids = (np.arange(150) * 7 + 1000).astype(np.uint32)  # not positions: the scanner reports what it is handed
    scores, got = S.scan("pq8", books, q, raw, ids, 150, 0.25, 10)
    lut = np.einsum("jd,jkd->jk", q.reshape(4, 3), books)
    exact = 0.25 + lut[np.arange(4), codes].sum(axis=1)
    best = np.argsort(-exact, kind="stable")[:10]
    np.testing.assert_array_equal(got, ids[best])
    np.testing.assert_allclose(scores, exact[best], rtol=1e-5, atol=1e-5)


def test_4bit_scanner_scores_are_the_quantized_table_sums():
    rng = np.random.default_rng(2)
    books, codes, raw, q = pq_setup(rng, 4)
    ids = (np.arange(150) + 500).astype(np.uint32)
    table, bias, delta = numpy_pq4.quantize_tables(numpy_pq4.query_tables(q[None], books))
    want = numpy_pq4.code_scores(np.float32(-1.5), bias[0], delta[0], numpy_pq4.scan(codes, table[0]))
    scores, got = S.scan("pq4", books, q, raw, ids, 150, -1.5, 150)  # keep all: every row's score
    np.testing.assert_array_equal(np.sort(got), ids)
    np.testing.assert_array_equal(scores, want[got - 500])
    # a smaller keep: the best by that score, ties by id
    order = np.lexsort((ids, -want))[:12]
    scores12, got12 = S.scan("pq4", books, q, raw, ids, 150, -1.5, 12)
    np.testing.assert_array_equal(got12, ids[order])


@pytest.mark.parametrize("code_type", ("pq8", "pq4"))
def test_scanner_reads_only_the_n_rows_it_is_given(code_type):
    rng = np.random.default_rng(3)
    books, codes, raw, q = pq_setup(rng, int(code_type[2:]))
    ids = np.arange(150, dtype=np.uint32)
    _, got = S.scan(code_type, books, q, raw, ids, 37, 0.0, 100)
    np.testing.assert_array_equal(np.sort(got), np.arange(37))


def test_an_unregistered_code_type_is_named():
    rng = np.random.default_rng(4)
    books, codes, raw, q = pq_setup(rng, 8)
    with pytest.raises(ValueError, match="no scanner is registered for code type 'pq6'"):
        S.scan("pq6", books, q, raw, np.arange(150, dtype=np.uint32), 150, 0.0, 5)


# --- probe ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("spread", (0.0, 0.7))
def test_probe_orders_lists_by_score_plus_spread(spread):
    rng = np.random.default_rng(5)
    qc = rng.standard_normal(40).astype(np.float32)
    s = rng.random(40).astype(np.float32)
    q = rng.standard_normal(12).astype(np.float32)
    order, lists = S.probe(qc, s, q, 9, spread)
    want = qc + np.float32(np.linalg.norm(q)) * (np.float32(spread) * s)
    np.testing.assert_array_equal(lists, np.argsort(-want, kind="stable")[:9])
    np.testing.assert_allclose(order, want[lists], rtol=1e-6)
    assert len(S.probe(qc, s, q, 100, spread)[1]) == 40  # nprobe beyond nlist: every list


# --- the re-rank chain ---------------------------------------------------------------------------------------------

def rerank_setup(seed, n=400, d=10, nq=6):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    q = rng.standard_normal((nq, d)).astype(np.float32)
    cands = [sorted(rng.choice(n, size=int(rng.integers(3, 60)), replace=False).tolist()) for _ in range(nq)]
    cands[0] = cands[0][:4]  # fewer than `exact`: the 4-bit step leaves it whole
    lo, step = _C.sq4_train(x)
    return x, q, cands, (_C.sq4_encode(x, lo, step), lo, step)


def top(scores_of, cands, k):
    """Per query its k best candidates by score (ties by id), and those scores."""
    out = []
    for i, c in enumerate(cands):
        c = np.array(c)
        s = scores_of(i, c)
        order = np.lexsort((c, -s))[:k]
        out.append((c[order], s[order]))
    return out


def assert_rows(scores, ids, want):
    for i, (wid, ws) in enumerate(want):
        np.testing.assert_array_equal(ids[i][: len(wid)], wid)
        np.testing.assert_allclose(scores[i][: len(wid)], ws, rtol=1e-5, atol=1e-5)
        assert np.all(ids[i][len(wid):] == -1)


@pytest.mark.parametrize("store", ("fp32", "fp16"))
def test_vectors_step_ranks_the_candidates_exactly(store):
    x, q, cands, _ = rerank_setup(6)
    xs = x if store == "fp32" else x.astype(np.float16)
    vectors = xs if store == "fp32" else xs.view(np.uint16)
    scores, ids = S.rerank(q, cands, 5, 60, vectors=vectors, ntotal=len(x))
    want = top(lambda i, c: xs[c].astype(np.float32) @ q[i], cands, 5)
    assert_rows(scores, ids, want)


def test_4bit_rows_cut_to_exact_before_the_vectors():
    x, q, cands, (rows, lo, step) = rerank_setup(7)
    exact, k = 8, 3
    scores, ids = S.rerank(q, cands, k, 60, exact, vectors=x, sq_rows=rows, sq_lo=lo, sq_step=step, ntotal=len(x))
    cut = [c for c, _ in top(lambda i, c: numpy_pq4.row_scores(q[i], rows[c], lo, step), cands, exact)]
    assert len(cut[0]) == 4 and all(len(c) == min(exact, len(cands[i])) for i, c in enumerate(cut))
    assert_rows(scores, ids, top(lambda i, c: x[c] @ q[i], cut, k))
    # without `exact` the 4-bit rows are not read: the vectors rank every candidate
    whole = S.rerank(q, cands, k, 60, 0, vectors=x, sq_rows=rows, sq_lo=lo, sq_step=step, ntotal=len(x))
    assert_rows(*whole, top(lambda i, c: x[c] @ q[i], cands, k))


def test_4bit_rows_alone_give_the_answer():
    x, q, cands, (rows, lo, step) = rerank_setup(8)
    scores, ids = S.rerank(q, cands, 4, 60, 2, sq_rows=rows, sq_lo=lo, sq_step=step, ntotal=len(x))
    assert_rows(scores, ids, top(lambda i, c: numpy_pq4.row_scores(q[i], rows[c], lo, step), cands, 4))


def test_rerank_refuses_candidates_past_the_rows():
    x, q, cands, _ = rerank_setup(9)
    with pytest.raises(ValueError, match="not below ntotal"):
        S.rerank(q, cands, 5, 60, vectors=x[:100], ntotal=100)
    with pytest.raises(ValueError, match="needs vectors or sq_rows"):
        S.rerank(q, cands, 5, 60, ntotal=len(x))


def test_the_two_readers_are_one_format(tmp_path):
    """The numpy reader (fastdpr/index/ivfpq.py NumpyIVFPQ.read_sections) and the compiled one read a file into the
    same lists; both refuse the same broken one."""
    from fastdpr.index.ivfpq import IVFPQIndex, NumpyIVFPQ
    rng = np.random.default_rng(11)
    x = rng.standard_normal((300, 16)).astype(np.float32)
    for nbits in (8, 4):
        index = IVFPQIndex(16, nlist=5, m=4, nbits=nbits, store="fp16", niter=3, pq_niter=3, backend="compiled")
        index.train(x)
        index.add(x)
        path = index.save(tmp_path / f"i{nbits}.fdpr")
        ref = NumpyIVFPQ.read_sections(fileformat.PyReader(path))
        raw = fileformat.open_reader(path)
        lists = S.IVFLists.load(raw.raw, 5, 4, nbits, 300)
        for l in range(5):
            np.testing.assert_array_equal(lists.codes(l), ref._codes[l])
            np.testing.assert_array_equal(lists.ids(l), ref._pos[l])
    w = fileformat.PyWriter(tmp_path / "bad.fdpr", "ivfpq")
    for key, value in (("dim", 16), ("nlist", 2), ("m", 4), ("nbits", 8), ("storage", 0), ("assign_by_ip", 0),
                       ("trained", 1), ("ntotal", 3)):
        w.meta(key, value)
    w.add("centroids", np.zeros((2, 16), np.float32))
    w.add("codebooks", np.zeros((4, 256, 4), np.float32))
    w.add("list_offsets", np.array([0, 2, 3], np.int64))
    w.add("codes", np.zeros(12, np.uint8))
    w.add("list_pos", np.array([0, 2, 2], np.int64))
    w.commit()
    with pytest.raises(InputError, match="repeat a vector"):
        NumpyIVFPQ.read_sections(fileformat.PyReader(tmp_path / "bad.fdpr"))
    with pytest.raises(InputError, match="repeat a vector"):
        load_index(tmp_path / "bad.fdpr")
