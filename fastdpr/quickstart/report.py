"""What a quickstart run shows a person: the paper claims checked against the numbers measured, a table and a
bar chart."""
from __future__ import annotations

from pathlib import Path

KS = (1, 5, 20, 100)
RETRIEVERS = ("bm25", "zero_shot", "dense", "hybrid")
DATASETS = ("nq_test", "squad_dev", "nyt_test")
TITLES = {"nq_test": "NQ test", "squad_dev": "SQuAD dev", "nyt_test": "NYT test"}
# what a person reads for each retriever (results.json keeps the short keys)
LABELS = {"bm25": "BM25", "zero_shot": "starting model", "dense": "fine-tuned dense", "hybrid": "hybrid"}


def claims(metrics: dict) -> list[dict]:
    """The papers' claims (DPR, GTR), each computed from the numbers measured in this run."""

    def top(dataset, name, k=20):
        return metrics[dataset]["retrieval"][name][f"top{k}"]

    checks = []

    def check(claim, holds, detail):
        checks.append({"claim": claim, "holds": bool(holds), "detail": detail})

    nq, sq, ny = "nq_test", "squad_dev", "nyt_test"
    check("NQ: fine-tuned dense beats BM25 at top-20 (DPR)", top(nq, "dense") > top(nq, "bm25"),
          f"dense {top(nq, 'dense'):.3f} vs BM25 {top(nq, 'bm25'):.3f}")
    check("NYT, a domain the starting model never saw: fine-tuning improves on it at top-20",
          top(ny, "dense") > top(ny, "zero_shot"),
          f"dense {top(ny, 'dense'):.3f} vs starting model {top(ny, 'zero_shot'):.3f}")
    for dataset in (nq, sq):
        check(f"{TITLES[dataset]}: fine-tuning keeps what the starting model knew (top-20 not lower)",
              top(dataset, "dense") >= top(dataset, "zero_shot"),
              f"dense {top(dataset, 'dense'):.3f} vs starting model {top(dataset, 'zero_shot'):.3f}")
    check("SQuAD dev: BM25 ahead of dense at top-20 (DPR's negative result on SQuAD)",
          top(sq, "bm25") > top(sq, "dense"), f"BM25 {top(sq, 'bm25'):.3f} vs dense {top(sq, 'dense'):.3f}")
    for dataset in DATASETS:
        best = max(top(dataset, "dense"), top(dataset, "bm25"))
        check(f"{TITLES[dataset]}: hybrid >= max(dense, BM25) at top-20 (DPR)", top(dataset, "hybrid") >= best,
              f"hybrid {top(dataset, 'hybrid'):.3f}, dense {top(dataset, 'dense'):.3f}, "
              f"BM25 {top(dataset, 'bm25'):.3f}")
    return checks


def format_table(results: dict) -> str:
    """The printed table of a results dict (as written to ``results.txt``)."""
    lines = []
    for dataset in DATASETS:
        section = results["datasets"][dataset]
        lines.append(f"{dataset} ({section['questions']} questions)   top-1   top-5  top-20 top-100  gold@20")
        for name in RETRIEVERS:
            m = section["retrieval"][name]
            qps = results["qps"].get(name)
            extra = f"   {qps:7.1f} q/s" if dataset == "nq_test" and qps else ""
            cells = "".join(f"{m[f'top{k}']:8.3f}" for k in KS)
            lines.append(f"  {LABELS[name]:<24}{cells}{m['gold_top20']:9.3f}{extra}")
    r = results["reader"]
    source = f", {r['source']}" if r.get("source") else ""
    lines.append(f"reader on NQ test (top-{r['top_k']} {r['retriever']} passages, {r['n']} questions{source}): "
                 f"EM {r['em']:.3f}  F1 {r['f1']:.3f}")
    for k, m in (r.get("by_top_k") or {}).items():
        if k != f"top{r['top_k']}":
            lines.append(f"  reading only the {k.replace('top', 'top-')} passage: EM {m['em']:.3f}  F1 {m['f1']:.3f}")
    ix = results["index"]
    truncated = ix.get("truncated_passages")
    cut = f", {truncated} passages cut at {ix['max_passage_length']} tokens" if truncated is not None else ""
    precision = f", encoded in {ix['encode_precision']}" if ix.get("encode_precision") else ""
    lines.append(f"index: {ix['spec']}, {ix['passages']} passages x {ix['dim']} dims, {ix['bytes'] / 2**20:.1f} MiB"
                 f"{cut}{precision}; hybrid: {results.get('hybrid', {}).get('fusion', 'linear')} fusion, "
                 f"alpha {results['hybrid_alpha']}")
    lines.append("claims:")
    for c in results["claims"]:
        lines.append(f"  [{'holds' if c['holds'] else 'NOT SHOWN'}] {c['claim']}: {c['detail']}")
    return "\n".join(lines)


def plot(results: dict, path: Path) -> None:
    """Bar chart of top-k accuracy, one panel per question set."""
    from fastdpr.plotting import pyplot

    plt = pyplot()
    fig, axes = plt.subplots(1, len(DATASETS), figsize=(5 * len(DATASETS), 4), sharey=True)
    width = 0.2
    for ax, dataset in zip(axes, DATASETS):
        retrieval = results["datasets"][dataset]["retrieval"]
        for i, name in enumerate(RETRIEVERS):
            values = [retrieval[name][f"top{k}"] for k in KS]
            ax.bar([x + (i - 1.5) * width for x in range(len(KS))], values, width, label=LABELS[name])
        ax.set_xticks(range(len(KS)), [f"top-{k}" for k in KS])
        ax.set_title(f"{TITLES[dataset]} ({results['datasets'][dataset]['questions']} q)")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("top-k accuracy")
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("fastdpr quickstart: retrieval accuracy (has_answer)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
