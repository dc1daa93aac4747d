"""The layering of docs/architecture.md holds: import-linter's contracts (pyproject.toml
[tool.importlinter]) checked on the source tree, as `make lint` checks them."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))
# the contracts that keep the files of a package free of cycles (issue 31): name -> container
NO_CYCLES = {"pipeline: files layered from the run": "onnxcast.pipeline",
             "registry: files layered from releases": "onnxcast.registry"}


def test_the_import_contracts_are_kept():
    done = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and done.stdout.count(" KEPT") >= 6, done.stdout[-2000:]
    flat = " ".join(done.stdout.split())
    for name in NO_CYCLES:
        assert re.search(re.escape(name) + r"[^)]*\) KEPT", flat), f"{name!r} not kept:\n{done.stdout[-2000:]}"


@pytest.mark.parametrize(("module", "back_edge"), [
    ("pipeline/significance.py", "onnxcast.pipeline.run"),  # a leaf that imports the top
    ("pipeline/config.py", "onnxcast.pipeline.data"),  # the cycle S2 broke, inside a function
    ("registry/plan.py", "onnxcast.registry.champion"),  # the champion <-> fetch cycle, back
])
def test_a_back_edge_inside_a_package_breaks_its_contract(tmp_path, module, back_edge):
    """The no-cycle contracts can fail: a copy of the package with one planted import that
    points up (function-local imports count: they made the cycles issue 31 found)."""
    shutil.copytree(REPO / "onnxcast", tmp_path / "onnxcast", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    planted = tmp_path / "onnxcast" / module
    planted.write_text(planted.read_text() + f"\n\ndef _planted():\n    import {back_edge}  # noqa\n")
    done = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    flat = " ".join(done.stdout.split())
    container = back_edge.rsplit(".", 1)[0]
    (name,) = [n for n, c in NO_CYCLES.items() if c == container]
    assert done.returncode == 1 and re.search(re.escape(name) + r"[^)]*\) BROKEN", flat), done.stdout[-3000:]
    assert f"{container}.{Path(module).stem} -> {back_edge}" in flat, done.stdout[-3000:]


def test_a_new_module_must_be_placed_in_its_packages_layers(tmp_path):
    """exhaustive: a module the layers do not name breaks the contract until it is placed."""
    shutil.copytree(REPO / "onnxcast", tmp_path / "onnxcast", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "onnxcast" / "pipeline" / "unplaced.py").write_text('"""Nobody placed me."""\n')
    done = subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "onnxcast.pipeline.unplaced" in done.stdout, done.stdout[-3000:]


def test_a_broken_contract_is_found(tmp_path):
    """The check can fail: a module of the base layer that imports the pipeline breaks it."""
    source = tmp_path / "src"
    for folder in ("base", "pipeline"):
        (source / "demo_pkg" / folder).mkdir(parents=True)
        (source / "demo_pkg" / folder / "__init__.py").write_text("")
    (source / "demo_pkg" / "__init__.py").write_text("")
    (source / "demo_pkg" / "base" / "bad.py").write_text("import demo_pkg.pipeline\n")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = demo_pkg\n\n[importlinter:contract:layers]\nname = layers\n"
        "type = layers\nlayers =\n    demo_pkg.pipeline\n    demo_pkg.base\n")
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(source), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "BROKEN" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]


# --- no module imports another module's private names -------------------------------------------

# (importer, imported module, name): why it is allowed for now. Empty is the goal.
PRIVATE_IMPORTS_ALLOWED: set[tuple[str, str, str]] = set()


def private_imports(package: Path) -> set[tuple[str, str, str]]:
    """``(importer, module, name)`` of every ``from module import _name`` (also inside
    functions, also relative) where ``module`` is another module of the package; dunder names
    such as ``__version__`` are public."""
    import ast

    root = package.parent
    found = set()
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        importer = ".".join(parts[:-1] if is_package else parts)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = importer.split(".")[: len(importer.split(".")) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if not module.startswith(package.name) or module == importer:
                continue
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.add((importer, module, alias.name))
    return found


def test_no_module_imports_another_modules_private_names():
    """A name with a leading underscore is its module's own: another module that needs it gets
    a public name (issue 31 found 33 such imports; fleet_quality took seven of quality's)."""
    found = private_imports(REPO / "onnxcast")
    assert found - PRIVATE_IMPORTS_ALLOWED == set(), sorted(found - PRIVATE_IMPORTS_ALLOWED)
    assert PRIVATE_IMPORTS_ALLOWED - found == set(), "allowed but gone: remove from the list"


def test_a_private_import_is_found(tmp_path):
    """The check can fail: a function-local and a relative import of another module's _name."""
    package = tmp_path / "demo_pkg"
    (package / "sub").mkdir(parents=True)
    for path in (package / "__init__.py", package / "sub" / "__init__.py"):
        path.write_text("")
    (package / "a.py").write_text("def _helper():\n    pass\n__version__ = '1'\n")
    (package / "sub" / "b.py").write_text("from demo_pkg import __version__\n\n\ndef f():\n"
                                          "    from demo_pkg.a import _helper\n")
    (package / "sub" / "c.py").write_text("from ..a import _helper as helper\n")
    assert private_imports(package) == {("demo_pkg.sub.b", "demo_pkg.a", "_helper"),
                                        ("demo_pkg.sub.c", "demo_pkg.a", "_helper")}


# --- onnxcast imports at module top unless they would make the importer heavier -------------------

HEAVY = {"torch", "onnx", "onnxruntime", "mlflow", "pandas", "great_expectations", "statsforecast", "fastapi",
         "uvicorn", "starlette", "onnxscript", "onnx_ir", "onnxslim", "statsmodels", "matplotlib", "pyarrow",
         "scipy", "airflow"}
# (importer, imported): why a function-local import stays inside its function
LOCAL_IMPORTS_ALLOWED = {
    ("onnxcast.pipeline.validate", "onnxcast.pipeline.evaluation"): "evaluation.judged and intervals.judged: one name",
    ("onnxcast.pipeline.validate", "onnxcast.pipeline.intervals"): "evaluation.judged and intervals.judged: one name",
}
# modules whose function-local onnxcast imports may wait (none left)
LOCAL_IMPORTS_LATER: set[str] = set()


def import_graph(package: Path) -> tuple[dict[str, set[str]], dict[str, list[tuple[int, str]]]]:
    """(module -> what it imports at module level, module -> [(line, onnxcast module)] it imports
    inside functions). ``from pkg import sub`` counts ``pkg.sub``; TYPE_CHECKING blocks do not count."""
    import ast

    root = package.parent
    paths = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    top: dict[str, set[str]] = {}
    local: dict[str, list[tuple[int, str]]] = {}
    for module, path in paths.items():
        is_package = path.name == "__init__.py"
        top[module], local[module] = set(), []

        def targets(node, module=module, is_package=is_package) -> list[str]:
            if isinstance(node, ast.Import):
                return [a.name for a in node.names]
            base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)] \
                if node.level else []
            name = ".".join(base + ([node.module] if node.module else []))
            return [name] + [f"{name}.{a.name}" for a in node.names if f"{name}.{a.name}" in paths]

        def walk(body, in_function, module=module, targets=targets):
            for node in body:
                if isinstance(node, ast.Import | ast.ImportFrom):
                    found = targets(node)
                    if in_function:
                        ours = [t for t in found if t.split(".")[0] == package.name]
                        if isinstance(node, ast.ImportFrom):
                            ours = ours[1:] or ours  # the submodules it names, else the module
                        local[module] += [(node.lineno, t) for t in ours]
                    else:
                        top[module].update(".".join(t.split(".")[:i + 1]) for t in found
                                           for i in range(len(t.split("."))))
                elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    walk(node.body, True)
                elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    continue
                else:
                    for field in ("body", "orelse", "finalbody", "handlers"):
                        walk([n for n in getattr(node, field, []) if isinstance(n, ast.AST)], in_function)
                    if isinstance(node, ast.ExceptHandler):
                        walk(node.body, in_function)

        walk(ast.parse(path.read_text()).body, False)
    return top, local


