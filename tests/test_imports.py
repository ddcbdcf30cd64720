"""The repository's modules import each other without a circle (a circle works only by import-order luck, and reads
as one concern split in two): every `import` and `from ... import`, those inside functions included."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("common", "tools")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """The repository modules a file imports (a `from package import module` counts as that module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in modules}


def test_no_circle_of_imports():
    files = [p for package in PACKAGES for p in (ROOT / package).rglob("*.py")]
    modules = {module_name(p): p for p in files}
    graph = {name: imports(path, set(modules)) - {name} for name, path in modules.items()}
    # a package's __init__ importing its own submodules (re-exports) is not a circle: drop package -> its children
    graph = {name: {m for m in deps if not m.startswith(name + ".")} for name, deps in graph.items()}
    state, circles = {}, []

    def visit(name, stack):
        state[name] = "open"
        for dep in sorted(graph[name]):
            if state.get(dep) == "open":
                circles.append(stack[stack.index(dep):] + [dep])
            elif dep not in state:
                visit(dep, stack + [dep])
        state[name] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert not circles, f"circles of imports: {circles}"
