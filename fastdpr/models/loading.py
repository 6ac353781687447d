"""Reading the ecosystem's model directories: plain Hugging Face encoders, sentence-transformers models and
HF DPR checkpoints. Only metadata is interpreted here; weights are loaded by transformers itself."""
from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

from fastdpr.errors import InputError, MissingDependency

log = logging.getLogger("fastdpr.models")

# a model_max_length this large means "no limit set" in transformers
_UNSET_MAX_LENGTH = 10**9


@contextlib.contextmanager
def hf_quiet():
    """Silence transformers' own warnings and per-file progress bars ("Loading weights", "Writing model shards")
    while fastdpr loads or saves a model: fastdpr reports its own progress, and checkpoints are saved often."""
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def read_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON ({err.msg})", path=str(path), line=err.lineno) from None
    if not isinstance(data, dict) and not isinstance(data, list):
        raise InputError("expected a JSON object or list", path=str(path))
    return data


def resolve_model(name: str | Path) -> Path:
    """The directory of a model given as a directory or as a Hugging Face name (``org/model``): a name is looked up
    in the local Hugging Face cache only (fastdpr never downloads a model behind the user's back); a name that is
    not there is an ``InputError`` saying how to get it."""
    path = Path(name)
    if path.exists() or not _looks_like_hub_name(str(name)):
        return path
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE
    except ImportError:  # pragma: no cover - transformers depends on huggingface_hub
        raise InputError("model directory not found", path=str(path)) from None
    try:
        return Path(snapshot_download(str(name), local_files_only=True))
    except Exception:  # huggingface_hub raises several error types for "not in the cache"
        raise InputError(
            f"neither a model directory nor a model in the local Hugging Face cache ({HF_HUB_CACHE}): download it "
            f"first (huggingface-cli download {name}) or give the directory it is in", path=str(path)) from None


