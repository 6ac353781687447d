"""The ``Index`` protocol, the spec-string parser, the registry of index types, ``build_index`` and ``load_index``.

Every index scores by inner product and returns ``(scores float32 (n, k), ids int64 (n, k))``, best first, with
``-1`` ids and ``-inf`` scores where fewer than ``k`` vectors exist. Ids are the caller's int64 ids (by default the
row number of each vector, in the order added).

Example::

    from fastdpr.index import build_index, load_index
    index = build_index(vectors, "hnsw,M=32,efc=200")
    scores, ids = index.search(queries, k=100, ef=256)
    index.save("wiki.fdpr")
    same = load_index("wiki.fdpr")

A new index type subclasses :class:`Index`, sets ``kind`` (the file's type tag), and implements ``from_spec``,
``_add``, ``_search``, ``_write`` and ``_read`` (plus ``train`` when it needs training); the base class checks every
input at the boundary, maps ids, and handles files.
"""
from __future__ import annotations

import importlib
import json
import os
import threading
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from fastdpr.errors import InputError
from fastdpr.index._native import MAX_THREADS

# chunk of rows validated/converted at once on add, so a 21M x 768 fp16 array never needs a full fp32 copy
ADD_CHUNK = 65536
INDEX_FILE_NAME = "index.fdpr"  # the file inside an index directory

# kind -> "module:Class"; modules are imported only when that kind is used
REGISTRY: dict[str, str] = {
    "flat": "fastdpr.index.flat:FlatIndex",
    "hnsw": "fastdpr.index.hnsw:HNSWIndex",
    "ivfpq": "fastdpr.index.ivfpq:IVFPQIndex",
    "faiss": "fastdpr.index.faiss_adapter:FaissIndex",
}


# ---------------------------------------------------------------------------------------------------------------
# spec strings


def parse_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"hnsw,M=32,efc=200,fp16"`` -> ``("hnsw", {"M": 32, "efc": 200, "fp16": True})``.

    Values are int, float or str; a bare word is a flag (True). ``"faiss:<factory>"`` keeps the factory string
    whole: ``("faiss", {"factory": "<factory>"})``.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise InputError(f"index spec must be a non-empty string, got {spec!r}")
    spec = spec.strip()
    if spec.startswith("faiss:"):
        factory = spec[len("faiss:"):].strip()
        if not factory:
            raise InputError("index spec 'faiss:' needs a factory string, e.g. 'faiss:HNSW32,Flat'")
        return "faiss", {"factory": factory}
    parts = [p.strip() for p in spec.split(",")]
    kind = parts[0].lower()
    if kind not in REGISTRY and kind != "auto":
        raise InputError(f"unknown index type {parts[0]!r} in spec {spec!r}; expected one of "
                         f"{sorted(REGISTRY) + ['auto']}")
    params: dict[str, Any] = {}
    for p in parts[1:]:
        if not p:
            raise InputError(f"empty field in index spec {spec!r}")
        if "=" in p:
            key, value = (s.strip() for s in p.split("=", 1))
            if not key or not value:
                raise InputError(f"bad field {p!r} in index spec {spec!r}")
            value = parse_value(value)
        else:
            key, value = p, True
        # the last one winning would build something other than what one of them says
        if key in params:
            raise InputError(f"index spec {spec!r} gives {key!r} twice")
        params[key] = value
    return kind, params


def check_storage_flags(params: dict[str, Any], where: str) -> None:
    """The bare ``fp16`` and ``fp32`` flags of a spec exclude each other."""
    if params.get("fp16") is True and params.get("fp32") is True:
        raise InputError(f"{where}: fp16 and fp32 conflict; give one of them")


