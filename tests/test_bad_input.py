"""Every bad input ends in one ``error:`` line and exit status 2, never a traceback.

Specific cases from the trust review, then hypothesis fuzzers over structured scheme files
and over command lines (a few thousand cases in all, a few seconds).
"""

from __future__ import annotations

import json
import os
import tomllib
import signal
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from splitformer.codegen import cli
from splitformer.codegen.cli import main
from splitformer.symbolic import SplitformerError, load_scheme, parse_scheme
from splitformer.symbolic.derivation import derive
from splitformer.symbolic.names import MODULE_ATTRIBUTES

from conftest import ROOT

VALID = load_scheme("post-ln").source


def _replace(old: str, new: str) -> str:
    assert old in VALID
    return VALID.replace(old, new, 1)


def _fails(capsys, *arguments: str, message: str = "") -> str:
    """``main(arguments)`` exits 2 with one ``error:`` line containing ``message``; returns it."""
    capsys.readouterr()
    assert main(list(arguments)) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and captured.err.startswith("error: "), captured.err
    assert message in captured.err, captured.err
    return captured.err


@pytest.mark.parametrize("text, message", [
    (_replace("fraction = 2", 'fraction = "1e5000"'), "out of range"),
    (_replace("fraction = 2", 'fraction = "1e309"'), "out of range"),
    (_replace("fraction = 2", "fraction = 1e309"), "not a number"),
    (_replace("fraction = 2", 'fraction = "1e99999999"'), "out of range"),
    (_replace("fraction = 2", 'fraction = "1e-300"'), "out of range"),
    (_replace("fraction = 2", 'fraction = "1e999999999999"'), "has more digits than a number is read with"),
    (_replace("fraction = 2", "fraction = " + "1" * 5000), "invalid TOML"),
    (_replace('name = "post-ln"', "name = " + "[" * 3000), "invalid TOML"),
    (_replace('name = "post-ln"', 'name = "' + "a" * 5000 + '"'), "is not a scheme name"),
    (_replace('name = "post-ln"', 'name = "t\\n"'), "is not a scheme name"),
    (_replace('name = "post-ln"', 'name = "class"'), "is a Python keyword"),
    (_replace('name = "post-ln"', 'name = "import"'), "is a Python keyword"),
    (_replace('attn = "attention"', '"attn\\n" = "attention"'), "is not an operator name"),
    (_replace('operator = "ffn"', 'operator = "ffn\\n"'), "unknown operator"),
    (_replace('attn = "attention"', 'attn = "attention"\nspare = "feed-forward"'),
     "operator 'spare' is declared but no step uses it"),
    # bounds on the derivation's work: a 4 kB file must not run for minutes
    (VALID + '\n[[steps]]\nrk = { a = [%s], b = [%s] }\nfields = [{ operator = "attn" }]\n' % (
        ", ".join("[%s]" % ", ".join(["0"] * i) for i in range(17)), ", ".join(['"1/17"'] * 17)),
     "has 17 stages; at most 16 are supported"),
    (VALID + '\n[[steps]]\noperator = "attn"\nsolver = "explicit"\n' * 61,
     "evaluates 65 operators per step; at most 64 are supported"),
])
def test_bad_scheme_files(text, message, tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    for command in ("show", "derive"):
        _fails(capsys, command, str(path), *(["--out", str(tmp_path / "out")] if command == "derive" else []),
               message=message)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["to", "forward", "half", "d_model", "n_heads", "parameters", "state_dict", "eps"])
def test_operator_names_clashing_with_module_attributes(name, capsys, tmp_path):
    path = tmp_path / "clash.toml"
    path.write_text(VALID.replace('"attn"', f'"{name}"').replace("\nattn = ", f"\n{name} = "))
    _fails(capsys, "show", str(path), message=f"operator name {name!r} clashes with the attribute")


def test_module_attributes_cover_torch_modules():
    torch = pytest.importorskip("torch")
    import re

    from conftest import GENERATED, import_path

    block = import_path(GENERATED / "torch" / "post_ln.py").Block(8, 2, 12)
    names = {name for name in dir(torch.nn.Module) + dir(block) if re.fullmatch(r"[a-z][a-z0-9_]*", name)}
    operators = {"attn", "norm1", "ffn", "norm2"}
    assert names - operators <= MODULE_ATTRIBUTES, sorted(names - operators - MODULE_ATTRIBUTES)