def _looks_like_hub_name(name: str) -> bool:
    """``bert-base-uncased`` or ``org/model``: no more than one slash, no leading dot or slash, no backslash."""
    import re

    return re.fullmatch(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?", name) is not None


def directory_kind(path: Path) -> str:
    """``fastdpr`` | ``sentence-transformers`` | ``dpr`` | ``hf``; InputError when it is none of them."""
    path = Path(path)
    if not path.is_dir():
        raise InputError("model directory not found", path=str(path))
    if (path / "fastdpr.json").is_file():
        return "fastdpr"
    if (path / "modules.json").is_file():
        return "sentence-transformers"
    if (path / "config.json").is_file():
        config = read_json(path / "config.json")
        if isinstance(config, dict) and config.get("model_type") == "dpr":
            return "dpr"
        return "hf"
    raise InputError("not a model directory (no fastdpr.json, modules.json or config.json)", path=str(path))


def load_encoder(path: str | Path):
    """An encoder-only ``transformers`` model from a directory (offline, no BERT pooler: it is never used, and an
    unused parameter would break DDP). Weights the checkpoint lacks are reported, the dropped pooler is not."""
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type in ("t5", "mt5", "umt5"):
        from transformers import T5EncoderModel as model_class
        kwargs = {}
    else:
        model_class = AutoModel
        # BERT-family classes take add_pooling_layer; pooling is ours
        kwargs = {"add_pooling_layer": False}
    with hf_quiet():
        try:
            model, info = model_class.from_pretrained(path, local_files_only=True, output_loading_info=True, **kwargs)
        except TypeError:
            model, info = model_class.from_pretrained(path, local_files_only=True, output_loading_info=True)
    missing = [k for k in info.get("missing_keys", ()) if not k.endswith("position_ids")]
    if missing:
        log.warning("%s: %d weights not in the checkpoint were newly initialised: %s", path, len(missing),
                    ", ".join(sorted(missing)[:6]) + (" ..." if len(missing) > 6 else ""))
    unexpected = [k for k in info.get("unexpected_keys", ()) if not k.startswith("pooler.")]
    if unexpected:
        log.info("%s: ignored %d checkpoint weights: %s", path, len(unexpected), ", ".join(sorted(unexpected)[:6]))
    return model


def load_tokenizer(*candidates: str | Path):
    """The tokenizer of the first candidate directory that has one."""
    from transformers import AutoTokenizer

    for path in candidates:
        if path is None:
            continue
        path = Path(path)
        if any((path / name).is_file() for name in ("tokenizer.json", "vocab.txt", "tokenizer_config.json",
                                                      "spiece.model", "vocab.json")):
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
    raise InputError("no tokenizer files found", path=str(next(p for p in candidates if p is not None)))


def max_positions(encoder) -> int | None:
    value = getattr(encoder.config, "max_position_embeddings", None)
    if isinstance(value, int) and value > 0:
        # RoBERTa reserves two positions for the padding offset
        if getattr(encoder.config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
            value -= 2
        return value
    return None


@dataclass
class SentenceTransformersSpec:
    """What a sentence-transformers directory says about itself."""

    transformer_path: Path
    pooling: str
    normalize: bool
    similarity: str
    max_length: int | None
    lowercase: bool


def _pooling_from_st_config(data: dict, path: Path) -> str:
    if "pooling_mode" in data and isinstance(data["pooling_mode"], (str, list)):
        modes = data["pooling_mode"] if isinstance(data["pooling_mode"], list) else [data["pooling_mode"]]
    else:
        modes = [key[len("pooling_mode_"):] for key, on in data.items() if key.startswith("pooling_mode_") and on]
    names = {"cls_token": "cls", "cls": "cls", "mean_tokens": "mean", "mean": "mean"}
    if len(modes) != 1 or modes[0] not in names:
        raise InputError(f"unsupported sentence-transformers pooling {modes}; fastdpr supports exactly one of "
                         "cls or mean", path=str(path))
    return names[modes[0]]


def read_sentence_transformers(path: str | Path) -> SentenceTransformersSpec:
    """Interpret ``modules.json`` (Transformer -> Pooling [-> Normalize]); other modules are refused, since
    silently skipping one (a Dense layer, say) would give different vectors."""
    path = Path(path)
    modules = read_json(path / "modules.json")
    if not isinstance(modules, list):
        raise InputError("expected a list of modules", path=str(path / "modules.json"))
    transformer_path = None
    pooling = None
    normalize = False
    for module in modules:
        kind = str(module.get("type", "")).rsplit(".", 1)[-1]
        sub = path / module.get("path", "")
        if kind == "Transformer":
            transformer_path = sub
        elif kind == "Pooling":
            pooling = _pooling_from_st_config(read_json(sub / "config.json"), sub / "config.json")
        elif kind == "Normalize":
            normalize = True
        else:
            raise InputError(f"unsupported sentence-transformers module {module.get('type')!r} "
                             "(fastdpr reads Transformer, Pooling and Normalize)", path=str(path / "modules.json"))
    if transformer_path is None or pooling is None:
        raise InputError("a sentence-transformers model needs a Transformer and a Pooling module",
                         path=str(path / "modules.json"))
    max_length = None
    lowercase = False
    st_config = transformer_path / "sentence_bert_config.json"
    if st_config.is_file():
        data = read_json(st_config)
        if isinstance(data.get("max_seq_length"), int):
            max_length = data["max_seq_length"]
        lowercase = bool(data.get("do_lower_case", False))
    similarity = "cosine" if normalize else "dot"
    meta = path / "config_sentence_transformers.json"
    if not normalize and meta.is_file():
        name = read_json(meta).get("similarity_fn_name")
        if name == "cosine":
            similarity = "cosine"
    return SentenceTransformersSpec(transformer_path, pooling, normalize, similarity, max_length, lowercase)


def tokenizer_max_length(tokenizer) -> int | None:
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < _UNSET_MAX_LENGTH:
        return value
    return None


def load_dpr_tower(path: str | Path, kind: str):
    """(BertModel, projection Linear or None) from an HF DPRQuestionEncoder / DPRContextEncoder directory.

    The BERT is rebuilt as a plain ``BertModel`` so that a saved fastdpr directory loads with ``AutoModel``; its
    weights are those transformers itself loaded into the DPR class, so outputs are identical."""
    import torch
    from transformers import BertConfig, BertModel, DPRContextEncoder, DPRQuestionEncoder

    path = Path(path)
    if directory_kind(path) != "dpr":
        raise InputError("not a Hugging Face DPR checkpoint (config.json model_type is not 'dpr')", path=str(path))
    cls, attr = (DPRQuestionEncoder, "question_encoder") if kind == "question" else (DPRContextEncoder, "ctx_encoder")
    dpr = cls.from_pretrained(path, local_files_only=True)
    inner = getattr(dpr, attr, None)
    if inner is None:
        raise InputError(f"expected a {cls.__name__} checkpoint", path=str(path))
    bert_config = BertConfig(**{k: v for k, v in dpr.config.to_dict().items()
                                if k not in ("model_type", "architectures", "projection_dim", "transformers_version")})
    bert = BertModel(bert_config, add_pooling_layer=False)
    missing, unexpected = bert.load_state_dict(inner.bert_model.state_dict(), strict=False)
    # position_ids-style buffers may differ between versions; real weights may not
    if [k for k in missing if not k.endswith("_ids")] or unexpected:
        raise InputError(f"DPR weights do not fit a BERT model (missing {missing}, unexpected {unexpected})",
                         path=str(path))
    projection = None
    if getattr(dpr.config, "projection_dim", 0) > 0:
        projection = torch.nn.Linear(inner.encode_proj.in_features, inner.encode_proj.out_features)
        projection.load_state_dict(inner.encode_proj.state_dict())
    return bert, projection


def require_safetensors():
    try:
        import safetensors.torch as st
    except ImportError as err:  # pragma: no cover - transformers depends on it
        raise MissingDependency("saving a projection needs the safetensors package (pip install safetensors)") from err
    return st
