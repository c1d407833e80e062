"""Every module of the package opens with a docstring whose summary (its first paragraph) is at most three lines."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway

PACKAGE = Path(gateway.__file__).parent
SUMMARY_MAX_LINES = 3


def summary_lines(source: str) -> int | None:
    """The number of lines of the module docstring's first paragraph, or None when the module has no docstring."""
    docstring = ast.get_docstring(ast.parse(source), clean=True)
    if docstring is None:
        return None
    lines = docstring.splitlines()
    return next((n for n, line in enumerate(lines) if not line.strip()), len(lines))


def test_summary_lines_counts_the_first_paragraph_only() -> None:
    assert summary_lines('"""One line."""\n') == 1
    assert summary_lines('"""One\n   two.\n\nDetails,\nmany\nlines.\n"""\n') == 2
    assert summary_lines('"""\nOne\ntwo\nthree\nfour.\n"""\n') == 4
    assert summary_lines("import os\n") is None


def test_every_module_opens_with_a_summary_of_at_most_three_lines() -> None:
    problems = []
    for path in sorted(PACKAGE.rglob("*.py")):
        lines = summary_lines(path.read_text(encoding="utf-8"))
        where = path.relative_to(PACKAGE.parent)
        if lines is None:
            problems.append(f"{where}: no module docstring; open the module with a summary of what it holds")
        elif lines > SUMMARY_MAX_LINES:
            problems.append(
                f"{where}: the docstring's first paragraph has {lines} lines; keep the summary to "
                f"{SUMMARY_MAX_LINES} and put the details after a blank line"
            )
    assert not problems, "\n".join(problems)
