"""Two rules of the layout, checked statically on the source so they cannot erode quietly:

- the staleness rule has one owner (`buffer/staleness.py`): no other module of the packages
  compares a staleness mode's name, except the two that sit where the rule cannot reach
  (`contract/regime.py`, below buffer, spells the rule's words; `analysis/synthetic.py`, which
  may not import buffer, simulates its drops);
- no module of the packages is longer than 400 lines (one job a module).
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("analysis", "buffer", "contract", "harness", "learner")
MODES = {"fixed", "bounded"}
STALENESS_OWNER = "buffer/staleness.py"
BELOW_OR_BESIDE_THE_OWNER = {"contract/regime.py", "analysis/synthetic.py"}
MAX_LINES = 400


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def mode_comparisons(tree: ast.AST) -> list[int]:
    """Lines that compare something to a staleness mode's name (`x == "fixed"`, `"bounded" !=
    y`, `x in ("fixed", ...)`): a branch on the mode."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            names = {
                elt.value
                for operand in operands
                for elt in (
                    operand.elts
                    if isinstance(operand, ast.Tuple | ast.List | ast.Set)
                    else [operand]
                )
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str)
            }
            if names & MODES:
                lines.append(node.lineno)
    return lines


def test_only_the_staleness_module_branches_on_the_mode() -> None:
    found = {}
    for path in _sources():
        where = str(path.relative_to(REPO))
        lines = mode_comparisons(ast.parse(path.read_text(), filename=where))
        if lines and where not in {STALENESS_OWNER, *BELOW_OR_BESIDE_THE_OWNER}:
            found[where] = lines
    assert found == {}, "compare the mode in buffer/staleness.py (StalenessPolicy) instead"


def test_the_check_sees_a_mode_branch() -> None:
    code = 'if spec.mode == "fixed":\n    pass\nok = mode in ("bounded", "x")\nno = m == "off"\n'
    assert mode_comparisons(ast.parse(code)) == [1, 3]


def test_no_module_is_longer_than_400_lines() -> None:
    long = {
        str(path.relative_to(REPO)): n
        for path in _sources()
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}, f"split these modules, one job each: {long}"
