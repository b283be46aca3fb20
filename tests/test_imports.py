"""ncclprobe's import graph, read from the installed source with ast: lazy imports inside functions count
(an import that runs later is still a dependency), so do `importlib.import_module("x")` and
`__import__("x")` of a literal name; `if TYPE_CHECKING:` blocks do not (they never run).

- Seams (STYLE.md): click is imported by cli.py alone, rich by render.py, NVML (pynvml, from
  nvidia-ml-py) by topo.py, torch by bench/ (`demo --real` reaches torch through bench.torchnccl).
- No import cycle between units. A unit is a package (witnesses/, model/, diagnose/, commands/, bench/,
  demo/, ...) or a top-level module (doc, render, topo, cli, toplevel, about, ...): the rule is
  package-level, and top-level modules count as packages of one. Inside a package, modules form no cycle
  either, except that a package's __init__ may import its own submodules (it is the package's face, and
  its submodules take shared names from it: model/__init__ <-> model/timing).
- Dependencies: each runtime requirement of the installed metadata is imported by some module, and
  each module from outside the standard library that is imported is a requirement (runtime or extra).
- Every module imports on its own, in a fresh interpreter."""
from __future__ import annotations

import ast
import functools
import importlib.metadata
import re
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


def _running_nodes(path: Path) -> tuple[ast.AST, ...]:
    """Every node of a module that can run: all but the bodies of `if TYPE_CHECKING:`."""
    return _running_in(path.read_text(), str(path))


@functools.cache  # each test reads the same files: parse each text once
def _running_in(text: str, filename: str) -> tuple[ast.AST, ...]:
    out, stack = [], [ast.parse(text, filename)]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            kids = child.orelse if isinstance(child, ast.If) and _type_checking(child) else [child]
            out += kids  # of `if TYPE_CHECKING:`, only the else branch ever runs
            stack += kids
    return tuple(out)


def _named_import(node: ast.AST) -> str:
    """The module an `importlib.import_module("x")` or `__import__("x")` call names literally ("" if none)."""
    if not isinstance(node, ast.Call) or not node.args:
        return ""
    func, arg = node.func, node.args[0]
    if (getattr(func, "id", None) or getattr(func, "attr", None)) not in ("import_module", "__import__"):
        return ""
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else ""


def outside(path: Path, top: str) -> set[str]:
    """The top-level names of the modules from outside the package that a module imports."""
    out = set()
    for node in _running_nodes(path):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""] if not node.level else []
        else:
            names = [_named_import(node)]
        out |= {n.split(".")[0] for n in names}
    return out - {top, ""}


def imports(name: str, path: Path, mods: dict[str, Path], top: str) -> set[str]:
    """The package's modules that module `name` imports (a `from X import Y` of a submodule Y is Y)."""
    out = set()
    for node in _running_nodes(path):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif not isinstance(node, ast.ImportFrom):
            targets = [(_named_import(node), None)]
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


def module_graph(root: Path) -> dict[str, dict[str, list[str]]]:
    """module -> module -> the import that makes that edge, less a package's __init__ importing its own
    submodules (the one module cycle allowed: see the docstring above)."""
    mods, top = modules(root), root.name
    out: dict[str, dict[str, list[str]]] = {}
    for name, path in mods.items():
        own = path.name == "__init__.py"
        for target in imports(name, path, mods, top):
            if target != name and not (own and target.startswith(name + ".")):
                out.setdefault(name, {})[target] = [f"{name} -> {target}"]
    return out


# outside module -> the one unit that may import it (STYLE.md: the click/rich/NVML/torch seams)
SEAMS = {"click": "cli", "rich": "render", "pynvml": "topo", "torch": "bench/"}


def seam_users(root: Path) -> dict[str, dict[str, list[str]]]:
    """seam module -> unit -> the modules of that unit that import it."""
    mods, top = modules(root), root.name
    out: dict[str, dict[str, list[str]]] = {}
    for name, path in mods.items():
        for ext in outside(path, top) & set(SEAMS):
            out.setdefault(ext, {}).setdefault(unit(name, mods, top), []).append(name)
    return out


