"""Data-parallel training with global negatives: 2 gloo processes on localhost equal one process on the full batch
(loss and gradients of one step, plain and GradCache; and the weights after a short run with checkpoints)."""
import json
import os
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from fastdpr.models import BiEncoder
from fastdpr.train.data import examples_from_records
from fastdpr.train.biencoder import BiEncoderTask, split_arguments
from fastdpr.train.trainer import Trainer
from tiny_models import tiny_biencoder

DATA = Path(__file__).parent / "data"
WORLD = 2


def _examples():
    records = json.loads((DATA / "squad_dev_train_sample.json").read_text())[:24]
    for i, rec in enumerate(records):  # uneven hard negatives: padded columns on both ranks
        if i % 4 == 0:
            rec["hard_negative_ctxs"] = []
        elif i % 4 == 1:
            rec["hard_negative_ctxs"].append(records[(i + 5) % len(records)]["positive_ctxs"][0])
    return examples_from_records(records)


def _args(out, **kw):
    # adam_eps=1: Adam's first steps move each weight by about lr·sign(g), which makes weights after a few steps
    # ill-conditioned in gradients near 0; with a large eps the update is ≈ lr·g and can be compared
    base = dict(output_dir=str(out), batch_size=8, n_hard=2, lr=0.1, adam_eps=1.0, show_progress=False, seed=3,
                # the chunked torch form of the fused loss: the Triton path is checked in the other training tests,
                # and the interpreter would only slow the three processes down here
                loss_backend="torch")
    base.update(kw)
    return split_arguments(base)


def _trainer(model, args, examples):
    training, biencoder = args
    trainer = Trainer(BiEncoderTask(model, examples, biencoder), training)
    trainer._setup()
    return trainer


def _step_grads(trainer, batch):
    trainer.model.zero_grad(set_to_none=True)
    loss = float(trainer.training_step(batch))
    grads = {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    trainer.model.zero_grad(set_to_none=True)
    return loss, grads


def _worker(rank, model_dir, work, init_file):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        examples = _examples()
        results = {}
        for name, kw in {"plain": {}, "grad_cache": {"grad_cache": True, "chunk_size": 3}}.items():
            model = BiEncoder.from_pretrained(model_dir)
            trainer = _trainer(model, _args(Path(work) / f"step-{name}", **kw), examples)
            results[name] = _step_grads(trainer, trainer.task.builder.batch(0, 1))
        torch.save(results, Path(work) / f"grads-rank{rank}.pt")
        # a short run through the whole loop: clipping, AdamW, schedule, checkpoints written by rank 0
        model = BiEncoder.from_pretrained(model_dir)
        _trainer(model, _args(Path(work) / "run", grad_cache=True, chunk_size=4, max_steps=3, save_steps=2,
                             warmup_steps=1), examples).train()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_equal_one_process_on_the_full_batch(tmp_path):
    # dropout off: each rank draws its own dropout masks, so only a dropout-free model can match exactly
    model = tiny_biencoder(tmp_path, dropout=0.0, max_passage_length=48)
    model_dir = tmp_path / "init"
    model.save_pretrained(model_dir)
    work = tmp_path / "work"
    work.mkdir()
    mp.spawn(_worker, args=(str(model_dir), str(work), str(tmp_path / "rendezvous")), nprocs=WORLD, join=True)

    examples = _examples()
    ranks = [torch.load(work / f"grads-rank{r}.pt") for r in range(WORLD)]
    for name, kw in {"plain": {}, "grad_cache": {"grad_cache": True, "chunk_size": 3}}.items():
        single = _trainer(BiEncoder.from_pretrained(model_dir), _args(tmp_path / f"single-{name}", **kw), examples)
        ref_loss, ref = _step_grads(single, single.task.builder.batch(0, 1))
        assert len(ref) > 30
        for r in range(WORLD):
            loss, grads = ranks[r][name]
            assert abs(loss - ref_loss) < 1e-5, (name, r, loss, ref_loss)
            assert grads.keys() == ref.keys()
            worst = max(float((grads[k] - ref[k]).abs().max()) for k in ref)
            assert worst < 1e-5, (name, r, worst)

    single = BiEncoder.from_pretrained(model_dir)
    _trainer(single, _args(tmp_path / "single-run", grad_cache=True, chunk_size=4, max_steps=3, save_steps=2,
                          warmup_steps=1), examples).train()
    trained = BiEncoder.from_pretrained(work / "run" / "model")
    start = BiEncoder.from_pretrained(model_dir).state_dict()
    moved = False
    for key, value in single.state_dict().items():
        assert torch.allclose(trained.state_dict()[key], value, atol=1e-5), key
        moved |= not torch.equal(value, start[key])
    assert moved
    saved = sorted(p.name for p in (work / "run" / "checkpoints").iterdir())
    assert saved == ["step-00000002", "step-00000003"]
    assert {p.name for p in (work / "run" / "checkpoints" / "step-00000003").glob("rng-rank*.pt")} == {
        "rng-rank0.pt", "rng-rank1.pt"}
    assert not os.environ.get("WORLD_SIZE")
