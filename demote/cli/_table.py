"""Plain-text tables for the command line: labels left-aligned, numbers right-aligned."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


def table(rows: Sequence[Sequence[str]], *, text_columns: int = 1, gap: int = 2) -> list[str]:
    """Lay out ``rows`` (the first is the header) as lines of aligned columns.

    The first ``text_columns`` columns are left-aligned; the others hold numbers (counts,
    ranges, ratios, percentages) and are right-aligned, headers included, so digits line
    up. Trailing spaces are stripped.
    """
    if not rows:
        return []
    n = max(len(r) for r in rows)
    widths = [max(len(r[i]) if i < len(r) else 0 for r in rows) for i in range(n)]
    lines = []
    for r in rows:
        cells = [
            c.ljust(widths[i]) if i < text_columns else c.rjust(widths[i]) for i, c in enumerate(r)
        ]
        lines.append((" " * gap).join(cells).rstrip())
    return lines
