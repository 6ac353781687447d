"""Dense retrieval: encode questions with a bi-encoder, search a MIPS index; its rows are corpus rows."""
from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from fastdpr.errors import InputError
from fastdpr.retrieve.base import Questions, Retriever, check_k, check_question_vectors, check_questions


def check_same_model(model, index) -> None:
    """Refuse a question encoder other than the model that encoded the index's passages: vectors of another model
    of the same dimension are searched without complaint and retrieve nonsense. An index whose file records the
    passage model's fingerprint (``fastdpr index`` carries it over from the vectors' manifest) is compared with
    ``model``; an index without one, or a model fastdpr cannot fingerprint, is taken as it is."""
    from fastdpr.errors import InputError

    expected = getattr(index, "model_fingerprint", None)
    if not expected or not hasattr(model, "passage_encoder"):
        return
    from fastdpr.encode.fingerprint import model_fingerprint

    found = model_fingerprint(model)
    if found != expected:
        raise InputError(f"the index holds passages encoded by another model (fingerprint {expected}; this model's "
                         f"is {found}): search with the model that encoded them, or allow it knowingly "
                         "(--allow-other-model; DenseRetriever(..., allow_other_model=True))")


class DenseRetriever(Retriever):
    """Questions -> ``model.encode_questions`` -> ``index.search`` -> passages (scores are inner products).

    ``search``, ``ranked_ids`` and ``retrieve`` take question texts or their vectors: a float array of shape
    ``(n, d)`` (``(d,)`` for one question), searched as given. ``encode(questions)`` gives the vectors a search of
    the texts computes (the question encoder as this retriever runs it: its precision, batch size and device; no
    normalisation added), and searching them returns exactly what searching the texts does: both go to the index
    in the same rounds of ``chunk_size`` questions.

    ``index`` ids are corpus rows (int64; −1 marks "fewer than k found" and is skipped). An index that records
    the fingerprint of the model that encoded its passages refuses another ``model`` (:func:`check_same_model`)
    unless ``allow_other_model``.

    Example::

        r = DenseRetriever(BiEncoder.from_pretrained("model/"), load_index("index/"), Corpus.open("psgs.tsv"))
        top = r.retrieve(["who wrote hamlet"], k=20)   # [[{"id", "title", "text", "score"}, ...]]
        vectors = r.encode(["who wrote hamlet"])        # (1, d) float32
        scores, rows = r.search(vectors, k=20)          # as r.search(["who wrote hamlet"], k=20)
    """

    def __init__(self, model, index, corpus, *, batch_size: int = 64, chunk_size: int = 4096, device=None,
                 search_params: dict | None = None, show_progress: bool = False, precision: str = "auto",
                 allow_other_model: bool = False):
        if not allow_other_model:
            check_same_model(model, index)
        if corpus is not None and hasattr(index, "__len__") and len(index) > len(corpus):
            raise InputError(f"the index has {len(index)} vectors but the corpus {len(corpus)} passages: they were "
                             "not built from the same passage file")
        self.model = model
        self.index = index
        self.corpus = corpus
        self.batch_size = batch_size
        self.chunk_size = chunk_size  # questions encoded and searched per round: bounds memory on big QA sets
        self.device = device
        self.search_params = dict(search_params or {})
        self.show_progress = show_progress
        # question-encoder precision (auto, fp32, bf16, fp16, int8); one question takes the model's warm path
        self.precision = precision

    @property
    def dim(self) -> int | None:
        """The index's vector size (fastdpr indexes: ``dim``, faiss ones: ``d``), else the model's; None when
        neither says."""
        for owner, name in ((self.index, "dim"), (self.index, "d"), (self.model, "dim")):
            value = getattr(owner, name, None)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
                return int(value)
        return None

    def encode(self, questions: Sequence[str]) -> np.ndarray:
        """``(n, d)`` float32 vectors of ``questions``, the ones ``search`` would search with."""
        parts = list(self._encoded_rounds(check_questions(questions)))
        return np.concatenate(parts) if parts else np.zeros((0, self.dim or 0), np.float32)

    def search(self, questions: Questions, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Raw index output for ``questions`` (texts or vectors): ``(scores float32 (n, k), rows int64 (n, k))``."""
        k = check_k(k)
        if isinstance(questions, np.ndarray):
            rounds = self._rounds(check_question_vectors(questions, self.dim))
        else:
            rounds = self._encoded_rounds(check_questions(questions))
        all_scores, all_rows = [], []
        for vectors in rounds:
            scores, rows = self.index.search(vectors, k, **self.search_params)
            all_scores.append(np.asarray(scores, dtype=np.float32))
            all_rows.append(np.asarray(rows, dtype=np.int64))
        if not all_scores:
            return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
        rows = np.concatenate(all_rows)
        if self.corpus is not None and rows.size and int(rows.max()) >= len(self.corpus):
            raise InputError(f"the index answered row {int(rows.max())} but the corpus has {len(self.corpus)} "
                             "passages: they were not built from the same passage file")
        return np.concatenate(all_scores), rows

    def _rounds(self, vectors: np.ndarray) -> Iterator[np.ndarray]:
        """``vectors`` in the rounds the texts they stand for would be encoded and searched in."""
        for start in range(0, len(vectors), self.chunk_size):
            yield vectors[start : start + self.chunk_size]

    def _encoded_rounds(self, questions: list[str]) -> Iterator[np.ndarray]:
        """The vectors of ``questions``, ``chunk_size`` at a time, float32 and C-contiguous as indexes take them."""
        # precision only when asked for: any object with encode_questions(...) may serve as the model
        extra = {"precision": self.precision} if self.precision != "auto" else {}
        for start in range(0, len(questions), self.chunk_size):
            vectors = self.model.encode_questions(questions[start : start + self.chunk_size],
                                                  batch_size=self.batch_size, device=self.device,
                                                  show_progress=self.show_progress, **extra)
            yield np.ascontiguousarray(vectors, dtype=np.float32)
