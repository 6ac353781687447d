"""``"auto"``: the index type and shape chosen from the number of vectors, their dimension and a memory budget.

>>> from fastdpr.index.auto import choose_index
>>> choose_index(1_000, 384).spec
'flat'
>>> choose_index(50_000, 384, compiled=True).spec
'ivfpq,nbits=4,nlist=512,store=fp16'
>>> choice = choose_index(21_015_324, 768, "24GB", compiled=True)
>>> choice.spec, choice.mmap
('ivfpq,nbits=4,nlist=16384,m=96,store=fp16,aniso=0.2,sq=4,spread=0.5,groups=128', True)

The rule, and what it rests on:

- exact search (``flat``) while n x d <= ``FLAT_MAX_FLOATS`` (20,000 x 384, 29 MiB of fp32 rows): every answer
  exact, with neither training nor tuning, at a cost per question that stays small (a few milliseconds on one
  core). Tuned 4-bit IVF-PQ at recall@100 0.95 already ran 1.17x exact search's q/s at 2,000 x 384 and 1.47x at
  3,000 (benchmarks/results/ann_auto_crossover.md), but an untuned one shares only part of the exact top 5 (3 of 5
  on questions over 5,125 MiniLM passages): for sets this small an approximate answer saves too little to be worth
  a wrong one; at 23,582 real MiniLM passages 4-bit IVF-PQ ran several times faster
  (benchmarks/results/ann_paired.md at c97483c);
- below ``COMPRESSED_MIN_N`` vectors, 4-bit IVF-PQ with d/2 sub-quantizers, about 2 sqrt(n) lists and fp16 rows
  for the exact re-rank, the best shape on the real pool (``ivfpq.default_nlist``);
- from ``COMPRESSED_MIN_N`` on, the compressed shape measured at 1M x 768 (benchmarks/results/ann_compressed.md):
  d/8 sub-quantizers, 4-bit rows that rank the re-rank candidates before the fp16 rows are read, the spread-aware
  probe order and score-aware codebooks (the switch itself, 150,000, lies between the measured sizes: it is not
  a measured crossover);
- from ``MANY_LISTS_MIN_N`` (10M) vectors on, about 4 sqrt(n) lists instead of 2 sqrt(n), the shape measured at
  DPR's 21M x 768 (benchmarks/results/ann_scale_families.md: 16,384 lists); the switch itself lies between
  measured sizes, and 8,192 lists at 21M were not measured on that generator;
- from ``GROUPED_MIN_LISTS`` (16,384) lists on the centroids are trained in two levels (``groups``, about
  sqrt(nlist)): a flat k-means of that many lists is impractical on a small machine;
- rows that do not fit the memory budget are left in the file and read through the page cache
  (``load_index(path, mmap=True)``, ``fastdpr search --mmap``); the codes must fit;
- without the compiled core the numpy backend builds only 8-bit codes without 4-bit rows, so the IVF-PQ shapes
  become ``ivfpq,nlist=<4 sqrt(n)>,store=fp16`` (m = d/8).

The search settings (nprobe, rerank, exact) are not part of the choice: ``index.tune(queries)`` measures the
cheapest ones that reach a recall target (``fastdpr.index.tune``).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from fastdpr.errors import InputError
from fastdpr.index._native import native
from fastdpr.index.ivfpq import default_m, default_nlist
from fastdpr.index.spec import check_storage_flags, parse_spec

FLAT_MAX_FLOATS = 20_000 * 384  # n x d up to which exact search is chosen
COMPRESSED_MIN_N = 150_000  # from here on the compressed shape (d/8 codes, 4-bit rows)
COMPRESSED = dict(aniso=0.2, sq=4, spread=0.5)  # the 1M x 768 shape of benchmarks/results/ann_compressed.md
# from this many lists on, the coarse centroids are trained in two levels (``groups``): a flat k-means pays n x nlist
# x d every iteration after a k-means++ seeding quadratic in nlist (benchmarks/results/coarse.md), and the compiled
# core files rows through groups of centroids from the same count on (csrc/ivfpq.h kGroupedAssignMinLists)
GROUPED_MIN_LISTS = 16_384
# from this many vectors on, about 4 sqrt(n) lists: with the coarse ranking through groups of centroids (0.16 ms a
# question at 16,384 x 768, benchmarks/results/coarse.md) more lists cost little and each probed list is shorter
MANY_LISTS_MIN_N = 10_000_000
POSITION_BYTES = 4  # per vector, the compiled core's list positions (csrc/ivfpq.h)
NUMPY_POSITION_BYTES = 8

_UNITS = {"": 1, "b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9,
          "t": 10 ** 12, "tb": 10 ** 12, "kib": 2 ** 10, "mib": 2 ** 20, "gib": 2 ** 30, "tib": 2 ** 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any, what: str = "memory budget") -> int:
    """``"2GB"`` -> 2,000,000,000 bytes; ``"1.5GiB"``, ``"512M"``, ``"100000"`` and plain integers work too (decimal
    units: k, M, G, T with or without B; binary ones: KiB, MiB, GiB, TiB). Anything else, or a size <= 0, is an
    ``InputError`` naming ``what``."""
    if isinstance(value, bool):
        raise InputError(f"{what} must be a size such as 2GB, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        size = value
    else:
        match = _SIZE.match(str(value))
        unit = match.group(2).lower() if match else None
        if not match or unit not in _UNITS:
            raise InputError(f"{what} must be a size such as 2GB, 512MiB or 100000 (bytes), got {value!r}")
        size = float(match.group(1)) * _UNITS[unit]
    if not size > 0 or size != size or size == float("inf"):
        raise InputError(f"{what} must be a positive size, got {value!r}")
    return int(size)


@dataclass(frozen=True)
class IndexChoice:
    """What ``"auto"`` builds: ``spec`` (a spec string), whether the file should be opened with ``mmap=True``
    (its rows do not fit the budget), the bytes it is expected to keep in RAM that way, and why."""

    spec: str
    mmap: bool
    resident_bytes: int
    reason: str


def coarse_groups(nlist: int) -> int:
    """Top-level groups of a two-level coarse k-means: the power of two nearest sqrt(nlist), so that both levels
    are about as large (n x (G + nlist / G) x d per iteration is least there)."""
    return 2 ** max(0, round(math.log2(math.sqrt(nlist))))


def _ivfpq_bytes(n: int, dim: int, m: int, nbits: int, nlist: int, sq: int, compiled: bool) -> tuple[int, int]:
    """(bytes that stay in RAM: codes, positions, centroids and codebooks; bytes of rows that may be mapped:
    fp16 vectors and 4-bit rows)."""
    codes = n * (m * nbits // 8 + (POSITION_BYTES if compiled else NUMPY_POSITION_BYTES))
    trained = 4 * (nlist * dim + (2 ** nbits) * dim)
    rows = n * 2 * dim + (n * ((dim + 1) // 2) if sq else 0)
    return codes + trained, rows


def choose_index(n: int, dim: int, memory_budget: Any = None, compiled: bool | None = None) -> IndexChoice:
    """The index for ``n`` vectors of dimension ``dim`` within ``memory_budget`` (bytes or a size string; None:
    no limit). ``compiled``: whether the compiled core builds it (None: whether it is available now)."""
    for name, value in (("n", n), ("dim", dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"auto index: {name} must be a positive integer, got {value!r}")
    budget = None if memory_budget is None else parse_size(memory_budget)
    if compiled is None:
        compiled = native() is not None

    def fits(nbytes: int) -> bool:
        return budget is None or nbytes <= budget

    if n * dim <= FLAT_MAX_FLOATS:
        for storage, width in (("", 4), (",fp16", 2)):
            if fits(n * dim * width):
                return IndexChoice("flat" + storage, False, n * dim * width,
                                   f"n x d = {n * dim} <= {FLAT_MAX_FLOATS}: exact search, every answer exact")

    if not compiled:  # the numpy backend builds 8-bit codes only
        m, nlist = default_m(dim), default_nlist(n, 8)
        ram, rows = _ivfpq_bytes(n, dim, m, 8, nlist, 0, compiled=False)
        spec = f"ivfpq,nlist={nlist},store=fp16"
        return _fitted(spec, ram, rows, fits, budget, n, "8-bit IVF-PQ (no compiled core: numpy builds 8-bit codes)")

    m4, nlist = default_m(dim, 2), default_nlist(n, 4)
    ram, rows = _ivfpq_bytes(n, dim, m4, 4, nlist, 0, compiled=True)
    if n < COMPRESSED_MIN_N and fits(ram + rows):
        return IndexChoice(f"ivfpq,nbits=4,nlist={nlist},store=fp16", False, ram + rows,
                           f"{n} vectors < {COMPRESSED_MIN_N}: 4-bit IVF-PQ, d/2 sub-quantizers, fp16 re-rank rows")
    m = default_m(dim, 8)
    if n >= MANY_LISTS_MIN_N:
        nlist = default_nlist(n, 8)
    ram, rows = _ivfpq_bytes(n, dim, m, 4, nlist, COMPRESSED["sq"], compiled=True)
    spec = (f"ivfpq,nbits=4,nlist={nlist},m={m},store=fp16,"
            + ",".join(f"{key}={value}" for key, value in COMPRESSED.items()))
    if nlist >= GROUPED_MIN_LISTS:
        spec += f",groups={coarse_groups(nlist)}"
    why = (f"{n} vectors >= {COMPRESSED_MIN_N}" if n >= COMPRESSED_MIN_N else
           "the fp16 rows of the d/2 shape do not fit the budget")
    return _fitted(spec, ram, rows, fits, budget, n, f"compressed 4-bit IVF-PQ ({why})")


def _fitted(spec: str, ram: int, rows: int, fits, budget: int | None, n: int, reason: str) -> IndexChoice:
    """The choice with its rows in RAM when everything fits, mapped from the file when only the codes do."""
    if fits(ram + rows):
        return IndexChoice(spec, False, ram + rows, reason)
    if fits(ram):
        return IndexChoice(spec, True, ram, reason + "; rows memory-mapped (they do not fit the budget)")
    raise InputError(f"memory budget of {budget} bytes is too small for {n} vectors: the smallest index "
                     f"({spec}) keeps {ram} bytes of codes in RAM")


def resolve_auto(n: int, dim: int, params: dict[str, Any], compiled: bool | None = None) -> tuple[str, dict]:
    """The ``(kind, params)`` an ``"auto"`` spec stands for: ``memory_budget=SIZE`` bounds it; the ``fp16``/``fp32``
    flags choose the storage of exact search and of IVF-PQ's re-rank rows."""
    params = dict(params)
    unknown = sorted(set(params) - {"memory_budget", "fp16", "fp32"})
    if unknown:
        raise InputError(f"unknown parameter(s) {unknown} for auto; known: ['fp16', 'fp32', 'memory_budget'] "
                         "(give a type, e.g. 'ivfpq,...', to set others)")
    check_storage_flags(params, "auto")
    choice = choose_index(max(int(n), 1), dim, params.pop("memory_budget", None), compiled)
    kind, chosen = parse_spec(choice.spec)
    if params.pop("fp32", False) is True:
        if kind == "flat":
            chosen.pop("fp16", None)
        else:
            chosen["store"] = "fp32"
    if params.pop("fp16", False) is True and kind == "flat":
        chosen["fp16"] = True
    return kind, chosen
