"""Plain English text out of Debian's documentation packages, cut into passages of about 50 words.

A *document* is ``(title, blocks)``: the blocks are the paragraphs, headings and list items of one HTML page, man
page, dictionary entry, fortune or package description, each already folded to single spaces. :func:`cut_passages`
turns a document into passages of about ``target`` words that end at sentence ends where the text has them; a
passage may run across blocks (a heading joins the paragraph after it rather than standing alone as a passage of two
words).

Readers, one per kind of file:

* :func:`html_document`: HTML pages through the standard library's ``html.parser``; scripts, styles, code blocks
  (``<pre>``), navigation bars, sidebars, headers and footers are left out (they are code or the same words on every
  page, not prose).
* :func:`man_document`: man pages rendered to text by ``man -l`` (so tables and escapes come out as a reader sees
  them), one block per paragraph.
* :func:`dictd_documents`: every entry of a dictd dictionary (``.index`` + ``.dict.dz``, which is gzip-readable).
* :func:`fortune_documents`: fortune files (entries between ``%`` lines).
* :func:`apt_documents`: package descriptions as ``apt-cache dumpavail`` prints them.
"""
from __future__ import annotations

import gzip
import os
import re
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

TARGET_WORDS = 50
#: a passage never grows past this; a longer sentence is cut into pieces of ``TARGET_WORDS`` words
MAX_WORDS = 100
#: passages shorter than this are captions, headings or a page's last crumbs, not text (a shorter document tail joins
#: the passage before it instead)
MIN_WORDS = 8

Document = tuple[str, list[str]]

# a sentence ends at . ! or ? (after any closing quotes or brackets) followed by space and a capital, digit or opening
# quote/bracket; "e.g. the" is not split, "Python 3.11. The" is
_SENTENCE_END = re.compile(r"(?<=[.!?])([\"')\]]*)\s+(?=[\"'(\[A-Z0-9])")


def fold(text: str) -> str:
    return " ".join(text.split())


def sentences(block: str) -> list[str]:
    """The sentences of one block (a block with no sentence end is one sentence)."""
    parts = _SENTENCE_END.split(block)
    # split() keeps the captured closers: glue each back onto the sentence before it
    out = [parts[0]]
    for closer, rest in zip(parts[1::2], parts[2::2]):
        out[-1] += closer
        out.append(rest)
    return [s for s in (fold(p) for p in out) if s]


def cut_passages(blocks: list[str], target: int = TARGET_WORDS, limit: int = MAX_WORDS,
                 min_words: int = MIN_WORDS) -> list[str]:
    """Passages of about ``target`` words (at most ``limit``) from a document's blocks, cut at sentence ends.

    Sentences are taken in order; when the next one would carry a passage past ``target``, the passage ends before
    or after it, whichever leaves it nearer ``target``. A tail under ``min_words`` joins the previous passage when
    that stays within ``limit``, else it is dropped, as is any passage under ``min_words``."""
    if not 0 < min_words <= target <= limit:
        raise ValueError(f"need 0 < min_words <= target <= limit, got {min_words}, {target}, {limit}")
    units: list[list[str]] = []
    for block in blocks:
        for sentence in sentences(block):
            words = sentence.split()
            if len(words) > limit:
                units += [words[i:i + target] for i in range(0, len(words), target)]
            else:
                units.append(words)
    passages: list[list[str]] = []
    current: list[str] = []
    for unit in units:
        total = len(current) + len(unit)
        if not current or total <= target:
            current = current + unit
        elif total - target < target - len(current) and total <= limit:
            passages.append(current + unit)
            current = []
        else:
            passages.append(current)
            current = list(unit)
    if current:
        if len(current) < min_words and passages and len(passages[-1]) + len(current) <= limit:
            passages[-1] = passages[-1] + current
        else:
            passages.append(current)
    return [" ".join(p) for p in passages if len(p) >= min_words]


# ------------------------------------------------------------------------------------------------------------- HTML

_BLOCK_TAGS = {"p", "div", "li", "ul", "ol", "dl", "dt", "dd", "h1", "h2", "h3", "h4", "h5", "h6", "table", "tr",
               "td", "th", "br", "hr", "section", "article", "blockquote", "caption", "figcaption", "body",
               "title", "main", "aside", "details", "summary", "form"}
