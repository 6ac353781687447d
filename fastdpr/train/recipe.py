"""The fine-tuning recipe fastdpr recommends for adapting a pretrained dual encoder with little compute, and the
evidence for it. The quickstart uses it (its results on the published QA sets: ``benchmarks/results/quickstart.md``);
``TrainingArguments`` and ``BiEncoderArguments`` keep DPR's own defaults for training from scratch
(docs/architecture.md, "DPR training defaults").

Why each choice. The ablations behind them ran on 2 CPU cores on an earlier data set (NQ paragraphs, SQuAD dev and
SQuADShifts NYT from a package archive that is no longer published): ``benchmarks/results/recipe_ablation.md`` and
``quality.md`` at commit c97483c; they are not yet repeated on the published sets.

* **A mixture of sources** (the target domain plus NQ and other Wikipedia questions): training on one domain's
  questions alone moves the model toward that domain and away from what it knew; the other sources keep it.
* **One BM25 hard negative per question** (DPR): it teaches the lexical precision SQuAD-style questions need; two
  cost 1.4x the training time for no difference beyond noise (``quickstart_hard_negatives.md`` at c97483c).
* **Warm-up over 10% of the steps, then linear decay**, AdamW, clipping at 2.0 (DPR).
* **bf16 autocast where the processor has native bf16** (AMX / AVX-512 BF16 on CPUs, any recent GPU): the same
  accuracy at a fraction of the time; fp32 elsewhere.
* **Batch 128, through GradCache above ``chunk_size`` questions per batch**: more in-batch negatives kept NQ
  (which the packaged model knew) where batch 32 lost a little, in the memory of a batch of 32.
* **Validation during training, best checkpoint kept**, so a run that starts to forget is cut where it was best.
* **Weight interpolation with the starting model** (WiSE-FT, Wortsman et al., CVPR 2022): the saved model is
  start + ``INTERPOLATE``·(trained − start). Fine-tuned alone, the packaged MiniLM gained on NYT but lost on NQ,
  which it had been trained on; halfway between the two it kept most of the gain and lost almost nothing.
* **Frozen word embeddings**: half of a small encoder's weights, rarely worth moving with a few thousand
  questions; the optimizer step gets cheaper and the vocabulary keeps its pretrained geometry.
* **No dropout on attention probabilities** (hidden-state dropout stays): torch's fused CPU attention has no
  dropout, so with it every attention runs unfused and a step takes longer; a few hundred steps of
  fine-tuning gain nothing from that regularisation.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the trainer imports torch; the recipe's constants must not
    from fastdpr.train.biencoder import BiEncoderArguments
    from fastdpr.train.trainer import TrainingArguments


#: share of each prepared training source in the examples seen (fastdpr.data.sources names)
# (new Wikipedia's SQuAD-style questions are the lexical precision the starting model lacks; QED's NQ questions keep
# what it knew; QED has 550 training questions, so a quarter of 2,048 uses nearly all of them)
DEFAULT_MIXTURE = {"new_wiki": 0.75, "qed": 0.25}
DEFAULT_LR = 1e-4
# batch 128 through GradCache (the memory of `chunk_size` questions): in the quickstart the batch of 32 left NQ test
# 0.004 below the starting model at top-20 and the batch of 128 kept it above (.923 vs .920) with NYT at .904; in the
# quality benchmark batch 128 was the best on NQ and within .002 of the best on NYT
DEFAULT_BATCH = 128
WARMUP = 0.1
INTERPOLATE = 0.5


def mixture_counts(mixture: dict[str, float], total: int) -> dict[str, int]:
    """How many examples of each source make ``total``, in the mixture's proportions (largest remainders)."""
    if not mixture or any(v < 0 for v in mixture.values()) or sum(mixture.values()) <= 0:
        raise ValueError(f"a mixture needs non-negative shares with a positive sum, got {mixture!r}")
    weight = sum(mixture.values())
    exact = {k: total * v / weight for k, v in mixture.items()}
    counts = {k: int(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True)[: total - sum(counts.values())]:
        counts[k] += 1
    return counts


def arguments(output_dir: str, examples: int, batch_size: int = DEFAULT_BATCH, lr: float = DEFAULT_LR,
              chunk_size: int = 32, eval_times: int = 2, device: str | None = None, seed: int = 0,
              show_progress: bool = True, **overrides) -> tuple[TrainingArguments, BiEncoderArguments]:
    """(``TrainingArguments``, ``BiEncoderArguments``) of the recipe for ``examples`` training questions seen once
    (steps = examples // batch_size), validating ``eval_times`` times, evenly spaced. ``overrides`` name fields of
    either class."""
    import torch

    from fastdpr.models.inference import bf16_supported
    from fastdpr.train.biencoder import split_arguments

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    steps = max(1, examples // batch_size)
    settings = dict(
        output_dir=output_dir, batch_size=batch_size, n_hard=1, epochs=1, max_steps=steps, lr=lr,
        warmup_steps=WARMUP, max_grad_norm=2.0, precision="bf16" if bf16_supported(device) else "fp32",
        grad_cache=batch_size > chunk_size, chunk_size=chunk_size, seed=seed,
        eval_steps=max(1, steps // max(1, eval_times)), save_steps=10**9, save_total_limit=1,
        best_metric="avg_rank", logging_steps=max(1, steps // 10), show_progress=show_progress, device=device,
        interpolate=INTERPOLATE, freeze_word_embeddings=True, attention_dropout=0.0,
        # the Triton interpreter is a test vehicle, not a CPU backend: on a CPU the chunked torch loss is used
        loss_backend="auto" if device.startswith("cuda") else "torch",
    )
    settings.update(overrides)
    return split_arguments(settings)
