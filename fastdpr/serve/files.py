"""The files a server reads while it runs, checked before and after every batch that reads them.

The corpus, its side file (``.fdpridx``) and a memory-mapped index are read in place for as long as the server
runs. Truncated under it, a mapped file kills the process (SIGBUS) at the next read of a page past the new end;
rewritten in place, it serves whatever the new bytes say (scores of 1e37, empty lists) with status 200. So each
file's identity and generation (device, inode, size, modification time) are taken at start-up and compared
before every batch that reads it (no read touches a file seen changed) and after it (no answer computed while one
changed goes out). A changed file is :class:`FileChanged`: that mode answers 503 until the server is restarted
on the new files. A change between the check and the read itself still reaches the read: the check narrows that
window to one batch, it does not close it."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable


class FileChanged(Exception):
    """A file the server reads changed on disk after it was loaded."""


class WatchedFiles:
    def __init__(self, paths: Iterable[str | os.PathLike]):
        found = {Path(p): _stamp(Path(p)) for p in dict.fromkeys(paths) if p is not None}
        self.stamps = {path: stamp for path, stamp in found.items() if stamp is not None}

    def check(self) -> None:
        for path, stamp in self.stamps.items():
            now = _stamp(path)
            if now != stamp:
                what = "is gone" if now is None else ("shrank" if now[2] < stamp[2] else "was replaced or rewritten")
                raise FileChanged(f"{path} {what} since the server loaded it: restart the server to serve the new "
                                  "files")


def _stamp(path: Path) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns
