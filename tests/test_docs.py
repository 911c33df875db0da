"""Every code block of README.md and docs/ runs as written, and the docs site builds strictly.

A page's blocks run in order, in a scratch folder of their own (never the repository), the way a
reader pastes them there with the environment active:

- ``python``: a fresh namespace, the scratch folder current and first on ``sys.path`` (as in a
  notebook started there). Marked ``<!-- docs: continues -->`` on the line before, a block runs
  in the namespace of the page's previous Python block (the page's text says it continues).
- ``text`` right after a ``python`` block: exactly what that block prints. Other ``text`` blocks
  are illustrations (elided output, formulas) and are not run.
- ``bash``/``sh``: ``bash -euo pipefail`` in the scratch folder, this environment's scripts first
  on ``PATH`` (as after ``source .venv/bin/activate``).
- ``toml``: a scheme file; ``splitformer.load_scheme`` must accept it.
- ``title="name"`` on the fence (shown as the file name on the site): a file, written to the
  scratch folder for the blocks after it, which must name it (a plug-in, a scheme file that
  needs one); it does not run by itself.
- ``<!-- docs: not run: REASON -->`` on the line before: not run. ``NOT_RUN`` lists every such
  block, so that one is never skipped silently.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])

#: Blocks that are not run, by page and first line, with the reason their page gives.
NOT_RUN = {
    ("README.md", "make demo"): "sets up the environment and runs the whole suite itself",
    ("docs/index.md", "python -m pip install -e \".[docs]\""): "installs packages and starts a web server",
    ("docs/reference/checks.md", "splitformer check tests/schemes/richardson.toml"):
        "checking two schemes takes about a minute of CPU",
    ("docs/reference/checks.md", 'make mutation SEEDS="0 1 2" MUTANTS=18 MUTATION_JOBS=2'): "mutation testing takes an hour",
    ("docs/reference/cli.md", "splitformer check post-ln --format json > checks.json"):
        "a full check takes about half a minute of CPU",
    ("docs/guide/networks.md", "splitformer check vit cvt resnet-block unet-level"):
        "the checks of the networks take minutes",
    ("docs/reference/performance.md", "make bench"): "benchmarks run for minutes",
    ("docs/reference/performance.md", "make bench-gpu GPU_PYTHON=python3"): "a benchmark on a CUDA device",
    ("docs/reference/performance.md", "python bench/figure.py post-ln/N1024/numpy candidate --inputs .cache/bench --prepare"):
        "a benchmark, from the repository root; about a minute",
    ("docs/guide/adjoint.md", "make train-demo"): "the training demo takes about 20 s",
    ("docs/guide/llm.md", "splitformer study post-ln pre-ln macaron rk2 --out study"): "a study trains for minutes",
    ("docs/guide/networks.md", "import timm, torch"):
        "timm imports torchvision, which this environment does not install (the suite imports timm through a stub)",
}

_FENCE = re.compile(r"^(?P<indent> {0,3})```(?P<info>[^\n`]*)\n(?P<text>.*?)^(?P=indent)```[ \t]*$", re.S | re.M)
_MARK = re.compile(r"<!--\s*docs:\s*(?P<mark>continues|not run:\s*(?P<reason>.*?))\s*-->\s*$")
_TITLE = re.compile(r'title="([^"]+)"')
_LANGUAGES = {"python", "text", "bash", "sh", "toml"}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    language: str
    text: str
    title: str | None
    continues: bool
    not_run: str | None

    @property
    def first_line(self) -> str:
        return self.text.strip().splitlines()[0].split("  #")[0].strip()

    def __str__(self) -> str:
        return f"{self.page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a page, in order, with the marks on the line before each."""
    source = page.read_text(encoding="utf-8")
    found = []
    for match in _FENCE.finditer(source):
        before = source[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        info = match.group("info").strip()
        title = _TITLE.search(info)
        found.append(Block(
            page=page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name, line=source.count("\n", 0, match.start()) + 1,
            language=info.split()[0] if info else "", text=match.group("text"),
            title=title.group(1) if title else None,
            continues=bool(mark) and mark.group("mark") == "continues",
            not_run=mark.group("reason") if mark and mark.group("reason") else None))
    return found


def _forget_generated() -> None:
    """Drop the ``generated`` package a previous page imported from its own scratch folder."""
    for name in [name for name in sys.modules if name == "generated" or name.startswith("generated.")]:
        del sys.modules[name]
    importlib.invalidate_caches()


@contextlib.contextmanager
def _scratch(folder: Path):
    """The scratch folder current and first on ``sys.path``; everything restored afterwards."""
    previous = Path.cwd()
    _forget_generated()
    os.chdir(folder)
    sys.path.insert(0, str(folder))
    try:
        yield
    finally:
        sys.path.remove(str(folder))
        os.chdir(previous)
        _forget_generated()


def _run_bash(block: Block, folder: Path) -> None:
    environment = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", block.text], cwd=folder, env=environment,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{block} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"


def _run_python(block: Block, namespace: dict) -> str:
    stream = io.StringIO()
    with contextlib.redirect_stdout(stream):
        try:
            exec(compile(block.text, str(block), "exec"), namespace)  # noqa: S102 - our own docs
        except Exception as error:  # name the block that failed
            pytest.fail(f"{block} raised {error!r}")
    return stream.getvalue()


def run_page(page: Path, folder: Path) -> None:
    """Run every block of ``page`` in ``folder``, in order."""
    import splitformer

    namespace, printed, previous = None, None, None
    with _scratch(folder):
        for block in blocks(page):
            if block.title:
                (folder / block.title).parent.mkdir(parents=True, exist_ok=True)
                (folder / block.title).write_text(block.text, encoding="utf-8")
            if block.not_run or block.title:
                previous = block
                continue
            if block.language == "python":
                if not block.continues or namespace is None:
                    namespace = {"__name__": "__main__"}
                printed = _run_python(block, namespace)
            elif block.language == "text":
                if previous is not None and previous.language == "python" and printed is not None:
                    assert printed.rstrip("\n") == block.text.rstrip("\n"), f"{block}: not what {previous} prints"
            elif block.language in ("bash", "sh"):
                _run_bash(block, folder)
            elif block.language == "toml":
                path = folder / f"block-{block.line}.toml"
                path.write_text(block.text, encoding="utf-8")
                splitformer.load_scheme(path)
            previous = block


def test_every_block_has_a_known_language_and_continues_a_python_block():
    for page in PAGES:
        found = blocks(page)
        for position, block in enumerate(found):
            assert block.language in _LANGUAGES, f"{block}: unknown language {block.language!r}"
            if block.continues:
                assert block.language == "python" and any(
                    earlier.language == "python" for earlier in found[:position]), f"{block} continues nothing"


def test_every_file_a_page_writes_is_used_by_a_later_block():
    for page in PAGES:
        found = blocks(page)
        for position, block in enumerate(found):
            if block.title:
                assert any(block.title in later.text for later in found[position + 1:]
                           if not later.not_run and not later.title), f"{block}: nothing uses {block.title}"


def test_the_blocks_not_run_are_the_listed_ones():
    marked = {(block.page, block.first_line): block.not_run for page in PAGES for block in blocks(page)
              if block.not_run}
    assert marked == NOT_RUN


def test_the_readme_is_short_and_its_quick_start_is_the_two_make_commands():
    readme = ROOT / "README.md"
    text = readme.read_text(encoding="utf-8")
    assert len(text.splitlines()) < 250
    heading = text[:text.index("## Quick start")].count("\n") + 1
    quick = next(block for block in blocks(readme) if block.line > heading)
    assert quick.text.splitlines() == ["make demo", "make test"]


def test_the_readme_links_to_files_that_exist():
    """mkdocs checks the links of docs/ (below); the README is not part of the site."""
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert targets
    for target in targets:
        assert "://" in target or (ROOT / target).exists(), target


def named_tests(text: str) -> list[tuple[str, str]]:
    """``(file, test)`` for each test a page names: ``tests/f.py::test_x`` and the ``::test_y`` after it."""
    named, current = [], None
    for file, test in re.findall(r"`(tests/[\w/]+\.py)?(?:::(test_\w+))?", text):
        current = file or current
        if test and current is not None:
            named.append((current, test))
    return named


def test_every_test_a_page_names_exists():
    """A promise is held by the tests it names: each must be a test function of that file."""
    for page in PAGES:
        for file, test in named_tests(page.read_text(encoding="utf-8")):
            path = ROOT / file
            assert path.exists() and re.search(rf"^def {test}\(", path.read_text(encoding="utf-8"), re.M), \
                f"{page.relative_to(ROOT)} names {file}::{test}, which does not exist"
    # control: a renamed test is found missing
    assert named_tests("`tests/test_docs.py::test_gone`, `::test_every_test_a_page_names_exists`") == [
        ("tests/test_docs.py", "test_gone"), ("tests/test_docs.py", "test_every_test_a_page_names_exists")]
    assert not re.search(r"^def test_gone\(", Path(__file__).read_text(encoding="utf-8"), re.M)


#: The pages with a block to run (the others hold prose, tables and blocks marked not run).
RUNNABLE = [page for page in PAGES if any(
    not block.not_run and block.language in ("python", "bash", "sh", "toml") for block in blocks(page))]


@pytest.mark.parametrize("page", RUNNABLE, ids=[page.relative_to(ROOT).as_posix() for page in RUNNABLE])
def test_the_code_blocks_of_the_page_run_as_written(page, tmp_path):
    run_page(page, tmp_path)


def test_the_api_reference_names_every_public_name():
    import splitformer

    reference = (ROOT / "docs" / "reference" / "api.md").read_text(encoding="utf-8")
    for name in set(splitformer.__all__) - {"__version__"}:
        assert f"`splitformer.{name}`" in reference, name


#: Negative controls: pages that must fail, one way each.
BROKEN = {
    "a python error": "```python\nundefined_name\n```\n",
    "a name from a block it does not continue": "```python\nx = 1\n```\n\n```python\nprint(x)\n```\n",
    "output that is not what the block prints": "```python\nprint(1)\n```\n\n```text\n2\n```\n",
    "a failing command": "```bash\nsplitformer derive no-such-scheme --out build\n```\n",
    "an invalid scheme file": "```toml\nsummary = \"no name\"\n```\n",
}


@pytest.mark.parametrize("text", BROKEN.values(), ids=BROKEN.keys())
def test_a_broken_block_fails_its_page(text, tmp_path):
    page = tmp_path / "broken.md"
    page.write_text(text, encoding="utf-8")
    (tmp_path / "scratch").mkdir()
    from splitformer import SplitformerError

    with pytest.raises((AssertionError, pytest.fail.Exception, SplitformerError)):
        run_page(page, tmp_path / "scratch")


def test_a_continued_block_sees_the_names_before_it(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 41\n```\n\n<!-- docs: continues -->\n```python\nprint(x + 1)\n```\n\n"
                    "```text\n42\n```\n", encoding="utf-8")
    run_page(page, tmp_path)


def test_the_docs_site_builds_strictly(tmp_path):
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("NOT CHECKED: mkdocs is not installed here; `pip install -e '.[docs]'` "
                    "(make test installs it) to build the docs site strictly")
    result = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                            cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                            timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert (tmp_path / "site" / "index.html").is_file()
