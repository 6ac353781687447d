"""Tiny random models and tokenizers for tests, built offline from configs in a temporary directory.

Nothing here downloads anything. The tokenizer is a real WordPiece BERT tokenizer over a small vocabulary
(special tokens, letters, digits, punctuation, ``##`` continuations and a few hundred common English words), so
any ASCII text tokenises without collapsing to ``[UNK]`` and token counts grow with text length like a real one.

Usage::

    from tiny_models import tiny_bert_dir, tiny_biencoder   # tests/ is on sys.path under pytest

    path = tiny_bert_dir(tmp_path)                    # a plain Hugging Face BERT directory
    model = tiny_biencoder(tmp_path, pooling="mean")  # a fastdpr BiEncoder over two tiny towers
    qdir, cdir = tiny_dpr_dirs(tmp_path)              # HF DPRQuestionEncoder / DPRContextEncoder checkpoints
    st_dir = tiny_sentence_transformers_dir(tmp_path) # a sentence-transformers directory (Pooling + Normalize)
"""
from __future__ import annotations

import string
from pathlib import Path

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

_WORDS = """
the of and to in a is was for on that with as by at from he it his an be are which or this had her she not were
they but have their one all been has its first who also more there after new when two would into other can may
him time only over some most years year city people world war state school between during known under called
united states american where such used many three these than while them what about then made being both through
film series team season game album song music band river north south east west part name born family later
since world history life country national government university first second during early work high well
question answer passage title text wikipedia paris france london england berlin germany rome italy water
president king queen church king river island capital population century number large small old new good
how why who whom whose when did does do many much long largest smallest best first last main what which
""".split()


def tiny_vocab() -> list[str]:
    """The vocabulary, in id order: special tokens first ([PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4)."""
    pieces: list[str] = list(SPECIAL_TOKENS)
    chars = string.ascii_lowercase + string.digits
    pieces += list(chars) + list(string.punctuation)
    pieces += ["##" + c for c in chars]
    seen = set(pieces)
    for word in _WORDS:
        if word not in seen:
            seen.add(word)
            pieces.append(word)
    return pieces


def tiny_tokenizer(model_max_length: int = 512):
    """A real (fast, WordPiece) BERT tokenizer over :func:`tiny_vocab`."""
    from transformers import BertTokenizer

    vocab = {piece: i for i, piece in enumerate(tiny_vocab())}
    tok = BertTokenizer(vocab=vocab, do_lower_case=True)
    tok.model_max_length = model_max_length
    return tok


def tiny_bert_config(hidden: int = 32, layers: int = 2, heads: int = 2, intermediate: int = 37,
                     max_position: int = 128, dropout: float = 0.1, **extra):
    from transformers import BertConfig

    return BertConfig(
        vocab_size=len(tiny_vocab()),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=intermediate,
        max_position_embeddings=max_position,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        pad_token_id=0,
        **extra,
    )


def _save_tokenizer(path: Path, max_position: int) -> None:
    tok = tiny_tokenizer(model_max_length=max_position)
    tok.save_pretrained(path)
    # a vocab.txt as well, for readers that expect the classic layout
    (path / "vocab.txt").write_text("\n".join(tiny_vocab()) + "\n", encoding="utf-8")


def tiny_bert_dir(tmp_path, name: str = "tiny-bert", hidden: int = 32, layers: int = 2, heads: int = 2,
                  intermediate: int = 37, max_position: int = 128, dropout: float = 0.1, seed: int = 0,
                  with_tokenizer: bool = True, **config_extra) -> Path:
    """Write a randomly initialised ``BertModel`` (seeded) + tokenizer to ``tmp_path/name``; return the path.

    The directory loads with ``AutoModel.from_pretrained`` / ``AutoTokenizer.from_pretrained``. The same seed and
    sizes give the same weights."""
    import torch
    from transformers import BertModel

    path = Path(tmp_path) / name
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_bert_config(hidden, layers, heads, intermediate, max_position, dropout, **config_extra)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = BertModel(config)
    model.save_pretrained(path)
    if with_tokenizer:
        _save_tokenizer(path, max_position)
    return path


