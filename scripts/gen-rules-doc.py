#!/usr/bin/env python3
"""Regenerate docs/rules.md from the rules' metadata (gateway/decision/rules/).

    python3 scripts/gen-rules-doc.py            # write docs/rules.md
    python3 scripts/gen-rules-doc.py --check    # exit 1 when docs/rules.md differs

The same text is printed by ``gateway policy rules --markdown``; tests/unit/decision/test_catalogue.py fails when
the shipped file is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gateway.decision.catalogue import render_markdown  # noqa: E402

TARGET = ROOT / "docs" / "rules.md"


def main(argv: list[str]) -> int:
    text = render_markdown()
    if "--check" in argv:
        if TARGET.read_text(encoding="utf-8") != text:
            print(f"{TARGET} is out of date: run scripts/gen-rules-doc.py", file=sys.stderr)
            return 1
        return 0
    TARGET.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