def seam_breaches(root: Path) -> list[str]:
    return sorted(f"{m} imports {ext} (only {SEAMS[ext]} may)" for ext, units in seam_users(root).items()
                  for u, names in units.items() if u != SEAMS[ext] for m in names)


def _cycles_text(g, bad) -> str:
    return "\n".join(f"{comp}: " + "; ".join(_why(g, comp)) for comp in bad)


def test_no_import_cycle_between_units():
    g = graph(ROOT)
    assert {"bench/", "demo/", "commands/", "witnesses/", "doc", "cli", "toplevel"} <= set(g)  # the graph was read
    bad = cycles(g)
    assert not bad, _cycles_text(g, bad)


def test_no_import_cycle_between_modules():
    g = module_graph(ROOT)
    assert "ncclprobe.model" in g["ncclprobe.model.timing"]  # the graph was read (the way back is the face's)
    bad = cycles(g)
    assert not bad, _cycles_text(g, bad)


def test_the_core_draws_nothing():
    """model/ and diagnose/ return data; what to show (doc.py's nodes, its Result) is the commands' to build."""
    g = graph(ROOT)
    assert "doc" not in g.get("model/", {}) and "doc" not in g.get("diagnose/", {}), \
        [*g.get("model/", {}).get("doc", []), *g.get("diagnose/", {}).get("doc", [])]


def test_bench_never_imports_demo_and_ncclapi_imports_neither():
    g = graph(ROOT)
    assert "demo/" not in g["bench/"], g["bench/"]["demo/"]
    assert not {"bench/", "demo/"} & set(g.get("ncclapi", {})), g.get("ncclapi")
    assert "bench/" in g["demo/"]  # demo may use bench (TorchOps, lazily): one direction only


def test_click_rich_nvml_and_torch_each_imported_behind_its_one_seam():
    assert not seam_breaches(ROOT), seam_breaches(ROOT)
    users = seam_users(ROOT)
    assert {ext: set(units) for ext, units in users.items()} == {ext: {u} for ext, u in SEAMS.items()}, users
    assert "ncclprobe.bench.torchnccl" in users["torch"]["bench/"]  # what `demo --real` runs on


def test_the_checker_finds_a_lazy_circle(tmp_path):
    """The shape that was here: a top-level import one way, a lazy one (inside a function) back; between
    packages, between top-level modules (cli <-> toplevel) and between a package's modules."""
    pkg = tmp_path / "pkg"
    for folder, text in (("bench", "from pkg.demo.ops import UID\n"),
                         ("demo", "UID = 1\ndef load():\n    from pkg.bench.torchnccl import TorchOps\n")):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
        (pkg / folder / ("torchnccl.py" if folder == "bench" else "ops.py")).write_text(text)
    (pkg / "__init__.py").write_text("")
    (pkg / "api.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.bench import x\n"
                                "else:\n    import pkg.cli\n")
    (pkg / "cli.py").write_text("def main():\n    import importlib\n    importlib.import_module('pkg.toplevel')\n")
    (pkg / "toplevel.py").write_text("from pkg import cli\n")
    (pkg / "model").mkdir()
    (pkg / "model" / "__init__.py").write_text("from . import rules\nfrom pkg import api\n")
    (pkg / "model" / "rules.py").write_text("from ..api import *\nfrom pkg.model import timing\n")
    (pkg / "model" / "timing.py").write_text("from . import rules\nfrom pkg.model import Model\n")
    g = graph(pkg)
    assert cycles(g) == [["bench/", "demo/"], ["cli", "toplevel"]], _cycles_text(g, cycles(g))
    assert set(g["api"]) == {"cli"}  # a TYPE_CHECKING import never runs; its else branch does
    assert sorted(g["model/"]["api"]) == ["pkg.model -> pkg.api", "pkg.model.rules -> pkg.api"]  # relative ones
    # model/__init__ -> rules is the package's face; rules <-> timing is a cycle
    assert cycles(module_graph(pkg)) == [["pkg.bench.torchnccl", "pkg.demo.ops"], ["pkg.cli", "pkg.toplevel"],
                                         ["pkg.model.rules", "pkg.model.timing"]]
    (pkg / "demo" / "ops.py").write_text("UID = 1\n")
    (pkg / "toplevel.py").write_text("")
    (pkg / "model" / "timing.py").write_text("from pkg.model import Model\n")
    assert cycles(graph(pkg)) == [] and cycles(module_graph(pkg)) == []


