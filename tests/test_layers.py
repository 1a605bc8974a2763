"""The package's dependencies point one way, modules stay small, private names stay home.

Layers, lowest first: families < graph < symbolic < estimators < blr < deep < engines
(and the user-facing modules at the top level). A module may import from its
own layer or a lower one, never a higher one, and never a ``_private`` name
of another package.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "blrppl"
LAYERS = ["families", "graph", "symbolic", "estimators", "blr", "deep", "engines"]
MAX_LINES = 600


def modules():
    return sorted(PACKAGE.rglob("*.py"))


def layer(path: pathlib.Path):
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 and parts[0] in LAYERS else None


def imports(path: pathlib.Path):
    """(line, imported module, imported names) of every absolute blrppl import, local ones included."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 and node.module.startswith("blrppl."):
            yield node.lineno, node.module, [a.name for a in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("blrppl."):
                    yield node.lineno, alias.name, []


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down_and_keep_private_names_home(path):
    own = layer(path)  # None for the user-facing top-level modules, which may import any layer
    parts = path.relative_to(PACKAGE).parts
    package = parts[0] if len(parts) > 1 else None
    for line, module, names in imports(path):
        target = module.split(".")[1]
        if own is not None and target in LAYERS:
            assert LAYERS.index(target) <= LAYERS.index(own), f"{path.name}:{line} imports {module} against the layer order"
        if target != package:
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            assert not private, f"{path.name}:{line} imports private names {private} from {module}"


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_modules_stay_small(path):
    assert path.read_text().count("\n") <= MAX_LINES, f"{path} has more than {MAX_LINES} lines; split it by idea"


def test_no_import_cycles_between_layers():
    edges = {name: set() for name in LAYERS}
    for path in modules():
        own = layer(path)
        for _, module, _ in imports(path):
            target = module.split(".")[1]
            if own and target in LAYERS and target != own:
                edges[own].add(target)

    def reaches(start, goal, seen=()):
        return any(t == goal or (t not in seen and reaches(t, goal, seen + (t,))) for t in edges[start])

    cycles = [name for name in LAYERS if reaches(name, name)]
    assert not cycles, f"layers in an import cycle: {cycles}"
