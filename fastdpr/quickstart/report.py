"""What a quickstart run shows a person: the targets checked against the numbers measured (each comparison with a
paired bootstrap interval over questions), a table and a bar chart."""
from __future__ import annotations

from pathlib import Path

KS = (1, 5, 20, 100)
METRICS = ("top1", "top5", "top20", "top100", "mrr10")
RETRIEVERS = ("bm25", "zero_shot", "dense", "hybrid")
DATASETS = ("nq_test", "squad", "new_wiki_test", "reddit", "amazon")
TITLES = {"nq_test": "NQ (QED test)", "squad": "SQuAD (XQuAD en)", "new_wiki_test": "new Wikipedia test",
          "reddit": "Reddit (unseen)", "amazon": "Amazon (unseen)"}
UNSEEN = ("reddit", "amazon")
# what a person reads for each retriever (results.json keeps the short keys)
LABELS = {"bm25": "BM25", "zero_shot": "starting model", "dense": "fine-tuned dense", "hybrid": "hybrid"}
#: a "not worse" claim holds when the lower end of its 95% interval is above this
NOT_WORSE = -0.005
#: the reader's open-domain target: EM from the top-5 passages on the NQ test set
READER_EM_TARGET = 0.40



# Reading comprehension figures published for models of about the reader's size, beside the quickstart's own
# (its reader trains for minutes on a few thousand questions; these trained on SQuAD's 87,599 for epochs). The
# packaged MiniLM's architecture (6 layers x 384, 22M parameters) has no published SQuAD v1.1 figure: its authors
# give SQuAD 2.0 dev F1 75.6 (github.com/microsoft/unilm, minilm/README.md).
PUBLISHED_SQUAD = ("DistilBERT (6 layers x 768, 66M) EM 0.777 F1 0.858, BERT-base (110M) EM 0.812 F1 0.885 "
                   "(Sanh et al. 2019, table 2)")

def comparisons(metrics: dict, rounds: int = 2000, seed: int = 0) -> dict:
    """Paired bootstrap intervals (b minus a, every metric of ``METRICS``) of the comparisons the claims rest on,
    keyed ``"<set>: <b> - <a>"``; ``metrics`` holds each retriever's per-question ``ranks``."""
    from fastdpr.eval.compare import paired_bootstrap

    out = {}

    def compare(dataset: str, a: str, b: str) -> None:
        ranks = metrics[dataset]["retrieval"]
        out[f"{dataset}: {b} - {a}"] = {
            m: dict(zip(("mean", "lo", "hi"), paired_bootstrap(ranks[a]["ranks"], ranks[b]["ranks"], m, rounds,
                                                                   seed)))
            for m in METRICS}

    for dataset in DATASETS:
        compare(dataset, "zero_shot", "dense")
        compare(dataset, "bm25", "dense")
        compare(dataset, best_single(metrics, dataset), "hybrid")
    return out


def best_single(metrics: dict, dataset: str) -> str:
    """The better of BM25 and fine-tuned dense at top-20 on ``dataset`` (BM25 on a tie)."""
    r = metrics[dataset]["retrieval"]
    return "dense" if r["dense"]["top20"] > r["bm25"]["top20"] else "bm25"


def _interval(c: dict) -> str:
    return f"{c['mean']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}]"


def claims(metrics: dict, compared: dict, reader: dict | None = None) -> list[dict]:
    """The targets, each computed from the numbers measured in this run."""
    checks = []

    def check(claim, holds, detail):
        checks.append({"claim": claim, "holds": bool(holds), "detail": detail})

    def top(dataset, name, k=20):
        return metrics[dataset]["retrieval"][name][f"top{k}"]

    for dataset in DATASETS:
        c = compared[f"{dataset}: dense - zero_shot"]
        check(f"{TITLES[dataset]}: fine-tuned dense >= the starting model (top-20 and MRR@10 intervals above "
              f"{NOT_WORSE})", c["top20"]["lo"] > NOT_WORSE and c["mrr10"]["lo"] > NOT_WORSE,
              f"top-20 {_interval(c['top20'])}, MRR@10 {_interval(c['mrr10'])}")
    c = compared["squad: dense - bm25"]["top20"]
    check("SQuAD: fine-tuned dense >= BM25 at top-20", c["mean"] >= 0,
          f"dense {top('squad', 'dense'):.3f} vs BM25 {top('squad', 'bm25'):.3f}, difference {_interval(c)}")
    for dataset in UNSEEN:
        gap = top(dataset, "bm25") - top(dataset, "zero_shot")
        closed = (top(dataset, "dense") - top(dataset, "zero_shot")) / gap if gap > 0 else float("inf")
        check(f"{TITLES[dataset]}: fine-tuning closes at least half of the starting model's top-20 gap to BM25",
              closed >= 0.5,
              f"starting model {top(dataset, 'zero_shot'):.3f}, dense {top(dataset, 'dense'):.3f}, BM25 "
              f"{top(dataset, 'bm25'):.3f}: {closed:.0%} of the gap closed")
    for dataset in DATASETS:
        best = best_single(metrics, dataset)
        c = compared[f"{dataset}: hybrid - {best}"]["top20"]
        check(f"{TITLES[dataset]}: hybrid >= max(BM25, dense) at top-20", c["mean"] >= 0,
              f"hybrid {top(dataset, 'hybrid'):.3f} vs {LABELS[best]} {top(dataset, best):.3f}, "
              f"difference {_interval(c)}")
    if reader is not None:
        check(f"Reader: open-domain EM from the top-{reader['top_k']} passages on NQ test >= {READER_EM_TARGET}",
              reader["em"] >= READER_EM_TARGET, f"EM {reader['em']:.3f} on {reader['n']} questions")
    return checks


