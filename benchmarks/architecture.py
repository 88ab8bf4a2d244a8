"""Figures of the source tree's architecture: import cycles, imports that go up the layers, long files, and the size
of the algorithm contract. Run it on a checkout (``PYTHONPATH=. python benchmarks/architecture.py``), or on an older
checkout of rayfl to compare (the layer table below also knows the names of the layout before issue 28).

* cycles: strongly connected groups of modules in the import graph (grimp, which sees imports inside functions and
  under ``TYPE_CHECKING`` too), with the modules of each group;
* upward imports: an import from a module of a layer to a module of a higher one (ARCHITECTURE.md's order);
* files over 400 lines in ``rayfl/``;
* hooks in the core contract: the methods of ``Algorithm`` (and the hooks of the old base class) a method may
  override, i.e. every public method defined in its class body.
"""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import grimp

# Layers bottom (0) to top. Old names (before issue 28) map to the layer their contents belong to by ARCHITECTURE.md's
# reading of where they stood: ``algorithms`` was the method layer, the YAML loader and rules were the experiment's.
LAYERS: list[tuple[str, ...]] = [
    ("rayfl.core", "rayfl.rng", "rayfl.partials"),
    ("rayfl.config",),
    ("rayfl.models", "rayfl.traces"),
    ("rayfl.system", "rayfl.data"),
    ("rayfl.fl", "rayfl.algorithms"),
    ("rayfl.experiment", "rayfl.config_loader", "rayfl.config_rules", "rayfl.config_fedoras"),
    ("rayfl.engine",),
    ("rayfl.report",),
    ("rayfl.tune",),
    ("rayfl.cli",),
]


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[1]):
                best = (index, len(prefix))
    return None if best is None else best[0]


def cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    modules = sorted(m for m in graph.modules if m.startswith("rayfl"))
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        work = [(v, iter(sorted(graph.find_modules_directly_imported_by(v))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        while work:
            node, children = work[-1]
            advanced = False
            for w in children:
                if not w.startswith("rayfl"):
                    continue
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.find_modules_directly_imported_by(w)))))
                    advanced = True
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    group.append(w)
                    if w == node:
                        break
                if len(group) > 1:
                    out.append(sorted(group))

    for m in modules:
        if m not in index:
            visit(m)
    return out


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    found = []
    for importer in sorted(m for m in graph.modules if m.startswith("rayfl")):
        low = layer_of(importer)
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            high = layer_of(imported)
            if low is not None and high is not None and high > low:
                found.append(f"{importer} -> {imported}")
    return found


def contract_hooks(root: Path) -> list[str]:
    for candidate in (root / "rayfl/fl/api/algorithm.py", root / "rayfl/algorithms/base.py"):
        if candidate.exists():
            tree = ast.parse(candidate.read_text(encoding="utf-8"))
            for node in tree.body:
                if isinstance(node, ast.ClassDef) and node.name == "Algorithm":
                    return [
                        f.name
                        for f in node.body
                        if isinstance(f, ast.FunctionDef)
                        and not f.name.startswith("_")
                        and not any(isinstance(d, ast.Name) and d.id == "property" for d in f.decorator_list)
                    ]
    return []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path("."), help="the checkout (its rayfl/ is analysed)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    graph = grimp.build_graph("rayfl", include_external_packages=False, exclude_type_checking_imports=False)
    files = sorted((args.root / "rayfl").rglob("*.py"))
    long_files = {
        str(f.relative_to(args.root)): n
        for f in files
        if (n := len(f.read_text(encoding="utf-8").splitlines())) > 400
    }
    found = cycles(graph)
    up = upward_imports(graph)
    hooks = contract_hooks(args.root)
    figures = {
        "modules": len([m for m in graph.modules if m.startswith("rayfl")]),
        "files": len(files),
        "lines": sum(len(f.read_text(encoding="utf-8").splitlines()) for f in files),
        "cycles": found,
        "upward_imports": up,
        "files_over_400_lines": long_files,
        "contract_hooks": hooks,
    }
    print(f"modules {figures['modules']}, files {figures['files']}, lines {figures['lines']}")
    print(f"import cycles: {len(found)}")
    for group in found:
        print("  " + " <-> ".join(group))
    print(f"upward imports: {len(up)}")
    for line in up:
        print("  " + line)
    print(f"files over 400 lines: {len(long_files)}")
    for name, n in long_files.items():
        print(f"  {name}: {n}")
    print(f"hooks in the core contract (Algorithm): {len(hooks)}: {', '.join(hooks)}")
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
