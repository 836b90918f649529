"""Render a report, given as a list of blocks, to Markdown and to self-contained HTML.

The report content is built once as blocks (heading, paragraph, bullet list, table, figure) and
rendered twice, so the two formats cannot drift apart. Tables are pivots of the summary frame.
"""

from __future__ import annotations

import base64
import html
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

DASH = "—"
INDEX_COLUMNS = ("arm", "lag", "comparison")
COUNT_STATISTICS = frozenset(
    {
        "trials",
        "scored",
        "diverged",
        "seeds",
        "seeds_needed",
        "seeds_run",
        "median_steps",
        "pareto_within_arm",
        "pareto_overall",
    }
)


@dataclass(frozen=True)
class Block:
    """One unit of report content. kind: h1 | h2 | h3 | p | list | table | figure."""

    kind: str
    text: str = ""
    items: list[str] = field(default_factory=list)
    table: pd.DataFrame | None = None
    path: Path | None = None
    # Table columns whose cells are literal text (a model's prompts and completions): shown
    # exactly, never read as Markdown or HTML (`literal_markdown`, `literal_text`).
    literal: tuple[str, ...] = ()


def format_number(value: float, statistic: str = "") -> str:
    """p-values to 4 decimals (or '<0.0001'), counts bare, small values 3 significant digits."""
    if value is None or pd.isna(value):
        return DASH
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if statistic.endswith(("_p", "_p_holm")):
        return "<0.0001" if value < 1e-4 else f"{value:.4f}"
    if statistic in COUNT_STATISTICS and float(value).is_integer():
        return f"{int(value)}"
    if value != 0 and abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.3f}"


def column_order(statistics: list[str]) -> list[str]:
    """Statistics in first-seen order, each `<x>_holm` moved right after its `<x>`."""
    base = [s for s in statistics if not s.endswith("_holm")]
    out = []
    for stat in base:
        out.append(stat)
        if f"{stat}_holm" in statistics:
            out.append(f"{stat}_holm")
    return out + [s for s in statistics if s not in out]


def cell_text(r: pd.Series) -> str:
    """'value [low, high]' when an interval exists, else 'value'; a censored median says so."""
    if r["statistic"] == "median_steps" and pd.isna(r["value"]) and "not reached" in r["note"]:
        return "not reached"
    text = format_number(r["value"], r["statistic"])
    if pd.notna(r["ci_low"]) and pd.notna(r["ci_high"]):
        low = format_number(r["ci_low"], r["statistic"])
        high = format_number(r["ci_high"], r["statistic"])
        text += f" [{low}, {high}]"
    return text


def _key_text(column: str, value: object) -> str:
    """Missing lag means 'all lags'; a missing arm or comparison is left blank."""
    if pd.isna(value):
        return "all" if column == "lag" else ""
    return str(value)


def wide_table(
    summary: pd.DataFrame, section: str, statistics: list[str] | None = None
) -> pd.DataFrame:
    """Pivot one section: a row per (arm, lag, comparison), a column per statistic, plus n, note.

    `n` is the first statistic's n (each section's text says what it counts); notes of all the
    row's statistics are joined, repeated ones once.
    """
    part = summary[summary["section"] == section]
    if statistics is not None:
        part = part[part["statistic"].isin(statistics)]
    if part.empty:
        return pd.DataFrame()
    order = statistics or column_order(list(dict.fromkeys(part["statistic"])))
    keys = [c for c in INDEX_COLUMNS if part[c].notna().any()]
    part = part.assign(cell=part.apply(cell_text, axis=1))
    out = []
    for key, group in part.groupby(keys, sort=True, dropna=False):
        key = key if isinstance(key, tuple) else (key,)
        record = {k: _key_text(k, v) for k, v in zip(keys, key, strict=True)}
        by_stat = group.set_index("statistic")
        for stat in order:
            record[stat] = by_stat["cell"].get(stat, DASH)
        first = group.iloc[0]["n"]
        record["n"] = DASH if pd.isna(first) else str(int(first))
        # Holm notes only name the family size, which the section text states once.
        own = group[~group["statistic"].str.endswith("_holm")]["note"].dropna()
        record["note"] = "; ".join(n for n in dict.fromkeys(own) if n)
        out.append(record)
    return pd.DataFrame(out)


