"""Build an IVF-PQ index larger than memory, in stages that resume (docs/architecture.md §3.10).

DPR's 21M x 768 passages are 32 GB as fp16 rows, more than a 24 GB machine holds, yet a compressed IVF-PQ search
needs only its codes in memory (and maps the rows it re-ranks with). ``IVFPQIndex.add`` keeps what it stores in
memory, so this builder keeps the rows out of it:

1. ``append(x)``: rows stream, as fp16, straight into the place the index file's ``vectors`` section will hold
   (``<index>.build/index.partial``, after a header left blank), their CRC-32 kept as they come;
2. ``train()``: the coarse centroids and the codebooks learn from a sample of those rows (blocks read from disk);
3. ``add()``: the codes and the 4-bit rows, what a search keeps in memory or maps, are added chunk by chunk to an
   in-memory index built without stored rows; it is saved as a checkpoint every ``checkpoint_every`` rows;
4. ``finish()``: that index's sections are copied behind the rows (its metadata now saying fp16 rows are stored),
   then the section table and the header: the partial file is renamed to an ordinary ``.fdpr`` file, which
   ``load_index(path, mmap=True)`` opens without reading the rows into memory.

Peak memory is the in-memory index (codes, list positions and, with ``sq=4``, 4-bit rows: d/2 bytes a row) plus
one chunk. Every stage resumes after a kill: the rows recorded in ``state.json`` (written after each append is on
disk) are kept and anything after them is cut off; training is redone unless its result was saved; adding goes on
from the last checkpoint. Reads go through ``pread`` rather than a mapping, so the rows a pass reads stay in the
page cache, not in the process's resident memory.

    >>> import numpy as np, tempfile, os
    >>> from fastdpr.index import load_index
    >>> from fastdpr.index.disk_build import IVFPQDiskBuilder
    >>> path = os.path.join(tempfile.mkdtemp(), "big.fdpr")
    >>> x = np.random.default_rng(0).standard_normal((4096, 32)).astype(np.float32)
    >>> b = IVFPQDiskBuilder(path, 32, "ivfpq,nlist=16,nbits=4,sq=4")
    >>> for start in range(0, 4096, 1024):
    ...     b.append(x[start:start + 1024])
    >>> b.train(); b.add()
    >>> index = load_index(b.finish(), mmap=True)
    >>> len(index), index.store
    (4096, 'fp16')
"""
from __future__ import annotations

import json
import os
import shutil
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from fastdpr.atomic import write_json
from fastdpr.errors import InputError
from fastdpr.index import fileformat
from fastdpr.index.factory import load_index
from fastdpr.index.ivfpq import IVFPQIndex, default_nlist
from fastdpr.index.spec import parse_spec
from fastdpr.progress import progress

STATE = "state.json"
PARTIAL = "index.partial"
TRAINED = "trained.fdpr"
ADDED = "added.fdpr"
SAMPLE_BLOCK = 256  # training rows are read in runs of this many: a few thousand reads, not one per row
COPY_BYTES = 64 << 20
FP16_MAX = 65504.0


