"""benchmarks/plot_results.py draws RESULTS.md's headline table: its parser finds the nine
quantized rows (three algorithms x three bit pairs) with their two ratios, and refuses a page
without the table rather than drawing an empty plot."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import plot_results  # noqa: E402


def test_the_headline_table_is_parsed():
    with open(plot_results.RESULTS, encoding="utf-8") as f:
        rows = plot_results.headline_rows(f.read())
    assert len(rows) == 9
    assert {r[0] for r in rows} == {"two_step", "ring", "semi_ring"}
    assert {r[1] for r in rows} == {"8/8", "4/8", "4/4"}
    # every quantized row is faster than Gloo fp32, and the ratios agree with the table's sense
    assert all(r[2] > 1.0 and r[2] > r[3] > 0 for r in rows), rows


def test_a_page_without_the_table_is_refused():
    with pytest.raises(SystemExit):
        plot_results.headline_rows(plot_results.TITLE + "\n\nno table here\n")
