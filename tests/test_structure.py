"""The code's shape the brief asks for: small modules, no import circle (imports inside functions
included; those only a type checker runs aside), and lower
layers that never import upper ones (mindp's protocol, codec and layout are the ground; the
harnesses and tools stand above every library package)."""
from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("mindp", "host_agent", "controller", "softswitch", "mininet_topos", "p4src", "bench", "tools", "tests")
MAX_LINES = 700
#: The ground: what every other part builds on, importing nothing of the project but itself.
GROUND = ("mindp.protocol", "mindp.codec", "mindp.layout", "mindp.fixedpoint", "mindp.layers",
          "mindp.switch_constants")
#: Harnesses and tools: no library module imports them.
ABOVE = ("mininet_topos", "bench", "tools", "tests", "mindp.harness")
LIBRARIES = ("mindp", "host_agent", "controller", "softswitch", "p4src")


def is_above(module: str) -> bool:
    return any(module == a or module.startswith(a + ".") for a in ABOVE)


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for pkg in PACKAGES:
        for path in (REPO / pkg).rglob("*.py"):
            parts = list(path.relative_to(REPO).with_suffix("").parts)
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _runtime_nodes(tree: ast.AST):
    """ast.walk, but not into `if TYPE_CHECKING:` blocks (annotations' imports, never run)."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def imports(name: str, top_level_only: bool) -> set[str]:
    """The project's modules `name` imports (at import time only, or anywhere it runs)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else _runtime_nodes(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            subs = {f"{base}.{a.name}" for a in node.names} & MODULES.keys()
            out.update(subs)
            if len(subs) < len(node.names):  # (a name of the package, not a module of it)
                out.add(base)
    return {m for m in out if m != name and m.split(".")[0] in PACKAGES}


def test_no_module_is_longer_than_the_brief_allows():
    long = {str(p.relative_to(REPO)): n for p in MODULES.values() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph (module -> the modules it imports), or None."""
    state: dict[str, int] = {}  # 1: on the path, 2: done

    def visit(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n] if n in path else [m, n]
            if n not in state and (found := visit(n, path + [n])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m, [m])):
            return found
    return None


def test_no_import_circle_even_through_imports_inside_functions():
    graph = {m: imports(m, top_level_only=False) & MODULES.keys() for m in MODULES}
    found = circle(graph)
    assert found is None, " -> ".join(found)


def test_the_circle_finder_names_a_circle_closed_inside_a_function(tmp_path):
    (tmp_path / "a.py").write_text("import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import a\n")
    graph = {}
    for name in "abc":
        tree = ast.parse((tmp_path / f"{name}.py").read_text())
        graph[name] = {a.name for n in _runtime_nodes(tree) if isinstance(n, ast.Import) for a in n.names}
    assert graph["c"] == set()
    assert circle(graph) in (["a", "b", "a"], ["b", "a", "b"])


def test_the_ground_imports_nothing_above_it():
    for m in GROUND:
        above = {n for n in imports(m, top_level_only=False) if n not in GROUND and n != "mindp"}
        assert not above, f"{m} imports {sorted(above)}"


def loaded_by_pytest(module: str) -> bool:
    return module.startswith("tests.") and module.rpartition(".")[2].startswith(("test_", "conftest"))


#: Collects test_node_core's and test_storage's tests again under its own fixture, on purpose.
RECOLLECTS = "tests.host_agent.test_pipeline"


def test_tests_share_helpers_through_harness_modules_never_through_test_modules():
    """A helper two test modules need lives in a module of its own (tests/*/helpers.py, harness.py,
    makerun.py ...): importing a test module runs its tests' definitions in the other, and pytest
    loads each conftest.py itself (its fixtures), not to be imported."""
    wrong = {m: sorted(filter(loaded_by_pytest, imports(m, top_level_only=False)))
             for m in MODULES if m.startswith("tests") and m != RECOLLECTS}
    assert not {m: n for m, n in wrong.items() if n}


def test_no_library_imports_a_harness_or_a_tool():
    for m in MODULES:
        if m.split(".")[0] in LIBRARIES and not is_above(m):
            harness = {n for n in imports(m, top_level_only=False) if is_above(n)}
            assert not harness, f"{m} imports {sorted(harness)}"
