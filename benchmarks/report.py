"""Join every ``<name>.md`` in the results folder into one ``README.md``, in a fixed order."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import DEFAULT_OUT  # noqa: E402

ORDER = ["e2e", "ann", "loss", "train", "encode", "bm25", "gpu"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args()
    parts = sorted(args.out.glob("*.md"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER else 99, p.stem))
    parts = [p for p in parts if p.name != "README.md"]
    from fastdpr.atomic import write_text

    body = "# fastdpr benchmark results\n\nEach section names the command that produced it.\n\n"
    body += "\n".join(p.read_text(encoding="utf-8") for p in parts)
    write_text(args.out / "README.md", body)
    print(f"wrote {args.out / 'README.md'} ({len(parts)} sections)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
