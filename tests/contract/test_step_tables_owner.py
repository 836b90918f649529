"""`contract.step_tables` is the one owner of the part files of `metrics.parquet/`,
`evals.parquet/` and `rollouts.parquet/`: no module of analysis, buffer, harness or learner
names, lists, writes or reads those parts itself. Checked statically on the source (docstrings
excluded), precisely enough that other Parquet files (`summary.parquet`, `prompts.parquet`)
never count."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("analysis", "buffer", "harness", "learner")
# Call names that list a directory by pattern, and that read or write Parquet.
GLOBS = {"glob", "rglob", "iglob", "fnmatch"}
PARQUET_IO = {
    "write_table",
    "read_table",
    "read_schema",
    "read_metadata",
    "dataset",
    "read_parquet",
    "to_parquet",
    "ParquetFile",
    "ParquetDataset",
    "write_dataset",
    "write_to_dataset",
}
# What names a step-table directory in an expression: TrialPaths.metrics / .evals / .rollouts,
# the layout constants, or the directory names spelled out.
STEP_TABLE_ATTRS = {"metrics", "evals", "rollouts"}
STEP_TABLE_NAMES = {"METRICS_DIR", "EVALS_DIR", "ROLLOUTS_DIR"}
STEP_TABLE_DIRS = {"metrics.parquet", "evals.parquet", "rollouts.parquet"}
# Modules still handling parts themselves, each with why; an entry that no longer finds
# anything fails the test, so the list only shrinks.
KNOWN_EXCEPTIONS: set[str] = set()


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the docstring nodes of the module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0] if body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _text(node: ast.AST) -> str | None:
    """A string literal's text; an f-string's literal pieces joined (`part-{i:06d}.parquet` ->
    `part-.parquet`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value for v in node.values if isinstance(v, ast.Constant))
    return None


def _call_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)


def _names_step_table(node: ast.AST) -> bool:
    for sub in ast.walk(node):
        if isinstance(sub, ast.Attribute) and sub.attr in STEP_TABLE_ATTRS:
            return True
        if isinstance(sub, ast.Name) and sub.id in STEP_TABLE_NAMES:
            return True
        if any(d in (_text(sub) or "") for d in STEP_TABLE_DIRS):
            return True
    return False


def part_handling(source: str) -> list[str]:
    """What in `source` handles step-table parts directly, one line per finding."""
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        text = _text(node) if id(node) not in docstrings else None
        if text is not None and "part-" in text and ".parquet" in text:  # the part-file naming
            found.append(f"line {node.lineno}: part name {text!r}")
        if not isinstance(node, ast.Call):
            continue
        name = _call_name(node)
        args = [*node.args, *(k.value for k in node.keywords)]
        if name in GLOBS:
            patterns = [t for a in args if (t := _text(a)) is not None]
            if any("*" in p and p.endswith(".parquet") for p in patterns):
                found.append(f"line {node.lineno}: {name}({patterns})")
        if name in PARQUET_IO and any(_names_step_table(a) for a in args):
            found.append(f"line {node.lineno}: {name} on a step table")
    return found


def test_the_check_flags_part_handling_and_nothing_else() -> None:
    # what the moved code used to do, each flagged
    assert len(part_handling('pq.write_table(t, metrics / f"part-{i:06d}.parquet")')) == 1
    assert len(part_handling('parts = sorted(path.glob("*.parquet"))')) == 1
    assert len(part_handling(r'_PART = re.compile(r"^part-(\d+)\.parquet$")')) == 1
    assert len(part_handling("t = ds.dataset(str(TrialPaths(d).metrics)).to_table()")) == 1
    assert len(part_handling("pq.read_table(trial / METRICS_DIR)")) == 1
    assert len(part_handling("pq.read_table(TrialPaths(d).rollouts)")) == 1
    # other Parquet, and docs naming the layout, are not
    assert part_handling('frame.to_parquet(out / "summary.parquet")') == []
    assert part_handling("frame = pd.read_parquet(paths.prompts)") == []
    assert part_handling("pq.write_table(table, out_dir / SUMMARY_FILE)") == []
    assert part_handling('"""Reads `metrics.parquet/part-NNNNNN.parquet`."""') == []
    assert part_handling('def f():\n    """`evals.parquet/part-*.parquet`."""') == []
    assert part_handling('sorted(logs.glob("*.log"))') == []


def test_no_module_outside_contract_handles_step_table_parts() -> None:
    findings, scanned = {}, set()
    for package in SCANNED:
        for path in sorted((REPO / package).rglob("*.py")):
            scanned.add(str(path.relative_to(REPO)))
            found = part_handling(path.read_text())
            if found:
                findings[str(path.relative_to(REPO))] = found
    # the scan sees the former owners
    assert {"analysis/loading.py", "learner/runtime/metrics_log.py"} <= scanned
    unexpected = {m: f for m, f in findings.items() if m not in KNOWN_EXCEPTIONS}
    assert unexpected == {}, "read and write parts through contract.step_tables"
    fixed = KNOWN_EXCEPTIONS - set(findings)
    assert fixed == set(), "these modules no longer handle parts: drop them from KNOWN_EXCEPTIONS"