def liftable_local_imports(package: Path, allowed: dict | None = None, later: set | None = None) -> list[str]:
    """The function-local imports of ``package`` modules that could sit at module top: outside
    the Airflow provider, not listed, loading no heavy library nor any third-party package the
    importer does not load already, closing no import cycle."""
    import sys

    top, local = import_graph(package)

    def closure(module: str) -> set[str]:
        seen, stack = set(), [module]
        while stack:
            current = stack.pop()
            if current not in seen:
                seen.add(current)
                stack += list(top.get(current, ())) + [current.rsplit(".", 1)[0]] * ("." in current)
        return seen

    def outside(module: str) -> set[str]:
        return {m.split(".")[0] for m in closure(module)} - set(sys.stdlib_module_names) - {"__future__", package.name}

    liftable = []
    for module, imports in local.items():
        if module.startswith(f"{package.name}.airflow") or module in (later or set()):
            continue
        for line, target in imports:
            if (module, target) in (allowed or {}) or outside(target) & HEAVY or module in closure(target):
                continue
            if outside(target) - outside(module):
                continue
            liftable.append(f"{module}:{line} imports {target} inside a function")
    return liftable


def test_onnxcast_imports_sit_at_module_top_unless_they_would_make_the_importer_heavier():
    """Issue 31: function-local imports hid five file cycles. One stays inside its function only
    in the Airflow provider (DAG files parse it: operators import in execute()), or when moving
    it up would load a heavy library (torch, onnxruntime, mlflow, pandas, GX, ...) or any
    third-party package the importer does not load today (numpy into the import-light store,
    promote, release or CLI modules), or close an import cycle; or for a reason listed."""
    liftable = liftable_local_imports(REPO / "onnxcast", LOCAL_IMPORTS_ALLOWED, LOCAL_IMPORTS_LATER)
    assert liftable == [], "\n".join(liftable)


