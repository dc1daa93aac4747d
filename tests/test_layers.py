"""The layering of docs/architecture.md holds: import-linter's contracts (pyproject.toml
[tool.importlinter]) checked on the source tree, as `make lint` checks them."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_import_contracts_are_kept():
    done = subprocess.run([str(Path(sys.executable).with_name("lint-imports")), "--no-cache"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "BROKEN" not in done.stdout and done.stdout.count(" KEPT") >= 4, done.stdout[-2000:]


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
