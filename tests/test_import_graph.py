"""The import graph of elmo_jax: no circle between modules, and the layers import downwards only,
directly or through other modules (loading a model for embedding imports no training code).

Every `import` counts, also those inside functions (a lazy import hides a circle, it does not
remove it) and under TYPE_CHECKING. `python tests/test_import_graph.py` prints which package (or
top-level module) imports which.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "elmo_jax"

# A package may not reach these, directly or not: the model, the text pipeline and the weight
# files know nothing of training, of the run folder or of the command line; reading a run folder,
# its checkpoints or a model, and embedding, know nothing of training.
FORBIDDEN = {
    "elmo_jax.model": ("elmo_jax.train", "elmo_jax.text", "elmo_jax.interop", "elmo_jax.workdir", "elmo_jax.model_io"),
    "elmo_jax.text": ("elmo_jax.train", "elmo_jax.model", "elmo_jax.interop", "elmo_jax.workdir", "elmo_jax.model_io"),
    "elmo_jax.interop": ("elmo_jax.train", "elmo_jax.text", "elmo_jax.workdir", "elmo_jax.model_io"),
    "elmo_jax.workdir": ("elmo_jax.train", "elmo_jax.model_io", "elmo_jax.cli", "elmo_jax.commands"),
    "elmo_jax.checkpoint": ("elmo_jax.train", "elmo_jax.workdir", "elmo_jax.cli", "elmo_jax.commands"),
    "elmo_jax.model_io": ("elmo_jax.train", "elmo_jax.cli", "elmo_jax.commands"),
    "elmo_jax.embed": ("elmo_jax.train", "elmo_jax.cli", "elmo_jax.commands"),
    "elmo_jax.elmo": ("elmo_jax.train", "elmo_jax.cli", "elmo_jax.commands"),
    "elmo_jax.train": ("elmo_jax.cli", "elmo_jax.commands"),  # the trainer knows nothing of the command line
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The elmo_jax modules a file imports (`from elmo_jax.x import y` counts as elmo_jax.x.y
    when that is a module, else elmo_jax.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                     for alias in node.names]  # fmt: skip
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) - {module_name(p)} for p in paths}


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt]
            if nxt not in state and (circle := visit(nxt)):
                return circle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (circle := visit(node)):
            return circle
    return None


def package_of(module: str) -> str:
    """elmo_jax.train.loop -> elmo_jax.train; top-level modules stand for themselves."""
    return ".".join(module.split(".")[:2])


def package_imports(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for module, imported in graph.items():
        out.setdefault(package_of(module), set()).update(package_of(m) for m in imported)
    return {p: deps - {p} for p, deps in out.items()}


def reached(graph: dict[str, set[str]], start: str) -> dict[str, list[str]]:
    """Every module `start` imports directly or through others, with one chain to it."""
    chains, todo = {start: [start]}, [start]
    while todo:
        module = todo.pop()
        for nxt in sorted(graph[module]):
            if nxt not in chains:
                chains[nxt] = chains[module] + [nxt]
                todo.append(nxt)
    return {m: chain for m, chain in chains.items() if m != start}


def forbidden_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module in sorted(graph):
        for owner, banned in FORBIDDEN.items():
            if module == owner or module.startswith(owner + "."):
                bad += [
                    " -> ".join(chain)
                    for m, chain in sorted(reached(graph, module).items())
                    if any(m == b or m.startswith(b + ".") for b in banned)
                ]
    return bad


def test_no_import_circle():
    assert find_circle(import_graph()) is None, " -> ".join(find_circle(import_graph()))


def test_layers_import_downwards_only():
    assert forbidden_imports(import_graph()) == []


def test_the_checks_see_a_circle_and_a_forbidden_import():
    graph = import_graph()
    graph["elmo_jax.model.bilm"] = graph["elmo_jax.model.bilm"] | {"elmo_jax.train.step"}
    assert find_circle(graph) is not None  # train.step imports model.bilm
    assert "elmo_jax.model.bilm -> elmo_jax.train.step" in forbidden_imports(graph)


def test_the_check_follows_chains_through_other_modules():
    """outputs.py may import anything the checks allow it, but model_io imports outputs: a chain
    model_io -> outputs -> train.loop brings training code into loading a model."""
    graph = import_graph()
    assert "elmo_jax.outputs" in graph["elmo_jax.model_io"]
    graph["elmo_jax.outputs"] = graph["elmo_jax.outputs"] | {"elmo_jax.train.loop"}
    assert "elmo_jax.model_io -> elmo_jax.outputs -> elmo_jax.train.loop" in forbidden_imports(graph)


def test_lazy_imports_count(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from elmo_jax.train import loop\n")
    assert imports_of(source, {"elmo_jax.train", "elmo_jax.train.loop"}) == {"elmo_jax.train.loop"}


if __name__ == "__main__":
    graph = import_graph()
    for package, imported in sorted(package_imports(graph).items()):
        print(f"{package:24} imports {', '.join(sorted(imported)) or 'nothing of elmo_jax'}")
    circle, bad = find_circle(graph), forbidden_imports(graph)
    print("import circle: " + (" -> ".join(circle) if circle else "none"))
    print("forbidden imports: " + ("; ".join(bad) if bad else "none"))
    sys.exit(1 if circle or bad else 0)
