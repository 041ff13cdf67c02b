"""Results as the scripts print and save them: aligned text tables, Markdown tables, CSV files
(whole, or a row at a time as rows finish, so that a run cut short keeps what it measured)."""

from __future__ import annotations

import csv
import os


def align_table(columns: list, lines: list, left: set, breaks=()) -> str:
    """Columns aligned (the names in `left` to the left), a rule under the header, and an empty
    line before each data line whose index is in `breaks`."""
    cells = [columns] + lines
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    out = []
    for n, line in enumerate(cells):
        if n - 1 in breaks:
            out.append("")
        out.append(
            "  ".join(
                v.ljust(w) if columns[i] in left else v.rjust(w)
                for i, (v, w) in enumerate(zip(line, widths))
            ).rstrip()
        )
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def md_row(cells) -> str:
    """'| a | b |': one Markdown table line of the cells (str of each)."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def md_head(head) -> str:
    """A Markdown table's header line and its rule ('|---|---|')."""
    return md_row(head) + "\n|" + "---|" * len(head)


def md_table(head, rows) -> str:
    """A Markdown table: the header, its rule and one line per row."""
    return "\n".join([md_head(head)] + [md_row(r) for r in rows])


def write_csv(path: str, rows: list, head=None) -> None:
    """Writes the rows to a CSV file: lists under the header `head`, or dicts under their keys
    (the first row's, or `head`)."""
    with open(path, "w", newline="") as f:
        if rows and isinstance(rows[0], dict):
            w = csv.DictWriter(f, fieldnames=list(head or rows[0]))
            w.writeheader()
        else:
            w = csv.writer(f)
            if head is not None:
                w.writerow(head)
        w.writerows(rows)


class CsvLog:
    """A CSV file written a row at a time, each flushed as it is added (a run cut short keeps its
    rows): dict rows under `fields` (extra keys left out with extrasaction="ignore", refused
    otherwise), or list rows with `dicts=False`, `fields` then the header line. With no path it
    writes nothing."""

    def __init__(self, path, fields, dicts=True, extrasaction="raise"):
        self.file = self.writer = None
        if not path:
            return
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self.file = open(path, "w", newline="")  # noqa: SIM115 - closed by close()
        if dicts:
            self.writer = csv.DictWriter(self.file, fieldnames=fields, extrasaction=extrasaction)
            self.writer.writeheader()
        else:
            self.writer = csv.writer(self.file)
            self.writer.writerow(fields)
        self.file.flush()

    def add(self, row) -> None:
        """Writes one row and flushes it."""
        if self.writer is not None:
            self.writer.writerow(row)
            self.file.flush()

    def close(self) -> None:
        """Closes the file (nothing to do without one)."""
        if self.file is not None:
            self.file.close()
            self.file = None
