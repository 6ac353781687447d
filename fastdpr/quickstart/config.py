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
    source_dir: str | None = None  # take the published files from a local folder instead of the network
    threads: int | None = None  # torch threads for encoding and training (None: all cores); speed is 1 thread
    show_progress: bool = True
    seed: int = 0
    # questions a test set keeps (None: all), and validation questions for the hybrid weight reported beside
    # the untuned default
    test_questions: int | None = 1000
    dev_questions: int | None = 200
    # the corpus: every paragraph of every set, one passage each (None); a number caps it, the test questions'
    # gold paragraphs always kept
    max_passages: int | None = None
    # dual encoder (GTR-style, as the packaged model was trained)
    question_length: int = 32
    # the packaged model's own limit; 840 of the 7,247 paragraphs are longer (QED's longest has 1,835 words) and
    # are cut, the count reported with the results
    passage_length: int = 256
    temperature: float = 0.05
    # the recipe (fastdpr.train.recipe); examples asked for = train_examples (fewer when a source runs out),
    # steps = examples seen // batch_size
    train_mixture: dict = field(default_factory=lambda: dict(DEFAULT_MIXTURE))
    # 6,144 requested at batch 128 (GradCache in chunks of 32): the mixture's QED share is capped by QED's 550
    # training questions, so 5,158 are seen in 40 steps; the model is saved at start + interpolate x (trained -
    # start). Both chosen on the validation questions only (benchmarks/results/recipe_tune.md: mean validation
    # top-20 .9787 against .9685 for 2,048 examples at 0.5)
    train_examples: int = 6144
    interpolate: float = 0.75
    dev_examples: int = 256  # validation records (the dev splits' own questions and paragraphs)
    batch_size: int = DEFAULT_BATCH
    chunk_size: int = 32  # GradCache sub-batch: larger batches cost the memory of this many
    lr: float = DEFAULT_LR
    eval_times: int = 2  # validations during training (best checkpoint kept)
    mine_hard: int = 1  # BM25 hard negatives mined per question, and used per question in training
    mine_depth: int = 30
    encode_batch_size: int = 64
    # encoders' precision for passages and questions: "fast" is bf16 where the hardware runs it natively (AMX /
    # AVX512-BF16 CPUs, CUDA) and the exact default elsewhere; bf16 vectors keep top-20 accuracy
    # (benchmarks/results/encode.md at c97483c) at 1.8x (AVX512-BF16) to 4.4x (AMX) the fp32 passages/s
    encode_precision: str = "fast"
    index_spec: str = "flat"
    k_union: int = 200  # hybrid: union of each side's top-K
    # reader: trained here from the packaged MiniLM for a fixed number of steps on the training questions, so
    # every machine gets the same reader however loaded it is (a time budget gave a busy machine a reader that
    # answered worse from the top 5 passages than from the top 1)
    reader_train_questions: int | None = None
    # None: every training question once (new Wikipedia's 6,197 and QED's 550 as they come); a mixture such as
    # {"new_wiki": 0.75, "qed": 0.25} draws reader_steps x reader_batch_size questions in those shares instead,
    # repeating a source's questions (in hash order) when it has fewer
    reader_mixture: dict | None = None
    reader_steps: int = 800
    reader_batch_size: int = 8  # questions a step
    reader_passages: int = 2  # passages a question in training: its positive and reader_passages - 1 negatives
    reader_lr: float = 1e-4
    reader_train_length: int = 192  # tokens of a training row (question + passage); reading uses 256
    reader_top_k: int = 5
    reader_test_questions: int | None = None  # NQ test questions read (None: all)
    reader_squad_questions: int | None = 1000  # XQuAD questions read from their gold paragraph
    # speed
    speed_questions: int = 100

    @classmethod
    def preset(cls, fast: bool = False, **overrides) -> "QuickstartConfig":
        """The default run, or ``fast`` (a smoke run on a small subset — still the real packaged model and the
        real data)."""
        if fast:
            base = dict(
                fast=True, test_questions=100, dev_questions=40, max_passages=1500,
                train_examples=128, dev_examples=32, batch_size=32, eval_times=1,
                reader_train_questions=200, reader_steps=30, reader_top_k=3, reader_test_questions=40,
                reader_squad_questions=40, speed_questions=40, k_union=100,
            )
        else:
            base = {}
        base.update({k: v for k, v in overrides.items() if v is not None})
        if overrides.get("reader_mixture") and overrides.get("reader_train_questions") is None:
            base.pop("reader_train_questions", None)  # a mixture sets its own count (the fast preset's 200 goes)
        return cls(**base)

    def __post_init__(self) -> None:
        if self.reader_mixture and self.reader_train_questions is not None:
            from fastdpr.errors import InputError

            raise InputError(
                f"reader_mixture {self.reader_mixture} and reader_train_questions {self.reader_train_questions} "
                "are both set: a mixture draws reader_steps x reader_batch_size questions itself; set one of them")

    def settings(self) -> dict:
        """What changes the results (not where they go or how they are shown)."""
        skip = {"out", "cache", "force", "source_dir", "threads", "show_progress"}
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in skip}
