"""Java-free BM25 over a passage corpus, wrapping bm25s (its numba backend when numba is installed).

The scoring, the sparse score matrix and the top-k selection are bm25s's; this module adds what a retrieval
pipeline needs around it: Lucene-compatible analysis defaults, building from a streamed corpus without holding the
passages, string passage ids in and out, batched multi-threaded search, and an atomic on-disk format.

Example::

    from fastdpr.sparse import BM25
    bm25 = BM25.from_corpus([{"id": "p1", "title": "Cats", "text": "Cats purr."},
                             {"id": "p2", "title": "Dogs", "text": "Dogs bark."}])
    scores, ids = bm25.search(["do cats purr"], k=1)     # ids[0, 0] == "p1"
    bm25.save("bm25/");  bm25 = BM25.load("bm25/")
"""
from __future__ import annotations

import array
import contextlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import numpy as np

from fastdpr._renamed import renamed
from fastdpr.errors import InputError

FORMAT_NAME = "fastdpr-bm25"
FORMAT_VERSION = 1
MANIFEST = "fastdpr_bm25.json"
IDS_FILE = "ids.npy"
TOKENIZER_VOCAB = "vocab.tokenizer.json"

# Tokens approximating Lucene's StandardTokenizer + EnglishPossessiveFilter (Anserini's default English analyzer):
# words joined by '.' or an apostrophe stay one token ("u.s.a", "don't"), digits joined by ',' too ("1,000"), and a
# trailing possessive 's is dropped ("obama's" -> "obama"). bm25s's default splitter (\w\w+) would instead drop
# every one-character token and split these, which costs top-10 agreement with Lucene.
LUCENE_LIKE_SPLITTER = r"(?u)(\w+(?:\.\w+|['\u2019](?![sS]\b)\w+|(?<=\d),(?=\d)\w+)*)(?:['\u2019][sS]\b)?"


# BM25 variants that give a passage a score for the query terms it lacks
_NONOCCURRENCE_METHODS = ("bm25l", "bm25+")


def _numba_available() -> bool:
    try:
        import numba  # noqa: F401
    except ImportError:
        return False
    return True


def _max_threads() -> int:
    if _numba_available():
        import numba

        return int(numba.config.NUMBA_NUM_THREADS)
    return os.cpu_count() or 1


class _FlatDocs(Sequence):
    """Token ids of every document in one flat int32 buffer plus offsets.

    bm25s indexes a sequence of per-document id lists; a Python list holds a pointer and an int object per id where
    this buffer holds 4 bytes, which matters when millions of passages are indexed. Items are materialised one
    document at a time."""

    def __init__(self) -> None:
        self._flat = array.array("i")
        self._offsets = array.array("q", [0])

    def append(self, ids: list[int]) -> None:
        self._flat.extend(ids)
        self._offsets.append(len(self._flat))

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):  # Sequence protocol; bm25s only iterates
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        return self._flat[self._offsets[i] : self._offsets[i + 1]].tolist()

    def __iter__(self) -> Iterator[list[int]]:
        flat, offsets = self._flat, self._offsets
        for i in range(len(offsets) - 1):
            yield flat[offsets[i] : offsets[i + 1]].tolist()


def passage_text(passage: dict) -> str:
    """The text BM25 indexes for a passage: title and text together (as Lucene DPR indexes do)."""
    title = passage.get("title") or ""
    text = passage.get("text") or ""
    return f"{title}\n{text}" if title else text


def _make_stemmer(name: str | None):
    if name in (None, "", "none"):
        return None
    import Stemmer  # PyStemmer

    if name not in Stemmer.algorithms():
        raise ValueError(f"unknown stemmer {name!r}; PyStemmer offers {', '.join(Stemmer.algorithms())}")
    return Stemmer.Stemmer(name)


