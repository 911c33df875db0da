"""The mutation driver (``tools/``, not installed): its population, its mutants, its kill commands."""

from collections import Counter

import pytest

from conftest import ROOT

import mutants  # tools/ (on the path through conftest)
import mutation

TEMPLATE = '''\
def f(x, *args, **kwargs) -> int:
    """Docstring: a - b, 1 + 2."""
    {%- if n > 1 -%}  {# a Jinja comment: n - 1 #}
    y = np.maximum(x, 0) * {{ scale }}  # a comment: x + y
    z = "a string - not code" + 'and + another'
    return y @ w - 1e-5 / eps ** 2
'''


@pytest.fixture(scope="module")
def population():
    return mutation.population()


def test_every_area_is_mutated_and_the_verification_code_never(population):
    areas = Counter(mutation.area_of(mutant.path) for mutant in population)
    assert set(areas) == set(mutation.AREAS) and min(areas.values()) > 100
    assert not [m for m in population if m.path.startswith(mutation.VERIFICATION)]
    paths = {m.path for m in population}
    assert {"codegen/lowering.py", "codegen/stage_render.py", "codegen/nn.py", "codegen/passes/matmul.py",
            "codegen/adapters/hf_bert.py", "templates/numpy/module.py.j2", "templates/networks/cvt.py.j2"} <= paths


def test_template_mutants_change_code_never_strings_comments_or_jinja_delimiters():
    found = [(line, TEMPLATE.splitlines()[line - 1][start:end], new)
             for line, start, end, new in mutants._template_candidates(TEMPLATE)]
    assert found == [(3, ">", ">="), (3, "1", "2"),
                     (4, "maximum", "minimum"), (4, "0", "1"), (4, "*", "/"),
                     (5, "+", "-"),
                     (6, "@", "*"), (6, "-", "+"), (6, "/", "*"), (6, "**", "*"), (6, "2", "3")]


def test_a_template_mutant_rewrites_one_token_of_one_line(population):
    mutant = next(m for m in population if m.path == "templates/numpy/module.py.j2")
    source = (ROOT / mutant.path).read_text(encoding="utf-8")
    before, after = source.splitlines(), mutants.apply(source, mutant).splitlines()
    changed = [n for n, (a, b) in enumerate(zip(before, after)) if a != b]
    assert len(before) == len(after) and changed == [mutant.line - 1]
    assert mutants.diff(source, mutant).splitlines() == [f"-{before[mutant.line - 1]}", f"+{after[mutant.line - 1]}"]


def test_a_python_mutant_changes_one_node(population):
    mutant = next(m for m in population if m.path == "codegen/passes/matmul.py" and "→" in m.description)
    source = (ROOT / mutant.path).read_text(encoding="utf-8")
    lines = mutants.diff(source, mutant).splitlines()
    assert len(lines) == 2 and lines[0][0] == "-" and lines[1][0] == "+"


def test_samples_draw_every_area_and_depend_on_the_seed(population):
    drawn = mutation.sample(population, 12, seed=3)
    assert len(drawn) == 12 and set(Counter(mutation.area_of(m.path) for m in drawn).values()) == {2}
    assert drawn == mutation.sample(population, 12, seed=3) != mutation.sample(population, 12, seed=4)


@pytest.mark.parametrize("path, stages, tests", [
    ("codegen/adapters/hf_bert.py", ["tests"], "test_llm_adapters.py"),
    ("codegen/network_render.py", ["tests", "check networks"], "test_network_semantics.py"),
    ("templates/networks/cvt.py.j2", ["tests", "check networks"], "test_cvt.py"),
    ("templates/numpy/module.py.j2", ["check"], None),
    ("codegen/passes/matmul.py", ["tests", "check"], "test_lowering.py"),
    ("symbolic/tableaux.py", ["tests", "check", "core tests"], "test_tableaux.py"),
])
def test_each_area_runs_its_tests_and_checks(path, stages, tests):
    found = mutation.kill_stages([path])
    assert [name for name, _ in found] == stages
    assert tests is None or tests in found[0][1]
    assert all((ROOT / test).exists() for _, command in found for test in command.split() if test.startswith("tests/"))


def test_every_judged_equivalent_names_a_mutant_and_a_reason(population):
    identities = {m.identity for m in population}
    judged = mutation.equivalents()
    assert all(reason.strip() for reason in judged.values())
    assert set(judged) <= identities, sorted(set(judged) - identities)


def test_a_mutant_is_judged_by_its_text_wherever_its_line_moves(population, tmp_path):
    mutant = next(m for m in population if m.path == "codegen/passes/matmul.py")
    source = (ROOT / mutant.path).read_text(encoding="utf-8")
    (tmp_path / "codegen" / "passes").mkdir(parents=True)
    (tmp_path / mutant.path).write_text("import os\n\n" + source, encoding="utf-8")
    moved = mutants.file_mutants(tmp_path, mutant.path)[mutant.index]
    assert moved.line == mutant.line + 2 and moved.identity == mutant.identity
    assert len({m.identity for m in population}) == len(population)  # the same mutation twice on a line: #2
