"""Real question-answering data, byte for byte as its authors publish it: fetch once, check, load, split.

Every file comes from a public repository at a pinned commit and must hash to a pinned sha256 (``FILES``); a file
that differs is refused by name. Where the machine reaches no network, a folder holding the same files stands in
(``fastdpr data fetch --from DIR``, or ``$FASTDPR_DATA_DIR``); after one fetch the files live in the cache and
nothing else is needed.

Usage::

    from fastdpr.data import sources
    cache = sources.fetch()                          # the cache (~/.cache/fastdpr), every file checked
    passages, questions = sources.load(cache, "qed")
    prepared = sources.prepare(cache)                # {name: {"passages", "train", "dev", "test", "counts"}}

Loaders return passages as ``{"id", "title", "text"}`` dicts with stable ids (a hash of title and text, so the same
paragraph gets the same id in every subset and on every machine) and questions as ``{"qid", "question",
"answers", "gold_ids"}`` records, ``gold_ids`` naming the passages (paragraphs) a question was written about.

Which set plays which part (docs/architecture.md, "Real data"):

* ``qed``: 1,355 Natural Questions questions with the Wikipedia paragraph each was answered from (QED's dev set,
  a subset of NQ dev). Split by article: half the articles are the **NQ test set** (NQ is what DPR and the starting
  model were trained on, so it is the set readers compare with), a tenth validation, the rest training.
* ``new_wiki``: SQuADShifts' new Wikipedia articles, SQuAD-style questions written on paragraphs. Split by article
  (48 articles): 80% training, 10% validation, 10% an in-domain test set. It is the only large set of SQuAD-style
  questions here, and SQuAD-style questions are where a retriever still has to learn lexical precision.
* ``xquad``: the 240 paragraphs / 1,190 questions of SQuAD v1.1 dev in XQuAD, the **SQuAD test set**; never
  trained on.
* ``reddit``, ``amazon``: SQuADShifts' Reddit posts and Amazon reviews, the **unseen domains**: no training,
  validation or choice of a setting ever reads them.
* ``nq_open_dev``, ``efficientqa_dev``, ``efficientqa_test`` and ``dpr:<set>``: real questions with answers and no
  passages (a realistic query stream for speed and index benchmarks).
"""
from __future__ import annotations

import ast
import csv
import hashlib
import json
import os
import shutil
import ssl
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

from fastdpr.atomic import atomic_open, write_json
from fastdpr.errors import DataUnavailable, FastDPRError, InputError

CACHE_ENV = "FASTDPR_CACHE"
#: a folder holding the published files (as under ``FILES``), taken instead of the network
DATA_DIR_ENV = "FASTDPR_DATA_DIR"


@dataclass(frozen=True)
class QAFile:
    """One published file, pinned by repository, commit and sha256."""

    name: str
    repo: str
    commit: str
    path: str
    sha256: str
    licence: str

    @property
    def url(self) -> str:
        return f"https://raw.githubusercontent.com/{self.repo}/{self.commit}/{self.path}"

    @property
    def origin(self) -> str:
        return f"github.com/{self.repo} at {self.commit[:12]}, {self.path}"


_QED = "google-research-datasets/QED", "2492920337122918bbfc7d12c1268b9af796c6cf"
_XQUAD = "deepmind/xquad", "60cac411649156efb6aab9dd4c9cde787a2c0345"
_SHIFTS = "modestyachts/squadshifts-website", "b7cc4d50af791c36c49417fb94dd739d6a9e7bef"
_NQ = "google-research-datasets/natural-questions", "fb26a3073b1fe636c97302890a27b491d6530130"
_ANSERINI = "castorini/anserini-tools", "5b819c1a45c8a0a3ec9426f476694f44a29dfaf3"