def tiny_biencoder(tmp_path=None, pooling: str = "cls", similarity: str = "dot", temperature: float = 0.05,
                   shared: bool = False, projection_dim: int = 0, max_question_length: int = 32,
                   max_passage_length: int = 64, hidden: int = 32, layers: int = 2, seed: int = 0,
                   dropout: float = 0.1, **config_extra):
    """A fastdpr ``BiEncoder`` over tiny random BERT towers (different seeds per tower unless ``shared``).

    ``tmp_path`` may be None: the towers are then written to a fresh temporary directory."""
    import tempfile

    from fastdpr.models import BiEncoder, BiEncoderConfig

    if tmp_path is None:
        tmp_path = tempfile.mkdtemp(prefix="fastdpr-tiny-")
    tmp_path = Path(tmp_path)
    qdir = tiny_bert_dir(tmp_path, name=f"tiny-q-{seed}-{hidden}-{layers}", hidden=hidden, layers=layers,
                         seed=seed, dropout=dropout)
    pdir = None
    if not shared:
        pdir = tiny_bert_dir(tmp_path, name=f"tiny-p-{seed + 1}-{hidden}-{layers}", hidden=hidden,
                             layers=layers, seed=seed + 1, dropout=dropout)
    config = BiEncoderConfig(pooling=pooling, similarity=similarity, temperature=temperature, shared=shared,
                             projection_dim=projection_dim, max_question_length=max_question_length,
                             max_passage_length=max_passage_length, **config_extra)
    return BiEncoder.from_encoders(qdir, pdir, config=config, projection_seed=seed)


def tiny_dpr_dirs(tmp_path, projection_dim: int = 0, hidden: int = 32, layers: int = 2, seed: int = 0,
                  max_position: int = 128) -> tuple[Path, Path]:
    """Write tiny random HF ``DPRQuestionEncoder`` and ``DPRContextEncoder`` checkpoints (+ tokenizers)."""
    import torch
    from transformers import DPRConfig, DPRContextEncoder, DPRQuestionEncoder

    base = tiny_bert_config(hidden=hidden, layers=layers, max_position=max_position).to_dict()
    for key in ("model_type", "architectures", "transformers_version"):
        base.pop(key, None)
    config = DPRConfig(projection_dim=projection_dim, **base)
    out = []
    for i, (cls, name) in enumerate(((DPRQuestionEncoder, "dpr-q"), (DPRContextEncoder, "dpr-ctx"))):
        path = Path(tmp_path) / name
        path.mkdir(parents=True, exist_ok=True)
        with torch.random.fork_rng():
            torch.manual_seed(seed + i)
            model = cls(config)
        model.save_pretrained(path)
        _save_tokenizer(path, max_position)
        out.append(path)
    return out[0], out[1]


def tiny_sentence_transformers_dir(tmp_path, pooling: str = "mean", normalize: bool = True,
                                   max_seq_length: int = 64, seed: int = 0, name: str = "tiny-st") -> Path:
    """Build a tiny sentence-transformers model (Transformer + Pooling [+ Normalize]) and ``save`` it.

    Needs the ``sentence_transformers`` package."""
    from sentence_transformers import SentenceTransformer

    try:  # sentence-transformers >= 6 layout
        from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    except ImportError:
        from sentence_transformers.models import Normalize, Pooling, Transformer

    bert = tiny_bert_dir(tmp_path, name=f"{name}-base", seed=seed, dropout=0.0)
    word = Transformer(str(bert), max_seq_length=max_seq_length)
    width = word.get_embedding_dimension() if hasattr(word, "get_embedding_dimension") \
        else word.get_word_embedding_dimension()
    pool = Pooling(width, pooling_mode=pooling)
    modules = [word, pool] + ([Normalize()] if normalize else [])
    st = SentenceTransformer(modules=modules, device="cpu")
    path = Path(tmp_path) / name
    st.save(str(path))
    return path


__all__ = ["tiny_vocab", "tiny_tokenizer", "tiny_bert_config", "tiny_bert_dir", "tiny_biencoder",
           "tiny_dpr_dirs", "tiny_sentence_transformers_dir"]


def tiny_vector_shards(tmp_path, n: int = 400, shard_size: int = 100) -> Path:
    """``fastdpr encode`` output of ``n`` made-up passages by a tiny mean-pooling bi-encoder, in shards of
    ``shard_size``: the input of ``fastdpr index`` in tests."""
    from fastdpr.data import Corpus
    from fastdpr.encode import encode_corpus

    words = ["river", "king", "city", "war", "song", "law", "tree", "gold"]
    passages = [{"id": f"p{i}", "title": f"t{i % 11}", "text": " ".join(words[(i * j + j // 3) % 8]
                 for j in range(i % 17 + 2))} for i in range(n)]
    model = tiny_biencoder(Path(tmp_path) / "m", pooling="mean", similarity="dot", max_passage_length=32)
    vec_dir = Path(tmp_path) / "vectors"
    encode_corpus(model, Corpus.from_passages(passages), vec_dir, batch_size=64, dtype="float16",
                  shard_size=shard_size, show_progress=False)
    return vec_dir
