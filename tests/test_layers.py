"""The packages' layers (pyproject.toml's import-linter contract, docs/architecture.md): each imports only the ones
below it. ``lint-imports`` reads the import statements (also those inside functions), so a shortcut upwards fails
CI here, naming the import."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests import REPO

LINT = [sys.executable, "-c", "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"]


def lint(root: Path) -> subprocess.CompletedProcess:
    """lint-imports on the package under ``root`` with the repository's contract."""
    return subprocess.run([*LINT, "--config", str(REPO / "pyproject.toml")], cwd=root, capture_output=True,
                          text=True, timeout=300, env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"})


def test_every_package_imports_only_the_layers_below_it():
    done = lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 1 kept, 0 broken" in done.stdout


def test_an_import_upwards_breaks_the_contract_and_is_named(tmp_path):
    shutil.copytree(REPO / "asr", tmp_path / "asr", ignore=shutil.ignore_patterns("__pycache__", "configs"))
    config = tmp_path / "asr" / "models" / "config.py"
    config.write_text(config.read_text() + "\n\ndef _shortcut():\n    from asr.train import fitting  # noqa: F401\n")
    done = lint(tmp_path)
    assert done.returncode != 0 and "asr.models.config -> asr.train.fitting" in done.stdout
