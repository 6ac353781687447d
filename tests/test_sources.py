"""Real-data sources: loaders on committed samples and on the published files when present, passage ids pinned
by value, the deterministic split, and fetching (from a folder, from a local HTTP server standing in for the
repositories, sha256 refusals, the one-line message for a missing file)."""
from __future__ import annotations

import functools
import hashlib
import http.server
import json
import shutil
import threading
from pathlib import Path

import pytest

from fastdpr.data import sources
from fastdpr.errors import DataUnavailable, FastDPRError, InputError

SAMPLES = Path(__file__).parent / "data" / "sources"


def test_load_qed_answers_gold_paragraph_and_ids():
    passages, questions = sources.load_qed(SAMPLES / "qed_sample.jsonlines")
    assert len(questions) == 8 and len(passages) == 8
    first = questions[0]
    assert first["question"] == "who got the first nobel prize in physics"
    assert first["answers"] == ["Wilhelm Conrad Röntgen , of Germany", "Wilhelm Conrad Röntgen"]
    assert first["qid"] == "nq--3290814144789249484"
    by_id = {p["id"]: p for p in passages}
    assert by_id[first["gold_ids"][0]]["title"] == "List of Nobel laureates in Physics"
    for q in questions:
        assert all(a in by_id[q["gold_ids"][0]]["text"] for a in q["answers"])
    # every annotator gave several spans: each span is an answer, so the question keeps answers
    jeep = next(q for q in questions if q["question"] == "what type of car is a jeep considered")
    assert jeep["answers"] == ["sport utility vehicles", "off - road vehicles"]
    # single-span annotations exist: the multi-span one (two names) is no answer string of its own
    garden = next(q for q in questions if q["question"].startswith("who designed the garden city"))
    assert "architect Barry Parker" not in garden["answers"] and "Raymond Unwin" in garden["answers"]


def test_passage_ids_are_pinned_by_value():
    # ids name passages in every run, index and result file: a change of hash or of the text it covers is a break
    assert sources.passage_id("nq", "Title", "Some text.") == "nq-" + hashlib.sha1(
        b"Title\nSome text.").hexdigest()[:12]
    assert sources.passage_id("nq", "Title", "Some text.") == "nq-140634080a57"
    passages, _ = sources.load_qed(SAMPLES / "qed_sample.jsonlines")
    assert passages[0]["id"] == "nq-76d969d38711"
    squad, _ = sources.load_squad(SAMPLES / "squad_dev_sample.json", prefix="squad")
    assert squad[0]["id"] == sources.passage_id("squad", squad[0]["title"], squad[0]["text"])


def test_load_qed_names_the_bad_line(tmp_path):
    lines = (SAMPLES / "qed_sample.jsonlines").read_text().splitlines()
    record = json.loads(lines[1])
    record["original_nq_answers"][0][0]["start"] += 3
    path = tmp_path / "qed.jsonlines"
    path.write_text("\n".join([lines[0], json.dumps(record)]) + "\n")
    with pytest.raises(InputError, match=r"qed\.jsonlines:2: answer .* is not at"):
        sources.load_qed(path)
    path.write_text(lines[0] + "\n" + json.dumps({"question_text": "q"}) + "\n")
    with pytest.raises(InputError, match=r"qed\.jsonlines:2: missing field"):
        sources.load_qed(path)
    path.write_text("{not json\n")
    with pytest.raises(InputError, match=r"qed\.jsonlines:1: bad JSON"):
        sources.load_qed(path)


def test_load_nq_open(tmp_path):
    questions = sources.load_nq_open(SAMPLES / "nq_open_sample.jsonl")
    assert len(questions) == 5 and questions[0]["qid"] == "nqopen-1"
    assert questions[0]["question"] == "when was the last time anyone was on the moon"
    assert questions[0]["answers"] == ["14 December 1972 UTC", "December 1972"]
    assert all(q["gold_ids"] == [] for q in questions)
    path = tmp_path / "bad.jsonl"
    path.write_text('{"question": "q", "answer": ["a"]}\n{"question": "q2", "answer": "a"}\n')
    with pytest.raises(InputError, match=r"bad\.jsonl:2: expected 'answer'"):
        sources.load_nq_open(path)


