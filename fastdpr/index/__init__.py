"""Maximum-inner-product indexes: exact (Flat), HNSW, IVF-PQ, and FAISS as an optional backend.

>>> from fastdpr.index import build_index, load_index
>>> index = build_index(vectors, "hnsw,M=32,efc=200")     # doctest: +SKIP
>>> scores, ids = index.search(queries, k=100)            # doctest: +SKIP
>>> index = build_index(vectors)                          # "auto": exact search or IVF-PQ by size  # doctest: +SKIP
>>> index.tune(train_questions, target_recall=0.95)       # the cheapest settings, saved    # doctest: +SKIP
>>> index_from_vectors("vectors/", "auto", "wiki.fdpr")   # a `fastdpr encode` directory to a file  # doctest: +SKIP

Compiled C++ cores (``fastdpr._C``) are used when present; every type has a pure-numpy fallback giving the same
results (exact search for HNSW's fallback, so "the same or better").
"""
from fastdpr.index._native import native_available
from fastdpr.index.auto import choose_index
from fastdpr.index.base import Index
from fastdpr.index.factory import build_index, index_class, load_index, make_index
from fastdpr.index.flat import FlatIndex, exact_search
from fastdpr.index.from_vectors import BuiltIndex, index_from_vectors
from fastdpr.index.hnsw import HNSWIndex
from fastdpr.index.ivfpq import IVFPQIndex
from fastdpr.index.spec import REGISTRY, parse_spec

__all__ = ["Index", "build_index", "load_index", "make_index", "parse_spec", "index_class", "REGISTRY",
           "FlatIndex", "HNSWIndex", "IVFPQIndex", "exact_search", "native_available", "choose_index",
           "index_from_vectors", "BuiltIndex"]
