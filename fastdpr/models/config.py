"""``BiEncoderConfig``: everything about a dual encoder that is not a weight, stored as ``fastdpr.json``."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from fastdpr.errors import InputError

POOLINGS = ("cls", "mean")
SIMILARITIES = ("dot", "cosine")
CONFIG_NAME = "fastdpr.json"
FORMAT_VERSION = 1


@dataclass
class BiEncoderConfig:
    """How the two towers turn token states into vectors and how vectors are compared.

    DPR (the default): separate towers, raw last-layer [CLS], dot product, 256 tokens per side.
    GTR-style: ``shared=True, pooling="mean", similarity="cosine", temperature=0.05``.

    Example::

        cfg = BiEncoderConfig(pooling="mean", similarity="cosine", temperature=0.05, shared=True)
        cfg.scale  # 20.0: scores are cos / temperature
    """

    pooling: str = "cls"
    similarity: str = "dot"
    # only used with cosine similarity (dot-product scores are never scaled: DPR has no temperature)
    temperature: float = 0.05
    shared: bool = False
    projection_dim: int = 0
    max_question_length: int = 256
    max_passage_length: int = 256
    # token_type_ids for the text segment of ``[CLS] title [SEP] text [SEP]``: the original DPR code feeds all
    # zeros; models fine-tuned elsewhere on tokenizer pair encodings may want 1 there.
    pair_token_types: bool = False
    # lowercase text before tokenising (a sentence-transformers ``do_lower_case`` setting)
    lowercase: bool = False

    def __post_init__(self) -> None:
        if self.pooling not in POOLINGS:
            raise InputError(f"unknown pooling {self.pooling!r}; expected one of {', '.join(POOLINGS)}")
        if self.similarity not in SIMILARITIES:
            raise InputError(f"unknown similarity {self.similarity!r}; expected one of {', '.join(SIMILARITIES)}")
        if not (isinstance(self.temperature, (int, float)) and self.temperature > 0):
            raise InputError(f"temperature must be a positive number, got {self.temperature!r}")
        for name in ("max_question_length", "max_passage_length"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 2):
                raise InputError(f"{name} must be an integer >= 2 (room for [CLS] and [SEP]), got {value!r}")
        if not (isinstance(self.projection_dim, int) and self.projection_dim >= 0):
            raise InputError(f"projection_dim must be a non-negative integer, got {self.projection_dim!r}")

    @property
    def scale(self) -> float:
        """Multiplier applied to inner products in the loss: 1 for dot, 1/temperature for cosine."""
        return 1.0 if self.similarity == "dot" else 1.0 / float(self.temperature)

    @property
    def normalize(self) -> bool:
        return self.similarity == "cosine"

    def to_dict(self) -> dict:
        return {"format_version": FORMAT_VERSION, **dataclasses.asdict(self)}

    @classmethod
    def from_dict(cls, data: dict, path: str | None = None) -> "BiEncoderConfig":
        data = dict(data)
        version = data.pop("format_version", FORMAT_VERSION)
        if version > FORMAT_VERSION:
            raise InputError(f"written by a newer fastdpr (format_version {version})", path=path)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"unknown fields {unknown}", path=path)
        try:
            return cls(**data)
        except InputError as err:
            raise InputError(err.reason, path=path) from None

    def save(self, directory: str | Path) -> None:
        from fastdpr.atomic import write_json

        write_json(Path(directory) / CONFIG_NAME, self.to_dict())

    @classmethod
    def load(cls, directory: str | Path) -> "BiEncoderConfig":
        path = Path(directory) / CONFIG_NAME
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise InputError(f"not valid JSON ({err.msg})", path=str(path), line=err.lineno) from None
        if not isinstance(data, dict):
            raise InputError("expected a JSON object", path=str(path))
        return cls.from_dict(data, path=str(path))

    def replace(self, **changes) -> "BiEncoderConfig":
        return dataclasses.replace(self, **changes)