# whole elements whose text is not the page's prose
_SKIP_TAGS = {"script", "style", "pre", "nav", "header", "footer", "noscript", "template", "svg", "button",
              "select", "textarea"}
# class or role words of navigation, sidebars and permalinks in Sphinx, javadoc and DocBook pages (not "header":
# Qt's pages leave their header <div> unclosed, so skipping it would skip the whole page)
_SKIP_CLASSES = {"sphinxsidebar", "related", "navigation", "navheader", "navfooter", "headerlink", "footer",
                 "sidebar", "toc", "breadcrumb", "breadcrumbs", "top-nav", "sub-nav", "flex-header",
                 "highlight", "sphinxsidebarwrapper", "prev-next-area", "bd-sidebar", "bd-header", "bd-footer",
                 "copyright", "admonition-title", "linenos", "navbar"}
_VOID_TAGS = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
              "track", "wbr"}


class _TextOfPage(HTMLParser):
    def __init__(self, skip_classes: bool = True):
        super().__init__(convert_charrefs=True)
        self.skip_classes = skip_classes
        self.blocks: list[str] = []
        self.title = ""
        self._current: list[str] = []
        self._skip: list[str] = []  # the open elements being skipped, innermost last
        self._in_title = False

    def _close_block(self) -> None:
        text = fold("".join(self._current))
        if text:
            self.blocks.append(text)
        self._current = []

    def handle_starttag(self, tag, attrs):
        if tag in _VOID_TAGS:
            if tag in ("br", "hr") and not self._skip:
                self._close_block()
            return
        if self._skip:
            self._skip.append(tag)
            return
        attributes = dict(attrs)
        words = set((attributes.get("class") or "").split()) | {attributes.get("role") or ""}
        if tag in _SKIP_TAGS or (self.skip_classes and words & _SKIP_CLASSES) or tag == "head":
            self._in_title = False
            if tag == "head":
                # the <title> inside <head> is wanted; the rest of <head> has no text anyway
                return
            self._close_block()
            self._skip.append(tag)
            return
        if tag == "title":
            self._in_title = True
        if tag in _BLOCK_TAGS:
            self._close_block()

    def handle_endtag(self, tag):
        if self._skip:
            # pop back to the matching open element (pages with unclosed <p> or <li> still end up balanced)
            if tag in self._skip:
                while self._skip and self._skip.pop() != tag:
                    pass
            return
        if tag == "title":
            self._in_title = False
        if tag in _BLOCK_TAGS:
            self._close_block()

    def handle_data(self, data):
        if self._skip:
            return
        if self._in_title:
            self.title += data
            return
        self._current.append(data)

    def close(self):
        super().close()
        self._close_block()

    @property
    def unclosed_skip(self) -> bool:
        return bool(self._skip)


def html_document(path: str | os.PathLike) -> Document:
    """The title and text blocks of one HTML page (read as UTF-8, undecodable bytes replaced).

    A page where a skipped element is still open at the end (a navigation ``<div>`` whose inner ``<div>``s are not
    all closed) would lose everything after it, so it is read again without skipping by class or role."""
    page = Path(path).read_bytes().decode("utf-8", "replace")
    parser = _TextOfPage()
    parser.feed(page)
    parser.close()
    if parser.unclosed_skip:
        parser = _TextOfPage(skip_classes=False)
        parser.feed(page)
        parser.close()
    return fold(parser.title), parser.blocks


# ------------------------------------------------------------------------------------------------------ man pages

_MAN_ENV = {"MANWIDTH": "1000", "MAN_KEEP_FORMATTING": "", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}


