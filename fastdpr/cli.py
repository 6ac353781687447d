"""The ``fastdpr`` command. It only wires: every subcommand lives in ``fastdpr/commands/<name>.py`` with two
functions, ``add_arguments(parser)`` and ``run(args) -> int``, and imports its heavy dependencies inside ``run``
so that ``fastdpr --help`` is instant."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util  # find_spec: importlib alone does not load its util submodule
import re
import sys

# subcommand -> (module, one-line help). Order is the order of the pipeline.
COMMANDS: dict[str, tuple[str, str]] = {
    "data": ("fastdpr.commands.data", "fetch the published QA files (sha256-checked) into a cache"),
    "split": ("fastdpr.commands.split", "split documents into 100-word passages (DPR psgs_w100)"),
    "bm25": ("fastdpr.commands.bm25", "build or search a BM25 index (Java-free)"),
    "mine": ("fastdpr.commands.mine", "mine positives and answer-aware BM25 hard negatives"),
    "train": ("fastdpr.commands.train", "train a dual encoder (GradCache, AMP, DDP)"),
    "encode": ("fastdpr.commands.encode", "encode passages into fp16/fp32 vector shards (resumable)"),
    "index": ("fastdpr.commands.index", "build a MIPS index from vector shards"),
    "search": ("fastdpr.commands.search", "retrieve passages: dense, bm25 or hybrid"),
    "tune-hybrid": ("fastdpr.commands.tune_hybrid", "tune the hybrid fusion weight on a dev set"),
    "evaluate": ("fastdpr.commands.evaluate", "top-k accuracy, MRR, nDCG, recall of a run"),
    "train-reader": ("fastdpr.commands.train_reader", "train the extractive reader"),
    "read": ("fastdpr.commands.read", "extract answers from retrieved passages"),
    "serve": ("fastdpr.commands.serve", "dense, sparse and hybrid search over HTTP, requests batched together"),
    "bench": ("fastdpr.commands.bench", "speed benchmarks against peers"),
    "quickstart": ("fastdpr.commands.quickstart", "the whole chain on published QA data (NQ, SQuAD, SQuADShifts)"),
}


class _HelpWithDefaults(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (unless the help already states it, or there is none), so that
    ``--help`` shows what a command does when a flag is left out."""

    def _get_help_string(self, action):
        text = action.help or ""
        # a flag that stores False defaults to True: "(default: True)" under --no-X says the opposite of what
        # leaving it out does, so such a flag states its default in words
        if (action.default is None or action.default is False or action.default == argparse.SUPPRESS
                or "default" in text or not action.option_strings or isinstance(action, argparse._StoreFalseAction)):
            return text
        return f"{text} (default: %(default)s)" if text else "default: %(default)s"


def _available() -> dict[str, tuple[str, str]]:
    found = {}
    for name, (module, help_) in COMMANDS.items():
        if importlib.util.find_spec(module) is not None:
            found[name] = (module, help_)
    return found


def build_parser() -> argparse.ArgumentParser:
    from fastdpr import __version__

    parser = argparse.ArgumentParser(prog="fastdpr", description="Dense Passage Retrieval end to end.")
    parser.add_argument("--version", action="version", version=f"fastdpr {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_) in _available().items():
        mod = importlib.import_module(module)
        # the module docstring (its usage examples) closes the command's --help
        p = sub.add_parser(name, help=help_, description=help_, epilog=_examples(mod),
                           formatter_class=_HelpWithDefaults)
        mod.add_arguments(p)
        for action in p._actions:  # argparse prints no help line (so no default) for options without help
            if action.help is None and action.option_strings and action.default not in (None, False):
                action.help = "default: %(default)s"
        p.set_defaults(_module=mod)
    return parser


def _examples(module) -> str | None:
    """The module docstring after its first paragraph (which repeats what the one-line help says): the first
    sentence may wrap over several lines, so the cut is at the first blank line, never mid-sentence."""
    doc = (module.__doc__ or "").strip()
    parts = re.split(r"\n[ \t]*\n", doc, maxsplit=1)
    return parts[1].strip() if len(parts) == 2 and parts[1].strip() else None


@contextlib.contextmanager
def _one_line_warnings(command: str):
    """Warnings as one line naming the command, as errors are: the default format names the fastdpr source
    line that raised the warning, which says nothing to a user and repeats its code."""
    import warnings

    def show(message, category, filename, lineno, file=None, line=None):
        text = str(message).replace("\n", " ")
        print(f"fastdpr {command}: warning: {text}", file=file or sys.stderr, flush=True)

    before = warnings.showwarning
    warnings.showwarning = show
    try:
        yield
    finally:
        warnings.showwarning = before


class Terminated(BaseException):
    """SIGTERM, raised where the command is, so that it stops the way Ctrl-C stops it (files closed, a message)."""


def _raise_terminated(signum, frame):
    raise Terminated


@contextlib.contextmanager
def _sigterm_stops():
    """SIGTERM raises :class:`Terminated` while a command runs (not where a program embedding ``main`` set its own
    handler, nor off the main thread, where signals cannot be handled)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stopped(args, what: str) -> None:
    """One line saying the command stopped, and what a rerun does (a command's ``ON_INTERRUPT``)."""
    hint = getattr(args._module, "ON_INTERRUPT", None)
    print(f"fastdpr {args.command}: {what}" + (f"; {hint}" if hint else ""), file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    import signal

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        with _sigterm_stops(), _one_line_warnings(args.command):
            return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        _stopped(args, "interrupted")
        return 130
    except Terminated:
        _stopped(args, "stopped by SIGTERM")
        return 128 + signal.SIGTERM
    except FastDPRError as err:
        print(f"fastdpr {args.command}: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        # the file system refused (an output under a file, a directory where a file goes, a read-only or full
        # disk): the user can act on it, a traceback adds nothing
        if err.filename is None:
            raise
        print(f"fastdpr {args.command}: error: {_os_error_text(err)}", file=sys.stderr)
        return 2


def _os_error_text(err: OSError) -> str:
    where = str(err.filename) + (f" -> {err.filename2}" if err.filename2 else "")
    return f"{where}: {err.strerror or err}"


from fastdpr.errors import FastDPRError  # noqa: E402  (kept light: no heavy imports)

if __name__ == "__main__":
    raise SystemExit(main())