@pytest.mark.parametrize("name, sizes", [("squad_dev_sample.json", (2, 6)),
                                         ("squadshifts_new_wiki_sample.json", (5, 15))])
def test_load_squad(name, sizes):
    passages, questions = sources.load_squad(SAMPLES / name, prefix="x")
    assert (len(passages), len(questions)) == sizes
    by_id = {p["id"]: p for p in passages}
    raw = json.loads((SAMPLES / name).read_text())
    first_qa = raw["data"][0]["paragraphs"][0]["qas"][0]
    assert questions[0]["qid"] == f"x-{first_qa['id']}"
    for q in questions:
        assert q["answers"] and len(set(q["answers"])) == len(q["answers"])
        text = by_id[q["gold_ids"][0]]["text"]
        assert all(a in text for a in q["answers"])
    assert all("_" not in p["title"] for p in passages)


def test_load_dpr_topics():
    nq = sources.load_dpr_topics(SAMPLES / "topics.dpr.nq.test.txt")
    assert [q["qid"] for q in nq] == ["0", "1", "2", "3", "4"]
    assert nq[0]["question"] == "who got the first nobel prize in physics"
    assert nq[0]["answers"] == ["Wilhelm Conrad Röntgen"]
    assert nq[2]["answers"] == ["Olivia", "MFSK"]
    curated = sources.load_dpr_topics(SAMPLES / "topics.dpr.curated.test.txt")
    assert curated[0]["question"] == "How tall is Mount McKinley?"
    assert "\\s?" in curated[0]["answers"][0]  # regular expressions, kept verbatim


def test_load_dpr_topics_reads_csv_quoted_fields(tmp_path):
    # line 37 of topics.dpr.nq.test.txt, as published
    path = tmp_path / "t.txt"
    path.write_text('who sings the theme song for the proud family\t"[\'Solange Knowles\', ""Destiny \'s Child""]"\n')
    (q,) = sources.load_dpr_topics(path)
    assert q["answers"] == ["Solange Knowles", 'Destiny \'s Child']


