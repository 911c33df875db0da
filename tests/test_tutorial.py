"""docs/tutorial.md runs: its Python blocks in order, each output block is what they print."""

import contextlib
import io
import re

import pytest

from conftest import ROOT

TUTORIAL = ROOT / "docs" / "tutorial.md"
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def blocks() -> list[tuple[str, str]]:
    """``(language, text)`` of every fenced block, in order."""
    return [(match.group(1), match.group(2)) for match in _BLOCK.finditer(TUTORIAL.read_text(encoding="utf-8"))]


def test_every_block_is_python_or_its_output():
    found = blocks()
    assert found and {language for language, _ in found} == {"python", "text"}
    for position, (language, _) in enumerate(found):
        if language == "text":
            assert position > 0 and found[position - 1][0] == "python", "an output block follows the code it shows"


def test_the_tutorial_runs_and_prints_what_it_shows(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "tutorial"}
    printed = ""
    for position, (language, text) in enumerate(blocks()):
        if language == "python":
            stream = io.StringIO()
            with contextlib.redirect_stdout(stream):
                try:
                    exec(compile(text, f"{TUTORIAL}:block{position}", "exec"), namespace)  # noqa: S102
                except Exception as error:  # name the block that failed
                    pytest.fail(f"block {position} of the tutorial raised {error!r}")
            printed = stream.getvalue()
        else:
            assert printed.rstrip("\n") == text.rstrip("\n"), f"output block {position}"
    assert (tmp_path / "build" / "torch" / "sphere_glu.py").is_file()