def test_a_local_import_that_could_sit_at_the_top_is_found(tmp_path):
    """The check can fail; and it leaves alone what would load torch or numpy into a light module."""
    package = tmp_path / "demo_pkg"
    (package / "airflow").mkdir(parents=True)
    for path in (package / "__init__.py", package / "airflow" / "__init__.py"):
        path.write_text("")
    (package / "light.py").write_text("import json\n")
    (package / "heavy.py").write_text("import torch\n")
    (package / "numeric.py").write_text("import numpy\n")
    (package / "user.py").write_text("def f():\n    from demo_pkg.light import json\n\n\n"
                                     "def g():\n    from demo_pkg import heavy, numeric\n")
    (package / "airflow" / "op.py").write_text("def execute():\n    from demo_pkg.light import json\n")
    assert liftable_local_imports(package) == ["demo_pkg.user:2 imports demo_pkg.light inside a function"]


# --- long functions (issue 31: split into named steps) ----------------------------------------------

MAX_FUNCTION_LINES = 60


def long_functions(package: Path, limit: int = MAX_FUNCTION_LINES) -> list[str]:
    """``path:line name (n lines)`` of every function or method of ``package`` longer than ``limit``
    lines, counted from ``def`` to its last line (docstring included)."""
    import ast

    found = []
    for path in sorted(package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    found.append(f"{path.relative_to(package.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return found


def test_no_function_of_the_package_is_longer_than_sixty_lines():
    assert long_functions(REPO / "onnxcast") == []


def test_a_long_function_is_found(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "".join(f"    x{i} = {i}\n" for i in range(MAX_FUNCTION_LINES))
    (package / "m.py").write_text(f"def short():\n    return 1\n\n\ndef long():\n{body}")
    assert long_functions(package) == [f"pkg/m.py:5 long ({MAX_FUNCTION_LINES + 1} lines)"]