def parse_value(value: str) -> Any:
    """A parameter value written as text (spec strings, ``--search-param KEY=VALUE``): int, else float, else the
    string itself."""
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def take_params(params: dict[str, Any], allowed: dict[str, Any], where: str) -> dict[str, Any]:
    """Check ``params`` against ``allowed`` (name -> default; the default's type is the expected type) and return
    the defaults updated with ``params``. Unknown names and wrong types are an ``InputError`` naming ``where``."""
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise InputError(f"unknown parameter(s) {unknown} for {where}; known: {sorted(allowed)}")
    out = dict(allowed)
    for key, value in params.items():
        default = allowed[key]
        if isinstance(default, bool):
            if not isinstance(value, (bool, np.bool_)):
                raise InputError(f"{where}: {key} is a flag (true/false), got {value!r}")
            value = bool(value)
        elif isinstance(default, int) and default is not None:
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise InputError(f"{where}: {key} must be an integer, got {value!r}")
            value = int(value)
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
                raise InputError(f"{where}: {key} must be a number, got {value!r}")
            value = float(value)
        out[key] = value
    return out


# ---------------------------------------------------------------------------------------------------------------
# boundary checks


def check_shape(x: Any, dim: int | None, what: str) -> np.ndarray:
    """``x`` as a 2-D array of real numbers -- floating point or integer, converted to float32 later -- without
    copying (a 1-D vector becomes one row). Wrong dimension or dtype is an ``InputError`` naming ``what``."""
    if not isinstance(x, np.ndarray):
        try:
            x = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise InputError(f"{what} must be a numeric array: {exc}") from None
    if x.ndim == 1:
        x = x.reshape(1, -1)
    if x.ndim != 2:
        raise InputError(f"{what} must be a 2-D array (n, dim), got shape {x.shape}")
    if x.dtype.kind not in "fiu" or x.dtype == np.bool_:
        raise InputError(f"{what} must hold real numbers (floating point or integer), got dtype {x.dtype}")
    if dim is not None and x.shape[1] != dim:
        raise InputError(f"{what} have dimension {x.shape[1]} but the index has dimension {dim}")
    if x.shape[1] == 0:
        raise InputError(f"{what} have dimension 0")
    return x


def check_finite(x: np.ndarray, what: str) -> None:
    """NaN/Inf anywhere is an ``InputError`` naming the first bad row (checked in chunks: no full-size temporary)."""
    if x.dtype.kind != "f":
        return
    for start in range(0, x.shape[0], ADD_CHUNK):
        block = x[start:start + ADD_CHUNK]
        if not np.isfinite(block).all():
            bad = start + int(np.argwhere(~np.isfinite(block))[0, 0])
            raise InputError(f"{what} row {bad} contains NaN or Inf")


def check_scores(scores: np.ndarray, ids: np.ndarray, ranks_past_float32: bool) -> None:
    """Finite vectors whose inner products leave float32 (entries near 1e37 and more) score NaN or +-inf, and an
    index that computes in float32 then ranks them at random: flat search answered -inf after +inf (the fallback
    +inf ties in the wrong order), HNSW NaN. Such a score of a result found is an ``InputError`` naming the query,
    not an answer. An index that ranks in a scale of its own (``ranks_past_float32``: IVF-PQ, whose ids are the
    same at any scale, ``tests/test_index_reliability.py``) may report +inf; NaN or -inf are refused there too."""
    beyond = np.isneginf(scores) if ranks_past_float32 else np.isinf(scores)
    bad = np.isnan(scores) | ((ids >= 0) & beyond)
    if bad.any():
        row = int(np.argwhere(bad)[0, 0])
        raise InputError(f"queries row {row}: inner products beyond the float32 range (+-3.4e38): the entries of the "
                         "queries or of the indexed vectors are too large; rescale them")


def check_matrix(x: Any, dim: int | None, what: str) -> np.ndarray:
    """Checked float32 C-contiguous rows (see ``check_shape`` and ``check_finite``)."""
    x = check_shape(x, dim, what)
    check_finite(x, what)
    return np.ascontiguousarray(x, dtype=np.float32)


FP16_MAX = 65504.0


def check_fp16_range(x: np.ndarray, what: str = "vectors") -> None:
    """fp16 storage cannot hold |v| > 65504 (it would become Inf and poison every score): a clear error instead."""
    for start in range(0, x.shape[0], ADD_CHUNK):
        block = x[start:start + ADD_CHUNK]
        if block.size and float(np.abs(block).max()) > FP16_MAX:
            bad = start + int(np.argwhere(np.abs(block) > FP16_MAX)[0, 0])
            raise InputError(f"{what} row {bad} has a component beyond the fp16 range (|v| > 65504); "
                             "use fp32 storage or rescale the vectors")


