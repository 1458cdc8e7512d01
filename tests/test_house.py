"""The house rules that keep the code readable by the next engineer (issue 13): comments stand on
their own, and modules import along the pipeline only."""

from __future__ import annotations

import ast
import itertools
import re
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast
ROOT = Path(__file__).resolve().parents[1]
OWN_TEXT = [*ROOT.glob("kernelcache/**/*.py"), *ROOT.glob("scripts/**/*"), *ROOT.glob("tests/gpu_checks/*.py"),
            *ROOT.glob("docs/*.md"),
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

# The floors, in the order a module may import: each layer imports only layers before it (and itself).
LAYERS = (
    # The ground floor, read by every stage and importing none: the errors, the version, the bundle format with the
    # vocabulary every stage reads (format/: manifest, canonical JSON, archive, fingerprint, environment key and scan,
    # Triton identity, cache-key pattern, compile-log records), and the hooks that run inside a served interpreter
    # (hooks/, kernelcache's site dir on PYTHONPATH: standard library only, as
    # test_the_shared_site_modules_need_only_the_standard_library checks), and where kernelcache's own user cache is
    # (usercache.py: one folder per use, standard library only).
    ("ground", ("kernelcache.errors", "kernelcache.version", "kernelcache.usercache", "kernelcache.format",
                "kernelcache.hooks")),
    ("plan", ("kernelcache.plan",)),
    ("exercise", ("kernelcache.exercise",)),
    ("harvest", ("kernelcache.harvest",)),
    ("bundle", ("kernelcache.bundle",)),
    ("cachedir", ("kernelcache.cachedir",)),
    ("remote", ("kernelcache.remote",)),  # transport: a bundle from a registry or a URL, verified on arrival
    ("buildcache", ("kernelcache.buildcache",)),  # what builds compiled, by Triton key: a dir, a URL, a registry
    # The build side's verbs: they only wire the above (preflight: what a build checks before its first exercise
    # process; enginecompile: vLLM's torch.compile artifact, built here, checked and unpacked by install and runtime).
    ("build", ("kernelcache.build", "kernelcache.capture", "kernelcache.preflight", "kernelcache.enginecompile")),
    ("install", ("kernelcache.install",)),
    ("runtime", ("kernelcache.runtime",)),
    ("manage", ("kernelcache.manage",)),  # ls / rm / prune: what install put in a cache dir, and what serves it
    ("verify", ("kernelcache.verify",)),
    ("tune", ("kernelcache.tune",)),  # times a bundle's autotuned kernels: install, exercise and verify's plan
    # The commands and the package face (kernelcache/__init__.py), which hands every verb on.
    # render.py: what the pod-start verbs print, shared by the click commands and the click-free entry point.
    ("cli", ("kernelcache.render", "kernelcache.cli", "kernelcache.entry", "kernelcache.__main__", "kernelcache")),
)
FACE = "kernelcache"  # everything is under the package face: it names itself alone


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in (ROOT / "kernelcache").rglob("*.py")}


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
    return {m for m in found if (m == FACE or m.startswith(FACE + ".")) and m != name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def layer(name: str) -> int:
    for index, (_, prefixes) in enumerate(LAYERS):
        if any(name == p or (p != FACE and name.startswith(p + ".")) for p in prefixes):
            return index
    raise AssertionError(f"{name} belongs to no layer of tests/test_house.py")


def test_stages_import_the_ground_floor_and_lower_stages_only():
    upward = []
    for name, targets in sorted(graph().items()):
        mine = layer(name)
        upward += [f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[layer(target)][0]})"
                   for target in sorted(targets) if layer(target) > mine]
    assert not upward, "\n".join(upward)


# -- one address per module -------------------------------------------------------------------------------------


def statements(path: Path) -> list[ast.stmt]:
    """A module's top-level statements past its docstring."""
    body = ast.parse(path.read_text()).body
    return body[1:] if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) else body