def test_the_checker_finds_a_seam_crossed_lazily(tmp_path):
    pkg = tmp_path / "pkg"
    for folder in ("bench", "demo", "model"):
        (pkg / folder).mkdir(parents=True)
        (pkg / folder / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "bench" / "torchnccl.py").write_text("def ops():\n    import torch.distributed as dist\n")
    (pkg / "demo" / "story.py").write_text("def real():\n    import torch\n")
    (pkg / "model" / "view.py").write_text("import importlib\nCon = importlib.import_module('rich.console')\n"
                                           "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import click\n")
    (pkg / "render.py").write_text("from rich.table import Table\n")
    (pkg / "topo.py").write_text("def nvml():\n    return __import__('pynvml')\n")
    assert seam_breaches(pkg) == ["pkg.demo.story imports torch (only bench/ may)",
                                  "pkg.model.view imports rich (only render may)"]
    assert seam_users(pkg)["pynvml"] == {"topo": ["pkg.topo"]}
    (pkg / "demo" / "story.py").write_text("def real():\n    from pkg.bench.torchnccl import ops\n")
    (pkg / "model" / "view.py").write_text("")
    assert seam_breaches(pkg) == []


def _norm(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()  # PEP 503


def requirements() -> tuple[set[str], set[str]]:
    """The distributions ncclprobe's installed metadata requires: (at run time, with any extra too)."""
    runtime, every = set(), set()
    for req in importlib.metadata.requires("ncclprobe") or []:
        name = _norm(re.match(r"[A-Za-z0-9._-]+", req)[0])
        every.add(name)
        if "extra ==" not in req:
            runtime.add(name)
    return runtime, every


def provided() -> dict[str, set[str]]:
    """Installed distribution -> the top-level module names it installs."""
    out: dict[str, set[str]] = {}
    for name, dists in importlib.metadata.packages_distributions().items():
        for d in dists:
            out.setdefault(_norm(d), set()).add(name)
    return out


def test_every_runtime_dependency_is_imported_and_every_import_is_declared():
    mods, top = modules(ROOT), ROOT.name
    used = {n for path in mods.values() for n in outside(path, top)} - set(sys.stdlib_module_names)
    runtime, every = requirements()
    provides = provided()
    assert {"click", "rich", "pynvml", "torch"} <= used  # the imports were read
    unused = sorted(d for d in runtime if not provides.get(d, set()) & used)
    assert not unused, f"runtime dependencies nothing in ncclprobe imports (or not installed): {unused}"
    declared = set().union(*(provides.get(d, {d.replace("-", "_")}) for d in every))
    assert used <= declared, f"imported but not a requirement: {sorted(used - declared)}"


def _import_alone(module: str) -> tuple[str, int, str]:
    r = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120)
    return module, r.returncode, r.stderr[-2000:]


def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = [n for n in modules(ROOT) if not n.endswith("__main__")]  # __main__ runs the command line
    assert len(names) > 40 and "ncclprobe.ncclapi" in names
    with ThreadPoolExecutor(2) as pool:  # two cores
        failed = [(m, err) for m, rc, err in pool.map(_import_alone, names) if rc != 0]
    assert not failed, failed


def test_every_package_of_the_source_tree_is_installed():
    """pyproject.toml lists the packages setuptools installs: one left out imports from a checkout (and an
    editable install) and is missing from every real install."""
    import tomllib
    source = Path(__file__).resolve().parent.parent / "ncclprobe"
    listed = set(tomllib.loads((source.parent / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(source.parent).parts) for p in source.rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
