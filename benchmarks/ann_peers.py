"""Peers on the real pool of ``real_pool.py``: fastdpr ``auto`` + ``tune`` against ScaNN, faiss IVF-PQ fast scan
with a refine step and faiss's RaBitQ IVF, at recall@100 >= 0.95, one thread; every setting chosen on the tuning
questions, every reported figure measured on the test questions (``real_pool.query_split``: half each, by hash).

**The same tuning budget for every system.** fastdpr builds what ``auto`` chooses and ``index.tune`` picks its
settings on the tuning questions. Each peer gets a sweep of its build (list or leaf counts of
``--lists-per-sqrt`` x sqrt(n); faiss fast scan and RaBitQ each in their own code layout) and, for every build, the
very procedure ``tune`` runs for fastdpr (``fastdpr.index.tune``: the same re-rank ladder 2k, 4k, 8k, ... of
candidates re-scored exactly — faiss's ``k_factor`` = R / k, ScaNN's reorder R —, the smallest list count that
clears the target by two standard errors found by doubling and bisection, the cheapest depths timed, the winner
confirmed on the half of the tuning sample that took no part in choosing it) through an adapter that maps
``nprobe`` / ``rerank`` onto the peer's own knobs. The fastest of a peer's builds on the tuning questions is its
entry. Then every entry, and exact search, is timed side by side on the test questions in alternating rounds (the
best round of each), so a changing load on the shared cores moves all of them alike.

    python benchmarks/ann_peers.py --n 1000000                      # the real 1M (after real_pool.py encode)
    python benchmarks/ann_peers.py --n 30000 --lists-per-sqrt 2,4   # a prefix of what is encoded so far
    python benchmarks/ann_peers.py --n 1000000 --tuned-only         # time what earlier runs finished tuning

**Resumable by build.** At a million rows each build and its tuning take minutes to an hour, so every build's
tuning result is kept in the benchmark cache (``<set>/peers-train<T>/<system>-nlist<L>.json``, written last) beside
the saved index of each system's fastest build so far; a run stopped at any point goes on from the builds not yet
tuned, and the side-by-side timing reloads the winners from disk. Each build is built and tuned in a process of its
own: a peer library that crashes costs that build (kept as an error row naming the signal; delete its ``.json`` to
try it again), not the run.

Writes ``<name>.{json,md}`` (default ``ann_peers_<pooling>_<n>``); ScaNN and RaBitQ are skipped, with the reason
in the report, where the installed packages lack them (``pip install scann``; faiss >= 1.12 for RaBitQ).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _common import markdown_table, write_results  # noqa: E402
from ann_auto import side_by_side  # noqa: E402
from datasets import Dataset, cache_dir, ground_truth  # noqa: E402

K = 100
TARGET = 0.95
THREADS = 1


class PeerIndex:
    """A peer's built index seen through fastdpr's tuning interface: ``nprobe`` is the number of lists (or leaves)
    searched and ``rerank`` the number of candidates re-scored exactly, so ``fastdpr.index.tune`` chooses its
    settings the way it chooses fastdpr's."""

    kind = "ivfpq"
    store, sq = "fp32", 0  # every peer keeps full vectors to re-rank with (tune's ladder of depths applies)

    def __init__(self, name: str, handle, search, n: int, dim: int, nlist: int):
        self.name, self.handle, self._search = name, handle, search
        self.n, self.dim, self.nlist = n, dim, nlist
        self.nprobe, self.rerank, self.tuned = 1, 2 * K, None

    def __len__(self) -> int:
        return self.n

    def search(self, q, k, threads=THREADS, nprobe=None, rerank=None):
        ids = self._search(self.handle, np.ascontiguousarray(q, dtype=np.float32), k, threads,
                           nprobe or self.nprobe, max(k, rerank or self.rerank))
        return None, np.asarray(ids, dtype=np.int64)


@dataclass
class Build:
    """One build of a peer: ``build(base)`` makes the handle ``search`` queries; ``save(handle, path)`` writes it to
    ``path`` (a file or a new folder) and ``load(path)`` reads it back."""

    system: str
    build: Callable
    search: Callable
    nlist: int
    params: dict
    save: Callable
    load: Callable

    @property
    def key(self) -> str:
        return f"{self.system}-nlist{self.nlist}"


