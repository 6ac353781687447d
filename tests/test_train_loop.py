"""The training loop: exact kill-and-resume, checkpoints, validation, mixed precision, learning on real pairs, CLI."""
import json
from pathlib import Path

import pytest
import torch

from fastdpr import cli
from fastdpr.errors import InputError
from fastdpr.models import BiEncoder
from fastdpr.train import checkpoint as ckpt
from fastdpr.train.data import load_examples
from fastdpr.train.biencoder import BiEncoderArguments, BiEncoderTask, split_arguments
from fastdpr.train.trainer import Trainer, TrainingArguments
from tiny_models import tiny_biencoder

DATA = Path(__file__).parent / "data"
SAMPLE = DATA / "squad_dev_train_sample.json"


@pytest.fixture(scope="module")
def examples():
    return load_examples(SAMPLE)


@pytest.fixture(scope="module")
def init_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("init")
    model = tiny_biencoder(path, pooling="mean", dropout=0.1, max_question_length=24, max_passage_length=48)
    model.save_pretrained(path / "model")
    return path / "model"


def _args(out, **kw):
    base = dict(output_dir=str(out), batch_size=16, n_hard=1, lr=2e-3, show_progress=False, logging_steps=1,
                loss_backend="torch")
    base.update(kw)
    return split_arguments(base)


def _trainer(model, args, examples, dev_examples=None, corpus=None, callbacks=()):
    training, biencoder = args
    return Trainer(BiEncoderTask(model, examples, biencoder, dev_examples=dev_examples, corpus=corpus), training,
                   callbacks=callbacks)


class Interrupt(Exception):
    pass


def _stop_after(step):
    def callback(trainer, record):
        if record["step"] == step:
            raise Interrupt(step)
    return callback


def _weights(model):
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def test_kill_and_resume_reaches_the_same_weights(tmp_path, examples, init_dir):
    # 4 batches per epoch, 7 steps, checkpoints at 3 and 6; dropout on, so generator states matter
    kw = dict(epochs=2, max_steps=7, save_steps=3, save_total_limit=1, eval_steps=3, grad_cache=True, chunk_size=8)
    dev = examples[:16]
    straight = BiEncoder.from_pretrained(init_dir)
    result = _trainer(straight, _args(tmp_path / "straight", **kw), examples, dev_examples=dev).train()
    assert result["step"] == 7

    out = tmp_path / "resumed"
    with pytest.raises(Interrupt):
        _trainer(BiEncoder.from_pretrained(init_dir), _args(out, **kw), examples, dev_examples=dev,
                callbacks=[_stop_after(5)]).train()
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step-00000003"]
    resumed = BiEncoder.from_pretrained(init_dir)  # fresh weights: everything must come from the checkpoint
    result2 = _trainer(resumed, _args(out, **kw), examples, dev_examples=dev).train(resume=True)
    assert result2["step"] == 7 and result2["best"] == result["best"]
    want, got = _weights(straight), _weights(resumed)
    assert all(torch.equal(want[k], got[k]) for k in want)
    assert any(not torch.equal(want[k], v) for k, v in _weights(BiEncoder.from_pretrained(init_dir)).items())

    # the metrics log has no step twice, and equals the uninterrupted one
    a, b = _lines(tmp_path / "straight" / "metrics.jsonl"), _lines(out / "metrics.jsonl")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    assert [r.get("loss") for r in a] == pytest.approx([r.get("loss") for r in b], abs=0)
    # rotation keeps the last checkpoint plus the best one; the best model sits in out/best
    kept = [p.name for p in ckpt.list_checkpoints(out)]
    best_step = result2["best_step"]
    assert f"step-{7:08d}" in kept and f"step-{best_step:08d}" in kept and len(kept) <= 2
    assert json.loads((out / "best" / "validation.json").read_text())["step"] == best_step
    assert not list((out / "checkpoints").glob(".tmp-*"))
    final = BiEncoder.from_pretrained(out / "model")
    assert all(torch.equal(got[k], v) for k, v in _weights(final).items())