def check_k(k: Any) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise InputError(f"k must be a positive integer, got {k!r}")
    if k < 1:
        raise InputError(f"k must be >= 1, got {k}")
    return int(k)


def check_threads(threads: Any) -> int:
    """A ``threads=`` value: 0 (all cores) up to ``MAX_THREADS`` (64 per core, at most 4096)."""
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise InputError(f"threads must be an integer, got {threads!r}")
    if threads < 0:
        raise InputError(f"threads must be >= 0 (0: all cores), got {threads}")
    if threads > MAX_THREADS:
        raise InputError(f"threads={threads} is more than this machine can use (at most {MAX_THREADS}: 64 per core)")
    return int(threads)


# k beyond the index size only pads the result with (-inf, -1); a padded result larger than this is refused rather
# than allocated (csrc/bind.h has the same rule for direct calls to the compiled core)
MAX_PADDED_RESULT_BYTES = 1 << 30


def check_padding(questions: int, k: int, n: int, what: str = "the index", unit: str = "vectors") -> None:
    """An ``InputError`` when ``k`` is beyond the ``n`` results there can be and padding ``questions`` result rows
    to ``k`` would take more than ``MAX_PADDED_RESULT_BYTES``: memory would grow with k, not with what exists."""
    if k > n and questions * k * 12 > MAX_PADDED_RESULT_BYTES:
        raise InputError(f"k={k} is larger than {what} ({n} {unit}), and padding {questions} result rows to that "
                         f"width takes {questions * k * 12 >> 20} MiB; ask for k <= {n}")