class IVFPQDiskBuilder:
    """Resumable, bounded-memory build of an IVF-PQ index with fp16 rows (module docstring). ``spec`` is an
    ``ivfpq`` spec (``store`` may only be ``fp16``, the default here); ``nlist`` defaults to the rule of
    ``default_nlist`` for the rows appended when training starts. ``workdir`` defaults to ``<path>.build``."""

    def __init__(self, path: str | os.PathLike, dim: int, spec: str = "ivfpq,nbits=4,sq=4",
                 workdir: str | os.PathLike | None = None):
        self.path = Path(path)
        self.dir = Path(workdir) if workdir is not None else self.path.with_name(self.path.name + ".build")
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
            raise InputError(f"dim must be a positive integer, got {dim!r}")
        self.dim = int(dim)
        self.params = _index_params(spec)
        self.spec = spec
        state_path = self.dir / STATE
        if state_path.exists():
            try:
                self.state = json.loads(state_path.read_text())
            except ValueError:
                raise InputError("the build state is not valid JSON; remove the folder to start over",
                                 path=str(state_path)) from None
            if self.state.get("dim") != self.dim or self.state.get("spec") != spec:
                raise InputError(f"a build of dim={self.state.get('dim')}, spec {self.state.get('spec')!r} is in "
                                 f"this folder, not dim={self.dim}, spec {spec!r}; remove it to start over",
                                 path=str(self.dir))
        else:
            self.dir.mkdir(parents=True, exist_ok=True)
            self.state = {"dim": self.dim, "spec": spec, "rows": 0, "crc": 0}
            self._save_state()
        # a kill mid-append (or mid-finish) leaves bytes past the last recorded row: they go, and the header with them
        with open(self.dir / PARTIAL, "ab+") as fh:
            fh.truncate(fileformat.HEADER_SIZE + self.rows * self.row_bytes)
            fh.seek(0)
            fh.write(b"\0" * fileformat.HEADER_SIZE)

    # -- state ----------------------------------------------------------------------------------------------------
    @property
    def rows(self) -> int:
        """Rows appended so far."""
        return int(self.state["rows"])

    @property
    def row_bytes(self) -> int:
        return 2 * self.dim

    @property
    def is_trained(self) -> bool:
        return (self.dir / TRAINED).exists()

    @property
    def added(self) -> int:
        """Rows whose codes are in the last checkpoint."""
        return int(self.state.get("added", 0))

    def _save_state(self) -> None:
        write_json(self.dir / STATE, self.state)

    # -- 1. rows --------------------------------------------------------------------------------------------------
    def append(self, x: Any) -> None:
        """Append rows ``(n, dim)`` (float32 or float16; stored as float16). On disk and recorded when it returns."""
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.dim:
            raise InputError(f"append: rows must have shape (n, {self.dim}), got {x.shape}")
        if x.dtype.kind != "f":
            raise InputError(f"append: rows must be floating point, got {x.dtype}")
        if x.shape[0] == 0:
            return
        if self.added:
            raise InputError("append: adding has started; rows come before add()")
        if not np.isfinite(x).all():
            row = int(np.argwhere(~np.isfinite(x))[0, 0])
            raise InputError(f"append: row {row} of this call holds NaN or Inf")
        if x.dtype != np.float16 and np.abs(x).max() > FP16_MAX:
            row = int(np.argwhere(np.abs(x) > FP16_MAX)[0, 0])
            raise InputError(f"append: row {row} of this call has a component beyond float16's range (65504)")
        data = np.ascontiguousarray(x, dtype=np.float16)
        fd = os.open(self.dir / PARTIAL, os.O_WRONLY)
        try:
            _pwrite_all(fd, memoryview(data).cast("B"), fileformat.HEADER_SIZE + self.rows * self.row_bytes)
            os.fsync(fd)
        finally:
            os.close(fd)
        self.state["crc"] = zlib.crc32(memoryview(data).cast("B"), int(self.state["crc"]))
        self.state["rows"] = self.rows + data.shape[0]
        self._save_state()

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` as a float16 array, read from disk (not mapped)."""
        if not 0 <= start <= stop <= self.rows:
            raise InputError(f"read_rows: [{start}, {stop}) is outside the {self.rows} rows appended")
        out = np.empty((stop - start, self.dim), dtype=np.float16)
        with open(self.dir / PARTIAL, "rb") as fh:
            fh.seek(fileformat.HEADER_SIZE + start * self.row_bytes)
            if fh.readinto(memoryview(out).cast("B")) != out.nbytes:
                raise InputError("the partial index file is shorter than its recorded rows",
                                 path=str(self.dir / PARTIAL))
        return out

    # -- 2. train -------------------------------------------------------------------------------------------------
    def train(self, sample: int | None = None, seed: int = 1234, show_progress: bool | None = None) -> None:
        """Train on ``sample`` rows (default: what the index's k-means uses, ``nlist * max_points_per_centroid``),
        read as random runs of ``SAMPLE_BLOCK`` rows. Saved; a second call does nothing."""
        if self.is_trained:
            return
        n = self.rows
        if n == 0:
            raise InputError("train: no rows appended yet")
        params = dict(self.params)
        nbits = int(params.get("nbits", 8))
        params.setdefault("nlist", default_nlist(n, nbits))
        index = IVFPQIndex.from_spec(self.dim, params)
        if sample is None:
            sample = index.nlist * index.train_params["max_points_per_centroid"]
        sample = min(int(sample), n)
        if sample < 1:
            raise InputError(f"train: sample must be >= 1, got {sample}")
        blocks = max(1, -(-sample // SAMPLE_BLOCK))
        n_runs = max(1, n // SAMPLE_BLOCK)
        rng = np.random.default_rng(seed)
        starts = np.sort(rng.choice(n_runs, size=min(blocks, n_runs), replace=False)) * SAMPLE_BLOCK
        parts = []
        with progress(total=int(starts.shape[0]), desc="read training sample", unit="run",
                      enabled=show_progress) as bar:
            for s in starts:
                parts.append(self.read_rows(int(s), min(int(s) + SAMPLE_BLOCK, n)))
                bar.update(1)
        x = np.concatenate(parts)[:sample].astype(np.float32)
        index.train(x)
        index.save(self.dir / TRAINED)

    # -- 3. add ---------------------------------------------------------------------------------------------------
    def add(self, chunk: int = 65536, checkpoint_every: int = 2_000_000, show_progress: bool | None = None) -> None:
        """Add the codes of every appended row not yet added, saving a checkpoint every ``checkpoint_every`` rows
        and at the end."""
        if not self.is_trained:
            raise InputError("add: train first")
        if chunk < 1 or checkpoint_every < 1:
            raise InputError(f"add: chunk and checkpoint_every must be >= 1, got {chunk}, {checkpoint_every}")
        start = self.added
        if start == self.rows:
            return
        index = load_index(self.dir / (ADDED if start else TRAINED))
        if len(index) != start:  # a kill between the checkpoint and the state: the checkpoint is the truth
            start = self.state["added"] = len(index)
            self._save_state()
        index.reserve(self.rows)  # the 4-bit rows grow in place: never two copies of them at once
        since = 0
        with progress(total=self.rows, desc="add", unit="row", enabled=show_progress) as bar:
            bar.update(start)
            while start < self.rows:
                stop = min(start + chunk, self.rows)
                index.add(self.read_rows(start, stop))
                bar.update(stop - start)
                since += stop - start
                start = stop
                if since >= checkpoint_every or start == self.rows:
                    index.save(self.dir / ADDED)
                    self.state["added"] = start
                    self._save_state()
                    since = 0

    # -- 4. finish ------------------------------------------------------------------------------------------------
    def finish(self, model_fingerprint: str | None = None) -> Path:
        """Write the index file at ``path`` and remove the build folder. Returns the path."""
        if self.rows == 0 or self.added != self.rows:
            raise InputError(f"finish: {self.added} of {self.rows} rows added; call add() first")
        src = fileformat.PyReader(self.dir / ADDED)
        if src.has("vectors"):
            raise InputError("finish: the added index stores rows of its own", path=str(self.dir / ADDED))
        vec_bytes = self.rows * self.row_bytes
        entries = [(b"vectors", fileformat.HEADER_SIZE, vec_bytes, int(self.state["crc"]))]
        pos = fileformat.HEADER_SIZE + vec_bytes
        partial = self.dir / PARTIAL
        with open(partial, "r+b") as out, open(self.dir / ADDED, "rb") as inp:
            for name in src.names():
                if name == "meta":
                    continue
                offset, length = src.span(name)
                pos += (-pos) % fileformat.ALIGN
                out.seek(pos)
                inp.seek(offset)
                _copy(inp, out, length)
                entries.append((name.encode("ascii"), pos, length, src.crc(name)))
                pos += length
            meta = [(k, "1" if k == "storage" else v) for k, v in src.meta_items()]  # 1: fp16 rows (csrc/ivfpq.h)
            if model_fingerprint:
                meta.append(("model_fingerprint", model_fingerprint))
            text = fileformat._meta_text(meta)
            pos += (-pos) % fileformat.ALIGN
            out.seek(pos)
            out.write(text)
            entries.append((b"meta", pos, len(text), zlib.crc32(text)))
            pos += len(text)
            fileformat.write_table_and_header(out, b"ivfpq", entries, pos)
            out.flush()
            os.fsync(out.fileno())
        del src
        self.path.parent.mkdir(parents=True, exist_ok=True)
        os.replace(partial, self.path)
        shutil.rmtree(self.dir)
        return self.path


def _index_params(spec: str) -> dict[str, Any]:
    kind, params = parse_spec(spec)
    if kind != "ivfpq":
        raise InputError(f"the disk builder makes ivfpq indexes, not {kind!r} (spec {spec!r})")
    store = params.pop("store", "fp16")
    if params.pop("fp32", False) or store != "fp16":
        raise InputError(f"the disk builder stores the rows as fp16; spec {spec!r} asks for other rows")
    params.pop("fp16", None)
    params["store"] = "none"  # the in-memory index holds no rows: they are already in the file
    return params


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        done = os.pwrite(fd, data, offset)
        data, offset = data[done:], offset + done


def _copy(inp: Any, out: Any, length: int) -> None:
    while length:
        block = inp.read(min(COPY_BYTES, length))
        if not block:
            raise InputError("a checkpoint section ends early", path=str(inp.name))
        out.write(block)
        length -= len(block)
