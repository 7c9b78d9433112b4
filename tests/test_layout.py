"""The package's shape: no module imports in a circle, files stay a size one can hold in one's head,
and the layout tables of docs/ARCHITECTURE.md name what is in the tree; README stays a front door
whose test commands are the ones CI runs. The layers themselves are pyproject.toml's
import-linter contract, which CI runs (`lint-imports`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 450


def import_cycles(graph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(root: str) -> None:
        # Iterative, so a long chain of imports cannot reach the recursion limit.
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.find_modules_directly_imported_by(target)))))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == module:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return cycles


def test_no_module_imports_in_a_circle():
    import grimp  # imported here: the GPU machine's runs collect this file without it

    graph = grimp.build_graph("arcpy", cache_dir=None)
    assert len(graph.modules) > 30  # the whole package was read
    assert import_cycles(graph) == []


def test_the_cycle_finder_finds_a_circle():
    import grimp

    graph = grimp.build_graph("arcpy", cache_dir=None)
    graph.add_import(importer="arcpy.errors", imported="arcpy.loop.engine")  # engine reaches errors
    cycles = import_cycles(graph)
    assert cycles and "arcpy.errors" in cycles[0] and "arcpy.loop.engine" in cycles[0]


def test_files_stay_small():
    sources = [p for p in (ROOT / "arcpy").rglob("*.py")] + [p for p in (ROOT / "libarc").rglob("*") if p.is_file()]
    assert sources
    long = {str(p.relative_to(ROOT)): n for p in sources if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def layout_rows() -> list[tuple[list[str], str]]:
    """The layout tables of docs/ARCHITECTURE.md (its last section): (the paths a row names, the row)."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    table = text[text.index("## 5. Layout"):]
    rows = []
    for line in table.splitlines():
        if line.startswith("| `"):
            cell = line.split("|")[1]
            rows.append((re.findall(r"`([^`]+)`", cell), line))
    return rows


def test_the_layout_names_every_module_and_nothing_else():
    named: set[str] = set()
    for paths, row in layout_rows():
        folder = ""
        for p in paths:
            # A row names its first path whole; later names in it are relative to that one's folder.
            full = p if "/" in p or not folder else folder + p
            folder = full[:full.rindex("/") + 1] if "/" in full else folder
            for hit in sorted(ROOT.glob(full.rstrip("/"))) or [None]:
                assert hit is not None, f"the layout names {full!r}, which is not in the tree ({row})"
                named.add(str(hit.relative_to(ROOT)))
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "arcpy").rglob("*.py")}
    covered = {m for m in modules if m in named or any(m.startswith(n.rstrip("/") + "/") for n in named)}
    assert modules - covered == set(), "modules the layout tables do not name"


def test_readme_stays_short_and_its_test_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    block = readme[readme.index("## Test"):].split("```")[1]
    commands = [line for line in block.splitlines() if line.strip()]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert commands and all(c.startswith("python ") for c in commands)
    assert [c for c in commands if '"$venv/bin/python"' + c[len("python"):] not in ci] == []


def device_probes(source: str) -> list[str]:
    """The getattr and hasattr calls in `source` whose object is a device (a name or attribute
    spelled device, dev, or ending in _device)."""
    import ast

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            target = ast.unparse(node.args[0]) if node.args else ""
            last = target.rsplit(".", 1)[-1]
            if last in ("device", "dev") or last.endswith("_device"):
                found.append(ast.unparse(node))
    return found


def test_front_ends_learn_what_a_device_can_do_only_from_its_capabilities():
    """No getattr or hasattr on a device outside arcpy/devices/: the Capabilities record on
    DeviceOps is the contract."""
    assert device_probes("k = getattr(engine.device, 'speculate_k', 0)\nhasattr(dev, 'x')") == [
        "getattr(engine.device, 'speculate_k', 0)", "hasattr(dev, 'x')"]
    probes = {str(p.relative_to(ROOT)): found for p in sorted((ROOT / "arcpy").rglob("*.py"))
              if "devices" not in p.relative_to(ROOT).parts and (found := device_probes(p.read_text()))}
    assert probes == {}


def named_paths(text: str) -> set[str]:
    """The paths a document names in code spans: those that start at a top-level entry of the
    tree (arcpy/..., libarc/..., docs/...; globs too), and dotted module names of the package
    (arcpy.text.sandbox)."""
    tops = {p.name for p in ROOT.iterdir() if not p.name.startswith(".git")}
    found = set()
    for token in re.findall(r"`([^`\s]+)`", text):
        token = token.rstrip(".,:;").split("::")[0]
        if "/" in token and token.split("/")[0] in tops:
            found.add(token)
        elif re.fullmatch(r"arcpy(\.[a-z_][a-z0-9_]*)+", token):
            found.add(token)
    return found


def path_exists(name: str) -> bool:
    import importlib.util

    if "/" not in name:  # a module, or a name in one
        import importlib

        parts = name.split(".")
        for n in range(len(parts), 0, -1):
            try:
                spec = importlib.util.find_spec(".".join(parts[:n]))
            except ModuleNotFoundError:  # a name inside a module that is not a package
                spec = None
            if spec is not None:
                obj = importlib.import_module(".".join(parts[:n]))
                return all((obj := getattr(obj, attr, None)) is not None for attr in parts[n:])
        return False
    return bool(list(ROOT.glob(name.rstrip("/")))) if "*" in name else (ROOT / name).exists()


def test_every_path_readme_and_docs_name_exists():
    assert named_paths("see `arcpy/loop/burst.py`, `libarc/model/*.cu`, `arcpy.text.sandbox`, `1/true/on`") == {
        "arcpy/loop/burst.py", "libarc/model/*.cu", "arcpy.text.sandbox"}
    assert not path_exists("arcpy/burst.py") and not path_exists("arcpy.kernel_bench")
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "tests").rglob("README.md"))]
    missing = {str(d.relative_to(ROOT)): sorted(n for n in named_paths(d.read_text()) if not path_exists(n))
               for d in docs}
    assert {d: names for d, names in missing.items() if names} == {}
