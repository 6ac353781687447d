"""Data layer: streaming readers and writers of the ecosystem's formats, the random-access :class:`Corpus`, and the
passage splitter. A passage is ``{"id": str, "title": str, "text": str}``; a question is
``{"qid": str, "question": str, "answers": list[str]}``.

Example::

    from fastdpr.data import Corpus, iter_qa
    corpus = Corpus.open("psgs_w100.tsv")      # random access by row or id; builds a sidecar index once
    corpus[0], corpus.get("17"), corpus.row_of("17")
    for q in iter_qa("nq-test.qa.csv"):
        ...
"""
from fastdpr.data._io import BadRowWarning, ReadStats
from fastdpr.data.corpus import Corpus
from fastdpr.data.passages import detect_passage_format, iter_passages, write_passages
from fastdpr.data.qa import iter_qa, read_qrels, write_beir_queries, write_qa, write_qrels
from fastdpr.data.runs import (
    RUN_FORMATS,
    attach_answers,
    attach_texts,
    detect_run_format,
    read_dpr_results,
    read_run,
    read_trec,
    results_to_run,
    write_dpr_results,
    write_pyserini_run,
    write_run,
    write_trec,
)
from fastdpr.data.split import split_documents, split_text, iter_documents
from fastdpr.data.training import read_training, write_dpr_biencoder, write_tevatron

__all__ = [
    "RUN_FORMATS",
    "attach_answers",
    "attach_texts",
    "BadRowWarning",
    "Corpus",
    "ReadStats",
    "detect_passage_format",
    "detect_run_format",
    "iter_documents",
    "iter_passages",
    "iter_qa",
    "read_dpr_results",
    "read_qrels",
    "read_run",
    "read_training",
    "read_trec",
    "results_to_run",
    "split_documents",
    "split_text",
    "write_beir_queries",
    "write_dpr_biencoder",
    "write_dpr_results",
    "write_passages",
    "write_pyserini_run",
    "write_qa",
    "write_qrels",
    "write_run",
    "write_tevatron",
    "write_trec",
]