def test_load_dpr_topics_names_the_bad_line(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("good question\t['a']\nbad question\t['unclosed\n")
    with pytest.raises(InputError, match=r"t\.txt:2:"):
        sources.load_dpr_topics(path)


def test_split_is_deterministic_disjoint_and_order_free():
    questions = [{"qid": str(i), "question": f"question number {i}?", "answers": ["x"]} for i in range(3000)]
    splits = sources.split_by_question(questions)
    again = sources.split_by_question(list(reversed(questions)))
    for name in ("train", "dev", "test"):
        assert sorted(q["qid"] for q in splits[name]) == sorted(q["qid"] for q in again[name])
    sizes = {k: len(v) for k, v in splits.items()}
    assert sum(sizes.values()) == 3000
    assert 200 < sizes["test"] < 400 and 200 < sizes["dev"] < 400
    # the same question asked twice (case, spacing) lands in one split
    dup = [{"qid": "a", "question": "Who  Wrote X?"}, {"qid": "b", "question": "who wrote x?"}]
    placed = {q["qid"]: name for name, qs in sources.split_by_question(dup * 1).items() for q in qs}
    assert placed["a"] == placed["b"]


def test_deduplicate_keeps_first():
    a = [{"id": "a1", "title": "", "text": "Same  text"}, {"id": "a2", "title": "", "text": "other"}]
    b = [{"id": "b1", "title": "T", "text": "same text"}]
    assert [p["id"] for p in sources.deduplicate([a, b])] == ["a1", "a2"]


# ------------------------------------------------------------------------------------------------------ fetching


@pytest.fixture
def sample_files(tmp_path, monkeypatch):
    """Two pinned files whose published copies are the committed samples: a folder holding them, and FILES
    narrowed to them with the samples' sha256."""
    folder = tmp_path / "published"
    folder.mkdir()
    pinned = {}
    for name, sample in (("qed-dev.jsonlines", "qed_sample.jsonlines"),
                         ("NQ-open.dev.jsonl", "nq_open_sample.jsonl")):
        shutil.copy(SAMPLES / sample, folder / name)
        old = sources.FILES[name]
        pinned[name] = sources.QAFile(name, old.repo, old.commit, old.path, sources.sha256_of(folder / name),
                                      old.licence)
    monkeypatch.setattr(sources, "FILES", pinned)
    monkeypatch.delenv(sources.DATA_DIR_ENV, raising=False)
    return folder


def test_fetch_from_a_folder_then_from_the_cache(tmp_path, sample_files):
    cache = tmp_path / "cache"
    assert sources.fetch(cache, source_dir=sample_files, show_progress=False) == cache
    shutil.rmtree(sample_files)  # once fetched, the cache alone serves
    assert sources.fetch(cache, show_progress=False) == cache
    passages, questions = sources.load(cache, "qed")
    assert len(questions) == 8 and len(passages) == 8
    assert len(sources.load(cache, "nq_open_dev")[1]) == 5


def test_the_environment_names_a_local_copy(tmp_path, sample_files, monkeypatch):
    monkeypatch.setenv(sources.DATA_DIR_ENV, str(sample_files))
    path = sources.fetch_file("qed-dev.jsonlines", tmp_path / "cache")
    assert path.read_bytes() == (sample_files / "qed-dev.jsonlines").read_bytes()


def test_a_file_that_differs_is_refused_by_name(tmp_path, sample_files):
    (sample_files / "qed-dev.jsonlines").write_text("{}\n")
    with pytest.raises(FastDPRError, match=r"qed-dev\.jsonlines: sha256 \w+ differs from the pinned"):
        sources.fetch(tmp_path / "cache", source_dir=sample_files, show_progress=False)
    assert not list((tmp_path / "cache").rglob("qed-dev*"))  # nothing half-written lands in the cache


def test_a_missing_file_says_where_it_comes_from_and_how_to_hand_it_over(tmp_path, sample_files):
    (sample_files / "NQ-open.dev.jsonl").unlink()
    with pytest.raises(DataUnavailable) as err:
        sources.fetch(tmp_path / "cache", source_dir=sample_files, show_progress=False)
    message = str(err.value)
    assert "\n" not in message
    assert "NQ-open.dev.jsonl: not found in" in message
    assert "google-research-datasets/natural-questions" in message and "nq_open/NQ-open.dev.jsonl" in message
    assert "--from DIR" in message and sources.DATA_DIR_ENV in message
    with pytest.raises(DataUnavailable, match="NQ-open.dev.jsonl is not in the cache"):
        sources.load(tmp_path / "cache", "nq_open_dev")


@pytest.fixture
def repository_server(sample_files, monkeypatch):
    """A local HTTP server laid out as <repo>/<commit>/<path>, standing in for the repositories."""
    root = sample_files.parent / "served"
    for file in sources.FILES.values():
        target = root / file.repo / file.commit / file.path
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(sample_files / file.name, target)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    monkeypatch.setattr(sources.QAFile, "url", property(lambda f: f"{base}/{f.repo}/{f.commit}/{f.path}"))
    yield root
    server.shutdown()
    server.server_close()


def test_fetch_downloads_from_the_repository(tmp_path, repository_server):
    cache = sources.fetch(tmp_path / "cache", show_progress=False)
    assert sources.load_qed(sources.dataset_path(cache, "qed"))[1][0]["question"].startswith("who got")
    # a corrupted download is refused and never cached
    file = sources.FILES["NQ-open.dev.jsonl"]
    (repository_server / file.repo / file.commit / file.path).write_text("tampered\n")
    with pytest.raises(FastDPRError, match="NQ-open.dev.jsonl: sha256"):
        sources.fetch_file("NQ-open.dev.jsonl", tmp_path / "other")
    # a file the server does not have: one line naming the URL and the way to hand the file over
    (repository_server / file.repo / file.commit / file.path).unlink()
    with pytest.raises(DataUnavailable, match=r"cannot download http://127\.0\.0\.1.*--from DIR"):
        sources.fetch_file("NQ-open.dev.jsonl", tmp_path / "other")


def test_data_fetch_command_with_a_missing_folder_file(tmp_path, sample_files, capsys):
    from fastdpr.cli import main

    (sample_files / "qed-dev.jsonlines").unlink()
    assert main(["data", "fetch", "--cache", str(tmp_path / "c"), "--from", str(sample_files), "--quiet"]) != 0
    err = capsys.readouterr().err
    assert "qed-dev.jsonlines: not found in" in err and "Traceback" not in err


# ------------------------------------------------------------------------------------- the published files


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """The published files, fetched (sha256-checked) into a fresh cache from $FASTDPR_DATA_DIR or the user's
    cache; the suite's conftest points $FASTDPR_DATA_DIR at the checkout's shared copy when there is one."""
    cache = tmp_path_factory.mktemp("published")
    try:
        if not sources.default_source_dir():
            shutil.copytree(sources.default_cache() / "qa", cache / "qa")
        return sources.fetch(cache, show_progress=False)
    except (DataUnavailable, FileNotFoundError) as err:
        pytest.skip(f"the published QA files are not here ({err}); see README, 'Real data'")


def test_the_published_sets_load_whole(published):
    expected = {"qed": (1343, 1355), "xquad": (240, 1190), "new_wiki": (1581, 7938), "reddit": (2033, 9803),
                "amazon": (2050, 9885), "nq_open_dev": (0, 3610), "efficientqa_dev": (0, 1800),
                "efficientqa_test": (0, 1769), "dpr:nq.test": (0, 3610), "dpr:squad.test": (0, 10570),
                "dpr:curated.test": (0, 694)}
    for name, (n_passages, n_questions) in expected.items():
        passages, questions = sources.load(published, name)
        assert (len(passages), len(questions)) == (n_passages, n_questions), name
        assert all(q["question"] and q["answers"] for q in questions), name
    prepared = sources.prepare(published)
    counts = {name: info["counts"] for name, info in prepared.items()}
    assert sum(c["passages"] for c in counts.values()) == 7247
    assert counts["qed"]["train"] + counts["qed"]["dev"] + counts["qed"]["test"] == 1355
    # split by article: no article's questions on two sides
    for name in sources.SPLITS:
        passages = {p["id"]: p["title"] for p in sources.read_jsonl(prepared[name]["passages"])}
        sides: dict[str, set] = {}
        for split in ("train", "dev", "test"):
            for q in sources.read_jsonl(prepared[name][split]):
                sides.setdefault(passages[q["gold_ids"][0]], set()).add(split)
        assert all(len(s) == 1 for s in sides.values()), name


def test_document_split_keeps_each_article_on_one_side():
    # five questions per paragraph, two paragraphs per article, as in SQuAD-style sets
    passages = [{"id": f"p{a}-{k}", "title": f"article {a}", "text": "x"} for a in range(300) for k in range(2)]
    passages += [{"id": f"r{i}", "title": "one title for everything", "text": "y"} for i in range(400)]
    questions = [{"qid": f"{p['id']}-{j}", "question": f"question {j} on {p['id']}", "gold_ids": [p["id"]]}
                 for p in passages for j in range(5)]
    splits = sources.split_by_question(questions, group=sources.document_group(passages))
    side = {}
    for name, records in splits.items():
        for q in records:
            p = q["gold_ids"][0]
            key = p.rsplit("-", 1)[0] if p.startswith("p") else p  # the article, or the passage itself
            assert side.setdefault(key, name) == name, f"{key} on two sides"
    # a title shared by more than 1% of the passages is not an article: those questions still spread over splits
    shared = {name for name, records in splits.items() for q in records if q["gold_ids"][0].startswith("r")}
    assert shared == {"train", "dev", "test"}
    # the default (by question text) would have put most articles on two sides
    by_question = sources.split_by_question(questions)
    sides = {}
    for name, records in by_question.items():
        for q in records:
            sides.setdefault(q["gold_ids"][0].rsplit("-", 1)[0], set()).add(name)
    assert sum(len(s) > 1 for s in sides.values()) > 100