def hands_on(node: ast.stmt) -> bool:
    """An import, ``__all__ = ...``, or an entry written into ``sys.modules``: what an alias module is made of."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    targets = node.targets if isinstance(node, ast.Assign) else []
    return bool(targets) and all(isinstance(t, ast.Subscript) or ast.unparse(t) == "__all__" for t in targets)


def from_elsewhere(node: ast.stmt) -> bool:
    """An import of something outside the importing package (``from ..x import``, ``import kernelcache.x``)."""
    return isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level != 1)


def second_address(path: Path) -> str:
    """Why ``path`` is another module's second address ("" when it is not): its statements only hand on what it
    imports (a package's ``__init__.py`` may hand on its own modules' names), or it enters a kernelcache module
    into ``sys.modules`` under another name (a fake of vLLM's or torch's modules is no alias)."""
    body = statements(path)
    if body and all(hands_on(n) for n in body) and (path.name != "__init__.py" or any(map(from_elsewhere, body))):
        return "only hands on what it imports"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            entries = [ast.unparse(t) for t in node.targets if isinstance(t, ast.Subscript)]
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "sys.modules.setdefault":
            entries = [ast.unparse(node)]
        else:
            entries = []
        aliased = [e for e in entries if e.startswith("sys.modules") and ("__name__" in e or "kernelcache." in e)]
        if aliased:
            return f"enters a module under another name: {aliased[0]}"
    return ""


def test_every_module_has_one_address():
    """No alias modules: a module lives at one place and every import names that place (pip's rule: internal paths
    promise nothing, so nothing keeps old ones alive). The bundle format's member paths are not module paths."""
    found = [f"{p.relative_to(ROOT)}: {why}" for p in sorted((ROOT / "kernelcache").rglob("*.py"))
             if (why := second_address(p))]
    assert not found, "\n".join(found)


def test_an_alias_module_would_be_found(tmp_path):
    """The check above sees the shapes the old aliases had: a re-export, a ``sys.modules`` entry under an old name."""
    shapes = {"reexport.py": '"""Old name."""\nfrom ..format.cachekey import base32_key\n__all__ = ["base32_key"]\n',
              "swap.py": "import sys\nfrom ..format import archive\nsys.modules[__name__] = archive\n",
              "keep.py": "import sys\ndef keep(name):\n"
                         "    sys.modules.setdefault('kernelcache.bundle.' + name, sys.modules[name])\n"}
    for name, text in shapes.items():
        (tmp_path / name).write_text(text)
        assert second_address(tmp_path / name), name
    (tmp_path / "__init__.py").write_text('"""A face."""\n\nfrom .layout import CacheDir\n\n__all__ = ["CacheDir"]\n')
    assert not second_address(tmp_path / "__init__.py")


SITE = ROOT / "kernelcache" / "hooks"


@pytest.mark.parametrize("module", ["kernelcache_tritonkey", "kernelcache_outputs", "kernelcache_prebuilt",
                                    "kernelcache_autotune", "kernelcache_walks", "kernelcache_records"])
def test_the_shared_site_modules_need_only_the_standard_library(module):
    """They run in every served process, from the site dir alone: the standard library and each other."""
    found = site_imports(module)
    assert found - {"__future__"}  # the walk saw its imports
    assert found <= set(sys.stdlib_module_names) | {"__future__"} | siblings(), found


@pytest.mark.parametrize("module", ["sitecustomize", "kernelcache_overlay", "kernelcache_listener"])
def test_the_triton_hooks_need_only_the_standard_library_and_triton(module):
    """The hooks that attach to Triton in a served or captured process need nothing of kernelcache but the site dir."""
    found = site_imports(module)
    assert "triton" in found or module == "sitecustomize"
    assert found <= set(sys.stdlib_module_names) | {"__future__", "triton"} | siblings(), found


def siblings() -> set[str]:
    return {p.stem for p in SITE.glob("*.py")} - {"sitecustomize"}