def man_document(path: str | os.PathLike) -> Document | None:
    """A man page (plain or gzipped roff) rendered by ``man -l`` without hyphenation or justification, one block per
    paragraph; ``None`` for a page that only points at another (``.so``), which is read in its own right."""
    path = Path(path)
    raw = path.read_bytes()
    if path.suffix == ".gz":
        raw = gzip.decompress(raw)
    if raw.lstrip().startswith(b".so "):
        return None
    env = {**os.environ, **_MAN_ENV}
    result = subprocess.run(["man", "-l", "--nh", "--nj", "-E", "UTF-8", "-"], input=raw, capture_output=True,
                            env=env, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{path}: man -l failed ({result.returncode}): "
                           f"{result.stderr.decode('utf-8', 'replace').strip()[:300]}")
    text = result.stdout.decode("utf-8", "replace")
    # without a terminal man still overstrikes bold and underline with backspaces in some setups
    text = re.sub(r".\x08", "", text)
    blocks = [fold(b) for b in re.split(r"\n\s*\n", text)]
    lines = text.strip().splitlines()
    if lines:
        blocks = blocks[1:] if fold(lines[0]) == blocks[0] else blocks  # the running header line
        blocks = blocks[:-1] if blocks and fold(lines[-1]) == blocks[-1] else blocks  # the running footer line
    name = path.name[:-3] if path.suffix == ".gz" else path.name
    return name, [b for b in blocks if b]


# ------------------------------------------------------------------------------------------------------ dictionaries

_B64 = {c: i for i, c in enumerate("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


def _dictd_number(text: str) -> int:
    value = 0
    for c in text:
        value = value * 64 + _B64[c]
    return value


def dictd_documents(index: str | os.PathLike, dictionary: str | os.PathLike) -> Iterator[Document]:
    """Every entry of a dictd dictionary once (several headwords may point at one entry), in file order; dictd's
    own ``00-database-*`` entries (the dictionary's name, URL and licence) are left out."""
    data = Path(dictionary).read_bytes()
    if str(dictionary).endswith(".dz"):
        data = gzip.decompress(data)
    entries: dict[tuple[int, int], str] = {}
    with open(index, encoding="utf-8", errors="replace") as fh:
        for number, line in enumerate(fh, 1):
            fields = line.rstrip("\n").split("\t")
            if len(fields) < 3:
                raise ValueError(f"{index}:{number}: expected 'headword<TAB>offset<TAB>length'")
            headword = fields[0]
            if headword.startswith("00-database") or headword.startswith("00database"):
                continue
            try:
                span = (_dictd_number(fields[1]), _dictd_number(fields[2]))
            except KeyError as err:
                raise ValueError(f"{index}:{number}: {err} is not a dictd base-64 digit") from None
            entries.setdefault(span, headword)
    for (offset, length), headword in sorted(entries.items()):
        text = data[offset:offset + length].decode("utf-8", "replace")
        yield headword, [fold(text)]


# ------------------------------------------------------------------------------------------------ fortunes, apt

def fortune_documents(path: str | os.PathLike) -> Iterator[Document]:
    """The entries of one fortune file (text between lines holding a single ``%``)."""
    name = Path(path).name
    text = Path(path).read_bytes().decode("utf-8", "replace")
    for entry in re.split(r"^%\s*$", text, flags=re.M):
        if entry.strip():
            yield name, [fold(entry)]


def apt_documents(dumpavail: str | os.PathLike) -> Iterator[Document]:
    """``Package: synopsis`` and the long description of every stanza of an ``apt-cache dumpavail`` output, the
    long description's paragraphs (separated by `` .`` lines) as blocks."""
    with open(dumpavail, encoding="utf-8", errors="replace") as fh:
        stanza = fh.read().split("\n\n")
    for record in stanza:
        package, description, in_description = "", [], False
        for line in record.splitlines():
            if line.startswith("Package:"):
                package = line.split(":", 1)[1].strip()
                in_description = False
            elif line.startswith("Description:") or line.startswith("Description-en:"):
                description = [line.split(":", 1)[1].strip()]
                in_description = True
            elif in_description and line.startswith(" "):
                description.append(line[1:])
            else:
                in_description = False
        if not package or not description:
            continue
        synopsis, body = description[0], description[1:]
        blocks = [f"{package}: {synopsis}."]
        paragraph: list[str] = []
        for line in body:
            if line.strip() == ".":
                blocks.append(fold(" ".join(paragraph)))
                paragraph = []
            else:
                paragraph.append(line)
        blocks.append(fold(" ".join(paragraph)))
        yield package, [b for b in blocks if b]
