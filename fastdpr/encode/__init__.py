"""Encoding a corpus into vector shards: batched, length-sorted, resumable, splittable across workers.

Modules: ``layout`` (the worker split, a run's identity), ``fingerprint`` (the tower's hash), ``writer``
(encoding, resume), ``merge`` (joining workers' parts). The files themselves (names, manifests, writing and
reading the shards) are ``fastdpr.data.vectors``, which needs no torch; its public names are importable from here
too.

Layout of an output directory::

    manifest.json                 one worker (or the merge of several): the shards in row order
    manifest.part-I-of-N.json     worker I of N (``--shard I/N`` or torchrun), until merged
    shard-00000.npy               float16/float32 (rows, dim), rows [0, S) of the corpus
    shard-00000.ids.json          the passage ids of those rows

The corpus is cut into fixed shards of ``shard_size`` rows; worker I of N owns a contiguous block of shards. A shard
counts only once its vectors, its ids and its manifest entry are all written (each atomically, the manifest last),
so a run killed at any point restarts from the last complete shard, and, since every shard is encoded as its own
length-sorted window with the same batches, the result equals an uninterrupted run.

Example::

    from fastdpr.encode import encode_corpus, load_vectors
    encode_corpus(model, Corpus.open("passages.tsv"), "vectors/", batch_size=128, dtype="float16")
    vectors, ids = load_vectors("vectors/")
"""
from fastdpr.data.vectors import (
    DTYPES,
    FORMAT,
    MANIFEST,
    VERSION,
    VectorShard,
    iter_vector_shards,
    load_vectors,
    part_manifest_name,
    read_manifest,
    shard_name,
)
from fastdpr.encode.fingerprint import model_fingerprint
from fastdpr.encode.layout import parse_shard_spec, worker_from_env, worker_shards
from fastdpr.encode.merge import merge_shards
from fastdpr.encode.writer import encode_corpus

__all__ = ["encode_corpus", "load_vectors", "iter_vector_shards", "merge_shards", "read_manifest", "VectorShard",
           "parse_shard_spec", "worker_shards", "worker_from_env", "model_fingerprint", "shard_name",
           "part_manifest_name", "FORMAT", "VERSION", "MANIFEST", "DTYPES"]
