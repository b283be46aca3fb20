"""ncclprobe's packages (its folders: witnesses, model, diagnose, commands, bench, demo, ...) import one
another in one direction only. The import graph is read from the source with ast, lazy imports inside
functions included (an import that runs later is still a dependency) and `if TYPE_CHECKING:` blocks left
out (they never run); no cycle of package-to-package imports may exist (bench/torchnccl <-> demo/ops was
one: the C API pieces both need live in ncclprobe/ncclapi.py). The top-level modules (doc, render, topo,
cli, ...) are the shared layer around the packages and are not followed. And every module imports on
its own, in a fresh interpreter."""
from __future__ import annotations

import ast
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import ncclprobe

ROOT = Path(ncclprobe.__file__).resolve().parent  # the installed package, as the other tests use it


def modules(root: Path) -> dict[str, Path]:
    """Dotted name -> file of every Python module of the package at root."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return getattr(t, "id", None) == "TYPE_CHECKING" or getattr(t, "attr", None) == "TYPE_CHECKING"


def _import_nodes(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    out, stack = [], [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                stack.extend(child.orelse)  # only the else branch ever runs
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append(child)
            else:
                stack.append(child)
    return out


def imports(name: str, path: Path, mods: dict[str, Path], top: str) -> set[str]:
    """The package's modules that module `name` imports (a `from X import Y` of a submodule Y is Y)."""
    out = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        else:
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
                pkg = pkg[:len(pkg) - node.level + 1]
                base = ".".join(pkg + ([node.module] if node.module else []))
            targets = [(base, a.name) for a in node.names]
        for base, item in targets:
            if base != top and not base.startswith(top + "."):
                continue
            target = f"{base}.{item}" if item and f"{base}.{item}" in mods else base
            while target not in mods and "." in target:  # `import a.b.c` of a name inside a module
                target = target.rsplit(".", 1)[0]
            out.add(target)
    return out


def unit(module: str, mods: dict[str, Path], top: str) -> str:
    """The node a module belongs to: its package ("bench/"), or itself for a top-level module."""
    parts = module.split(".")
    if len(parts) == 1:
        return top
    sub = f"{top}.{parts[1]}"
    return f"{parts[1]}/" if mods[sub].name == "__init__.py" else parts[1]


def graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """unit -> unit -> the module imports that make that edge."""
    mods, top = modules(root), root.name
    out: dict[str, dict[str, list[str]]] = {}
    for name, path in mods.items():
        src = unit(name, mods, top)
        for target in imports(name, path, mods, top):
            dst = unit(target, mods, top)
            if dst != src:
                out.setdefault(src, {}).setdefault(dst, []).append(f"{name} -> {target}")
    return out


def packages_only(g: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
    """The imports of one package by another (units named "name/")."""
    return {a: {b: e for b, e in ds.items() if b.endswith("/")} for a, ds in g.items() if a.endswith("/")}


def cycles(g: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected sets of two or more units."""
    nodes = sorted(set(g) | {d for ds in g.values() for d in ds})
    reach = {n: set(g.get(n, ())) for n in nodes}
    changed = True
    while changed:  # a few dozen units: the transitive closure is cheap
        changed = False
        for n in nodes:
            more = set().union(*(reach[m] for m in reach[n])) - reach[n]
            if more:
                reach[n] |= more
                changed = True
    seen, out = set(), []
    for n in nodes:
        if n in seen:
            continue
        comp = sorted({n} | {m for m in reach[n] if n in reach[m]})
        seen.update(comp)
        if len(comp) > 1:
            out.append(comp)
    return out


def _why(g, comp) -> list[str]:
    return [e for a in comp for b in comp for e in g.get(a, {}).get(b, [])]


def test_no_import_cycle_between_packages():
    g = packages_only(graph(ROOT))
    assert {"bench/", "demo/", "commands/", "witnesses/"} <= set(g)  # the graph was read
    bad = cycles(g)
    assert not bad, "\n".join(f"{comp}: " + "; ".join(_why(g, comp)) for comp in bad)


def test_bench_never_imports_demo_and_ncclapi_imports_neither():
    g = graph(ROOT)
    assert "demo/" not in g["bench/"], g["bench/"]["demo/"]
    assert not {"bench/", "demo/"} & set(g.get("ncclapi", {})), g.get("ncclapi")
    assert "bench/" in g["demo/"]  # demo may use bench (TorchOps, lazily): one direction only


def test_the_checker_finds_a_lazy_circle(tmp_path):
    """The shape that was here: a top-level import one way, a lazy one (inside a function) back."""
    pkg = tmp_path / "pkg"
    for folder, text in (("bench", "from pkg.demo.ops import UID\n"),
                         ("demo", "UID = 1\ndef load():\n    from pkg.bench.torchnccl import TorchOps\n")):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / ("torchnccl.py" if folder == "bench" else "ops.py")).write_text(text)
    (pkg / "__init__.py").write_text("")
    (pkg / "api.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.bench import x\n")
    (pkg / "model").mkdir()
    (pkg / "model" / "__init__.py").write_text("from . import rules\nfrom pkg import api\n")
    (pkg / "model" / "rules.py").write_text("from ..api import *\n")
    g = graph(pkg)
    assert cycles(packages_only(g)) == [["bench/", "demo/"]]
    assert "bench/" not in g.get("api", {})  # a TYPE_CHECKING import never runs
    assert sorted(g["model/"]["api"]) == ["pkg.model -> pkg.api", "pkg.model.rules -> pkg.api"]  # relative ones
    (pkg / "demo" / "ops.py").write_text("UID = 1\n")
    assert cycles(packages_only(graph(pkg))) == []


def _import_alone(module: str) -> tuple[str, int, str]:
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    return module, r.returncode, r.stderr[-2000:]


def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = [n for n in modules(ROOT) if not n.endswith("__main__")]  # __main__ runs the command line
    assert len(names) > 40 and "ncclprobe.ncclapi" in names
    with ThreadPoolExecutor(2) as pool:  # two cores
        failed = [(m, err) for m, rc, err in pool.map(_import_alone, names) if rc != 0]
    assert not failed, failed