class BM25:
    """A BM25 index over passages with string ids.

    Defaults follow Lucene/Anserini's English BM25 (the DPR paper's BM25 baseline): k1=0.9, b=0.4, Lucene's
    English stopword list, Porter stemming, title and text indexed together. Build with :meth:`from_corpus`,
    query with :meth:`search`, persist with :meth:`save` / :meth:`load`."""

    def __init__(
        self,
        *,
        k1: float = 0.9,
        b: float = 0.4,
        method: str = "lucene",
        stemmer: str | None = "porter",
        stopwords: str | list[str] | None = "english",
        splitter: str = LUCENE_LIKE_SPLITTER,
        backend: str = "auto",
    ) -> None:
        import bm25s

        if k1 < 0 or not 0 <= b <= 1:
            raise ValueError(f"BM25 needs k1 >= 0 and 0 <= b <= 1, got k1={k1}, b={b}")
        if backend == "auto":
            backend = "numba" if _numba_available() else "numpy"
        self.params = {"k1": float(k1), "b": float(b), "method": method, "stemmer": stemmer,
                       "stopwords": stopwords, "splitter": splitter}
        self.backend = backend
        self._stemmer = _make_stemmer(stemmer)
        self.tokenizer = bm25s.tokenization.Tokenizer(
            lower=True, splitter=splitter, stopwords=stopwords or None, stemmer=self._stemmer
        )
        self.retriever = bm25s.BM25(k1=k1, b=b, method=method, backend=backend)
        self._ids: np.ndarray = np.array([], dtype="<U1")
        self.corpus_path: str | None = None

    # ------------------------------------------------------------------ building
    @classmethod
    def from_corpus(
        cls, passages: Iterable[dict], *, show_progress: bool | None = None, total: int | None = None, **params: Any
    ) -> "BM25":
        """Index ``passages`` (an iterable of ``{"id", "title", "text"}`` dicts, or a ``Corpus``), streaming them:
        only token ids are kept, never the passage texts.

        Example: ``BM25.from_corpus(fastdpr.data.iter_passages("psgs.tsv"), k1=0.9, b=0.4)``"""
        bm25 = cls(**params)
        bm25._index(passages, show_progress=show_progress, total=total)
        return bm25

    def _index(self, passages: Iterable[dict], *, show_progress: bool, total: int | None) -> None:
        import bm25s
        from fastdpr.progress import progress

        if total is None and hasattr(passages, "__len__"):
            total = len(passages)  # type: ignore[arg-type]
        docs = _FlatDocs()
        ids: list[str] = []

        def texts() -> Iterator[str]:
            for n, passage in enumerate(passages):
                if not isinstance(passage, dict) or "id" not in passage or "text" not in passage:
                    raise InputError(f"passage #{n} is not a dict with 'id' and 'text' keys: {passage!r:.80}")
                ids.append(str(passage["id"]))
                yield passage_text(passage)

        bar = progress(total=total, desc="BM25 tokenize", unit="psg", enabled=show_progress)
        # allow_empty=False: a passage with no terms gets no postings (bm25s would otherwise give it a "" term
        # that every term-less query then matches)
        for token_ids in self.tokenizer.streaming_tokenize(texts(), update_vocab=True, allow_empty=False):
            docs.append(token_ids)
            bar.update(1)
        bar.close()
        if not ids:
            raise InputError("cannot build a BM25 index from an empty corpus")
        id_array = np.asarray(ids)
        del ids
        _check_unique(id_array)
        vocab = dict(self.tokenizer.stem_to_sid if self._stemmer is not None else self.tokenizer.word_to_id)
        # A term id without postings for queries with no known term. It must be inside the vocabulary bm25s
        # builds its matrix over: bm25s's own fallback appends it past the matrix's last column.
        vocab.setdefault("", len(vocab))
        # bm25s's own tqdm bars only on a terminal: in a log their carriage returns pile up on one line
        self.retriever.index(bm25s.tokenization.Tokenized(ids=docs, vocab=vocab),
                             show_progress=bool(show_progress) and sys.stderr.isatty())
        self._ids = id_array

    # ------------------------------------------------------------------ querying
    def __len__(self) -> int:
        return len(self._ids)

    @property
    def ids(self) -> np.ndarray:
        """Passage ids in index row order (a numpy array of str)."""
        return self._ids

    def tokenize_queries(self, queries: Sequence[str]) -> list[list[int]]:
        """Query token ids in this index's vocabulary (unknown terms dropped)."""
        empty = [self.retriever.vocab_dict[""]]
        return [
            ids or empty
            for ids in self.tokenizer.streaming_tokenize(list(queries), update_vocab=False, allow_empty=False)
        ]

    def search_rows(
        self,
        queries: Sequence[str],
        k: int = 100,
        *,
        threads: int | None = None,
        batch_size: int = 4096,
        show_progress: bool = False,
        n_threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Like :meth:`search` but returns index rows (int64, -1 past the last passage matched) instead of
        passage ids."""
        from fastdpr.progress import progress

        if isinstance(queries, str):
            raise TypeError("search() takes a list of queries, not a single string")
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        if len(self) == 0:
            raise RuntimeError("this BM25 index is empty; build it with BM25.from_corpus or BM25.load")
        k = int(k)
        from fastdpr.index.base import check_padding

        check_padding(len(queries), k, len(self), "the BM25 index", "passages")  # before the (n, k) arrays
        depth = min(k, len(self))  # bm25s ranks at most every passage
        workers = self._threads(_renamed_threads(threads, n_threads))
        n = len(queries)
        # padded as the dense indexes pad: score -inf, row -1 where fewer than k passages match
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        rows = np.full((n, k), -1, dtype=np.int64)
        bar = progress(total=n, desc="BM25 search", unit="q", enabled=show_progress)
        for start in range(0, n, batch_size):
            batch = queries[start : start + batch_size]
            token_ids = self.tokenize_queries(batch)
            if self.params["method"] in _NONOCCURRENCE_METHODS:
                # these variants score every passage, matching or not: bm25s's own search
                docs, batch_scores = self.retriever.retrieve(
                    token_ids, k=depth, show_progress=False, n_threads=workers, sorted=True
                )
            else:
                from fastdpr.sparse import _topk

                starts = np.cumsum([0] + [len(t) for t in token_ids], dtype=np.int64)
                docs, batch_scores = _topk.search(np.concatenate(token_ids), starts, self.retriever.scores, depth,
                                                  threads=workers, backend=self.backend)
            # every BM25 term weight is positive, so a score of 0 means the passage shares no term with the
            # query: no result, however short the list
            matched = batch_scores > 0
            scores[start : start + len(batch), :depth] = np.where(matched, batch_scores, -np.inf)
            rows[start : start + len(batch), :depth] = np.where(matched, docs, -1)
            bar.update(len(batch))
        bar.close()
        return scores, rows

    def search(
        self,
        queries: Sequence[str],
        k: int = 100,
        *,
        threads: int | None = None,
        batch_size: int = 4096,
        show_progress: bool = False,
        n_threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` passages of every query: ``(scores float32 (n, k), ids str (n, k))``, best first.

        Only passages sharing a term with the query are results: where fewer than ``k`` match (or the corpus is
        smaller than ``k``), the tail holds id ``""`` and score ``-inf``, as the dense indexes pad theirs.
        ``threads``: None or 0 = all cores, 1 = this thread only (the index types' search and the CLI's
        ``--threads`` read it the same way; ``n_threads`` is its old, deprecated name).

        Example: ``scores, ids = bm25.search(["who wrote hamlet"], k=100)``"""
        scores, rows = self.search_rows(queries, k, threads=_renamed_threads(threads, n_threads),
                                        batch_size=batch_size, show_progress=show_progress)
        return scores, ids_of_rows(self._ids, rows)

    def _threads(self, threads: int | None) -> int:
        most = _max_threads()
        if threads is None or threads <= 0:
            return most
        return min(int(threads), most)

    # ------------------------------------------------------------------ persistence
    def save(self, path: str | os.PathLike) -> None:
        """Write the index to directory ``path`` atomically: it is built in a temporary sibling directory and
        renamed into place, so ``path`` holds either the old index or the complete new one."""
        path = Path(path)
        if path.exists() and not _replaceable(path):
            raise InputError("refusing to overwrite a directory that is not a fastdpr BM25 index", path=str(path))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            self.retriever.save(tmp, show_progress=False)
            self.tokenizer.save_vocab(tmp, vocab_name=TOKENIZER_VOCAB)
            np.save(tmp / IDS_FILE, self._ids, allow_pickle=False)
            manifest = {
                "format": FORMAT_NAME,
                "version": FORMAT_VERSION,
                "num_docs": len(self),
                "params": self.params,
                "corpus_path": self.corpus_path,
            }
            (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
            for f in tmp.iterdir():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
            _swap_in(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False, backend: str = "auto") -> "BM25":
        """Open an index written by :meth:`save`. ``mmap=True`` maps the score matrix instead of reading it."""
        import bm25s

        path = Path(path)
        manifest = _read_manifest(path)
        params, num_docs = manifest.get("params"), manifest.get("num_docs")
        known = {"k1", "b", "method", "stemmer", "stopwords", "splitter"}
        if not isinstance(params, dict) or not set(params) <= known:
            raise InputError(f"damaged {MANIFEST}: 'params' must be an object with keys from {sorted(known)}",
                             path=str(path))
        if not isinstance(num_docs, int) or isinstance(num_docs, bool) or num_docs < 0:
            raise InputError(f"damaged {MANIFEST}: 'num_docs' must be an integer >= 0, got {num_docs!r}",
                             path=str(path))
        try:
            bm25 = cls(**params, backend=backend)
        except (TypeError, ValueError, KeyError, AttributeError) as err:  # a parameter the analyser cannot take
            raise InputError(f"damaged {MANIFEST}: bad 'params' ({err})", path=str(path)) from None
        # the other files are bm25s's and numpy's: any failure to read them is a damaged (or partial) index
        try:
            bm25.retriever = bm25s.BM25.load(
                path, mmap=mmap, load_corpus=False, show_progress=False, override_params={"backend": bm25.backend}
            )
            bm25.tokenizer.load_vocab(path, vocab_name=TOKENIZER_VOCAB)
            bm25._ids = np.load(path / IDS_FILE, mmap_mode="r" if mmap else None, allow_pickle=False)
            scored = int(bm25.retriever.scores["num_docs"])
        except (OSError, ValueError, KeyError, TypeError, EOFError) as err:
            raise InputError(f"damaged BM25 index: {type(err).__name__}: {err}", path=str(path)) from None
        if bm25._ids.ndim != 1 or bm25._ids.dtype.kind != "U":
            raise InputError(f"damaged BM25 index: {IDS_FILE} must hold one string id per passage", path=str(path))
        bm25.corpus_path = manifest.get("corpus_path")
        if len(bm25._ids) != num_docs or scored != num_docs:
            raise InputError("BM25 index files disagree on the number of passages (a damaged index?)", path=str(path))
        return bm25


def _renamed_threads(threads: int | None, n_threads: int | None) -> int | None:
    return renamed("threads", threads, "n_threads", n_threads, "BM25.search")


def ids_of_rows(ids: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The passage id of every row, ``""`` for row -1 (nothing found)."""
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size and rows.min() >= 0:
        return ids[rows]
    return np.where(rows >= 0, ids[np.maximum(rows, 0)] if len(ids) else "", "")


def _check_unique(ids: np.ndarray) -> None:
    uniq, counts = np.unique(ids, return_counts=True)
    if len(uniq) != len(ids):
        dup = str(uniq[np.argmax(counts > 1)])
        raise InputError(f"passage id {dup!r} occurs {counts.max()} times; passage ids must be unique")


def _read_manifest(path: Path) -> dict:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"not a fastdpr BM25 index (no {MANIFEST})", path=str(path)) from None
    except NotADirectoryError:
        raise InputError("not a fastdpr BM25 index (not a directory)", path=str(path)) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"unreadable {MANIFEST}: {err}", path=str(path)) from None
    if not isinstance(manifest, dict):
        raise InputError(f"unreadable {MANIFEST}: not a JSON object", path=str(path))
    if manifest.get("format") != FORMAT_NAME or manifest.get("version") != FORMAT_VERSION:
        raise InputError(
            f"unsupported BM25 index format {manifest.get('format')!r} v{manifest.get('version')}", path=str(path)
        )
    return manifest


def _replaceable(path: Path) -> bool:
    return path.is_dir() and (not any(path.iterdir()) or (path / MANIFEST).exists())


def _swap_in(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path``; an existing ``path`` is moved aside first and removed only after the swap."""
    old = None
    if path.exists():
        old = path.with_name(f".{path.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)  # left by a run killed mid-swap
        os.rename(path, old)
    try:
        os.rename(tmp, path)
    except BaseException:
        if old is not None:
            os.rename(old, path)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    with contextlib.suppress(OSError):
        fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


__all__ = ["BM25", "LUCENE_LIKE_SPLITTER", "passage_text"]
