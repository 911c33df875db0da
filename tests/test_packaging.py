"""The distribution installs one import name, ``splitformer``, with every subpackage and data folder listed."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import ROOT


def _declared() -> tuple[list[str], dict[str, str]]:
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return setuptools["packages"], setuptools["package-dir"]


def test_every_subpackage_is_declared_under_splitformer():
    packages, folders = _declared()
    found = {"splitformer"}
    for name, folder in folders.items():  # code packages and data folders (schemes, templates) alike
        found.add(name)
        for path in (ROOT / folder).rglob("*"):
            if path.is_dir() and "__pycache__" not in path.parts and any(path.iterdir()):
                found.add(".".join((name, *path.relative_to(ROOT / folder).parts)))
    assert sorted(packages) == sorted(found)
    assert all(package.split(".")[0] == "splitformer" for package in packages)


def test_version_everywhere():
    import splitformer

    script = str(Path(sys.executable).parent / "splitformer")
    for command in ([script, "--version"], [sys.executable, "-m", "splitformer", "--version"]):
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"splitformer {splitformer.__version__}"