NEWLINE_MARK = "⏎"
EMPTY_TEXT = "(empty)"


def literal_text(text: str) -> str:
    """Literal text on one line: each line break shown as NEWLINE_MARK, empty text as
    EMPTY_TEXT (a table cell cannot show either)."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\n", NEWLINE_MARK)
    return text or EMPTY_TEXT


def literal_markdown(text: str) -> str:
    """`text` as a Markdown code span: shown exactly, never read as Markdown or inline HTML
    (a completion that writes `<script>` or `**` shows those characters). The fence is one
    backtick longer than any run inside, padded when the text starts or ends with a backtick
    or a space (CommonMark strips one space on each side)."""
    if not text:
        return f"_{EMPTY_TEXT}_"
    shown = literal_text(text)
    fence = "`" * (1 + max((len(run) for run in re.findall(r"`+", shown)), default=0))
    pad = " " if shown[0] in "` " or shown[-1] in "` " else ""
    return f"{fence}{pad}{shown}{pad}{fence}"


def markdown_table(table: pd.DataFrame, literal: tuple[str, ...] = ()) -> str:
    """A GitHub pipe table; pipes inside cells are escaped; the `literal` columns' cells are
    code spans (`literal_markdown`)."""

    def esc(v: object) -> str:
        return str(v).replace("|", "\\|").replace("\n", " ")

    def cell(column: str, v: object) -> str:
        return esc(literal_markdown(str(v)) if column in literal else v)

    header = "| " + " | ".join(esc(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---" for _ in table.columns) + "|"
    body = [
        "| " + " | ".join(cell(c, v) for c, v in zip(table.columns, r, strict=True)) + " |"
        for r in table.itertuples(index=False)
    ]
    return "\n".join([header, rule, *body])


def to_markdown(blocks: list[Block], base: Path) -> str:
    """Markdown with figures linked relative to `base` (the report directory)."""
    out = []
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            out.append("#" * int(b.kind[1]) + " " + b.text)
        elif b.kind == "p":
            out.append(b.text)
        elif b.kind == "list":
            out.append("\n".join(f"- {item}" for item in b.items) or "- (none)")
        elif b.kind == "table":
            out.append(
                markdown_table(b.table, b.literal)
                if b.table is not None and len(b.table)
                else "_(no rows)_"
            )
        elif b.kind == "figure" and b.path is not None:
            out.append(f"![{b.text}]({b.path.relative_to(base).as_posix()})\n\n_{b.text}_")
    return "\n\n".join(out) + "\n"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1200px;margin:2em auto;
padding:0 1em;color:#222;line-height:1.45}
table{border-collapse:collapse;font-size:13px;margin:.5em 0 1.5em;display:block;overflow-x:auto;
max-width:100%}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:left;vertical-align:top}
th{background:#f2f2f2} tr:nth-child(even){background:#fafafa}
figure{margin:1em 0} figure img{max-width:100%} figcaption{font-size:13px;color:#555}
"""


def _image_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def to_html(blocks: list[Block], title: str) -> str:
    """A single HTML file: inline CSS, tables from pandas, figures embedded as base64 PNG."""
    parts = [
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
        f"<style>{_CSS}</style></head><body>",
    ]
    for b in blocks:
        if b.kind in ("h1", "h2", "h3"):
            parts.append(f"<{b.kind}>{html.escape(b.text)}</{b.kind}>")
        elif b.kind == "p":
            parts.append(f"<p>{html.escape(b.text)}</p>")
        elif b.kind == "list":
            items = "".join(f"<li>{html.escape(i)}</li>" for i in b.items) or "<li>(none)</li>"
            parts.append(f"<ul>{items}</ul>")
        elif b.kind == "table":
            if b.table is None or b.table.empty:
                parts.append("<p><em>(no rows)</em></p>")
            else:
                shown = b.table.assign(
                    **{c: b.table[c].map(lambda v: literal_text(str(v))) for c in b.literal}
                )
                parts.append(shown.to_html(index=False, escape=True, border=0, na_rep=DASH))
        elif b.kind == "figure" and b.path is not None:
            parts.append(
                f"<figure>{_image_tag(b.path, b.text)}"
                f"<figcaption>{html.escape(b.text)}</figcaption></figure>"
            )
    parts.append("</body></html>")
    return "\n".join(parts)
