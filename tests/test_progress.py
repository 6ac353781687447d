import io

from fastdpr.progress import progress, track


class _Pipe(io.StringIO):
    def isatty(self):
        return False


def test_log_lines_not_carriage_returns(monkeypatch):
    stream = _Pipe()
    bar = progress(total=10, desc="work", unit="x", stream=stream, log_every=0.0)
    for _ in range(10):
        bar.update(1)
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    lines = text.strip().splitlines()
    assert lines[-1].startswith("work: 10/10 (100%)")
    assert len(lines) == 10  # one per update (log_every=0); the closing one would repeat the last
    assert sum(line.startswith("work: 10/10") for line in lines) == 1


def test_log_lines_close_writes_the_count_not_shown_yet():
    stream = _Pipe()
    bar = progress(total=4, desc="work", stream=stream, log_every=0.0)
    bar.update(3)
    bar.log_every = bar.every = 3600.0  # the last update is not shown when it happens
    bar.update(1)
    bar.close()
    lines = stream.getvalue().strip().splitlines()
    assert [line.split(" ")[1] for line in lines] == ["3/4", "4/4"]


def test_log_lines_throttled():
    stream = _Pipe()
    with progress(total=1000, desc="work", stream=stream, log_every=3600.0) as bar:
        for _ in range(1000):
            bar.update(1)
    assert len(stream.getvalue().strip().splitlines()) == 1  # only the closing line


def test_disabled_and_env(monkeypatch):
    stream = _Pipe()
    with progress(total=3, desc="quiet", stream=stream, enabled=False) as bar:
        bar.update(3)
    monkeypatch.setenv("FASTDPR_PROGRESS", "0")
    with progress(total=3, desc="quiet", stream=stream, log_every=0.0) as bar:
        bar.update(3)
    assert stream.getvalue() == ""


def test_track_yields_everything():
    assert list(track(range(5), enabled=False)) == [0, 1, 2, 3, 4]


def test_encoding_a_corpus_counts_once_over_all_shards(tmp_path, monkeypatch, capsys):
    from fastdpr.data import Corpus
    from fastdpr.encode import encode_corpus
    from tiny_models import tiny_biencoder

    import fastdpr.progress as progress_module

    monkeypatch.setattr(progress_module, "LOG_EVERY_S", 0.0)
    passages = [{"id": f"p{i}", "title": "t", "text": f"passage number {i} " * (1 + i % 5)} for i in range(23)]
    model = tiny_biencoder(tmp_path)
    encode_corpus(model, Corpus.from_passages(passages), tmp_path / "vectors", batch_size=4, shard_size=10,
                  show_progress=True)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("encode passages")]
    assert lines and all("/23 " in line for line in lines)  # one total: the corpus, never a shard
    assert lines[-1].startswith("encode passages: 23/23 (100%)")