_ROWS = [
    ("qed-dev.jsonlines", _QED, "qed-dev.jsonlines",
     "2ea322b71a333023380c3954083b81af2d5670c8ac47ddec58c843233895c429", "CC BY-SA 3.0"),
    ("xquad.en.json", _XQUAD, "xquad.en.json",
     "e4c57d1c9143aaa1c5d265ba5987a65f4e69528d2a98f29d6e75019b10344f29", "CC BY-SA 4.0"),
    ("squadshifts_new_wiki_v1.0.json", _SHIFTS, "datasets/new_wiki_v1.0.json",
     "1d50a0ca4cdab88d038b52ea8a2d0510af6038d7f41a0a256b9659237769d0ee", "CC BY 4.0"),
    ("squadshifts_reddit_v1.0.json", _SHIFTS, "datasets/reddit_v1.0.json",
     "b4ac346dbf1816fdec80fdcf91d06a4b754fa51e47960fa8614a94f37ea42a4b", "CC BY 4.0"),
    ("squadshifts_amazon_reviews_v1.0.json", _SHIFTS, "datasets/amazon_reviews_v1.0.json",
     "9db7bdee84a91f0fb80b9e74f365042fbbb217cb8e0a7e73bb071245472589b6", "CC BY 4.0"),
    ("NQ-open.dev.jsonl", _NQ, "nq_open/NQ-open.dev.jsonl",
     "f15567f38099f3615f5b8a685c0aef449c11ad90d3da3735e8d1b98115b40616", "CC BY-SA 3.0"),
    ("NQ-open.efficientqa.dev.1.1.jsonl", _NQ, "nq_open/NQ-open.efficientqa.dev.1.1.jsonl",
     "0ad45e2fa9fd32d10b3cf08c63e6d22f97ba1a0ce44ea98040f4c18bce7e268d", "CC BY-SA 3.0"),
    ("NQ-open.efficientqa.test.1.1.jsonl", _NQ, "nq_open/NQ-open.efficientqa.test.1.1.jsonl",
     "c37b3cb2069632dfef219fa770d7910ac77ff6d12a08e8f3d5f058b388aca8a6", "CC BY-SA 3.0"),
    ("topics.dpr.nq.test.txt", _ANSERINI, "topics/topics.dpr.nq.test.txt",
     "480cfe1d5b81bedd879ffe7c6a9ec294d317811e71c44daabfe242ca9d719d46", "CC BY-SA 3.0 (NQ)"),
    ("topics.dpr.nq.dev.txt", _ANSERINI, "topics/topics.dpr.nq.dev.txt",
     "95ab55300a28f079302502da5fe48b0e4ced4b25e111fa03d08cb1ba361834c1", "CC BY-SA 3.0 (NQ)"),
    ("topics.dpr.squad.test.txt", _ANSERINI, "topics/topics.dpr.squad.test.txt",
     "380c71fadfe5230412b170d87e2373f3bb90027b6121afd21be92a60cf7b2af8", "CC BY-SA 4.0 (SQuAD)"),
    ("topics.dpr.trivia.dev.txt", _ANSERINI, "topics/topics.dpr.trivia.dev.txt",
     "79e7ea851bb5ca6ebbfd6c760d032064d324166d46b8ffaf70e0fb733186ed2a", "Apache-2.0 (TriviaQA)"),
    ("topics.dpr.curated.test.txt", _ANSERINI, "topics/topics.dpr.curated.test.txt",
     "0545ad16b1ddc5379e3938a3bfd3237c02f0bfe05ef4a2a227957f65c963592b", "as DPR's data (CuratedTREC)"),
]


FILES = {name: QAFile(name, repo, commit, path, digest, licence)
         for name, (repo, commit), path, digest, licence in _ROWS}