def test_resume_without_the_generator_state_drifts(tmp_path, examples, init_dir):
    # the exactness above is not an accident of dropout being inert: drop the saved RNG state and it breaks
    kw = dict(epochs=1, max_steps=4, save_steps=2)
    straight = BiEncoder.from_pretrained(init_dir)
    _trainer(straight, _args(tmp_path / "a", **kw), examples).train()
    out = tmp_path / "b"
    with pytest.raises(Interrupt):
        _trainer(BiEncoder.from_pretrained(init_dir), _args(out, **kw), examples,
                callbacks=[_stop_after(3)]).train()
    (ckpt.latest_checkpoint(out) / "rng-rank0.pt").unlink()
    resumed = BiEncoder.from_pretrained(init_dir)
    _trainer(resumed, _args(out, **kw), examples).train(resume=True)
    want, got = _weights(straight), _weights(resumed)
    assert not all(torch.equal(want[k], got[k]) for k in want)


def test_resume_needs_a_checkpoint(tmp_path, examples, init_dir):
    with pytest.raises(InputError, match="no checkpoint"):
        _trainer(BiEncoder.from_pretrained(init_dir), _args(tmp_path), examples).train(resume=True)


def test_validation_average_rank_matches_brute_force(tmp_path, examples, init_dir):
    model = BiEncoder.from_pretrained(init_dir)
    dev = examples[:20]
    trainer = _trainer(model, _args(tmp_path, dev_batch_size=8), examples, dev_examples=dev)
    model.train()
    result = trainer.validate()
    assert model.training  # validation runs in eval mode and restores the mode
    # brute force over the pool of the first 16 dev questions (2 full batches of 8), each passage once (the
    # sample repeats passages: a hard negative is another question's positive)
    pool = {}
    for e in dev[:16]:
        for c in [e.positives[0]] + e.hard_negatives[:1]:
            pool.setdefault(c["key"], c)
    keys = list(pool)
    q = torch.from_numpy(model.encode_questions([e.question for e in dev[:16]]))
    p = torch.from_numpy(model.encode_passages([pool[k] for k in keys]))
    scores = q @ p.T
    ranks = []
    for i, e in enumerate(dev[:16]):
        pos = keys.index(e.positives[0]["key"])
        ranks.append(int((scores[i] > scores[i, pos] + 1e-5).sum()))
    assert result["avg_rank"] == pytest.approx(sum(ranks) / len(ranks), abs=0.2)
    assert 0 < result["loss"] < 10


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_steps_agree_with_fp32(tmp_path, examples, precision):
    # no dropout, so fp32, autocast and GradCache-under-autocast see the same function
    model = tiny_biencoder(tmp_path, pooling="mean", dropout=0.0, max_question_length=24, max_passage_length=48)
    batch = None
    losses, grads = {}, {}
    for name, kw in {"fp32": {}, precision: {"precision": precision},
                     "gc": {"precision": precision, "grad_cache": True, "chunk_size": 6}}.items():
        trainer = _trainer(model, _args(tmp_path / name, **kw), examples)
        trainer._setup()
        batch = batch or trainer.task.builder.batch(0, 0)
        model.zero_grad(set_to_none=True)
        losses[name] = float(trainer.training_step(batch))
        if kw.get("precision") == "fp16":
            assert trainer.scaler.is_enabled()
            trainer.scaler.unscale_(trainer.optimizer)
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad(set_to_none=True)
    assert losses[precision] == pytest.approx(losses["fp32"], abs=0.05)
    assert losses["gc"] == pytest.approx(losses[precision], abs=0.02)
    cos = torch.nn.functional.cosine_similarity(grads["fp32"], grads[precision], dim=0)
    assert cos > 0.98
    cos_gc = torch.nn.functional.cosine_similarity(grads["gc"], grads[precision], dim=0)
    assert cos_gc > 0.99


def test_tiny_model_learns_real_question_passage_pairs(tmp_path, examples, init_dir):
    # 64 SQuAD dev questions with their paragraphs; the hard negative is another paragraph of the same article
    model = BiEncoder.from_pretrained(init_dir)
    trainer = _trainer(model, _args(tmp_path, epochs=5, warmup_steps=2, logging_steps=4, loss_backend="auto"),
                      examples, dev_examples=examples)
    before = trainer.validate()
    trainer.train()
    after = trainer.validate()
    log = [r for r in _lines(tmp_path / "metrics.jsonl") if "lr" in r]
    assert log[-1]["loss"] < log[0]["loss"] - 0.2
    assert after["loss"] < before["loss"] - 0.1
    # a pool of 64 distinct paragraphs: a random model ranks the positive about half-way down
    assert before["avg_rank"] > 20 and after["avg_rank"] < 0.6 * before["avg_rank"], (before, after)
    assert all(r["examples_per_s"] > 0 for r in log)


