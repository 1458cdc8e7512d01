"""The house rules that keep the code readable by the next engineer (issue 13): comments stand on
their own, and modules import along the pipeline only."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]
OWN_TEXT = [*ROOT.glob("kernelcache/**/*.py"), *ROOT.glob("scripts/**/*"), *ROOT.glob("docs/*.md"),
            *ROOT.glob("kernelcache/recipes/**/*.toml"), ROOT / "README.md"]


def test_comments_cite_nothing_outside_the_repository():
    """Research notes are not in the repository: a comment states the fact (and links upstream)."""
    found = []
    for path in OWN_TEXT:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if "shared/research" in line or "§" in line or re.search(r"\b[\w-]+\.md §", line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)


# -- the import graph -------------------------------------------------------------------------------

# The pipeline, in the order a module may import: each layer imports only layers before it (and itself).
LAYERS = (
    ("plan", ("kernelcache.plan",)),
    ("exercise", ("kernelcache.exercise",)),
    ("harvest", ("kernelcache.harvest",)),
    ("bundle", ("kernelcache.bundle",)),
    ("cachedir", ("kernelcache.cachedir",)),
    ("remote", ("kernelcache.remote",)),  # transport: a bundle from a registry or a URL, verified on arrival
    ("buildcache", ("kernelcache.buildcache",)),  # what builds compiled, by Triton key: a dir, a URL, a registry
    ("build", ("kernelcache.build", "kernelcache.capture")),  # the build side's verbs: they only wire the above
    ("install", ("kernelcache.install",)),
    ("runtime", ("kernelcache.runtime",)),
    ("manage", ("kernelcache.manage",)),  # ls / rm / prune: what install put in a cache dir, and what serves it
    ("verify", ("kernelcache.verify",)),
    ("tune", ("kernelcache.tune",)),  # times a bundle's autotuned kernels: install, exercise and verify's plan
    ("cli", ("kernelcache.cli", "kernelcache.entry", "kernelcache.__main__")),
)
# The ground floor, shared by every layer: the errors, the version, the package face, and the bundle format with
# the vocabulary every stage reads (kernelcache/format/: the manifest records harvest produces and install reads,
# the environment fingerprint an exercise process reports and install compares, ...).
BASE = ("kernelcache", "kernelcache.version", "kernelcache.errors")
GROUND = ("kernelcache.format",)
# Runs inside the served interpreter (from kernelcache's site dir on PYTHONPATH) and checks the same files the
# fingerprint key names: standard library only (test_the_shared_site_module_needs_only_the_standard_library),
# so any layer may import it. (The import graph names it by its folder when imported as `from .site import`.)
SHARED_SITE = ("kernelcache.runtime.site", "kernelcache.runtime.site.kernelcache_tritonkey",
               "kernelcache.runtime.site.kernelcache_prebuilt", "kernelcache.runtime.site.kernelcache_autotune")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / "kernelcache").rglob("*.py") if "site" not in p.parts}


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every kernelcache module ``name`` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    tree = ast.parse(path.read_text())
    for block in [n for n in ast.walk(tree) if isinstance(n, ast.If) and ast.unparse(n.test) == "TYPE_CHECKING"]:
        block.body = []  # imports for type checkers only never run
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, node.module] if node.module else base)
            found |= {f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
    return {m for m in found if m.startswith("kernelcache") and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def layer(name: str) -> int | None:
    if name in BASE or name in SHARED_SITE or any(name == g or name.startswith(g + ".") for g in GROUND):
        return None
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or name.startswith(p + ".") for p in prefixes):
            return index
    raise AssertionError(f"{name} belongs to no layer of tests/test_house.py")


def test_nothing_is_imported_upward():
    upward = []
    for name, targets in sorted(graph().items()):
        mine = layer(name)
        for target in sorted(targets):
            theirs = layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
            if mine is None and theirs is not None:
                upward.append(f"{name} (shared) imports {target} ({LAYERS[theirs][0]})")
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize("module", ["kernelcache_tritonkey", "kernelcache_outputs", "kernelcache_prebuilt",
                                    "kernelcache_autotune", "kernelcache_walks"])
def test_the_shared_site_modules_need_only_the_standard_library(module):
    """They run in every served process, from the site dir alone: the standard library and each other."""
    site = ROOT / "kernelcache" / "runtime" / "site"
    siblings = {"kernelcache_tritonkey", "kernelcache_outputs", "kernelcache_prebuilt", "kernelcache_autotune",
                "kernelcache_walks"}
    found = set()
    for node in ast.walk(ast.parse((site / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:  # from . import sibling
            assert node.level == 1 and node.module is None, ast.unparse(node)
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {(node.module or "").split(".")[0]}
    assert found - {"__future__"}  # the walk saw its imports
    assert found <= set(sys.stdlib_module_names) | {"__future__"} | siblings, found


def test_there_is_no_import_circle():
    edges = graph()
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        seen[name] = 1
        for target in sorted(edges.get(name, ())):
            if seen.get(target) == 1:
                circle = path[path.index(target):] + [target] if target in path else [name, target]
                raise AssertionError("import circle: " + " -> ".join(circle))
            if target not in seen:
                visit(target, [*path, target])
        seen[name] = 2

    for name in sorted(edges):
        if name not in seen:
            visit(name, [name])