# dataset name -> (file, loader kind, passage-id prefix)
DATASETS = {
    "qed": ("qed-dev.jsonlines", "qed", "nq"),
    "xquad": ("xquad.en.json", "squad", "squad"),
    "new_wiki": ("squadshifts_new_wiki_v1.0.json", "squad", "newwiki"),
    "reddit": ("squadshifts_reddit_v1.0.json", "squad", "reddit"),
    "amazon": ("squadshifts_amazon_reviews_v1.0.json", "squad", "amazon"),
    "nq_open_dev": ("NQ-open.dev.jsonl", "nq_open", ""),
    "efficientqa_dev": ("NQ-open.efficientqa.dev.1.1.jsonl", "nq_open", ""),
    "efficientqa_test": ("NQ-open.efficientqa.test.1.1.jsonl", "nq_open", ""),
}
DPR_TOPICS = ("nq.test", "nq.dev", "squad.test", "trivia.dev", "curated.test")

#: (dev, test) shares of each set with passages, split by article; a set not named is a test set only
SPLITS = {"qed": (0.1, 0.5), "new_wiki": (0.1, 0.1)}
#: the sets :func:`prepare` writes by default: every set with passages
PASSAGE_SETS = ("qed", "xquad", "new_wiki", "reddit", "amazon")


def default_cache() -> Path:
    """``$FASTDPR_CACHE`` if set, else ``~/.cache/fastdpr``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "fastdpr"


def default_source_dir() -> Path | None:
    """``$FASTDPR_DATA_DIR`` if set: a local copy of the published files."""
    env = os.environ.get(DATA_DIR_ENV)
    return Path(env).expanduser() if env else None


# ------------------------------------------------------------------------------------------------------------ fetch


def sha256_of(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _ssl_context() -> ssl.SSLContext:
    # the CA bundle pip is told to use, so a machine behind a TLS-inspecting proxy works the same
    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or None
    if cafile and not Path(cafile).is_file():
        cafile = None
    return ssl.create_default_context(cafile=cafile)


def _copy_checked(source, destination: Path, file: QAFile) -> None:
    """Stream ``source`` (a binary file object) into ``destination`` atomically, refusing a sha256 mismatch."""
    digest = hashlib.sha256()
    with atomic_open(destination, "wb") as out:
        while block := source.read(1 << 20):
            digest.update(block)
            out.write(block)
        if digest.hexdigest() != file.sha256:
            # raising inside atomic_open discards the temporary file: a wrong file never lands in the cache
            raise FastDPRError(
                f"{file.name}: sha256 {digest.hexdigest()} differs from the pinned {file.sha256} "
                f"(the published file is {file.origin}); refused"
            )


def _hand_over(file: QAFile, cache: Path) -> str:
    return (f"it is published at {file.origin}: run `fastdpr data fetch` where that is reachable, or put a copy "
            f"in a folder and run `fastdpr data fetch --from DIR` (or set ${DATA_DIR_ENV}=DIR); "
            f"the cache is {cache}")


def cached_path(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Where file ``name`` lies once fetched (``cache/qa/<name>``)."""
    return (Path(cache) if cache is not None else default_cache()) / "qa" / name


def fetch_file(name: str, cache: str | os.PathLike | None = None, source_dir: str | os.PathLike | None = None,
               timeout: float = 120.0) -> Path:
    """Put file ``name`` into ``cache/qa/`` once, checked against its sha256, and return its path.

    A file already there that was checked (a ``.sha256`` stamp beside it) is kept. Otherwise it is copied from
    ``source_dir`` (default ``$FASTDPR_DATA_DIR``) when given, else downloaded from its repository."""
    if name not in FILES:
        raise KeyError(f"unknown data file {name!r}; known: {sorted(FILES)}")
    file = FILES[name]
    cache = Path(cache) if cache is not None else default_cache()
    target = cached_path(name, cache)
    stamp = target.with_name(target.name + ".sha256")
    if target.is_file() and stamp.is_file() and stamp.read_text().strip() == file.sha256:
        return target
    source_dir = Path(source_dir) if source_dir is not None else default_source_dir()
    if source_dir is not None:
        local = source_dir / name
        if not local.is_file():
            raise DataUnavailable(f"{name}: not found in {source_dir}; {_hand_over(file, cache)}")
        with open(local, "rb") as fh:
            _copy_checked(fh, target, file)
    else:
        request = urllib.request.Request(file.url, headers={"User-Agent": "fastdpr-data-fetch"})
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=_ssl_context()) as response:
                _copy_checked(response, target, file)
        except OSError as err:
            raise DataUnavailable(f"{name}: cannot download {file.url} ({err}); {_hand_over(file, cache)}") from err
    with atomic_open(stamp, "w") as fh:
        fh.write(file.sha256 + "\n")
    return target