def pad_results(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(nq, k') results widened to k columns with -inf scores and -1 ids."""
    nq, have = rows.shape
    if have >= k:
        return scores, rows
    out_s = np.full((nq, k), -np.inf, dtype=np.float32)
    out_i = np.full((nq, k), -1, dtype=np.int64)
    out_s[:, :have] = scores
    out_i[:, :have] = rows
    return out_s, out_i


def check_ids(ids: Any, n: int) -> np.ndarray:
    ids = np.asarray(ids)
    if ids.ndim != 1 or ids.shape[0] != n:
        raise InputError(f"ids must be a 1-D array of {n} integers, got shape {ids.shape}")
    if n and ids.dtype.kind not in "iu":
        raise InputError(f"ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    if n and ids.min() < 0:
        raise InputError("ids must be >= 0 (-1 marks a missing result)")
    if np.unique(ids).shape[0] != n:
        raise InputError("ids must be unique")
    return ids


# ---------------------------------------------------------------------------------------------------------------
# the protocol


class Index:
    """Maximum-inner-product index. Subclasses implement the ``_``-prefixed methods on checked inputs."""

    kind: ClassVar[str] = ""
    # whether ids stay right where inner products leave float32 (the scores then read +inf): ``check_scores``
    ranks_past_float32: ClassVar[bool] = False
    # search parameters accepted by ``search(..., **params)`` (name -> default), checked by ``take_params``
    search_params: ClassVar[dict[str, Any]] = {}
    #: the fingerprint of the model whose passage vectors the index holds (``fastdpr.encode.model_fingerprint``,
    #: from the vectors' manifest), saved in the file, so that a search with another model can be refused
    model_fingerprint: str | None = None
    #: what ``tune`` chose and measured (``fastdpr.index.tune.TuneResult.record``), saved in the file as metadata
    #: ``tuned``; the settings themselves are the index's own search defaults
    tuned: dict | None = None

    def __init__(self, dim: int):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise InputError(f"index dimension must be a positive integer, got {dim!r}")
        self._dim = int(dim)
        self._labels: np.ndarray | None = None  # external ids by row; None: the row number is the id
        self._write_lock = threading.Lock()  # adds are serialised; searches are not blocked by it

    # -- to implement -------------------------------------------------------------------------------------------
    @classmethod
    def from_spec(cls, dim: int, params: dict[str, Any]) -> "Index":
        raise NotImplementedError

    def _ntotal(self) -> int:
        raise NotImplementedError

    @property
    def stores_fp16(self) -> bool:
        """True when the rows are stored as fp16 (they must then fit its range)."""
        return False

    def _check_rows(self, x: np.ndarray) -> None:
        """Checks of rows about to be added (raise InputError); run before anything is added."""
        if self.stores_fp16:
            check_fp16_range(x)

    def _add(self, x: np.ndarray) -> None:
        """Append float32 C-contiguous rows (already checked); row numbers continue from ``_ntotal()``. Also
        float16 rows when ``_takes_half()``."""
        raise NotImplementedError

    def _takes_half(self) -> bool:
        """True when ``_add`` and ``_search`` accept float16 rows as they are (the compiled core widens them
        itself, a block at a time), so fp16 vectors are never copied to float32 in Python."""
        return False

    def _search(self, q: np.ndarray, k: int, **params: Any) -> tuple[np.ndarray, np.ndarray]:
        """Top-k by inner product of float32 rows, k <= the number of rows; returns row numbers (-1 padded)."""
        raise NotImplementedError

    def _write(self, writer: Any) -> None:
        """Add this index's sections and metadata to an open file writer (``fileformat``)."""
        raise NotImplementedError

    @classmethod
    def _read(cls, reader: Any, mmap: bool = False) -> "Index":
        raise NotImplementedError

    # -- training (types that need none keep these) ---------------------------------------------------------------
    @property
    def is_trained(self) -> bool:
        return True

    def train(self, vectors: np.ndarray) -> None:
        """Learn what the index needs from sample vectors (no-op for types that need nothing)."""

    def stored_vectors(self) -> np.ndarray | None:
        """The stored rows (n, dim) in the order added, when the type keeps them in a form ``tune`` can read."""
        return None

    def tune(self, queries: Any, target_recall: float = 0.95, k: int = 100, vectors: Any = None, truth: Any = None,
             max_queries: int | None = None, threads: int = 0, save: str | os.PathLike | None = None):
        """Find the cheapest search settings whose recall@``k`` against exact search on ``queries`` (a sample:
        training questions or held-out vectors) reaches ``target_recall``, and make them this index's defaults
        (saved with it). Returns a ``fastdpr.index.tune.TuneResult``; see that module."""
        from fastdpr.index import tune

        return tune.tune(self, queries, target_recall=target_recall, k=k, vectors=vectors, truth=truth,
                         max_queries=tune.MAX_QUERIES if max_queries is None else max_queries, threads=threads,
                         save=save)

    # -- public -----------------------------------------------------------------------------------------------------
    @property
    def dim(self) -> int:
        return self._dim

    def __len__(self) -> int:
        return self._ntotal()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(dim={self._dim}, n={len(self)})"

    def add(self, vectors: np.ndarray, ids: Any = None) -> None:
        """Append vectors (n, dim) of any real dtype; ``ids`` (n,) int64 >= 0, unique (default: row numbers).
        float32 and float16 rows go to the compiled core without a float32 copy in Python."""
        x = check_shape(vectors, self._dim, "vectors")
        check_finite(x, "vectors")  # before anything is added: a bad row leaves the index unchanged
        self._check_rows(x)
        n = x.shape[0]
        if not self.is_trained:
            raise InputError(f"{type(self).__name__} must be trained before vectors are added "
                             "(build_index trains it; or call index.train(sample))")
        with self._write_lock:
            n0 = self._ntotal()
            labels = self._labels
            if ids is not None:
                ids = check_ids(ids, n)
                if labels is None:
                    labels = np.arange(n0, dtype=np.int64)
                if labels.shape[0] and np.isin(ids, labels).any():
                    raise InputError("ids already present in the index")
                labels = np.concatenate([labels, ids])
            elif labels is not None:
                new = np.arange(n0, n0 + n, dtype=np.int64)
                if np.isin(new, labels).any():
                    raise InputError("default ids (row numbers) collide with ids given earlier; pass ids")
                labels = np.concatenate([labels, new])
            # labels are published before the rows, so a concurrent search never sees a row without its id
            self._labels = labels
            if (x.dtype == np.float32 and x.flags.c_contiguous) or (x.dtype == np.float16 and self._takes_half()):
                self._add(x)
            else:  # convert chunk by chunk: a large fp16 array never needs a full fp32 copy
                for start in range(0, n, ADD_CHUNK):
                    self._add(np.ascontiguousarray(x[start:start + ADD_CHUNK], dtype=np.float32))

    def search(self, queries: np.ndarray, k: int, **params: Any) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` by inner product: ``(scores float32 (n, k), ids int64 (n, k))``, best first; ``-1`` / ``-inf``
        pad rows when the index holds fewer than ``k`` vectors. ``params`` are the type's search parameters.
        Queries of any real dtype are accepted; float16 ones go to the compiled core as they are."""
        k = check_k(k)
        q = check_shape(queries, self._dim, "queries")
        check_finite(q, "queries")
        if not (q.dtype == np.float16 and self._takes_half()):
            q = np.ascontiguousarray(q, dtype=np.float32)
        n = self._ntotal()
        if n == 0:
            raise InputError(f"cannot search an empty {type(self).__name__}: add vectors first")
        params = take_params(params, self.search_params, f"{type(self).__name__}.search")
        if "threads" in params:
            params["threads"] = check_threads(params["threads"])
        # k beyond the index size: search for what exists, pad the rest (cheap, and no type sizes work by k)
        check_padding(q.shape[0], k, n)
        scores, rows = pad_results(*self._search(q, min(k, n), **params), k)
        check_scores(scores, rows, self.ranks_past_float32)
        labels = self._labels  # read after the search: every row returned has its id published
        if labels is not None:
            ids = np.where(rows >= 0, labels[np.maximum(rows, 0)], -1)
        else:
            ids = rows
        return np.ascontiguousarray(scores, dtype=np.float32), np.ascontiguousarray(ids, dtype=np.int64)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the index to one file (a directory path gets ``index.fdpr`` inside it); returns the file path."""
        from fastdpr.index import fileformat

        # the slash is read from the argument: Path("newdir/") drops it, and newdir would become a file
        named_dir = str(os.fspath(path)).endswith(("/", os.sep))
        path = Path(path)
        if path.is_dir() or named_dir:
            path = path / INDEX_FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = fileformat.open_writer(path, self.kind, compiled=self._uses_compiled_writer())
        if self._labels is not None:
            writer.add("labels", self._labels)
        if self.model_fingerprint:
            writer.meta("model_fingerprint", self.model_fingerprint)
        if self.tuned:
            writer.meta("tuned", json.dumps(self.tuned, sort_keys=True, separators=(",", ":")))
        self._write(writer)
        writer.commit()
        return path

    def _uses_compiled_writer(self) -> bool:
        """Compiled index types write through the C++ writer; pure-Python ones may use either."""
        return False

    def _restore_labels(self, reader: Any) -> None:
        if reader.has("labels"):
            labels = reader.array("labels", np.int64)
            if labels.shape[0] != self._ntotal():
                reader.fail(f"labels hold {labels.shape[0]} ids for {self._ntotal()} vectors")
            # the same rules as ids given to add(): a negative id would read as "missing", a repeated one twice
            if labels.shape[0] and (labels.min() < 0 or np.unique(labels).shape[0] != labels.shape[0]):
                reader.fail("labels are not unique non-negative ids")
            self._labels = np.array(labels)


# ---------------------------------------------------------------------------------------------------------------
# registry, build, load


def index_class(kind: str) -> type[Index]:
    try:
        target = REGISTRY[kind]
    except KeyError:
        raise InputError(f"unknown index type {kind!r}; expected one of {sorted(REGISTRY)}") from None
    module_name, cls_name = target.split(":")
    module = importlib.import_module(module_name)
    return getattr(module, cls_name)


def make_index(spec: str, dim: int, n_hint: int = 0, memory_budget: Any = None) -> Index:
    """An empty (untrained) index for ``spec``; ``n_hint`` (the number of vectors to come) and ``memory_budget``
    (bytes or a size such as ``"2GB"``) shape ``"auto"`` (``fastdpr.index.auto``)."""
    kind, params = parse_spec(spec)
    if kind == "auto":
        from fastdpr.index.auto import resolve_auto

        if memory_budget is not None:
            if "memory_budget" in params:
                raise InputError(f"index spec {spec!r} gives memory_budget, and so does the caller; give one")
            params["memory_budget"] = memory_budget
        kind, params = resolve_auto(n_hint, dim, params)
    elif memory_budget is not None:
        raise InputError(f"memory_budget shapes the 'auto' index only, not {kind!r}")
    return index_class(kind).from_spec(dim, params)


def build_index(vectors: np.ndarray, spec: str = "auto", ids: Any = None, memory_budget: Any = None) -> Index:
    """Build an index over ``vectors`` (n, dim) from a spec string; trains it first when the type needs it.
    ``"auto"`` (the default) chooses the type and shape from n, dim and ``memory_budget`` (``fastdpr.index.auto``);
    ``index.tune(queries)`` then sets its search parameters.

    >>> import numpy as np
    >>> from fastdpr.index import build_index
    >>> x = np.random.default_rng(0).standard_normal((1000, 64)).astype(np.float32)
    >>> x /= np.linalg.norm(x, axis=1, keepdims=True)
    >>> index = build_index(x, "flat")
    >>> scores, ids = index.search(x[:2], k=5)
    >>> ids[:, 0].tolist()
    [0, 1]
    """
    if not isinstance(vectors, np.ndarray):
        vectors = check_matrix(vectors, None, "vectors")
    if vectors.ndim != 2 or vectors.shape[0] == 0:
        raise InputError(f"build_index needs a non-empty 2-D array of vectors, got shape {vectors.shape}")
    index = make_index(spec, vectors.shape[1], n_hint=vectors.shape[0], memory_budget=memory_budget)
    if not index.is_trained:
        index.train(vectors)
    index.add(vectors, ids=ids)
    return index


def resolve_index_path(path: str | os.PathLike) -> Path:
    path = Path(path)
    if path.is_dir():
        path = path / INDEX_FILE_NAME
    if not path.exists():
        raise InputError("index file not found", path=str(path))
    if not path.is_file():  # a FIFO or a device: opening it could wait forever
        raise InputError("not a valid fastdpr index: not a regular file", path=str(path))
    return path


def load_index(path: str | os.PathLike, mmap: bool = False) -> Index:
    """Load an index saved by ``Index.save`` (a file, or a directory holding ``index.fdpr``); the type comes from
    the file's header. ``mmap=True`` leaves large vector blocks in the file mapping instead of copying them.

    A truncated or corrupted file raises ``InputError`` (a ``ValueError``) naming the file: a file whose size
    disagrees with its header and section table is refused at open. With ``mmap=True`` the file must not then be
    truncated or rewritten in place while it is mapped: the operating system kills a process that reads a page
    that is gone (SIGBUS), which no check at open can prevent. fastdpr never does that to its own files (``save``
    writes a new file and renames it over the old one, so a mapping keeps the old contents); other tools must not
    either."""
    from fastdpr.index import fileformat

    path = resolve_index_path(path)
    reader = fileformat.open_reader(path)
    cls = index_class(reader.type)
    try:
        index = cls._read(reader, mmap=mmap)
    except InputError:
        raise
    except ValueError as exc:  # the compiled loaders' FormatError names the file already
        raise InputError(str(exc)) from None
    index._restore_labels(reader)
    if reader.has_meta("model_fingerprint"):
        index.model_fingerprint = reader.meta("model_fingerprint")
    if reader.has_meta("tuned"):  # absent from files written before tune
        try:
            tuned = json.loads(reader.meta("tuned"))
        except ValueError:
            tuned = None
        if not isinstance(tuned, dict):
            reader.fail("metadata 'tuned' is not a JSON object")
        index.tuned = tuned
    return index
