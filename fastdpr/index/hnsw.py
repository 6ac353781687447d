"""HNSW graph index for maximum inner product (compiled), with an exact-search fallback.

Spec: ``"hnsw,M=32,efc=200,ef=128,fp16,graph=ip|cos|l2,mips=l2,phi=...,entry=1,floor=..."``.

- ``graph=ip`` (default): native inner-product graph; ``graph=cos`` builds on directions; ``mips=l2`` (or
  ``graph=l2``) uses the MIPS->L2 reduction, with phi fixed by the first add (or given) and larger vectors
  rejected afterwards. Every variant searches and scores by the exact inner product with the stored vectors.
- ``ef``: beam width of the level-0 search; a beam narrower than ``k`` returns the best ``k`` of every node it
  scored (cheaper than raising ``ef`` to ``k``, at lower recall); ``entry``: width of the level-1 beam whose results
  all seed level 0 (1 = plain greedy descent). Both can be overridden per search: ``index.search(q, 100, ef=256)``.
  On clustered non-normalised data extra entry points leave the inner-product graph's recall as it is but lift the
  L2-reduced graph's, so ``mips=l2`` wants ``entry=8``.
- Why the inner-product graph here does not stall like other IP graphs on non-normalised data: the neighbour
  heuristic prunes a candidate when a kept neighbour is more similar to it than the node is, and under inner
  product a few high-norm nodes are "more similar" to everything, so the plain heuristic can leave nodes with few
  links, most of them to those hubs; this graph tops every list back up to M with the best pruned candidates (see
  ``select_neighbors`` in ``csrc/hnsw.cpp``), which keeps local structure reachable around the hubs
  (``benchmarks/index_core_bench.py hnsw`` compares the recall with hnswlib's and faiss's HNSW). ``floor`` sets
  that top-up (default M; 0 is the plain heuristic, close to hnswlib's graph, with a quarter of the links): on
  the real MiniLM mean-pooled pool of the earlier data it searched faster at equal recall and built faster than
  the default (``hnsw_paired_real.md`` in git at c97483c); on the calibrated synthetic set
  it never reaches recall@100 0.95 below ef 320, where the default does at ef 160
  (``benchmarks/results/hnsw_paired_*.md``).
- Memory layout: one record per node with the level-0 links next to a half-precision copy of the vector, which is
  what the graph walk scores (half the bytes per neighbour); with fp32 storage the list the walk found is re-ranked
  with the fp32 vectors, so returned scores are exact inner products. Resident bytes per vector at d = 384, M = 32:
  1,088 (the record) plus 1,536 with fp32 storage.
- Without the compiled core (or with ``FASTDPR_NO_NATIVE=1``) the index stores the vectors and searches them
  exactly: the same results or better. It saves them with its parameters and no graph, and loading that file with
  the compiled core builds the graph then.

>>> import numpy as np
>>> from fastdpr.index import build_index
>>> x = np.random.default_rng(0).standard_normal((2000, 32)).astype(np.float32)
>>> index = build_index(x, "hnsw,M=16,efc=100")
>>> scores, ids = index.search(x[:2], k=5, ef=64)
>>> ids.shape
(2, 5)
"""
from __future__ import annotations

from typing import Any

import numpy as np

from fastdpr.errors import InputError
from fastdpr.index._native import native
from fastdpr.index.base import Index
from fastdpr.index.checks import take_params
from fastdpr.index.exact import numpy_exact_search
from fastdpr.index.rows import RowStore
from fastdpr.index.spec import check_storage_flags

DEFAULTS = {"M": 32, "efc": 200, "ef": 128, "fp16": False, "fp32": False, "graph": "ip", "mips": "ip", "phi": 0.0,
            "entry": 1, "seed": 12345, "floor": -1}


