"""The distribution installs one import name, ``splitformer``, with every subpackage listed."""

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
    for name, folder in folders.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / folder)
            found.add(".".join((name, *relative.parts)))
    assert sorted(packages) == sorted(found)
    assert all(package.split(".")[0] == "splitformer" for package in packages)


def test_version_everywhere():
    import splitformer

    script = str(Path(sys.executable).parent / "splitformer")
    for command in ([script, "--version"], [sys.executable, "-m", "splitformer", "--version"]):
        result = subprocess.run(command, capture_output=True, text=True)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == f"splitformer {splitformer.__version__}"
