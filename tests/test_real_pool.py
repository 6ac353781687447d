"""benchmarks/real_pool.py end to end on a tiny input: passages -> queries -> encode with a tiny model (no network, no
apt), resumption shard by shard, nested subsets and the manifest; and the text readers it is built on."""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
FIXTURES = Path(__file__).parent / "data" / "real_pool"


@pytest.fixture
def rp(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import real_pool

    return real_pool


@pytest.fixture
def text(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    import real_pool_text

    return real_pool_text


# ------------------------------------------------------------------------------------------------------ text readers


def test_passages_end_at_sentences_near_the_target(text):
    def sentence(words: int) -> str:
        return "Word " + " ".join(["word"] * (words - 2)) + " end."

    def lengths(passages):
        return [len(p.split()) for p in passages]

    # 20+20 = 40; a third sentence would make 60, 10 past 50 where stopping is 10 short: the tie stops early
    assert lengths(text.cut_passages([sentence(20)] * 7, target=50)) == [40, 40, 40, 20]
    # 30+30 = 60 is 10 past 50, stopping at 30 is 20 short: the passage takes the second sentence
    assert lengths(text.cut_passages([sentence(30)] * 4, target=50)) == [60, 60]
    assert all(p.endswith("end.") for p in text.cut_passages([sentence(20)] * 7))


def test_a_sentence_longer_than_the_limit_is_cut_and_a_short_tail_joins_the_passage_before(text):
    long = " ".join(f"w{i}" for i in range(130))
    passages = text.cut_passages([long, "Tail of four words."], target=50, limit=100, min_words=8)
    assert [len(p.split()) for p in passages] == [50, 50, 34]
    assert passages[-1].endswith("Tail of four words.")
    assert text.cut_passages(["Too short."], min_words=8) == []


def test_sentences_split_after_closing_quotes_but_not_inside_numbers(text):
    assert text.sentences('He said "stop." Then Python 3.11 ran. e.g. this stays. Done!') == \
        ['He said "stop."', "Then Python 3.11 ran. e.g. this stays.", "Done!"]


def test_html_keeps_prose_and_leaves_out_code_navigation_and_scripts(text):
    title, blocks = text.html_document(FIXTURES / "page.html")
    assert title == "Rivers of the north — Sample manual"
    body = " ".join(blocks)
    assert "The river rises in the hills" in body and "The second bridge, of stone" in body
    for unwanted in ("script text", "code_block_must_not_appear", "Navigation words", "Footer words", "¶",
                     "color: red"):
        assert unwanted not in body
    # list items and paragraphs are blocks of their own
    assert "The first bridge was built of wood in the twelfth century and was washed away by a flood." in blocks


def test_an_unclosed_navigation_element_does_not_swallow_the_page(text, tmp_path):
    page = tmp_path / "unbalanced.html"
    # the sidebar opens three <div>s and closes two: everything after it is inside it as far as the parser knows
    page.write_text('<html><body><div class="sidebar"><div class="toc"><div>Contents</div>'
                    '<div class="content"><p>The river rises in the hills above the old city.</p></div></body></html>')
    _, blocks = text.html_document(page)
    assert "The river rises in the hills above the old city." in blocks


@pytest.mark.skipif(shutil.which("man") is None, reason="man (man-db) renders the man pages")
def test_man_pages_render_to_paragraphs_and_pointer_pages_are_skipped(text, tmp_path):
    page = tmp_path / "rivers.7.gz"
    page.write_bytes(gzip.compress((FIXTURES / "rivers.7").read_bytes()))
    name, blocks = text.man_document(page)
    assert name == "rivers.7"
    assert any("The rivers tool prints the length" in b and b.endswith("several lines.") for b in blocks)
    assert not any("Sample Manual" in b for b in blocks)  # the running header and footer
    pointer = tmp_path / "streams.7"
    pointer.write_text(".so man7/rivers.7\n")
    assert text.man_document(pointer) is None


def _write_dictd(folder: Path, entries: list[tuple[str, str]], aliases: dict[str, str]) -> Path:
    """A dictd dictionary: ``entries`` (headword, text) and ``aliases`` (headword -> headword whose entry it
    shares)."""
    digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"

    def b64(n: int) -> str:
        out = ""
        while True:
            out = digits[n % 64] + out
            n //= 64
            if not n:
                return out

    data, spans = b"", {}
    for headword, body in entries:
        raw = body.encode("utf-8")
        spans[headword] = (len(data), len(raw))
        data += raw
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "demo.dict.dz").write_bytes(gzip.compress(data))
    lines = [f"{h}\t{b64(o)}\t{b64(n)}" for h, (o, n) in spans.items()]
    lines += [f"{alias}\t{b64(spans[h][0])}\t{b64(spans[h][1])}" for alias, h in aliases.items()]
    (folder / "demo.index").write_text("\n".join(sorted(lines)) + "\n")
    return folder / "demo.index"


DICT_ENTRIES = [
    ("00-database-info", "This is the demo dictionary, made for a test, under no licence at all."),
    ("ford", "Ford \\Ford\\, n. A place in a river or other water, where it may be passed by man or beast on foot,\n"
             "   by wading. [1913 Webster]"),
    ("weir", "Weir \\Weir\\, n. A dam in a stream or river to stop and raise the water, for the purpose of\n"
             "   conducting it to a mill, forming a fish pond, or the like. [1913 Webster]"),
]


def test_dictd_entries_once_each_without_the_database_entries(text, tmp_path):
    index = _write_dictd(tmp_path, DICT_ENTRIES, aliases={"fords": "ford"})
    docs = list(text.dictd_documents(index, tmp_path / "demo.dict.dz"))
    assert [title for title, _ in docs] == ["ford", "weir"]
    assert docs[0][1] == [" ".join(DICT_ENTRIES[1][1].split())]


def test_apt_descriptions_keep_synopsis_and_paragraphs(text):
    docs = list(text.apt_documents(FIXTURES / "dumpavail.txt"))
    assert [title for title, _ in docs] == ["river-tools", "river-data"]
    assert docs[0][1][0] == "river-tools: tools that describe the rivers of a country."
    assert len(docs[0][1]) == 3 and docs[0][1][2].startswith("This package holds")
    assert docs[1][1][0] == "river-data: data files for the river tools."


# ------------------------------------------------------------------------------------------------------- the stages


def _tiny_packages(rp, work: Path) -> list:
    """Unpacked trees as the fetch stage leaves them, for packages of every kind; ``demo-html-copy`` holds the same
    page again, so all of its passages are duplicates."""
    root = work / "unpacked"
    html = root / "demo-html" / "usr/share/doc/demo/html"
    html.mkdir(parents=True)
    shutil.copy(FIXTURES / "page.html", html / "page.html")
    copy = root / "demo-html-copy" / "usr/share/doc/demo/html"
    copy.mkdir(parents=True)
    shutil.copy(FIXTURES / "page.html", copy / "again.html")
    _write_dictd(root / "demo-dict" / "usr/share/dictd", DICT_ENTRIES, aliases={"fords": "ford"})
    fortunes = root / "demo-fortune" / "usr/share/games/fortunes"
    fortunes.mkdir(parents=True)
    shutil.copy(FIXTURES / "seasons", fortunes / "seasons")
    # the index beside a fortune file is binary; were it read, this would be a passage of its own
    (fortunes / "seasons.dat").write_bytes(b"\0\0This index would be read as a fortune of more than eight words.")
    packages = [rp._html("demo-html", "usr/share/doc/demo/html/*.html"),
                rp.Package("demo-dict", "dictd", ("usr/share/dictd/demo.index",)),
                rp.Package("demo-fortune", "fortune", ("usr/share/games/fortunes/*",), exclude=("*.dat",)),
                rp._html("demo-html-copy", "usr/share/doc/demo/html/*.html")]
    if shutil.which("man"):
        man = root / "demo-man" / "usr/share/man/man7"
        man.mkdir(parents=True)
        (man / "rivers.7.gz").write_bytes(gzip.compress((FIXTURES / "rivers.7").read_bytes()))
        packages.append(rp.Package("demo-man", "man", ("usr/share/man/man*/*.gz",)))
    return packages


QUERY_SETS = {
    "set_a": [{"qid": "1", "question": "how long is the river thames", "answers": ["215 miles"]},
              {"qid": "2", "question": "who built the first canal", "answers": ["the duke"]},
              {"qid": "3", "question": "when do fishing seasons close", "answers": ["autumn"]}],
    "set_b": [{"qid": "1", "question": "How long is the  River Thames", "answers": ["346 km"]},
              {"qid": "2", "question": "what is a weir", "answers": ["a dam"]}],
}


def _build(rp, work: Path, model_dir: Path, **encode):
    rp.stage_passages(work, _tiny_packages(rp, work), qa_corpus=FIXTURES / "qa_corpus.jsonl",
                      apt_dump=FIXTURES / "dumpavail.txt", processes=1)
    rp.stage_queries(work, sets=list(QUERY_SETS), load=lambda name: QUERY_SETS[name])
    return rp.stage_encode(work, model_path=str(model_dir), show_progress=False, **encode)


@pytest.fixture
def model_dir(tmp_path):
    from tiny_models import tiny_bert_dir

    return tiny_bert_dir(tmp_path, name="tiny-encoder", dropout=0.0)


def test_pipeline_writes_passages_queries_vectors_and_manifest(rp, tmp_path, model_dir):
    work = tmp_path / "work"
    done = _build(rp, work, model_dir, shard_size=4)

    passages = [json.loads(line) for line in (work / "passages.jsonl").open()]
    texts = [p["text"] for p in passages]
    assert len(texts) == len(set(texts)), "exact duplicates are kept once"
    assert all(len(t.split()) >= 8 for t in texts)
    assert not any("code_block_must_not_appear" in t or "Short one." in t or "demo dictionary" in t
                   or "This index would be read" in t for t in texts)
    counts = json.loads((work / "passages.done.json").read_text())["counts"]
    assert counts["demo-html-copy"]["passages"] == 0
    assert counts["demo-html-copy"]["duplicates"] == counts["demo-html"]["passages"] > 0
    assert counts["demo-dict"]["passages"] == 2 and counts["demo-fortune"]["passages"] == 2
    assert counts["demo-dict"]["documents"] == 2 and counts["demo-fortune"]["documents"] == 3  # entries, not files
    assert counts["apt-descriptions"]["passages"] >= 2
    qa = [p for p in passages if p["source"] == "qa-corpus"]
    assert {p["paragraph"] for p in qa} == {"nq-000000000001", "nq-000000000002"}
    assert all(p["id"].startswith(p["source"] + "-") for p in passages)

    queries = [json.loads(line) for line in (work / "queries.jsonl").open()]
    assert [q["qid"] for q in queries] == ["set_a:1", "set_a:2", "set_a:3", "set_b:2"]  # set_b:1 repeats set_a:1
    assert all(q["split"] == rp.query_split(q["question"]) for q in queries)
    assert {q["split"] for q in queries} <= {"tune", "test"}

    n = len(passages)
    order = np.load(work / "encode" / "order.npy")
    assert sorted(order.tolist()) == list(range(n))
    assert order.tolist() == np.random.default_rng(rp.SEED).permutation(n).tolist()
    for pooling in ("mean", "cls"):
        vectors = rp.load_vectors(work, pooling)
        assert vectors.shape == (n, 32) and vectors.dtype == np.float16
        assert rp.load_vectors(work, pooling, what="queries").shape == (4, 32)
    assert not np.allclose(rp.load_vectors(work, "mean"), rp.load_vectors(work, "cls"))
    assert [p["id"] for p in rp.passage_order(work, 5)] == [passages[i]["id"] for i in order[:5]]

    manifest = json.loads((work / "manifest.json").read_text())
    assert manifest["passages"]["passages"] == n and manifest["passages"]["counts"] == counts
    assert manifest["queries"]["queries"] == 4 and manifest["queries"]["counts"]["set_b"]["kept"] == 1
    assert manifest["encode"]["dims"] == 32 and manifest["encode"]["poolings"] == ["mean", "cls"]
    assert manifest["encode"]["passages"]["rows"] == n == done["passages"]["rows"]
    assert set(manifest["seconds"]) == {"passages", "queries", "encode"}
    assert "code_commit" in manifest


def test_encode_resumes_shard_by_shard_and_prefixes_are_nested(rp, tmp_path, model_dir):
    work = tmp_path / "work"
    first = _build(rp, work, model_dir, shard_size=3, limit=5)
    assert first["passages"]["rows"] == 5 and first["passages"]["rows_encoded_now"] == 5
    assert first["passages"]["shards_skipped"] == 0
    # the questions come after the first shard of passages and before the others
    marker = {key: (work / "encode" / name).stat().st_mtime_ns for key, name in
              (("first", "passages/shard-00000000-00000003.done.json"),
               ("queries", "queries/shard-00000003-00000004.done.json"),
               ("second", "passages/shard-00000003-00000005.done.json"))}
    assert marker["first"] <= marker["queries"] <= marker["second"]
    assert first["passages"]["per_second_now"] > 0 and first["passages"]["per_cpu_second_now"] > 0
    prefix = rp.load_vectors(work, "mean", 5)
    with pytest.raises(ValueError, match="only 5 rows"):
        rp.load_vectors(work, "mean", 6)

    folder = work / "encode" / "passages"
    finished = folder / "mean-00000000-00000003.npy"
    stamp = finished.stat().st_mtime_ns
    # a shard killed halfway: one pooling written, the other a torn file, no marker
    (folder / "cls-00000003-00000006.npy").write_bytes(b"torn")
    full = rp.stage_encode(work, model_path=str(model_dir), shard_size=3, show_progress=False)
    n = full["passages"]["rows"]
    assert n > 6
    assert full["passages"]["shards_skipped"] == 1  # [0, 3) was done; [3, 5) was the short shard of --limit 5
    assert full["passages"]["rows_encoded_now"] == n - 3
    assert finished.stat().st_mtime_ns == stamp
    whole = rp.load_vectors(work, "cls")
    assert np.load(folder / "cls-00000003-00000006.npy").shape == (3, 32)
    np.testing.assert_array_equal(rp.load_vectors(work, "mean", 5), prefix)
    for small in (1, 3, 4, n - 1):
        np.testing.assert_array_equal(rp.load_vectors(work, "cls", small), whole[:small])

    # everything finished: a rerun encodes nothing
    again = rp.stage_encode(work, model_path=str(model_dir), shard_size=3, show_progress=False)
    assert again["passages"]["rows_encoded_now"] == 0 and again["queries"]["rows_encoded_now"] == 0
    # a shorter --limit afterwards does not shrink what the manifest reports
    rp.stage_encode(work, model_path=str(model_dir), shard_size=3, limit=3, show_progress=False)
    assert json.loads((work / "manifest.json").read_text())["encode"]["passages"]["rows"] == n

    # a re-encoded shard gives the vectors it gave before
    marker = folder / "shard-00000000-00000003.done.json"
    marker.unlink()
    rp.stage_encode(work, model_path=str(model_dir), shard_size=3, show_progress=False)
    np.testing.assert_allclose(rp.load_vectors(work, "cls").astype(np.float32), whole.astype(np.float32),
                               atol=1e-2)


def test_a_shard_interrupted_between_pieces_resumes_from_its_last_finished_piece(rp, tmp_path, model_dir,
                                                                                  monkeypatch):
    import minilm_pool

    straight = _build(rp, tmp_path / "straight", model_dir, shard_size=5, limit=5, piece=2)
    assert straight["passages"]["rows_encoded_now"] == 5
    want = rp.load_vectors(tmp_path / "straight", "mean", 5)

    work = tmp_path / "work"
    real, calls = minilm_pool.encode_both, []

    def dies_on_the_third_piece(model, seqs, tower, *args, **kwargs):
        if tower == "passage":
            calls.append(len(seqs))
            if len(calls) == 3:
                raise KeyboardInterrupt  # the job stopped while the shard's last piece was encoded
        return real(model, seqs, tower, *args, **kwargs)

    monkeypatch.setattr(minilm_pool, "encode_both", dies_on_the_third_piece)
    with pytest.raises(KeyboardInterrupt):
        _build(rp, work, model_dir, shard_size=5, limit=5, piece=2)
    folder = work / "encode" / "passages"
    assert calls == [2, 2, 1] and not (folder / "shard-00000000-00000005.done.json").exists()
    assert sorted(p.name for p in (folder / "pieces").glob("*.done.json")) == [
        "piece-00000000-00000002.done.json", "piece-00000002-00000004.done.json"]
    monkeypatch.setattr(minilm_pool, "encode_both", real)
    resumed = rp.stage_encode(work, model_path=str(model_dir), shard_size=5, limit=5, piece=2,
                              show_progress=False)
    assert resumed["passages"]["rows_encoded_now"] == 1  # the two finished pieces were not encoded again
    np.testing.assert_allclose(rp.load_vectors(work, "mean", 5).astype(np.float32), want.astype(np.float32),
                               atol=1e-2)
    assert not list((folder / "pieces").iterdir())  # joined into the shard's files and removed
    with pytest.raises(SystemExit, match="piece must be positive"):
        rp.stage_encode(work, model_path=str(model_dir), shard_size=5, piece=0, show_progress=False)


def test_stages_refuse_work_built_with_other_settings(rp, tmp_path, model_dir):
    work = tmp_path / "work"
    _build(rp, work, model_dir, shard_size=4, limit=2)
    with pytest.raises(SystemExit, match="queries stage .* built with settings"):
        rp.stage_queries(work, sets=["set_a"], load=lambda name: QUERY_SETS[name])
    with pytest.raises(SystemExit, match="remove .*encode"):
        rp.stage_encode(work, model_path=str(model_dir), shard_size=3, show_progress=False)


def test_encode_needs_the_passages_stage(rp, tmp_path):
    with pytest.raises(SystemExit, match="run the passages stage first"):
        rp.stage_encode(tmp_path, model_path="unused", show_progress=False)


def test_a_package_whose_files_moved_is_named(rp, tmp_path):
    (tmp_path / "unpacked" / "demo").mkdir(parents=True)
    with pytest.raises(SystemExit, match="demo: no file"):
        rp.stage_passages(tmp_path, [rp._html("demo", "usr/share/doc/demo/*.html")],
                          qa_corpus=FIXTURES / "qa_corpus.jsonl", apt_dump=FIXTURES / "dumpavail.txt", processes=1)


def test_fp16_overflow_is_refused(rp):
    with pytest.raises(ValueError, match="does not fit float16"):
        rp._to_fp16(np.array([[1e6]], dtype=np.float32), "rows 0-1")


def test_auto_precision_is_bf16_only_where_it_runs_natively(rp, monkeypatch):
    from fastdpr.models import precision

    monkeypatch.setattr(precision, "bf16_supported", lambda device="cpu": False)
    assert rp.resolve_encode_precision("auto", "cpu") == "fp32"
    monkeypatch.setattr(precision, "bf16_supported", lambda device="cpu": True)
    assert rp.resolve_encode_precision("auto", "cpu") == "bf16"
    assert rp.resolve_encode_precision("fp16", "cpu") == "fp16"
