"""Dependencies point one way (design section 2): contract is the bottom of the graph, and
analysis depends on nothing of this repo but contract. Checked on the source, statically, so a
lazy import inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"analysis", "buffer", "contract", "harness", "learner"}


def repo_imports(package: str) -> dict[str, set[str]]:
    """{module file: top-level repo packages it imports}, for every module of `package`."""
    found: dict[str, set[str]] = {}
    for path in sorted((REPO / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        found[str(path.relative_to(REPO))] = names & PACKAGES
    return found


def test_contract_imports_only_itself() -> None:
    imports = repo_imports("contract")
    assert "contract/record.py" in imports  # the scan sees the package
    assert {
        module: pkgs - {"contract"} for module, pkgs in imports.items() if pkgs - {"contract"}
    } == {}


def test_analysis_depends_on_contract_alone() -> None:
    imports = repo_imports("analysis")
    assert "analysis/loading.py" in imports
    outside = {module: pkgs - {"analysis", "contract"} for module, pkgs in imports.items()}
    assert {module: pkgs for module, pkgs in outside.items() if pkgs} == {}
    assert "contract" in imports["analysis/loading.py"]
