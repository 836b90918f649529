"""Dependencies point one way (design section 2): contract is the bottom of the graph, and
analysis depends on nothing of this repo but contract; inside each package no modules import each
other in a cycle. Checked on the source, statically, so a lazy import inside a function counts
too; an import under `if TYPE_CHECKING:` counts in the cycle check (a type-only circle still ties
two modules' definitions together) and nowhere else (it never runs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

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


def _is_type_checking_guard(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_names(
    tree: ast.AST, module: str, is_package: bool, *, typing: bool = False
) -> set[str]:
    """Dotted names a module imports, anywhere in it (function bodies too); under
    `if TYPE_CHECKING:` only with `typing`. `from a.b import c` yields both `a.b` and `a.b.c`
    (c may be a module)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if not typing and isinstance(node, ast.If) and _is_type_checking_guard(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def module_graph(root: Path, package: str) -> dict[str, set[str]]:
    """{module: modules of the same package it imports}, from the source under `root`."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        files[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    graph = {}
    for module, (path, is_package) in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        imported = _imported_names(tree, module, is_package, typing=True)
        graph[module] = {name for name in imported if name in files and name != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle_inside_a_package(package: str) -> None:
    graph = module_graph(REPO, package)
    assert len(graph) > 3  # the scan sees the package
    assert import_cycles(graph) == []


def test_cycle_check_counts_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import thing\n")
    (pkg / "b.py").write_text("def thing():\n    from pkg import c\n    return c\n")
    (pkg / "c.py").write_text("from . import a\n")  # relative, back to a: a -> b -> c -> a
    (pkg / "d.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.e import x\n"
    )
    (pkg / "e.py").write_text("from pkg.d import TYPE_CHECKING\n")  # d -> e only when typing
    assert sorted(import_cycles(module_graph(tmp_path, "pkg"))) == [
        ["pkg.a", "pkg.b", "pkg.c"],
        ["pkg.d", "pkg.e"],
    ]


def _imports_of(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return _imported_names(tree, "x", is_package=False)


def test_learner_math_imports_neither_config_nor_runtime() -> None:
    """`learner.algorithms` is pure tensor math: no pydantic config, no runtime; the names it
    shares with them come from the leaf `learner.vocabulary`, which imports nothing of the repo."""
    forbidden = ("learner.config", "learner.runtime", "pydantic", "buffer", "harness")
    offenders = {}
    for path in sorted((REPO / "learner" / "algorithms").rglob("*.py")):
        bad = {name for name in _imports_of(path) if name.startswith(forbidden)}
        if bad:
            offenders[str(path.relative_to(REPO))] = bad
    assert offenders == {}
    vocabulary = _imports_of(REPO / "learner" / "vocabulary.py")
    assert {name for name in vocabulary if name.split(".")[0] in PACKAGES} == set()


def test_generators_reach_the_learner_through_its_public_surface() -> None:
    """`harness.generators` score tokens and record MoE routing with the learner's own code, and
    reach it through `learner.scoring` alone: no `learner.runtime` module (internals that may
    move, as the MoE modules did into `learner.runtime.moe`) is imported by a generator."""
    reached: set[str] = set()
    offenders = {}
    for path in sorted((REPO / "harness" / "generators").rglob("*.py")):
        names = _imports_of(path)
        reached |= names
        bad = {name for name in names if name.startswith("learner.runtime")}
        if bad:
            offenders[str(path.relative_to(REPO))] = bad
    assert "learner.scoring" in reached  # the scan sees the generators' learner imports
    assert offenders == {}


# harness's rooms, top to bottom. A module imports its own room and rooms of later layers only,
# never a room of its own layer or above: the experiment plans trials and the executors start
# them, both over `launch` (what a trial is to a launcher, the subprocess pool, child
# processes), so no arrow points from executors back up to experiment or trial. A room is a
# subpackage, or a top-level module (`config*.py` together are `config`, `cli*.py` are `cli`).
HARNESS_LAYERS = [
    ("cli",),
    ("experiment", "trial"),
    ("evaluation", "planning"),
    ("executors", "generators"),
    ("storage", "models"),
    ("launch", "tasks"),
    ("config", "file_lock", "provenance", "signals"),
    ("overrides", "seeds", "cpu_lists", "staleness_regimes", "lockfile"),
]


def harness_room(module: str) -> str:
    """`harness.executors.ray` -> `executors`; `harness.config.tuning` -> `config`."""
    parts = module.split(".")
    if len(parts) == 1:
        return "harness"
    return next((room for room in ("config", "cli") if parts[1].startswith(room)), parts[1])


def upward_imports(graph: dict[str, set[str]], layers: list[tuple[str, ...]]) -> list[str]:
    """`a -> b` for every import of a module in a room not below the importer's."""
    depth = {room: i for i, layer in enumerate(layers) for room in layer}
    bad = []
    for module, targets in sorted(graph.items()):
        source = harness_room(module)
        for target in sorted(targets):
            room = harness_room(target)
            if room not in {source, "harness"} and depth[room] <= depth[source]:
                bad.append(f"{module} -> {target}")
    return bad


def test_harness_rooms_point_down() -> None:
    graph = module_graph(REPO, "harness")
    assert {"harness.launch.trials", "harness.executors.base"} <= set(graph)
    rooms = {harness_room(m) for m in graph} - {"harness"}
    placed = {room for layer in HARNESS_LAYERS for room in layer}
    assert rooms == placed  # a new room is placed in HARNESS_LAYERS
    assert upward_imports(graph, HARNESS_LAYERS) == []


def test_an_upward_import_is_named() -> None:
    graph = {"harness.executors.base": {"harness.experiment.grid", "harness.launch.trials"}}
    layers = [("experiment",), ("executors",), ("launch",)]
    assert upward_imports(graph, layers) == ["harness.executors.base -> harness.experiment.grid"]
