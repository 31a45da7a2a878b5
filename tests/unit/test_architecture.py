"""The layout's rules, checked from the source (no model runs).

- No import cycle between the library's modules (imports inside functions count: a cycle hidden in a
  function is still a cycle in the design).
- The command line sits on top: no library module imports `specwire.cli`.
- Id-convention arithmetic (SGLang's "output of layer k" = hs index k + 1, its -1 for the embeddings)
  happens only in `specwire/wiring.py`: elsewhere, no `+ 1` / `- 1` is applied to a hidden-state id.
- Every module opens with a docstring, and none grows past the line budget without saying why.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src" / "specwire"
MAX_LINES = 700


def module_name(path: Path) -> str:
    rel = path.relative_to(SRC.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def library_files() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(SRC.rglob("*.py"))}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The specwire modules that module `name` imports (a `from pkg import mod` names the module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                found.add(t)
    return found


def import_graph() -> dict[str, set[str]]:
    files = library_files()
    known = set(files)
    graph = {n: imports_of(n, p, known) for n, p in files.items()}
    # a package's __init__ is imported on the way to any of its modules: that is not a design edge
    for n, deps in graph.items():
        graph[n] = {d for d in deps if not (files[d].name == "__init__.py" and not n.startswith(d + ".")
                                            and _is_face(files[d]))}
    return graph


def _is_face(path: Path) -> bool:
    """An __init__ that only hands names on (or is empty)."""
    tree = ast.parse(path.read_text())
    return all(isinstance(n, (ast.Import, ast.ImportFrom, ast.Expr, ast.Assign, ast.FunctionDef)) for n in tree.body)


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None."""
    WHITE, GREY, BLACK = 0, 1, 2
    color = {n: WHITE for n in graph}
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        color[n] = GREY
        stack.append(n)
        for m in sorted(graph[n]):
            if color.get(m) == GREY:
                return stack[stack.index(m):] + [m]
            if color.get(m) == WHITE and (c := visit(m)):
                return c
        stack.pop()
        color[n] = BLACK
        return None

    for n in sorted(graph):
        if color[n] == WHITE and (c := visit(n)):
            return c
    return None


def test_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_library_never_imports_the_cli():
    graph = import_graph()
    offenders = sorted(f"{n} imports {d}" for n, deps in graph.items() if not n.startswith("specwire.cli")
                       and n != "specwire.__main__" for d in deps if d == "specwire.cli" or d.startswith("specwire.cli."))
    assert not offenders, offenders


# Names that hold hidden-state / layer ids; a +1 or -1 applied to one of them is a convention change.
_ID_NAME = re.compile(r"(?:^|_)(?:hs|ids?|layer_ids?|layers?|aux|sglang|specforge)(?:_|$)")


def _names(node: ast.AST) -> set[str]:
    out = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def id_arithmetic(text: str) -> list[tuple[int, str]]:
    """(line, code) of each `x + 1` / `x - 1` / `1 + x` where x is, or is drawn from, an id-like name.

    A comprehension or for-loop variable drawn from an id-like iterable counts as id-like
    (`[i + 1 for i in hs_ids]`). Strings and comments are not code, so prose may say "hs = id + 1".
    """
    tree = ast.parse(text)
    lines = text.splitlines()
    hits: set[tuple[int, str]] = set()

    def scan(root: ast.AST, id_like) -> None:
        for node in ast.walk(root):
            if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
                for one, other in ((node.right, node.left), (node.left, node.right)):
                    if isinstance(one, ast.Constant) and type(one.value) is int and one.value == 1 and id_like(other):
                        hits.add((node.lineno, lines[node.lineno - 1].strip()))

    scan(tree, lambda e: any(_ID_NAME.search(n) for n in _names(e)))
    for node in ast.walk(tree):  # variables drawn from id-like iterables, within their own loop
        gens = node.generators if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) else []
        pairs = [(g.target, g.iter) for g in gens]
        if isinstance(node, (ast.For, ast.AsyncFor)):
            pairs.append((node.target, node.iter))
        drawn = set().union(*[_names(t) for t, it in pairs if any(_ID_NAME.search(n) for n in _names(it))])
        if drawn:
            scan(node, lambda e: bool(_names(e) & drawn))
    return sorted(hits)


def test_id_arithmetic_detector_catches_the_usual_forms():
    bad = ["x = [i + 1 for i in hs_ids]", "x = [hs - 1 for hs in wiring.hs_ids]", "layer_id = hs_ids[0] - 1",
           "x = [aux_id + 1 for aux_id in cfg]", "y = 1 + sglang_ids[0]",
           "for k in eagle_aux_hidden_state_layer_ids:\n    out.append(k + 1)"]
    for code in bad:
        assert id_arithmetic(code), code
    assert not id_arithmetic("n_new = max_new_tokens - 1")
    assert not id_arithmetic("x = steps + 1  # depth plus the bonus token")
    assert not id_arithmetic('msg = "SpecForge convention, hs = id + 1"')


def test_id_convention_arithmetic_lives_only_in_wiring():
    offenders = []
    for name, path in library_files().items():
        if name == "specwire.wiring":
            continue
        offenders += [f"{path.relative_to(SRC.parent)}:{n}: {line}" for n, line in id_arithmetic(path.read_text())]
    assert not offenders, "id arithmetic outside wiring.py (use its named conversions):\n" + "\n".join(offenders)


@pytest.mark.parametrize("name", sorted(library_files()))
def test_module_has_a_scope_docstring_and_fits_the_budget(name):
    path = library_files()[name]
    text = path.read_text()
    tree = ast.parse(text)
    doc = ast.get_docstring(tree)
    if path.name == "__init__.py" and not text.strip():
        return
    assert doc, f"{path}: a module opens with a docstring saying what it owns"
    lines = len(text.splitlines())
    if lines > MAX_LINES:
        assert "why this module is long" in doc.lower(), \
            f"{path}: {lines} lines; split it, or say in its docstring 'Why this module is long: ...'"