def format_table(results: dict) -> str:
    """The printed table of a results dict (as written to ``results.txt``)."""
    lines = []
    for dataset in DATASETS:
        section = results["datasets"][dataset]
        lines.append(f"{TITLES[dataset]} ({section['questions']} questions)".ljust(34)
                     + "  top-1   top-5  top-20 top-100  MRR@10 gold@20")
        for name in RETRIEVERS:
            m = section["retrieval"][name]
            qps = results["qps"].get(name)
            extra = f"   {qps:7.1f} q/s" if dataset == "nq_test" and qps else ""
            cells = "".join(f"{m[f'top{k}']:8.3f}" for k in KS)
            lines.append(f"  {LABELS[name]:<32}{cells}{m['mrr10']:8.3f}{m['gold_top20']:8.3f}{extra}")
    r = results["reader"]
    source = f", {r['source']}" if r.get("source") else ""
    lines.append(f"reader on NQ test (top-{r['top_k']} {r['retriever']} passages, {r['n']} questions{source}): "
                 f"EM {r['em']:.3f}  F1 {r['f1']:.3f}")
    for k, m in (r.get("by_top_k") or {}).items():
        if k != f"top{r['top_k']}":
            lines.append(f"  reading only the {k.replace('top', 'top-')} passage: EM {m['em']:.3f}  F1 {m['f1']:.3f}")
    if r.get("nq_gold_paragraph"):
        m = r["nq_gold_paragraph"]
        lines.append(f"  the same NQ questions from their gold paragraph: EM {m['em']:.3f}  F1 {m['f1']:.3f}")
    if r.get("squad_gold_paragraph"):
        m = r["squad_gold_paragraph"]
        lines.append(f"  SQuAD (XQuAD en) from the gold paragraph, {m['n']} questions: EM {m['em']:.3f}  "
                     f"F1 {m['f1']:.3f}")
        lines.append(f"    published, whole SQuAD v1.1 dev (XQuAD en is 1,190 of its questions): {PUBLISHED_SQUAD}")
    ix = results["index"]
    truncated = ix.get("truncated_passages")
    cut = f", {truncated} passages cut at {ix['max_passage_length']} tokens" if truncated is not None else ""
    precision = f", encoded in {ix['encode_precision']}" if ix.get("encode_precision") else ""
    lines.append(f"index: {ix['spec']}, {ix['passages']} passages x {ix['dim']} dims, {ix['bytes'] / 2**20:.1f} MiB"
                 f"{cut}{precision}; hybrid: {results.get('hybrid', {}).get('fusion', 'linear')} fusion, "
                 f"alpha {results['hybrid_alpha']}")
    lines.append("claims (differences: mean [95% paired bootstrap interval over questions]):")
    for c in results["claims"]:
        lines.append(f"  [{'holds' if c['holds'] else 'NOT MET'}] {c['claim']}: {c['detail']}")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Bar chart of top-k accuracy, one panel per question set."""
    from fastdpr.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(DATASETS), figsize=(4 * len(DATASETS), 4), sharey=True)
    width = 0.2
    for ax, dataset in zip(axes, DATASETS):
        retrieval = results["datasets"][dataset]["retrieval"]
        for i, name in enumerate(RETRIEVERS):
            values = [retrieval[name][f"top{k}"] for k in KS]
            ax.bar([x + (i - 1.5) * width for x in range(len(KS))], values, width, label=LABELS[name])
        ax.set_xticks(range(len(KS)), [f"top-{k}" for k in KS])
        ax.set_title(f"{TITLES[dataset]} ({results['datasets'][dataset]['questions']} q)", fontsize=10)
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("top-k accuracy")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("fastdpr quickstart: retrieval accuracy (has_answer)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