def test_module_attributes_cover_every_emitted_module_class():
    """Every attribute an emitted Block, Stack or network Model sets or defines (and its bases) is reserved, so that
    an operator of a scheme or a network file named like one is refused instead of breaking the constructor."""
    import ast

    from conftest import GENERATED

    public = {"Block", "Stack", "Model", "_CanonicalModule", "_Network"}
    found = set()
    for path in (GENERATED / "torch").glob("*.py"):
        for cls in ast.parse(path.read_text()).body:
            if isinstance(cls, ast.ClassDef) and cls.name in public:
                found |= {item.name for item in cls.body if isinstance(item, ast.FunctionDef)}
                found |= {node.attr for node in ast.walk(cls) if isinstance(node, ast.Attribute)
                          and isinstance(node.ctx, ast.Store) and getattr(node.value, "id", "") == "self"}
    names = {name for name in found if name[0].isalpha()}
    assert names <= MODULE_ATTRIBUTES, sorted(names - MODULE_ATTRIBUTES)


@pytest.mark.parametrize("network, old, new", [
    ("resnet-block", 'conv1', 'stride'),
    ("vit", 'operator = "embed"', 'operator = "input_shape"'),
    ("vit", 'operator = "head"', 'operator = "n_classes"'),
])
def test_a_network_operator_named_like_a_model_attribute_is_refused(network, old, new, capsys, tmp_path):
    source = (ROOT / "symbolic" / "networks" / f"{network}.toml").read_text()
    assert old in source
    path = tmp_path / "clash.toml"
    path.write_text(source.replace(old, new).replace(f'name = "{network}"', 'name = "clash"'))
    _fails(capsys, "show", str(path), message="clashes with the attribute")


@pytest.mark.parametrize("steps, message", [
    ("[{ parallel = [[]] }]", "applies no operator"),
    ("[{ parallel = [[], []] }]", "applies no operator"),
    ("[" + "{ parallel = [[" * 40 + "]]}" * 40 + "]", "nest deeper than 32 levels"),
    ("[" + "{ parallel = [[" * 400 + "]]}" * 400 + "]", "nested too deeply"),  # beyond tomllib's recursion
])
def test_compositions_that_cannot_make_sense(steps, message, capsys, tmp_path):
    head, operators = VALID[:VALID.index("[operators]")], VALID[VALID.index("[operators]"):VALID.index("[[steps]]")]
    path = tmp_path / "odd.toml"
    path.write_text(f"{head}steps = {steps}\n{operators}")
    _fails(capsys, "show", str(path), message=message)


def test_two_schemes_with_one_name_in_one_derive(tmp_path, capsys):
    first, second = tmp_path / "a.toml", tmp_path / "b.toml"
    first.write_text(VALID)
    second.write_text(VALID.replace("fraction = 2", 'fraction = "3/2"'))
    _fails(capsys, "derive", str(first), str(second), "--out", str(tmp_path / "out"), message="would both be written")
    _fails(capsys, "derive", "post-ln", str(second), "--out", str(tmp_path / "out"), message="would both be written")
    assert not (tmp_path / "out").exists()
    assert main(["derive", "post-ln", "post-ln", "--out", str(tmp_path / "same"), "--backend", "numpy"]) == 0


def test_empty_names_and_folders(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, "derive", "post-ln", "--out", "", message="--out: empty folder name")
    _fails(capsys, "derive", "", message="empty scheme name")
    (tmp_path / "folder.toml").mkdir()
    _fails(capsys, "show", "folder.toml", message="is a folder")
    assert list(tmp_path.iterdir()) == [tmp_path / "folder.toml"]


def test_scheme_files_are_read_up_to_a_size(capsys, tmp_path):
    _fails(capsys, "show", "/dev/zero", message="it is a character device, not a regular file")
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 << 20))
    _fails(capsys, "show", str(big), message="larger than")


