"""Summary pivots and number formatting shared by the Markdown and HTML reports."""

from __future__ import annotations

import math

from analysis.render import (
    Block,
    column_order,
    format_number,
    literal_markdown,
    markdown_table,
    to_html,
    wide_table,
)
from analysis.summary import row, to_frame


def test_format_number() -> None:
    assert format_number(math.nan) == "—"
    assert format_number(0.00003, "welch_p") == "<0.0001"
    assert format_number(0.04567, "wilcoxon_p_holm") == "0.0457"
    assert format_number(34.0, "seeds_needed") == "34"
    assert format_number(0.0, "diverged") == "0"
    assert format_number(1.0, "iqm") == "1.000"  # a score, not a count
    assert format_number(0.00215, "max_kl_old") == "0.00215"  # small values keep 3 digits


def test_column_order_puts_holm_next_to_raw_p() -> None:
    stats = ["diff", "wilcoxon_p", "welch_p", "wilcoxon_p_holm", "welch_p_holm"]
    assert column_order(stats) == [
        "diff",
        "wilcoxon_p",
        "wilcoxon_p_holm",
        "welch_p",
        "welch_p_holm",
    ]


def test_wide_table_pivots_one_section() -> None:
    summary = to_frame(
        [
            row("final_score", "iqm", 0.5, arm="a", lag=0, ci_low=0.4, ci_high=0.6, n=5),
            row("final_score", "mean", 0.52, arm="a", lag=0, ci_low=0.41, ci_high=0.63, n=5),
            row("final_score", "iqm", 0.7, arm="a", n=1, note="interval needs at least 2 seeds"),
            row(
                "time_to_threshold",
                "median_steps",
                math.nan,
                arm="a",
                lag=0,
                n=3,
                note="median not reached (pass rate >= 0.5)",
            ),
        ]
    )
    table = wide_table(summary, "final_score")
    assert list(table.columns) == ["arm", "lag", "iqm", "mean", "n", "note"]
    first = table.iloc[0].to_dict()
    assert first == {
        "arm": "a",
        "lag": "0",
        "iqm": "0.500 [0.400, 0.600]",
        "mean": "0.520 [0.410, 0.630]",
        "n": "5",
        "note": "",
    }
    assert table.iloc[1]["lag"] == "all" and table.iloc[1]["mean"] == "—"
    assert "at least 2 seeds" in table.iloc[1]["note"]
    assert wide_table(summary, "time_to_threshold").iloc[0]["median_steps"] == "not reached"


def test_markdown_escapes_pipes_and_html_escapes_text() -> None:
    summary = to_frame([row("s", "x", 1.0, arm="a|b", n=1)])
    md = markdown_table(wide_table(summary, "s"))
    assert "a\\|b" in md and md.splitlines()[1] == "|---|---|---|---|"
    html = to_html([Block("h1", "<T>"), Block("p", "a & b")], "<T>")
    assert "&lt;T&gt;" in html and "a &amp; b" in html and "<T>" not in html


def test_literal_text_is_a_code_span_whatever_it_holds() -> None:
    """A completion is shown exactly: the fence outgrows its backticks, edge spaces and
    backticks are padded (CommonMark strips one space a side), line breaks are marked."""
    assert literal_markdown("46") == "`46`"
    assert literal_markdown("a ``b`` c") == "```a ``b`` c```"
    assert literal_markdown("`x`") == "`` `x` ``"
    assert literal_markdown(" 4 ") == "`  4  `"
    assert literal_markdown("a\r\nb\nc") == "`a⏎b⏎c`"
    assert literal_markdown("") == "_(empty)_"