def test_cli_trains_and_saves(tmp_path, init_dir, capsys):
    out = tmp_path / "run"
    code = cli.main(["train", str(SAMPLE), "--model", str(init_dir), "-o", str(out), "--dev", str(SAMPLE),
                     "--batch-size", "32", "--epochs", "1", "--lr", "1e-3", "--grad-cache", "--chunk-size", "16",
                     "--similarity", "cosine", "--temperature", "0.1", "--loss-backend", "torch", "--no-progress"])
    assert code == 0
    model = BiEncoder.from_pretrained(out / "model")
    assert model.config.similarity == "cosine" and model.config.temperature == pytest.approx(0.1)
    assert (out / "best" / "validation.json").is_file()
    saved = json.loads((out / "training_args.json").read_text())
    assert saved["task"]["grad_cache"] is True and saved["task"]["similarity"] == "cosine"
    assert saved["task"]["freeze_word_embeddings"] is True
    saved = saved["training"]
    # flags given win; what is left out comes from the default recipe (finetune)
    assert saved["lr"] == 1e-3 and saved["batch_size"] == 32
    assert saved["interpolate"] == 0.5 and saved["warmup_steps"] == 0.1
    assert saved["precision"] in ("bf16", "fp32")
    printed = capsys.readouterr().out
    assert str(out / "model") in printed


def test_cli_dpr_recipe_defaults(tmp_path, init_dir):
    out = tmp_path / "dpr"
    code = cli.main(["train", str(SAMPLE), "--model", str(init_dir), "-o", str(out), "--recipe", "dpr",
                     "--batch-size", "16", "--max-steps", "1", "--loss-backend", "torch", "--no-progress"])
    assert code == 0
    saved = json.loads((out / "training_args.json").read_text())["training"]
    assert (saved["lr"], saved["epochs"], saved["interpolate"], saved["precision"]) == (2e-5, 40, 1.0, "fp32")


def test_cli_errors_are_one_line(tmp_path, init_dir, capsys):
    code = cli.main(["train", str(SAMPLE), "--model", str(init_dir), "-o", str(tmp_path / "x"),
                     "--batch-size", "1000"])
    assert code == 2
    assert "lower --batch-size" in capsys.readouterr().err
    code = cli.main(["train", str(tmp_path / "missing.json"), "--model", str(init_dir), "-o", str(tmp_path / "y")])
    assert code == 2


def test_validation_topk_accuracy_with_a_corpus(tmp_path, examples, init_dir):
    from fastdpr.data import Corpus
    from fastdpr.text.answers import has_answer

    passages = {}
    for e in examples:
        for c in e.positives + e.hard_negatives:
            passages.setdefault(c["text"], {"id": str(c["key"]), "title": c["title"], "text": c["text"]})
    corpus = Corpus.from_passages(list(passages.values()))
    model = BiEncoder.from_pretrained(init_dir)
    dev = examples[:16]
    trainer = _trainer(model, _args(tmp_path, best_metric="top5", topk=(1, 5)), examples, dev_examples=dev,
                      corpus=corpus)
    result = trainer.validate()
    q = model.encode_questions([e.question for e in dev])
    p = model.encode_passages(list(passages.values()))
    top = torch.topk(torch.from_numpy(q @ p.T), 5, dim=1).indices.tolist()
    texts = [x["text"] for x in passages.values()]
    hits = [[has_answer(texts[j], e.answers) for j in row] for row, e in zip(top, dev)]
    assert result["top1"] == pytest.approx(sum(h[0] for h in hits) / len(dev))
    assert result["top5"] == pytest.approx(sum(any(h) for h in hits) / len(dev))
    with pytest.raises(InputError, match="needs a corpus"):
        _trainer(model, _args(tmp_path, best_metric="top5"), examples, dev_examples=dev)