def test_a_fifo_is_refused_without_being_opened(capsys, tmp_path):
    """A FIFO blocks whoever opens it for reading: refused by kind, in one line, at once."""
    fifo, plugin = tmp_path / "f.toml", tmp_path / "f.py"
    os.mkfifo(fifo)
    os.mkfifo(plugin)
    message = "it is a FIFO (named pipe), not a regular file"
    _fails(capsys, "show", str(fifo), message=message)
    _fails(capsys, "derive", str(fifo), "--out", str(tmp_path / "out"), message=message)
    _fails(capsys, "show", "post-ln", "--load", str(plugin), message=message)
    _fails(capsys, "show", "post-ln", "--load", str(tmp_path / "absent.py"), message="no such file")  # control
    assert not (tmp_path / "out").exists()


def test_the_report_shows_html_as_text(tmp_path, capsys):
    path = tmp_path / "html.toml"
    path.write_text(_replace('description = """', 'description = """<script>alert(1)</script> & <b>bold</b>\n'))
    assert main(["derive", str(path), "--out", str(tmp_path / "out"), "--backend", "numpy"]) == 0
    report = (tmp_path / "out" / "reports" / "post_ln.md").read_text()
    assert "&lt;script>alert(1)&lt;/script> &amp; &lt;b>bold&lt;/b>" in report
    assert "<script>" not in report and "<b>" not in report


_LINKS = "[x](javascript:alert(3)) ![t](http://attacker.example/t.png)"
_ACTIVE = _LINKS + " $\\href{javascript:alert(4)}{c}$ [r][1]\n\n[1]: javascript:x\n```"


@pytest.mark.parametrize("field", ["summary", "description", "network summary"])
def test_the_report_shows_links_images_and_math_as_text(field, tmp_path):
    """Markdown's active constructs in a scheme's or network's text (a ``javascript:`` link, a remote image, a
    reference link, ``\\href`` in math) are shown as text: rendered (Python-Markdown, as mkdocs does), the report has
    no link or image."""
    import markdown

    text = _ACTIVE.replace(" $\\href{javascript:alert(4)}{c}$", "")  # a LaTeX link macro: refused, see below
    source, report = {
        "summary": (_replace('summary = "', f'summary = "{_LINKS} '), "post_ln"),
        "description": (_replace('description = """', f'description = """{text}\n'), "post_ln"),
        "network summary": ((ROOT / "symbolic" / "networks" / "resnet-block.toml").read_text().replace(
            'summary = "', f'summary = "{_LINKS} '), "resnet_block")}[field]
    path = tmp_path / "links.toml"
    path.write_text(source)
    assert main(["derive", str(path), "--out", str(tmp_path / "out"), "--backend", "numpy"]) == 0
    html = markdown.markdown((tmp_path / "out" / "reports" / f"{report}.md").read_text())
    assert "javascript:alert(3)" in html and "attacker.example" in html  # the text is there, as text
    assert "<a " not in html and "<img" not in html and "href=" not in html
    fenced = markdown.markdown(report_text := (tmp_path / "out" / "reports" / f"{report}.md").read_text(),
                               extensions=["fenced_code"])
    assert "<pre>" not in fenced and fenced.count("<h2>") == report_text.count("\n## ")  # attack 17: a ``` line
    control = markdown.markdown(_ACTIVE)  # the same text unescaped renders active links and images
    assert "<a " in control and "<img" in control


