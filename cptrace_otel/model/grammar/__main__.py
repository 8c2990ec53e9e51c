"""``python3 -m cptrace_otel.model.grammar --header``: write ``_speedups/grammar.h`` from the record grammar (or
``--check``: exit 1 when the committed header is not the generated one)."""

from __future__ import annotations

import argparse
import sys

from . import HEADER_PATH, render_header


def main(argv: list[str] | None = None) -> int:
    """``--header``: write the header (or ``--check``: exit 1 when the committed one differs)."""
    ap = argparse.ArgumentParser(prog="python3 -m cptrace_otel.model.grammar",
                                 description="write the record grammar's C header")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--header", action="store_true", help=f"write {HEADER_PATH.name} next to the C sources")
    g.add_argument("--check", action="store_true", help="exit 1 when the committed header is not the generated one")
    args = ap.parse_args(argv)
    text = render_header()
    if args.check:
        same = HEADER_PATH.exists() and HEADER_PATH.read_text(encoding="utf-8") == text
        if not same:
            print(f"{HEADER_PATH.name} is stale: run python3 -m cptrace_otel.model.grammar --header", file=sys.stderr)
        return 0 if same else 1
    HEADER_PATH.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
