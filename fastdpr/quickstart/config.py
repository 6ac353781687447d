"""Sizes and settings of a quickstart run."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from fastdpr.train.recipe import DEFAULT_BATCH, DEFAULT_LR, DEFAULT_MIXTURE


@dataclass
class QuickstartConfig:
    """Sizes and settings of a quickstart run. ``None`` for a count means "all available"."""

    out: str = "quickstart"
    cache: str | None = None
    fast: bool = False
    force: bool = False
    source_dir: str | None = None  # take the archives from a local directory instead of the package index
    threads: int | None = None  # torch threads for encoding and training (None: all cores); speed is 1 thread
    show_progress: bool = True
    seed: int = 0
    # held-out questions
    nq_test: int = 1000
    squad_test: int = 1000
    nyt_test: int = 500
    nq_dev: int = 200  # hybrid tuning (reported beside the untuned default)
    nyt_dev: int = 100
    # evaluation pool: gold paragraphs of the questions above plus distractors, cut into `passage_words`-word
    # passages, up to `max_passages` (0 or None: every paragraph of every source)
    max_passages: int | None = 5000
    passage_words: int = 100
    # dual encoder (GTR-style, as the packaged model was trained)
    question_length: int = 32
    passage_length: int = 192  # 100 words + title fit: the encoder reads what BM25 reads
    temperature: float = 0.05
    # the recipe (fastdpr.train.recipe); examples seen = train_examples, steps = train_examples // batch_size
    train_mixture: dict = field(default_factory=lambda: dict(DEFAULT_MIXTURE))
    # 2,048 examples at batch 128 (16 steps, GradCache in chunks of 32): on NQ test the batch of 128 kept what the
    # starting model knew where batch 32 lost 0.004 at top-20, and the extra examples took NYT test top-20 from
    # 0.890 to 0.904 (benchmarks/results/quickstart.md; the quality benchmark shows the same for batch 128)
    train_examples: int = 2048
    dev_examples: int = 128
    batch_size: int = DEFAULT_BATCH
    chunk_size: int = 32  # GradCache sub-batch: larger batches cost the memory of this many
    lr: float = DEFAULT_LR
    eval_times: int = 2  # validations during training (best checkpoint kept)
    mine_hard: int = 1  # BM25 hard negatives mined per question, and used per question in training
    mine_depth: int = 30
    encode_batch_size: int = 64
    # encoders' precision for passages and questions: "fast" is bf16 where the hardware runs it natively (AMX /
    # AVX512-BF16 CPUs, CUDA) and the exact default elsewhere; bf16 vectors keep top-20 accuracy
    # (benchmarks/results/encode.md) at 1.8x (AVX512-BF16) to 4.4x (AMX) the fp32 passages/s
    encode_precision: str = "fast"
    index_spec: str = "flat"
    k_union: int = 200  # hybrid: union of each side's top-K
    # reader: the reader benchmark's, when cached (reader_from_cache); else one trained here from the packaged
    # MiniLM for a fixed number of steps, so every machine gets the same reader however loaded it is (a time
    # budget gave a busy machine a reader that answered worse from the top 5 passages than from the top 1)
    reader_from_cache: bool = True
    reader_train_questions: int = 2000
    reader_steps: int = 300
    reader_batch_size: int = 8  # questions a step
    reader_passages: int = 2  # passages a question in training: its positive and reader_passages - 1 negatives
    reader_lr: float = 1e-4
    reader_train_length: int = 192  # tokens of a training row (question + passage); reading uses 256
    reader_top_k: int = 5
    reader_test_questions: int = 200
    # speed
    speed_questions: int = 100

    @classmethod
    def preset(cls, fast: bool = False, **overrides) -> "QuickstartConfig":
        """The default run, or ``fast`` (a smoke run on a small subset — still the real packaged model and the
        real data)."""
        if fast:
            base = dict(
                fast=True, nq_test=200, squad_test=100, nyt_test=100, nq_dev=60, nyt_dev=40, max_passages=1200,
                train_examples=128, dev_examples=32, batch_size=32, eval_times=1,
                reader_train_questions=200, reader_steps=30, reader_top_k=3, reader_test_questions=40,
                speed_questions=40, k_union=100,
            )
        else:
            base = {}
        base.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**base)

    def settings(self) -> dict:
        """What changes the results (not where they go or how they are shown)."""
        skip = {"out", "cache", "force", "source_dir", "threads", "show_progress"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