def test_a_description_holding_a_latex_link_macro_is_refused(tmp_path, capsys):
    """Attack 23: Markdown shows a description's ``\\(\\href{javascript:…}{x}\\)`` as ``\\(\\href…\\)``, which
    MathJax (its ``\\(`` delimiters on) renders as a link. The report is refused, nothing written."""
    path = tmp_path / "href.toml"
    path.write_text(_replace('description = """', 'description = """\\\\(\\\\href{javascript:alert(1)}{x}\\\\)\n'))
    assert main(["derive", str(path), "--out", str(tmp_path / "out"), "--backend", "numpy"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "would render a LaTeX link or HTML macro" in error, error
    assert not (tmp_path / "out").exists()


def test_an_interrupt_is_one_line_and_status_130(monkeypatch, capsys):
    def interrupted(*arguments, **keywords):
        raise KeyboardInterrupt

    import splitformer.symbolic.derivation as derivation

    monkeypatch.setattr(derivation, "derive", interrupted)
    capsys.readouterr()
    assert main(["show", "post-ln"]) == 130
    assert capsys.readouterr().err == "error: interrupted\n"


def _wait_for_cpu(pid: int, seconds: float) -> None:
    """Wait until process ``pid`` has used ``seconds`` of CPU (a loaded machine starts slowly)."""
    ticks = os.sysconf("SC_CLK_TCK")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            time.sleep(seconds)
            return
        if (int(fields[11]) + int(fields[12])) / ticks >= seconds:
            return
        time.sleep(0.05)


def test_sigint_during_check_in_a_real_process():
    # A second SIGINT once the first was reported (a Ctrl-C pressed twice, or one sent to the
    # whole process group as well) landed in the message or in the interpreter's shutdown,
    # after it restored the default disposition: a traceback, or death by the signal (-2).
    process = subprocess.Popen([sys.executable, "-m", "splitformer", "check"], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_cpu(process.pid, seconds=1.0)  # well past start-up: inside main()
    process.send_signal(signal.SIGINT)
    first = process.stderr.readline()
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 130 and first + err == "error: interrupted\n", first + err


def test_an_interrupt_inside_an_exec_still_ends_with_status_130(tmp_path):
    # CPython 3.11 marks a KeyboardInterrupt that leaves an exec of a string (a dataclass's
    # generated methods while a module is imported) as unhandled even when main() catches it;
    # 'python -m' then ended by re-raising SIGINT (status -2) after the message.
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\n"
        "import splitformer.codegen.cli as cli\n"
        "def interrupted(argv):\n"
        "    exec('raise KeyboardInterrupt')\n"
        "cli._run = interrupted\n"
        "sys.exit(cli.main())\n")
    result = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert (result.returncode, result.stderr) == (130, "error: interrupted\n"), result


def test_a_closed_pipe_ends_quietly(monkeypatch, capsys):
    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    assert main(["list"]) == 141
    assert capsys.readouterr().err == ""


def test_a_pipe_closed_by_head_in_a_real_process():
    command = f"{sys.executable} -m splitformer show post-ln --format toml | head -c 1; exit ${{PIPESTATUS[0]}}"
    result = subprocess.run(["bash", "-c", command], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode in (0, 141) and result.stderr == "" and result.stdout == "#"


def test_a_full_stdout_is_one_error_line():
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        result = subprocess.run([sys.executable, "-m", "splitformer", "list"], cwd=ROOT, stdout=full,
                                stderr=subprocess.PIPE, text=True)
    assert result.returncode == 2
    assert result.stderr == "error: cannot write to standard output: No space left on device\n"


# --- fuzzers -------------------------------------------------------------------------

_NAMES = st.one_of(st.sampled_from(["attn", "ffn", "norm1", "to", "class", "x" * 70, "attn\n", "a-b", "", "Attn",
                                    "final_norm", "u0", "np"]),
                   st.text(alphabet="abz_-0\n ", max_size=6))
_KINDS = st.sampled_from(["attention", "feed-forward", "layer-norm", "convolution", 3])
_NUMBERS = st.one_of(st.sampled_from(["1e5000", "1e309", "1/0", "1/2", "2", "-1", "0", "1" * 40, " 3/4 ", "nan", "inf",
                                      "0x10", "1_000", "1e-300"]),
                     st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.booleans())
_SUBSTEP = st.fixed_dictionaries({}, optional={
    "operator": _NAMES, "solver": st.sampled_from(["explicit", "projection", "exact", ""]), "fraction": _NUMBERS,
    "on": _NAMES, "extra": st.integers(0, 1)})
_TABLEAU = st.fixed_dictionaries({}, optional={"a": st.lists(st.lists(_NUMBERS, max_size=3), max_size=3),
                                               "b": st.lists(_NUMBERS, max_size=3), "label": st.text(max_size=3)})
_STEPS = st.recursive(
    st.lists(_SUBSTEP, max_size=3),
    lambda steps: st.lists(st.one_of(
        _SUBSTEP,
        st.fixed_dictionaries({"parallel": st.lists(steps, max_size=3)}, optional={"weights": st.lists(_NUMBERS, max_size=3)}),
        st.fixed_dictionaries({"rk2": st.lists(_SUBSTEP, max_size=2)}),
        st.fixed_dictionaries({"rk": st.one_of(st.sampled_from(["rk4", "heun", "mine", "nope"]), _TABLEAU),
                               "fields": st.lists(_SUBSTEP, max_size=2)}),
    ), max_size=3),
    max_leaves=12,
)
_DOCUMENTS = st.fixed_dictionaries(
    {"name": st.one_of(st.sampled_from(["fuzz", "post-ln", "class", "a" * 80, "t\n", "x-"]), st.text(max_size=5)),
     "operators": st.dictionaries(_NAMES, _KINDS, max_size=4), "steps": _STEPS},
    optional={"summary": st.text(max_size=20), "activation": st.sampled_from(["relu", "gelu", "swish", 1]),
              "description": st.text(max_size=20), "final_norm": st.one_of(st.booleans(), st.integers()),
              "order": st.one_of(st.integers(-1, 3), st.text(max_size=2)), "splitting_order": st.integers(-1, 3),
              "tableaux": st.dictionaries(st.sampled_from(["mine", "Bad", "x" * 70]), _TABLEAU, max_size=2)},
)


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return repr(value) if value == value and abs(value) != float("inf") else ("nan" if value != value else "inf")
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return "{" + ", ".join(f"{json.dumps(key)} = {_toml(item)}" for key, item in value.items()) + "}"


def _document(document: dict) -> str:
    return "\n".join(f"{json.dumps(key)} = {_toml(value)}" for key, value in document.items())


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(_DOCUMENTS)
def test_fuzz_structured_scheme_files(document):
    """Structured documents near the valid ones: a scheme that applies an operator, or one error line."""
    try:
        scheme = parse_scheme(_document(document), "fuzz.toml")
    except SplitformerError as error:
        assert "\n" not in str(error) and str(error).startswith("fuzz.toml")
    else:
        assert scheme.substeps()


def _mutated(document, draw_path, value):
    """``document`` with the value at ``draw_path`` (a list of keys and indices) replaced or removed."""
    import copy

    result = copy.deepcopy(document)
    node = result
    for key in draw_path[:-1]:
        node = node[key]
    if value is _DELETE:
        del node[draw_path[-1]]
    else:
        node[draw_path[-1]] = value
    return result


_DELETE = object()
_DUPLICATE = object()


def _value_at(document, path):
    for key in path:
        document = document[key]
    return document


def _paths(node, prefix=()):
    """Every path to a value in a parsed TOML document."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in items:
        yield prefix + (key,)
        yield from _paths(child, prefix + (key,))


_BUILTIN_DOCUMENTS = [tomllib.loads(load_scheme(name).source) for name in ("post-ln", "pre-ln", "parallel", "rk2", "rk4")]
_STRINGS = st.one_of(_NAMES, st.sampled_from(["projection", "explicit", "norm1", "norm2", "ffn", "attn", "1/3", "gelu"]))
_VALUES = st.one_of(st.just(_DELETE), _NUMBERS, _NAMES, _KINDS, st.lists(_SUBSTEP, max_size=2), _TABLEAU,
                    st.sampled_from([[], {}, [[]], {"parallel": [[]]}, "projection", "explicit", "norm1", "attn"]))


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_fuzz_mutated_builtin_schemes(data):
    """A built-in scheme with up to three values replaced or removed: it derives, or one error line."""
    document = data.draw(st.sampled_from(_BUILTIN_DOCUMENTS))
    for _ in range(data.draw(st.sampled_from([1, 1, 1, 2, 3]))):
        path = data.draw(st.sampled_from(list(_paths(document))))
        current = _value_at(document, path)
        alike = {str: _STRINGS, int: _NUMBERS, float: _NUMBERS, list: st.just(_DUPLICATE)}.get(type(current), _VALUES)
        value = data.draw(st.one_of(*[alike] * 6, _VALUES))  # mostly a value of the same type
        if value is _DUPLICATE:
            value = current + current[:1]
        document = _mutated(document, path, value)
    try:
        scheme = parse_scheme(_document(document), "fuzz.toml")
        derive(scheme)
    except SplitformerError as error:
        assert "\n" not in str(error)


_ARGUMENT = st.one_of(
    st.sampled_from(["list", "show", "derive", "check", "--format", "json", "toml", "latex", "--backend", "cuda",
                     "--activation", "swish", "--passes", "turbo", "--out", "", "--plots", "--force", "--all-builtins",
                     "post-ln", "missing.toml", "/dev/null", "/", "-", "--", "--version=2", "\n", "--help=x"]),
    st.text(max_size=6),
)


@settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))
@given(arguments=st.lists(_ARGUMENT, max_size=5))
def test_fuzz_command_lines(arguments, fast_stages, capsys):
    """Random command lines: a status, one ``error:`` line on failure, never an exception."""
    capsys.readouterr()
    try:
        status = cli.main(arguments)
    except SystemExit as exit:  # --help and --version print and exit 0, as argparse does
        assert exit.code == 0 and any(argument.startswith(("-h", "--h", "--v")) for argument in arguments), arguments
        return
    err = capsys.readouterr().err
    assert status in (0, 1, 2)
    if status == 2:
        assert err.count("\n") == 1 and err.startswith("error: "), err


@pytest.fixture
def fast_stages(monkeypatch, tmp_path):
    """Stand-ins for the slow stages: this fuzzer is about arguments and input files."""
    import splitformer.codegen.pipeline as pipeline

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(cli, "_show", lambda arguments: cli._load(arguments.scheme, arguments.activation).name)
    monkeypatch.setattr(cli, "_check", lambda arguments: ("", 0 * len([cli._load(n, None) for n in arguments.schemes])))
    monkeypatch.setattr(pipeline, "generate", lambda scheme, backends, out, passes=None: {})


def test_a_plot_folder_with_a_long_name_is_refused_before_the_checks(tmp_path, capsys, monkeypatch):
    import splitformer.codegen.verification.runner as checking

    monkeypatch.setattr(checking, "run_checks", lambda *arguments: pytest.fail("the checks ran"))
    long = "x" * 300
    _fails(capsys, "check", "post-ln", "--plots", str(tmp_path / long / "p"), message="--plots")
    _fails(capsys, "check", "post-ln", "--plots", str(tmp_path / "new" / long), message="is longer than")
    assert list(tmp_path.iterdir()) == []



@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux's /proc, where no file can be created")
@pytest.mark.parametrize("arguments, work, message", [
    (["derive", "post-ln", "--out", "/proc/splitformer-out"], "splitformer.codegen.pipeline.generate",
     "--out /proc/splitformer-out: cannot write in /proc"),
    (["check", "post-ln", "--plots", "/proc/splitformer-plots"], "splitformer.codegen.verification.runner.run_checks",
     "--plots /proc/splitformer-plots: cannot write in /proc"),
    (["compare", "post-ln", "--plot", "/proc/splitformer.png"], "splitformer.codegen.compare.compare",
     "--plot /proc/splitformer.png: cannot write in /proc"),
])
def test_an_unwritable_destination_is_refused_before_any_work(arguments, work, message, capsys, monkeypatch):
    monkeypatch.setattr(work, lambda *a, **k: pytest.fail("work began"))
    _fails(capsys, *arguments, message=message)


@pytest.mark.parametrize("arguments, message", [
    (["compare", "post-ln", "--plot", "plot.txt"], "the plot is a PNG image; name it *.png"),
    (["compare", "post-ln", "--sizes", "d=16,d=32"], "--sizes: d is given twice"),
    (["compare", "post-ln", "--sizes", "d=0"], "with positive integers up to 2**31, got 'd=0'"),
    (["compare", "post-ln", "--sizes", "d=2147483649"], "up to 2**31, got 'd=2147483649'"),  # attack 25
])
def test_bad_compare_options(arguments, message, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _fails(capsys, *arguments, message=message)
    assert list(tmp_path.iterdir()) == []


def test_compare_takes_one_name_as_one_scheme_and_checks_sizes():
    from splitformer.codegen.compare import compare

    assert [row.scheme for row in compare("pre-ln").rows] == ["pre-ln"]
    for sizes in ({"d": -1}, {"d": 2.5}, {"width": 8}, [("d", 8)]):
        with pytest.raises(SplitformerError, match="sizes"):
            compare("pre-ln", sizes=sizes)


@pytest.mark.parametrize("arguments, message", [
    (["--d-model", "4000000"], "d-model = 4000000 is above 16384"),
    (["--tokens", "100000000"], "tokens = 100000000 is above 65536"),
    (["--seeds", "1000000000"], "seeds = 1000000000 is above 1000"),
    (["--d-model", "8192", "--layers", "64"], "the weights (at least layers × d-model × max(d-model, d-ff)) would hold"),
    (["--batch", "4096", "--tokens", "4096"], "one activation (batch × tokens × max(d-model, d-ff)) would hold"),
])
def test_a_study_too_large_for_one_machine_is_refused_before_any_work(arguments, message, capsys, tmp_path,
                                                                      monkeypatch):
    """Sizes within every other check but beyond memory (a 64 TB weight, 6 GB tokens) or time (10⁹ seeds): one line."""
    monkeypatch.chdir(tmp_path)
    _fails(capsys, "study", "post-ln", "--steps", "1", *arguments, message=message)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["compare", "study"])
@pytest.mark.parametrize("network", ["resnet-block", "vit"])
def test_compare_given_a_network_file_says_it_is_one(network, command, capsys, tmp_path, monkeypatch):
    """Attack 15: a network file where a block scheme is expected was read as a scheme ("unknown field 'step'"); the
    message names the commands that take it (tester s39: study was missing, and a 'step: …' prefix read as garbled)."""
    monkeypatch.chdir(tmp_path)
    field = "step" if network == "resnet-block" else "embedding"
    _fails(capsys, command, str(ROOT / "symbolic" / "networks" / f"{network}.toml"),
           message=f"{network}.toml: this is a network file (its field '{field}'), where a block scheme is expected "
                   "(derive, show and check take networks; compare, study and")
    assert list(tmp_path.iterdir()) == []


def test_an_error_line_writes_terminal_escapes_as_text(tmp_path, capsys):
    """Attack 20: a network file's ``steps.scheme`` holding ESC/BEL sequences reached stderr as bytes (on a terminal:
    a new window title, a cleared screen, colours). Written as escapes; the line stays one line."""
    network = tmp_path / "esc.toml"
    network.write_text((ROOT / "symbolic" / "networks" / "vit.toml").read_text().replace(
        'scheme = "pre-ln"', 'scheme = "\\u001b]0;TITLE\\u0007\\u001b[2J\\u001b[31mnosuch.toml"'))
    assert main(["show", str(network)]) == 2
    error = capsys.readouterr().err
    assert "\x1b" not in error and "\x07" not in error and "\\x1b]0;TITLE\\x07\\x1b[2J" in error, error
    assert error.count("\n") == 1


@pytest.mark.parametrize("command", [["compare"], ["check"], ["study"]])
def test_two_schemes_of_one_name_are_refused_where_results_are_told_apart_by_name(command, tmp_path, capsys,
                                                                                  monkeypatch):
    """Attack 27: a copy of rk4 still named post-ln (``show post-ln --format toml`` is the documented start of a
    file) was merged with the built-in: compare plotted one curve of two, check reported post-ln as order 4 and
    wrote both plots to one file. Refused before any work, as derive and study refuse it; control: another name."""
    assert main(["show", "rk4", "--format", "toml"]) == 0
    mine = tmp_path / "mine.toml"
    mine.write_text(capsys.readouterr().out.replace('name = "rk4"', 'name = "post-ln"', 1))
    monkeypatch.setattr("splitformer.codegen.verification.runner.scheme_checks", lambda *a, **k: pytest.fail("work"))
    _fails(capsys, *command[:1], "post-ln", str(mine), *command[1:],
           message=f"{command[0]}: a scheme is given twice: post-ln (results are told apart by name; rename one)")
    if command == ["compare"]:
        mine.write_text(mine.read_text().replace('name = "post-ln"', 'name = "my-rk4"', 1))
        assert main(["compare", "post-ln", str(mine)]) == 0 and "my-rk4" in capsys.readouterr().out


@pytest.mark.parametrize("arguments, message", [
    (["derive", "post-ln", "--load", ""], "error: plug-in file: empty name (expected a Python file, .py)"),
    (["compare", "post-ln", "--plot", ""], "error: --plot: empty file name (the plot is a PNG image; name it *.png)"),
    (["check", "post-ln", "--plots", ""], "error: --plots: empty folder name (use '.' for the current folder)")])
def test_an_empty_file_name_is_said_to_be_empty(arguments, message, capsys, tmp_path, monkeypatch):
    """Attacker s39 L9: '' was reported as '.' (Path('') is the current folder)."""
    monkeypatch.chdir(tmp_path)
    assert main(arguments) == 2
    assert capsys.readouterr().err == message + "\n" and list(tmp_path.iterdir()) == []