class HNSWIndex(Index):
    """Inner-product HNSW. ``len``, ``dim``, ``add`` and ``search`` as in :class:`fastdpr.index.Index`."""

    kind = "hnsw"
    search_params = {"ef": 0, "threads": 0, "entry": 0}

    def __init__(self, dim: int, M: int = 32, efc: int = 200, ef: int = 128, fp16: bool = False, graph: str = "ip",
                 phi: float = 0.0, entry: int = 1, seed: int = 12345, floor: int = -1):
        super().__init__(dim)
        if graph not in ("ip", "cos", "l2"):
            raise InputError(f"hnsw: graph must be ip, cos or l2, got {graph!r}")
        # the ranges the compiled graph and its file loader accept (csrc/hnsw.cpp)
        for name, value, lo, hi in (("M", M, 2, 4096), ("efc", efc, 1, 1 << 30), ("ef", ef, 1, 1 << 30),
                                    ("entry", entry, 1, 1 << 20), ("seed", seed, 0, None), ("floor", floor, -1, M)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"hnsw: {name} must be an integer, got {value!r}")
            if value < lo or (hi is not None and value > hi):
                raise InputError(f"hnsw: {name} must be in [{lo}, {hi if hi is not None else 'inf'}], got {value}")
        if not np.isfinite(phi) or phi < 0:
            raise InputError(f"hnsw: phi must be a finite number >= 0, got {phi}")
        self.M, self.efc, self.ef, self.fp16, self.graph, self.entry, self.seed = M, efc, ef, fp16, graph, entry, seed
        self.floor = floor
        self._phi = float(phi)
        C = native()
        self._impl = None
        if C is not None:
            self._impl = C.HNSWIndex(self._dim, M=M, ef_construction=efc, ef_search=ef, graph=graph,
                                     storage="fp16" if fp16 else "fp32", phi=float(phi), entry_points=entry,
                                     seed=int(seed) & 0x7FFFFFFFFFFFFFFF, floor=floor)
        self._store = RowStore(self._dim, fp16)  # the fallback's rows

    @classmethod
    def from_spec(cls, dim: int, params: dict[str, Any]) -> "HNSWIndex":
        p = take_params(params, DEFAULTS, "hnsw")
        check_storage_flags(p, "hnsw")
        graph = p["graph"]
        if p["mips"] not in ("ip", "l2"):
            raise InputError(f"hnsw: mips must be ip or l2, got {p['mips']!r}")
        if p["mips"] == "l2":
            if "graph" in params and graph != "l2":
                raise InputError(f"hnsw: mips=l2 and graph={graph} conflict; give one of them")
            graph = "l2"
        return cls(dim, M=p["M"], efc=p["efc"], ef=p["ef"], fp16=p["fp16"], graph=graph, phi=p["phi"],
                   entry=p["entry"], seed=p["seed"], floor=p["floor"])

    @property
    def native(self) -> bool:
        return self._impl is not None

    @property
    def phi(self) -> float:
        return self._impl.phi if self._impl is not None else self._phi

    @property
    def stores_fp16(self) -> bool:
        return self.fp16

    def _takes_half(self) -> bool:
        return self._impl is not None

    def _ntotal(self) -> int:
        return len(self._impl) if self._impl is not None else len(self._store)

    def _add(self, x: np.ndarray, threads: int = 0) -> None:
        if self._impl is not None:
            try:
                self._impl.add(x, threads)
            except ValueError as exc:
                raise InputError(str(exc)) from None
            return
        if self.graph == "l2":  # same rule as the compiled graph, so the fallback accepts exactly the same adds
            sq = np.einsum("ij,ij->i", x, x, dtype=np.float64)
            if len(self._store) == 0 and self._phi <= 0 and sq.size:
                self._phi = float(sq.max())
            if sq.size and sq.max() > self._phi * (1 + 1e-6):
                raise InputError(f"mips=l2: vector {int(sq.argmax())} of this add has squared norm {sq.max():.6g} "
                                 f"above phi = {self._phi:.6g}, fixed by the first add")
        self._store.append(x)

    def _search(self, q: np.ndarray, k: int, ef: int = 0, threads: int = 0, entry: int = 0):
        if not 0 <= ef <= 1 << 30 or not 0 <= entry <= 1 << 20:
            raise InputError(f"hnsw search: ef must be in [0, 2^30] and entry in [0, 2^20] (0: the index's "
                             f"setting), got ef={ef}, entry={entry}")
        if self._impl is not None:
            return self._impl.search(q, k, ef, threads, entry)
        return numpy_exact_search(self._store.array(), q, k)

    # -- statistics ---------------------------------------------------------------------------------------------
    def mean_degree(self) -> float:
        return self._impl.mean_degree() if self._impl is not None else float("nan")

    def reachable(self) -> int:
        """Nodes reachable from the entry point on level 0 (a connectivity check)."""
        return self._impl.reachable() if self._impl is not None else len(self._store)

    # -- files --------------------------------------------------------------------------------------------------
    def _uses_compiled_writer(self) -> bool:
        return self._impl is not None

    def _write(self, writer: Any) -> None:
        if self._impl is not None:
            self._impl.save(writer.raw)
            return
        # The fallback holds no graph and fakes none: it writes its vectors and the graph's parameters without any
        # link section, and a compiled loader builds the graph from them (`_read`).
        self._store.write(writer)
        for key, value in (("M", self.M), ("ef_construction", self.efc), ("ef_search", self.ef),
                           ("entry_points", self.entry), ("graph", self.graph), ("phi", float(self.phi)),
                           ("seed", int(self.seed) & 0x7FFFFFFFFFFFFFFF), ("floor", self.floor)):
            writer.meta(key, value)

    @classmethod
    def _read(cls, reader: Any, mmap: bool = False) -> "HNSWIndex":
        C = native()
        if C is not None and hasattr(reader, "raw") and reader.has("links0"):
            impl = C.HNSWIndex.load(reader.raw, mmap)
            index = cls.__new__(cls)
            Index.__init__(index, impl.dim)
            index.M, index.efc, index.ef = impl.M, impl.ef_construction, impl.ef_search
            index.fp16, index.graph, index.entry = impl.storage == "fp16", impl.graph, impl.entry_points
            index.seed = int(reader.meta("seed"))
            index.floor = impl.floor
            index._phi = impl.phi
            index._impl = impl
            index._store = RowStore(impl.dim, index.fp16)
            return index
        # the vectors (of a graph file, or of a file the fallback wrote), with the graph's parameters
        store = RowStore.read(reader, mmap)
        params = {}
        for key, name, lo, hi in (("M", "M", 2, 4096), ("ef_construction", "efc", 1, 1 << 30),
                                  ("ef_search", "ef", 1, 1 << 30), ("entry_points", "entry", 1, 1 << 20),
                                  ("seed", "seed", 0, None), ("floor", "floor", -1, 4096)):
            if reader.has_meta(key):
                params[name] = reader.meta_int(key, lo, hi)
        if params.get("floor", -1) > params.get("M", DEFAULTS["M"]):
            reader.fail("floor above M")
        if reader.has_meta("graph"):
            params["graph"] = reader.meta("graph")
            if params["graph"] not in ("ip", "cos", "l2"):
                reader.fail(f"unknown graph {params['graph']!r}")
        if reader.has_meta("phi"):
            params["phi"] = reader.meta_float("phi")
            if not np.isfinite(params["phi"]) or params["phi"] < 0:
                reader.fail("bad phi")
        index = cls(store.dim, fp16=store.fp16, **params)
        if index._impl is None:
            index._store = store
        elif len(store):  # a file without a graph, loaded with the compiled core: build the graph now
            index._add(np.ascontiguousarray(store.array(), dtype=np.float32))
        return index
