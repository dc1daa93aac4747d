"""docs/rollout-security.md names the tests that cover each attack as pytest node ids
(``tests/<file>.py::test_name`` or ``tests/<file>.py::TestClass::test_name``): each must
name a test that exists, so a renamed or deleted test cannot leave the page claiming it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "rollout-security.md"
NODE_ID = re.compile(r"(tests/[\w/]+\.py)((?:::\w+)+)")


def documented_node_ids() -> list[tuple[str, list[str]]]:
    """(file, [class..., test]) of every node id the page names, in order, without repeats."""
    found = dict.fromkeys((m.group(1), m.group(2)) for m in NODE_ID.finditer(DOC.read_text()))
    return [(path, parts.split("::")[1:]) for path, parts in found]


def defines(path: Path, names: list[str]) -> bool:
    """Whether ``path`` defines ``names`` (classes, then a test function) at module level."""
    body = ast.parse(path.read_text(), filename=str(path)).body
    *classes, test = names
    for name in classes:
        body = next((node.body for node in body if isinstance(node, ast.ClassDef) and node.name == name), None)
        if body is None:
            return False
    return any(isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == test for node in body)


def test_the_page_names_the_tests_of_each_attack():
    ids = documented_node_ids()
    assert len(ids) >= 30, f"{DOC.name} names only {len(ids)} tests: the node-id pattern no longer matches it"
    assert all(names[-1].startswith("test_") for _, names in ids), [names for _, names in ids]


def test_every_test_the_page_names_exists():
    missing = []
    for path, names in documented_node_ids():
        file = REPO / path
        if not file.is_file():
            missing.append(f"{path}::{'::'.join(names)} (no such file)")
        elif not defines(file, names):
            missing.append(f"{path}::{'::'.join(names)}")
    assert not missing, f"{DOC.relative_to(REPO)} names tests that do not exist:\n" + "\n".join(missing)