def test_interpolation_saves_the_average_of_start_and_trained(tmp_path, examples, init_dir):
    start = _weights(BiEncoder.from_pretrained(init_dir))
    raw = _trainer(BiEncoder.from_pretrained(init_dir), _args(tmp_path / "raw", max_steps=3, epochs=1), examples)
    raw.train()
    trained = _weights(raw.model)
    half = _trainer(BiEncoder.from_pretrained(init_dir),
                   _args(tmp_path / "half", max_steps=3, epochs=1, interpolate=0.5), examples, dev_examples=examples)
    half.train()
    # training itself is unchanged (the raw weights stay in the model) ...
    assert all(torch.equal(trained[k], v) for k, v in _weights(half.model).items())
    # ... and what is saved, or validated and kept as best, is halfway between start and trained
    for folder in ("model", "best"):
        saved = _weights(BiEncoder.from_pretrained(tmp_path / "half" / folder))
        moved = [k for k in start if start[k].is_floating_point() and not torch.equal(start[k], trained[k])]
        assert moved
        for k in moved:
            torch.testing.assert_close(saved[k], (start[k] + trained[k]) / 2, rtol=1e-5, atol=1e-6)
    with pytest.raises(InputError, match="interpolate"):
        _args(tmp_path, interpolate=1.5)


def test_frozen_word_embeddings_do_not_move(tmp_path, examples, init_dir):
    trainer = _trainer(BiEncoder.from_pretrained(init_dir),
                      _args(tmp_path / "frozen", max_steps=2, epochs=1, freeze_word_embeddings=True), examples)
    before = trainer.model.question_encoder.embeddings.word_embeddings.weight.detach().clone()
    layer = next(trainer.model.question_encoder.encoder.parameters()).detach().clone()
    trainer.train()
    assert torch.equal(trainer.model.question_encoder.embeddings.word_embeddings.weight, before)
    assert not torch.equal(next(trainer.model.question_encoder.encoder.parameters()), layer)


def test_attention_dropout_is_set_on_every_self_attention_block(tmp_path):
    from fastdpr.train.trainer import set_attention_dropout

    model = tiny_biencoder(tmp_path, shared=False)
    assert set_attention_dropout(model, 0.0) == 2 * model.question_encoder.config.num_hidden_layers
    blocks = [m for m in model.modules() if "SelfAttention" in type(m).__name__]
    assert blocks and all(m.dropout.p == 0.0 for m in blocks)
    assert model.question_encoder.config.attention_probs_dropout_prob > 0  # the saved config keeps its own
    with pytest.raises(InputError, match="attention_dropout"):
        TrainingArguments(output_dir=str(tmp_path), attention_dropout=1.0)


def test_training_in_a_log_shows_the_progress_line_of_every_long_stage(tmp_path, examples, init_dir, capsys,
                                                                       monkeypatch):
    # in a log (stderr not a terminal) training said nothing until `logging_steps` steps were done: with large
    # batches on a CPU, minutes of silence. Now a line at once, then the timed progress line other stages print.
    import fastdpr.progress as progress_module

    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    model = BiEncoder.from_pretrained(init_dir)
    _trainer(model, _args(tmp_path, show_progress=True, logging_steps=100, max_steps=3), examples).train()
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "train: 3 steps of 16 questions to go"
    steps = [line for line in err if line.startswith("train: ") and "/3 (" in line]
    assert [line.split()[1] for line in steps] == ["1/3", "2/3", "3/3"]
    assert all("step/s" in line and "loss=" in line for line in steps)


def test_the_task_loads_its_model_with_the_model_settings(examples, init_dir):
    task = BiEncoderTask(str(init_dir), examples,
                         BiEncoderArguments(similarity="cosine", temperature=0.1, max_question_length=16))
    config = task.model.config
    assert (config.similarity, config.max_question_length) == ("cosine", 16)
    assert config.temperature == pytest.approx(0.1)
    with pytest.raises(InputError, match="pooling apply when the task loads the model"):
        BiEncoderTask(BiEncoder.from_pretrained(init_dir), examples, BiEncoderArguments(pooling="cls"))
    with pytest.raises(InputError, match="unknown training settings: nhard"):
        split_arguments({"output_dir": None, "nhard": 1})
    training, biencoder = split_arguments({"output_dir": None, "lr": 1e-3, "n_hard": 2})
    assert (training.lr, biencoder.n_hard) == (1e-3, 2)
