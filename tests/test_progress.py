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
    assert len(lines) == 11  # one per update (log_every=0) and the closing one


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