def faiss_builds(lists: list[int], d: int, train: int) -> tuple[list[Build], str]:
    """Each faiss build, and why none where faiss lacks them."""
    try:
        import faiss
    except ImportError:
        return [], "faiss not installed (pip install faiss-cpu)"
    ip = faiss.METRIC_INNER_PRODUCT

    def factory_build(factory):
        def build(base):
            faiss.omp_set_num_threads(os.cpu_count() or 1)
            index = faiss.index_factory(d, factory, ip)
            rows = np.sort(np.random.default_rng(0).choice(len(base), min(train, len(base)), replace=False))
            index.train(np.ascontiguousarray(base[rows], dtype=np.float32))
            for s in range(0, len(base), 65536):
                index.add(np.ascontiguousarray(base[s:s + 65536], dtype=np.float32))
            return index
        return build

    def search(index, q, k, threads, nprobe, rerank):
        faiss.omp_set_num_threads(threads)
        faiss.extract_index_ivf(index).nprobe = int(nprobe)
        faiss.downcast_index(index).k_factor = rerank / k
        return index.search(q, k)[1]

    layouts = [("faiss-ivfpq-fastscan", "PQ{m}x4fs".format(m=max(1, d // 2)))]
    why = ""
    if hasattr(faiss, "IndexIVFRaBitQFastScan"):
        layouts += [("faiss-ivf-rabitq-fs", "RaBitQfs"), ("faiss-ivf-rabitq4-fs", "RaBitQfs4")]
    else:
        why = f"faiss {faiss.__version__} has no RaBitQ IVF (1.12 and later)"
    def save(index, path: Path) -> None:
        faiss.write_index(index, str(path))

    def load(path: Path):
        return faiss.read_index(str(path))

    out = [Build(name, factory_build(f"IVF{nl},{codes},RFlat"), search, nl, {"factory": f"IVF{nl},{codes},RFlat"},
                 save, load)
           for name, codes in layouts for nl in lists]
    return out, why


def scann_builds(lists: list[int], d: int, train: int) -> tuple[list[Build], str]:
    try:
        import scann
    except ImportError:
        return [], "scann not installed (pip install scann)"

    def leaf_build(leaves):
        def build(base):
            base = np.ascontiguousarray(base, dtype=np.float32)
            # ScaNN's recipe for inner product: k-means tree, anisotropic 4-bit AH on 2-dimensional blocks
            # (threshold 0.2 as in its examples), then an exact float re-rank of the short list
            b = (scann.scann_ops_pybind.builder(base, K, "dot_product")
                 .tree(num_leaves=leaves, num_leaves_to_search=max(1, leaves // 16),
                       training_sample_size=min(len(base), train))
                 .score_ah(2, anisotropic_quantization_threshold=0.2)
                 .reorder(4 * K))
            b.set_n_training_threads(os.cpu_count() or 1)
            return b.build()
        return build

    def search(searcher, q, k, threads, nprobe, rerank):
        # one thread: search_batched runs on the calling thread only
        return searcher.search_batched(q, k, int(rerank), int(nprobe))[0]

    def save(searcher, path: Path) -> None:
        path.mkdir()
        searcher.serialize(str(path), relative_path=True)  # relative: the folder is renamed into place

    def load(path: Path):
        return scann.scann_ops_pybind.load_searcher(str(path))

    return [Build("scann", leaf_build(nl), search, nl, {"num_leaves": nl, "dims_per_block": 2,
                                                        "anisotropic_quantization_threshold": 0.2}, save, load)
            for nl in lists], ""


def load_real(work: Path, pooling: str, n: int, n_queries: int) -> tuple[Dataset, np.ndarray, np.ndarray]:
    """The first ``n`` passages of the pool, and the first ``n_queries`` tuning and test questions: (data set of
    all its questions, tuning rows, test rows)."""
    import real_pool

    base = real_pool.load_vectors(work, pooling, n)
    questions = real_pool.load_vectors(work, pooling, what="queries")
    if questions.size == 0:
        raise SystemExit(f"no question vectors in {work}/encode/queries: python benchmarks/real_pool.py encode")
    records = real_pool._read_texts(work / "queries.jsonl")
    tune_rows = [i for i, r in enumerate(records) if r["split"] == "tune"][:n_queries]
    test_rows = [i for i, r in enumerate(records) if r["split"] == "test"][:n_queries]
    rows = tune_rows + test_rows
    directory = cache_dir() / f"real-pool-{pooling}-{n}-tune{len(tune_rows)}-test{len(test_rows)}"
    directory.mkdir(parents=True, exist_ok=True)
    ds = Dataset(name=f"real-{pooling}-{n}", base=np.asarray(base, dtype=np.float32),
                 queries=np.asarray(questions[rows], dtype=np.float32), directory=directory,
                 description=f"real pool ({work}), MiniLM {pooling} pooling, first {n:,} rows of the fixed permutation")
    return ds, np.arange(len(tune_rows)), np.arange(len(tune_rows), len(rows))


def tune_build(spec: Build, ds, q_tune, gt_tune, stage: Path) -> None:
    """Build and tune one peer build (in the child process :func:`tune_peer` starts): its row goes to
    ``<stage>/<key>.json`` and, where the target was reached, its index to ``<stage>/<key>.candidate``."""
    from fastdpr.atomic import write_json
    from fastdpr.errors import InputError
    from fastdpr.index import tune

    t0 = time.perf_counter()
    handle = spec.build(ds.base)
    build_s = time.perf_counter() - t0
    print(f"  {spec.key}: built in {build_s:.0f} s, tuning", flush=True)  # a crash's log says which of the two
    index = PeerIndex(spec.system, handle, spec.search, ds.n, ds.dim, spec.nlist)
    t0 = time.perf_counter()
    try:
        result = tune.tune(index, q_tune, target_recall=TARGET, k=K, truth=gt_tune, threads=THREADS)
    except InputError as err:  # the target is out of this build's reach
        write_json(stage / f"{spec.key}.json", {"system": spec.system, "build": spec.params, "nlist": spec.nlist,
                                                "build_s": round(build_s, 1), "error": str(err)})
        return
    row = {"system": spec.system, "build": spec.params, "nlist": spec.nlist, "build_s": round(build_s, 1),
           "tune_s": round(time.perf_counter() - t0, 1), "settings": dict(result.params),
           "tune_recall": result.recall, "tune_qps": result.qps, "evaluations": result.evaluations}
    save_candidate(spec, handle, stage)
    write_json(stage / f"{spec.key}.json", row)  # last: a row on disk means its build is done


def save_candidate(spec: Build, handle, stage: Path) -> None:
    """Write ``handle`` to ``<stage>/<key>.candidate``, whole or not at all (:func:`keep_index` may keep it)."""
    candidate = _clear(stage / f"{spec.key}.candidate")
    partial = _clear(stage / f"{spec.key}.candidate.partial")
    spec.save(handle, partial)
    partial.rename(candidate)


def _clear(path: Path) -> Path:
    """``path`` with nothing at it (a file or a folder removed)."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    return path


def child_command(args, key: str) -> list[str]:
    """The command that builds and tunes build ``key`` in a process of its own, on the data ``args`` name."""
    return [sys.executable, str(Path(__file__).resolve()), "--n", str(args.n), "--pooling", args.pooling,
            "--queries", str(args.queries), "--lists-per-sqrt", ",".join(str(f) for f in args.lists_per_sqrt),
            "--train", str(args.train), "--peers", ",".join(args.peers), "--work", str(args.work), "--build", key]


def tune_peer(spec: Build, args, stage: Path) -> dict:
    """Build and tune one peer build in a child process, or read what an earlier run kept in ``stage``: its row.

    A child process, because a peer library can crash: faiss 1.15.1's IVF RaBitQ fast scan ended the whole run with
    a segmentation fault on the real 1M at 4,000 lists. A build whose process dies is recorded with the signal as
    its error, and the sweep goes on."""
    from fastdpr.atomic import write_json

    kept = stage / f"{spec.key}.json"
    if kept.exists():
        print(f"  {spec.system} {spec.params}: kept from {kept}", flush=True)
        return json.loads(kept.read_text())
    code = subprocess.run(child_command(args, spec.key)).returncode
    if not kept.exists():
        why = f"killed by signal {-code}" if code < 0 else f"exit status {code}"
        row = {"system": spec.system, "build": spec.params, "nlist": spec.nlist,
               "error": f"the build or its tuning crashed ({why})"}  # no timing: the process took it along
        write_json(kept, row)
        print(f"  {spec.system} {spec.params}: {row['error']}", flush=True)
        return row
    row = json.loads(kept.read_text())
    if "error" not in row:
        print(f"  {spec.system} {spec.params}: {row['settings']} recall {row['tune_recall']:.4f} at "
              f"{row['tune_qps']:.0f} q/s on the tuning questions (build {row['build_s']:.0f} s, tune "
              f"{row['tune_s']:.0f} s)", flush=True)
    return row


def keep_index(spec: Build, stage: Path) -> None:
    """Make build ``spec``'s candidate index (:func:`tune_build`) the kept fastest build of its system, in place of
    the one kept before; without a candidate, the kept one stays unnamed (:func:`best_index` builds it again)."""
    from fastdpr.atomic import write_json

    target, marker = stage / f"{spec.system}.index", stage / f"{spec.system}.index.json"
    candidate = stage / f"{spec.key}.candidate"
    # the marker goes first and comes back last: a run stopped in between finds no marker and builds again, never
    # loads one build's index under another build's settings
    marker.unlink(missing_ok=True)
    if not candidate.exists():
        return
    _clear(target)
    candidate.rename(target)  # the folder or file appears whole or not at all
    write_json(marker, {"key": spec.key})


def best_index(spec: Build, row: dict, ds, stage: Path) -> PeerIndex:
    """The index of ``row`` (its system's fastest build): the one kept on disk, else built again (its tuning is
    kept, so only the build is repeated)."""
    marker = stage / f"{spec.system}.index.json"
    if marker.exists() and json.loads(marker.read_text())["key"] == spec.key:
        handle = spec.load(stage / f"{spec.system}.index")
    else:
        print(f"  {spec.key}: no saved index, building it again", flush=True)
        handle = spec.build(ds.base)
        save_candidate(spec, handle, stage)
        keep_index(spec, stage)
    return PeerIndex(spec.system, handle, spec.search, ds.n, ds.dim, spec.nlist)


def peer_builds(args, lists: list[int], dim: int) -> list[tuple[str, list[Build], str]]:
    """(family, its builds, why none) for each family of ``args.peers``."""
    return [(family, *(faiss_builds if family == "faiss" else scann_builds)(lists, dim, args.train))
            for family in args.peers]


def run_build(args, key: str) -> None:
    """The child process of :func:`tune_peer`: build and tune build ``key`` alone."""
    ds, tune_rows, _ = load_real(args.work, args.pooling, args.n, args.queries)
    gt = ground_truth(ds, K)
    lists = peer_lists(args, ds.n)
    specs = [spec for _, builds, _ in peer_builds(args, lists, ds.dim) for spec in builds if spec.key == key]
    if not specs:
        raise SystemExit(f"--build {key!r}: no such build among {args.peers} at lists {lists}")
    stage = ds.directory / f"peers-train{args.train}"
    tune_build(specs[0], ds, ds.queries[tune_rows], gt[tune_rows], stage)


def peer_lists(args, n: int) -> list[int]:
    return sorted({max(1, int(round(f * math.sqrt(n)))) for f in args.lists_per_sqrt})


def run(args) -> dict:
    from fastdpr.index import FlatIndex, build_index, load_index
    from fastdpr.index.auto import choose_index
    from fastdpr.index.tune import recall_at

    ds, tune_rows, test_rows = load_real(args.work, args.pooling, args.n, args.queries)
    gt = ground_truth(ds, K)
    q_tune, q_test = ds.queries[tune_rows], ds.queries[test_rows]
    gt_tune, gt_test = gt[tune_rows], gt[test_rows]
    lists = peer_lists(args, ds.n)
    print(f"{ds.name}: {ds.n:,} x {ds.dim}, {len(tune_rows)} tuning and {len(test_rows)} test questions; "
          f"peer list counts {lists}", flush=True)
    stage = ds.directory / f"peers-train{args.train}"
    stage.mkdir(parents=True, exist_ok=True)

    choice = choose_index(ds.n, ds.dim)
    ours_path, ours_row = stage / "fastdpr-auto.fdpr", stage / "fastdpr-auto.json"
    if ours_row.exists() and ours_path.exists():
        ours, fastdpr_row = load_index(ours_path), json.loads(ours_row.read_text())
        print(f"  fastdpr auto: kept from {ours_row}", flush=True)
    elif args.tuned_only:
        raise SystemExit(f"--tuned-only: fastdpr's tuned index is not in {stage} yet; run without --tuned-only")
    else:
        from fastdpr.atomic import write_json

        t0 = time.perf_counter()
        ours = build_index(ds.base, "auto")
        build_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        # saved with its tuned settings: a resumed run searches with exactly these
        tuned = ours.tune(q_tune, target_recall=TARGET, k=K, truth=gt_tune, threads=THREADS, save=ours_path)
        fastdpr_row = {"system": "fastdpr auto + tune", "build": {"spec": choice.spec}, "build_s": round(build_s, 1),
                       "tune_s": round(time.perf_counter() - t0, 1), "settings": dict(tuned.params),
                       "tune_recall": tuned.recall, "tune_qps": tuned.qps, "evaluations": tuned.evaluations}
        write_json(ours_row, fastdpr_row)
    print(f"  fastdpr auto -> {choice.spec}: {fastdpr_row['settings']} recall {fastdpr_row['tune_recall']:.4f}",
          flush=True)

    skipped, tried = {}, []
    peers: dict[str, tuple[Build, dict]] = {}
    for family, builds, why in peer_builds(args, lists, ds.dim):
        if why:
            skipped[family] = why
            print(f"  {family}: {why}", flush=True)
        # --tuned-only: a system enters the table only with every build of its sweep tuned (its entry is the
        # fastest of them all), so one with a build still to tune is left out whole, and said to be
        untuned = {}
        for spec in builds if args.tuned_only else []:
            if not (stage / f"{spec.key}.json").exists():
                untuned.setdefault(spec.system, []).append(spec.nlist)
        for system, left in untuned.items():
            total = sum(spec.system == system for spec in builds)
            skipped[system] = (f"{total - len(left)} of {total} builds tuned so far (lists {left} not yet; "
                               "timed by a run without --tuned-only)")
            print(f"  {system}: {skipped[system]}", flush=True)
        for spec in builds:
            if spec.system in untuned:
                continue
            row = tune_peer(spec, args, stage)
            best = peers.get(spec.system)
            candidate = stage / f"{spec.key}.candidate"  # where this run built and tuned it
            if "error" not in row and (best is None or row["tune_qps"] > best[1]["tune_qps"]):
                if candidate.exists():
                    keep_index(spec, stage)
                peers[spec.system] = (spec, row)  # the fastest build so far
            _clear(candidate)
            tried.append(row)

    flat = FlatIndex(ds.dim)
    flat.add(ds.base)
    contenders = {"fastdpr auto + tune": lambda: ours.search(q_test, K, threads=THREADS),
                  "exact (fastdpr flat)": lambda: flat.search(q_test, K, threads=THREADS)}
    test_recall = {"fastdpr auto + tune": recall_at(ours.search(q_test, K, threads=THREADS)[1], gt_test),
                   "exact (fastdpr flat)": 1.0}
    for name, (spec, row) in peers.items():
        index, settings = best_index(spec, row, ds, stage), row["settings"]
        contenders[name] = lambda i=index, s=settings: i.search(q_test, K, THREADS, **s)
        test_recall[name] = recall_at(index.search(q_test, K, THREADS, **settings)[1], gt_test)
    times = side_by_side(contenders, args.rounds)
    chosen = [fastdpr_row] + [dict(r) for _, r in peers.values()]
    for row in chosen:
        row["test_recall"] = test_recall[row["system"]]
        row["test_qps"] = len(q_test) / times[row["system"]]
    exact_qps = len(q_test) / times["exact (fastdpr flat)"]
    return {"set": ds.name, "n": ds.n, "dim": ds.dim, "description": ds.description, "pooling": args.pooling,
            "tune_questions": len(tune_rows), "test_questions": len(test_rows), "lists": lists, "train": args.train,
            "rounds": args.rounds, "chosen": chosen, "tried": tried, "skipped": skipped, "exact_qps": exact_qps,
            "load": os.getloadavg()}


def report(out: dict) -> str:
    rows = []
    fastdpr_qps = out["chosen"][0]["test_qps"]
    for r in out["chosen"]:
        rows.append({"system": r["system"], "build": ", ".join(f"{k} {v}" for k, v in r["build"].items()),
                     "settings": ", ".join(f"{k} {v}" for k, v in r["settings"].items()),
                     "recall@100 tuning": r["tune_recall"], "recall@100 test": r["test_recall"],
                     "q/s test": int(round(r["test_qps"])), "fastdpr ÷ it": f"{fastdpr_qps / r['test_qps']:.2f}×",
                     "build s": int(round(r["build_s"]))})
    rows.append({"system": "exact (fastdpr flat)", "recall@100 test": 1.0, "q/s test": int(round(out["exact_qps"])),
                 "fastdpr ÷ it": f"{fastdpr_qps / out['exact_qps']:.2f}×"})
    tried = []
    for t in out["tried"]:  # a build whose tuning failed has an error instead of settings
        tried.append({"system": t["system"], "build": ", ".join(f"{k} {v}" for k, v in t["build"].items()),
                      "settings": ", ".join(f"{k} {v}" for k, v in t.get("settings", {}).items()) or t.get("error"),
                      "recall@100 tuning": t.get("tune_recall"),
                      "q/s tuning": int(round(t["tune_qps"])) if "tune_qps" in t else None,
                      "build s": int(round(t["build_s"])) if "build_s" in t else None,
                      "tune s": int(round(t["tune_s"])) if "tune_s" in t else None})
    peers = out["chosen"][1:]
    best = max(peers, key=lambda r: r["test_qps"]) if peers else None
    verdict = (f"fastdpr auto + tune {fastdpr_qps:.0f} q/s against the best peer, {best['system']}, "
               f"{best['test_qps']:.0f} q/s: **{fastdpr_qps / best['test_qps']:.2f}×** (target 1.5×)"
               if best else "no peer measured")
    skipped = "".join(f"\n- {k}: {v}" for k, v in out["skipped"].items())
    return (f"{out['description']}; {out['tune_questions']} tuning and {out['test_questions']} test questions; "
            f"recall@100 target {TARGET}, 1 thread; peer list counts {out['lists']} (k-means on "
            f"{min(out['train'], out['n']):,} rows); q/s the best of {out['rounds']} alternating rounds on the test "
            f"questions; load average at the end {tuple(round(v, 1) for v in out['load'])}.\n\n"
            f"{verdict}.\n\n### Chosen on the tuning questions, measured on the test questions\n\n"
            + markdown_table(rows, floatfmt=".4f")
            + "\n\n### Every build tried (tuning questions)\n\n" + markdown_table(tried, floatfmt=".4f")
            + (f"\n\nNot measured:{skipped}" if skipped else ""))


def main(argv: list[str] | None = None) -> int:
    import real_pool

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, required=True, help="passages: the first n of the pool's fixed permutation")
    ap.add_argument("--pooling", default="mean", choices=real_pool.POOLINGS)
    ap.add_argument("--queries", type=int, default=1000, help="tuning questions, and as many test questions")
    ap.add_argument("--lists-per-sqrt", default="2,4,8",
                    help="the peers' list (leaf) counts, as multiples of sqrt(n), comma-separated")
    ap.add_argument("--train", type=int, default=250_000, help="rows the peers' k-means sees")
    ap.add_argument("--peers", default="faiss,scann")
    ap.add_argument("--rounds", type=int, default=3, help="alternating timing rounds on the test questions")
    ap.add_argument("--tuned-only", action="store_true",
                    help="build and tune nothing: time the systems whose every build an earlier run tuned")
    ap.add_argument("--work", type=Path, default=None, help="real_pool.py's folder (default: its cache folder)")
    ap.add_argument("--build", default=None, help=argparse.SUPPRESS)  # the child process of one build
    ap.add_argument("--name", default=None)
    ap.add_argument("--out", default=None, help="results folder (default: benchmarks/results)")
    args = ap.parse_args(argv)
    try:
        args.lists_per_sqrt = [float(v) for v in args.lists_per_sqrt.split(",") if v.strip()]
    except ValueError:
        ap.error(f"--lists-per-sqrt {args.lists_per_sqrt!r}: comma-separated numbers")
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(args.peers) - {"faiss", "scann"}
    if unknown:
        ap.error(f"--peers: unknown {sorted(unknown)}; known: faiss, scann")
    if args.n < 1 or args.queries < 1 or args.rounds < 1 or not args.lists_per_sqrt:
        ap.error("--n, --queries, --rounds and --lists-per-sqrt must be positive")
    args.work = args.work or real_pool.default_work()
    if args.build:
        run_build(args, args.build)
        return 0
    try:
        out = run(args)
    except ValueError as err:  # fewer rows encoded than asked for
        raise SystemExit(f"ann_peers: {err}") from None
    name = args.name or f"ann_peers_{args.pooling}_{args.n}"
    write_results(name, args.out, out, report(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