def fetch(cache: str | os.PathLike | None = None, source_dir: str | os.PathLike | None = None,
          names: Iterable[str] | None = None, show_progress: bool = True) -> Path:
    """Fetch every file (or ``names``) into the cache, each checked; return the cache. Safe to call again."""
    from fastdpr.progress import progress

    cache = Path(cache) if cache is not None else default_cache()
    names = list(names) if names is not None else list(FILES)
    with progress(total=len(names), unit="file", desc="data", enabled=show_progress) as bar:
        for name in names:
            fetch_file(name, cache, source_dir)
            bar.update(1)
    return cache


def dataset_path(cache: str | os.PathLike, dataset: str) -> Path:
    """The fetched file of ``dataset`` (a key of ``DATASETS`` or ``"dpr:<set>"``), checked to be there."""
    if dataset.startswith("dpr:"):
        name = f"topics.dpr.{dataset[4:]}.txt"
    else:
        name = DATASETS[dataset][0] if dataset in DATASETS else None
    if name not in FILES:
        raise KeyError(f"unknown dataset {dataset!r}; known: {sorted(DATASETS)} and dpr:<{'|'.join(DPR_TOPICS)}>")
    path = cached_path(name, cache)
    if not path.is_file():
        raise DataUnavailable(f"{name} is not in the cache; {_hand_over(FILES[name], Path(cache))}")
    return path


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


