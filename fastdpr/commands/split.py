"""``fastdpr split``: documents (JSONL or plain text files) into N-word passages, DPR's psgs_w100 scheme.

    fastdpr split wiki.jsonl -o passages.tsv
    fastdpr split docs/ -o passages.jsonl --words 100 --stride 50 --numeric-ids

Beside the passages goes their document map, ``<output>.docmap.tsv`` (document id, then its passage ids), which
``fastdpr mine`` uses to turn the gold document ids of QA files into passages.
"""
from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("inputs", nargs="+", metavar="INPUT",
                        help="JSONL documents {id,title,text}, plain text files (title = file name), or directories")
    parser.add_argument("-o", "--output", required=True, help="passage file to write (.tsv with header, or .jsonl)")
    parser.add_argument("--words", type=int, default=100, help="words per passage (default 100)")
    parser.add_argument("--stride", type=int, default=None,
                        help="start a passage every STRIDE words (default: --words, i.e. no overlap)")
    parser.add_argument("--numeric-ids", action="store_true",
                        help="number passages 1, 2, ... instead of <document id>#<block>")
    parser.add_argument("--format", choices=["auto", "tsv", "jsonl"], default="auto",
                        help="output format (default: from the output's extension)")
    parser.add_argument("--skip-bad", action="store_true", help="skip bad documents with a warning instead of failing")


def run(args: argparse.Namespace) -> int:
    import sys

    from fastdpr.data._io import ReadStats
    from fastdpr.data.split import docmap_path, split_files
    from fastdpr.errors import InputError

    if args.words < 1:
        raise InputError(f"--words must be >= 1, got {args.words}")
    if args.stride is not None and not 1 <= args.stride <= args.words:
        raise InputError(f"--stride must be between 1 and --words ({args.words}), got {args.stride}")
    import warnings

    from fastdpr.data.split import iter_documents

    # a look for one readable document before anything is written; its bad rows are reported by the split
    looked = ReadStats()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = next(iter_documents(args.inputs, skip_bad=True, stats=looked), None)
    if found is None:
        if looked.first_errors:  # say why the first row was refused (an encoding, a missing field), not "nothing"
            raise InputError(f"{looked.first_errors[0]} (no document of {', '.join(map(str, args.inputs))} "
                             "could be read: nothing to split)")
        raise InputError(f"no document with text in {', '.join(map(str, args.inputs))}: nothing to split")
    stats = ReadStats()
    n = split_files(args.inputs, args.output, words=args.words, stride=args.stride, numeric_ids=args.numeric_ids,
                    fmt=args.format, skip_bad=args.skip_bad, stats=stats)
    skipped = f", skipped {stats.bad} bad document(s)" if stats.bad else ""
    print(f"wrote {n} passages from {stats.rows} documents to {args.output}{skipped}; document map: "
          f"{docmap_path(args.output)}", file=sys.stderr)
    return 0