def site_imports(module: str) -> set[str]:
    """The top-level names a module of the site dir imports (``from . import x``: its sibling x)."""
    found = set()
    for node in ast.walk(ast.parse((SITE / f"{module}.py").read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level:  # from . import sibling
            assert node.level == 1 and node.module is None, ast.unparse(node)
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found |= {(node.module or "").split(".")[0]}
    return found


def test_a_family_names_its_exercise_on_the_floor_above_and_the_plan_never_imports_it():
    """The plan names each family's exercise entry as text (``Family.exercise``, ``module:function``), which
    exercise/worker.py resolves in the exercise process: a reference up one floor that is no import. Drawn here, so
    that the import test above sees the whole loop: each entry is a function of an exercise-floor module, and no plan
    module imports it (the exercise module may import its family's declaration: down a floor)."""
    from kernelcache.plan import families

    edges = graph()
    plan = layer("kernelcache.plan")
    imported_by_plan = {target for name, targets in edges.items() if layer(name) == plan for target in targets}
    named = [f for f in families.families() if f.exercise]
    assert named
    for family in named:
        module, _, function = family.exercise.partition(":")
        assert module in edges and layer(module) == layer("kernelcache.exercise"), family.exercise
        defined = {n.name for n in ast.parse(modules()[module].read_text()).body if isinstance(n, ast.FunctionDef)}
        assert function in defined, family.exercise
        assert module not in imported_by_plan, f"the plan imports {module}"


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


# -- the floors, drawn by folder ----------------------------------------------------------------------------------


def room(name: str) -> str:
    """The room a module stands in when the house is drawn by folder: its top-level folder or module."""
    return ".".join(name.split(".")[:2])


def rooms() -> dict[str, set[str]]:
    """Room -> the rooms its modules import (its own left out)."""
    found: dict[str, set[str]] = {}
    for name, targets in graph().items():
        found.setdefault(room(name), set()).update(room(t) for t in targets if room(t) != room(name))
    return found


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The rooms that import each other in a loop (strongly connected, more than one room), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            members = []
            while not members or members[-1] != node:
                members.append(stack.pop())
            if len(members) > 1:
                found.append(sorted(members))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def arrows_back_up(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The fewest arrows that, taken out, leave no circle: those that run back up however the rooms are stacked
    in floors (tried one and two at a time; more than two come back as every arrow inside a circle)."""
    inside = [(a, b) for group in circles(edges) for a in group for b in sorted(edges[a]) if b in group]
    for count in (1, 2):
        for taken in itertools.combinations(inside, count):
            rest = {a: {b for b in targets if (a, b) not in taken} for a, targets in edges.items()}
            if not circles(rest):
                return list(taken)
    return inside


def test_drawn_by_folder_at_most_one_arrow_runs_back_up():
    """The served process's hooks stand on the ground floor, so a stage that reads them imports down; the one
    arrow that may run back up is the hook that records a captured command's compiles with the exercise's
    listener."""
    up = arrows_back_up(rooms())
    assert len(up) <= 1, up


def test_drawn_by_folder_no_circle_is_left_once_that_arrow_is_out():
    edges = rooms()
    up = set(arrows_back_up(edges))
    rest = {a: {b for b in targets if (a, b) not in up} for a, targets in edges.items()}
    assert not circles(rest), circles(rest)


# -- the commands -------------------------------------------------------------------------------------------------

COMMANDS = [*ROOT.glob("kernelcache/cli/*.py"), ROOT / "kernelcache" / "entry.py", ROOT / "kernelcache" / "render.py"]
LONGEST = 60  # lines of one function, its decorators included


def test_no_function_of_the_commands_is_longer_than_a_screen():
    """A command parses its options, calls one API function and renders the result: 60 lines hold that."""
    long = []
    for path in COMMANDS:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if node.end_lineno - start + 1 > LONGEST:
                    long.append(f"{path.relative_to(ROOT)}:{start}: {node.name} ({node.end_lineno - start + 1} lines)")
    assert COMMANDS and not long, "\n".join(long)


def test_no_banner_or_comment_of_the_commands_names_an_issue():
    """Code says what it does; the tracker says why it changed."""
    named = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in COMMANDS
             for number, line in enumerate(path.read_text().splitlines(), 1) if re.search(r"\bissue \d+", line)]
    assert not named, "\n".join(named)


# -- the cache dir's layout -----------------------------------------------------------------------------------------

LAYOUT = ROOT / "kernelcache" / "cachedir" / "layout.py"


def test_the_names_of_a_cache_dir_are_spelled_in_its_layout_table_alone():
    """cachedir/layout.py names every folder and file kernelcache keeps in a cache dir; elsewhere a path into the
    state is built from those names (``cache.state / INSTALLED``), never from a string of its own."""
    from kernelcache.cachedir import layout

    names = [layout.LOCK, layout.INSTALLED, layout.JOURNAL, layout.STAGING, layout.FINGERPRINTS, layout.CHECKED,
             layout.SERVED, layout.TRITON_KEYS, layout.LOG, layout.MISS_LOG]
    spelled = re.compile(r'(/ |STATE_DIR, |join\(\w+, |\(\()"(' + "|".join(map(re.escape, names)) + r')"')
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in ROOT.glob("kernelcache/**/*.py")
             if path != LAYOUT for number, line in enumerate(path.read_text().splitlines(), 1) if spelled.search(line)]
    assert not found, "\n".join(found)


# -- what scripts import ----------------------------------------------------------------------------------------

KERNELCACHE_IMPORT = re.compile(r"from (kernelcache[\w.]*) import (?:\(([^)]*)\)|([\w ,]+))|import (kernelcache[\w.]*)"
                                r"|-m[\"', ]* (kernelcache[\w.]*)|[\"'](kernelcache[\w.]*)[:\"']")


def script_imports() -> list[tuple[str, str]]:
    """(file, module or module.name) for every kernelcache module or name a file under scripts/ imports: Python's
    imports, ``python -m`` and ``-c`` in shell, and ``module:function`` job calls."""
    found = []
    for path in sorted(ROOT.glob("scripts/**/*")):
        if not path.is_file() or path.suffix not in (".py", ".sh"):
            continue
        for match in KERNELCACHE_IMPORT.finditer(path.read_text()):
            module, wrapped, names, *others = match.groups()
            where = str(path.relative_to(ROOT))
            if module:
                found += [(where, f"{module}.{name.split()[0]}") for name in (wrapped or names).split(",")
                          if name.strip()]
            found += [(where, other) for other in others if other]
    return found


def scripts_exercise_api() -> set[str]:
    """The modules of exercise/ docs/ARCHITECTURE.md's "What scripts import" names."""
    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text().split("## What scripts import", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `exercise/(\w+)\.py` \|", text, re.M))


def test_scripts_import_no_private_name_and_of_exercise_only_what_the_docs_name():
    api, private, unnamed = scripts_exercise_api(), [], []
    for where, name in script_imports():
        parts = name.split(".")
        if any(p.startswith("_") and not p.startswith("__") for p in parts):
            private.append(f"{where}: {name}")
        elif parts[1:2] == ["exercise"] and len(parts) > 2 and parts[2] not in api:
            unnamed.append(f"{where}: {name}")
    assert not private, "private names:\n" + "\n".join(private)
    assert not unnamed, "exercise modules docs/ARCHITECTURE.md does not name for scripts:\n" + "\n".join(unnamed)
    assert {"drivers", "layers"} <= api


def test_the_scripts_import_check_sees_each_kind_of_import():
    names = {name for _, name in script_imports()}
    assert {"kernelcache.format.archive.read_manifest", "kernelcache.exercise.worker",
            "kernelcache.exercise.testkernels", "kernelcache.exercise.flashinfer_sampling.setup_toolchain"} <= names