def load_qed(path: str | os.PathLike, prefix: str = "nq") -> tuple[list[dict], list[dict]]:
    """QED's jsonlines: each line a Natural Questions question with its Wikipedia paragraph (``paragraph_text``,
    title ``title_text``) and NQ's short answers (``original_nq_answers``: one list of spans per annotator, with
    character offsets into the paragraph, checked here).

    Answers are the distinct strings of the single-span annotations, as NQ-open keeps them (a multi-span
    annotation, a list of several names, is no one answer string); a question whose annotators all gave several
    spans keeps every span, so that no question loses its answers. Returns (unique paragraphs, questions)."""
    passages: dict[str, dict] = {}
    questions = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                title, text = str(record["title_text"]), record["paragraph_text"]
                question, annotations = record["question_text"], record["original_nq_answers"]
                example = record["example_id"]
            except json.JSONDecodeError as err:
                raise InputError(f"bad JSON: {err.msg}", path=str(path), line=number) from err
            except (KeyError, TypeError) as err:
                raise InputError(f"missing field {err}", path=str(path), line=number) from err
            for span in (s for annotation in annotations for s in annotation):
                if text[span["start"]:span["end"]] != span["string"]:
                    raise InputError(f"answer {span['string']!r} is not at {span['start']}:{span['end']} of its "
                                     "paragraph", path=str(path), line=number)
            single = [a[0]["string"] for a in annotations if len(a) == 1]
            answers = single or [s["string"] for a in annotations for s in a]
            answers = [a for a in dict.fromkeys(a.strip() for a in answers) if a]
            if not answers:
                raise InputError("a question without an answer", path=str(path), line=number)
            pid = passage_id(prefix, title, text.strip())
            passages.setdefault(pid, {"id": pid, "title": title, "text": text.strip()})
            questions.append({"qid": f"{prefix}-{example}", "question": question.strip(), "answers": answers,
                              "gold_ids": [pid]})
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
    """A DPR question file as Anserini ships it: ``question \\t ['answer', ...]`` lines (CSV-quoted where a field
    holds quotes), or JSON lines
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
                # DPR's files are CSV with tabs: a field holding quotes is quoted, its quotes doubled
                fields = next(csv.reader([line], delimiter="\t"))
                if len(fields) != 2:
                    raise InputError("expected 'question<TAB>[answers]'", path=str(path), line=number)
                question, answers_text = fields
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


def load_nq_open(path: str | os.PathLike, prefix: str = "nqopen") -> list[dict]:
    """NQ-open / EfficientQA jsonl: ``{"question", "answer": [...]}`` a line, no passages (``gold_ids`` empty).
    qids are line numbers."""
    questions = []
    for number, record in _jsonl(path):
        question, answers = record.get("question"), record.get("answer")
        if not isinstance(question, str) or not question.strip():
            raise InputError("expected a non-empty 'question' string", path=str(path), line=number)
        if not isinstance(answers, list) or not all(isinstance(a, str) for a in answers):
            raise InputError("expected 'answer' as a list of strings", path=str(path), line=number)
        questions.append({"qid": f"{prefix}-{number}", "question": question.strip(), "answers": answers,
                          "gold_ids": []})
    return questions


def load(cache: str | os.PathLike, dataset: str) -> tuple[list[dict], list[dict]]:
    """Load one fetched dataset by name (a key of ``DATASETS`` or ``dpr:<set>``): (passages, questions); sets
    without passages give an empty passage list."""
    path = dataset_path(cache, dataset)
    if dataset.startswith("dpr:"):
        return [], load_dpr_topics(path)
    _, kind, prefix = DATASETS[dataset]
    if kind == "qed":
        return load_qed(path, prefix)
    if kind == "nq_open":
        return [], load_nq_open(path, prefix=dataset.replace("_", ""))
    return load_squad(path, prefix=prefix)


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
    for _, record in _jsonl(path):
        yield record


def _jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield number, json.loads(line)
                except json.JSONDecodeError as err:
                    raise InputError(f"bad JSON: {err.msg}", path=str(path), line=number) from err


# 3: the published QA files (QED, XQuAD, SQuADShifts), split by article
SPLIT_VERSION = 3


def prepare(cache: str | os.PathLike, datasets: Iterable[str] = PASSAGE_SETS) -> dict[str, dict]:
    """Write each fetched set with passages in the project's formats under ``cache/prepared/<name>/``:
    ``passages.jsonl`` and ``{train,dev,test}.jsonl`` for the sets of ``SPLITS`` (split by article, so no
    article's questions straddle two splits), ``test.jsonl`` alone for the others. Returns {name: {"passages":
    path, "test": path, ..., "counts": {...}}}; complete outputs of the same split are kept."""
    cache = Path(cache)
    out = {}
    for name in datasets:
        if name not in PASSAGE_SETS:
            raise KeyError(f"{name!r} has no passages to prepare; sets with passages: {PASSAGE_SETS}")
        folder = cache / "prepared" / name
        done = folder / "counts.json"
        if not done.is_file() or json.loads(done.read_text()).get("split") != SPLIT_VERSION:
            passages, questions = load(cache, name)
            if name in SPLITS:
                dev, test = SPLITS[name]
                splits = split_by_question(questions, dev=dev, test=test, group=document_group(passages))
            else:
                splits = {"test": questions}
            write_passages_jsonl(folder / "passages.jsonl", passages)
            for split, records in splits.items():
                write_qa_jsonl(folder / f"{split}.jsonl", records)
            # written last: its presence says the folder is complete
            write_json(done, {"passages": len(passages), **{s: len(r) for s, r in splits.items()},
                              "split": SPLIT_VERSION})
        counts = json.loads(done.read_text())
        names = ["passages"] + [s for s in ("train", "dev", "test") if s in counts]
        out[name] = {**{n: str(folder / f"{n}.jsonl") for n in names}, "counts": counts}
    return out
