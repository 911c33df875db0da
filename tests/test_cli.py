"""The command line: output, files written, and bad input (exit 2, one line, nothing written)."""

import os
import subprocess
import sys

import pytest

from splitformer.codegen.cli import main

from conftest import ROOT


def run(*arguments, cwd=ROOT):
    result = subprocess.run([sys.executable, "-m", "splitformer.codegen.cli", *arguments], capture_output=True, text=True, cwd=cwd)
    return result.returncode, result.stdout, result.stderr


def test_list_prints_each_builtin_with_a_summary(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines]
    assert names[:2] == ["post-ln", "pre-ln"]
    assert all(len(line.split(None, 1)) == 2 for line in lines)


@pytest.mark.parametrize("fmt, marker", [("text", "attn_q[i, m, e] ="), ("latex", r"\sum_{k}"),
                                         ("markdown", "## 1. The continuous equation"), ("toml", 'name = "post-ln"')])
def test_show_formats(fmt, marker, capsys):
    assert main(["show", "post-ln", "--format", fmt]) == 0
    assert marker in capsys.readouterr().out


def test_show_names_the_equation_the_fractions_make(tmp_path, capsys):
    """A fraction changes the continuous equation (its coefficient): ``show``'s text says which equation it is."""
    from splitformer.symbolic.builtins import builtin_text

    text = builtin_text("macaron")
    assert main(["show", "macaron"]) == 0
    assert capsys.readouterr().out.splitlines()[1] == (
        "equation: u_t = 1/2·ffn_pre(u) − ∂I_S1[norm1](u) + attn(u) − ∂I_S1[norm2](u) + 1/2·ffn_post(u) − ∂I_S1[norm3](u)")
    tenth = tmp_path / "tenth.toml"
    tenth.write_text(text.replace('fraction = "1/2"', 'fraction = "1/10"').replace("splitting_order = 1\n", ""))
    assert main(["show", str(tenth)]) == 0
    assert capsys.readouterr().out.splitlines()[1].startswith("equation: u_t = 1/10·ffn_pre(u) − ∂I_S1[norm1](u)")


@pytest.mark.parametrize("name, beta", [("heavy-ball", "1/2"), ("nesterov", "3/10")])
def test_show_names_the_equation_momentum_across_layers_is_consistent_with(name, beta, capsys):
    """Momentum β with a fixed β sums the increments to G/(1 − β) (a geometric series): 2·G, 10/7·G (written here)."""
    assert main(["show", str(ROOT / "tests" / "schemes" / f"{name}.toml")]) == 0
    scale = {"1/2": "2", "3/10": "10/7"}[beta]
    assert capsys.readouterr().out.splitlines()[1].endswith(
        f"= G, its steps' field; with {name} momentum β = {beta} across layers the stack is consistent with "
        f"u_t = {scale}·G")
    assert main(["show", str(ROOT / "tests" / "schemes" / "adams-bashforth.toml")]) == 0  # consistent with G itself
    assert capsys.readouterr().out.splitlines()[1].endswith("ffn(Proj[norm2](u))")


def test_a_parallel_steps_title_says_what_it_computes(tmp_path, capsys):
    """Each branch as it updates u (its fraction, its field's projected state, a projection as Proj), the weights
    with their signs: post-LN's relaxation and a step of a projection branch and negative weights."""
    assert main(["show", "post-ln"]) == 0
    assert "substep 3: parallel: 1/2·(u + 2Δt·ffn(u)) + 1/2·u" in capsys.readouterr().out.splitlines()
    scheme = tmp_path / "parproj.toml"
    scheme.write_text('name = "parproj"\nsummary = "s"\n[operators]\nnorm = "layer-norm"\nffn = "feed-forward"\n'
                      '[[steps]]\nparallel = [[{ operator = "norm", solver = "projection" }], '
                      '[{ operator = "ffn", solver = "explicit", fraction = "-1/2", on = "norm" }], '
                      '[{ operator = "ffn", solver = "explicit", fraction = "3" }]]\nweights = ["2", "-1/2", "-1/2"]\n')
    assert main(["show", str(scheme)]) == 0
    assert ("substep 1: parallel: 2·Proj[norm](u) − 1/2·(u − (1/2)Δt·ffn(Proj[norm] u)) − 1/2·(u + 3Δt·ffn(u))"
            in capsys.readouterr().out.splitlines())


def test_show_toml_carries_the_chosen_activation(capsys):
    assert main(["show", "pre-ln", "--format", "toml", "--activation", "gelu"]) == 0
    from splitformer.symbolic import parse_scheme

    assert parse_scheme(capsys.readouterr().out).activation == "gelu"


def test_derive_writes_modules_reports_and_package_files(tmp_path, capsys):
    assert main(["derive", "post-ln", "--out", str(tmp_path), "--backend", "numpy"]) == 0
    assert (tmp_path / "numpy" / "post_ln.py").is_file()
    assert (tmp_path / "reports" / "post_ln.md").is_file()
    assert (tmp_path / "__init__.py").is_file() and (tmp_path / "numpy" / "__init__.py").is_file()
    assert not (tmp_path / "torch").exists()


def test_derive_a_scheme_file(tmp_path):
    scheme = tmp_path / "mine.toml"
    scheme.write_text((ROOT / "symbolic" / "schemes" / "post-ln.toml").read_text().replace('"post-ln"', '"mine"'))
    assert main(["derive", str(scheme), "--out", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "torch" / "mine.py").is_file()


@pytest.mark.parametrize("arguments, message", [
    (["show", "no-such-scheme"], "unknown scheme 'no-such-scheme'"),
    (["derive", "post-ln", "--backend", "cuda"], "invalid choice: 'cuda'"),
    (["show", "post-ln", "--format", "pdf"], "invalid choice: 'pdf'"),
    (["derive", "post-ln", "--activation", "swish"], "unknown activation 'swish'"),
    (["derive", "missing.toml"], "cannot read scheme or network file missing.toml"),
    (["derive"], "name at least one SCHEME"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["derive", "post-ln", "--passes", "turbo"], "unknown pass 'turbo'"),
    (["derive", "post-ln", "--passes", " "], "the pass list ' ' names no pass"),
    (["derive", "post-ln", "--passes", ",,"], "the pass list ',,' names no pass"),
    (["derive", "post-ln", "--passes", "all,none"], "the pass list 'all,none': 'all' and 'none' stand alone"),
    (["derive", "post-ln", "--passes", "matmul,all"], "'all' and 'none' stand alone, not in a list of pass names"),
    (["derive", "post-ln", "--name", "numpy"], "'numpy' is the name of a module the generated code imports"),
    (["derive", "post-ln", "--name", "weakref"], "--name: 'weakref' is the name of a module the generated code imports"),
    (["show", "post-ln", "--format", "text", "pre-ln"], "unrecognized arguments: pre-ln"),  # show takes one
    (["derive", "post-ln", "--backend", "numpy", "pre-ln", "--bogus"], "unrecognized arguments: --bogus"),
    (["derive", "post-ln", "--backend", "numpy", "torch"],  # an option's second value is not read as a scheme
     "unrecognized arguments: torch (after an option, a scheme is a built-in name or a file)"),
])
def test_bad_input_is_one_error_line_exit_2_and_writes_nothing(arguments, message, tmp_path):
    code, out, err = run(*arguments, "--out", str(tmp_path / "out")) if arguments[0] == "derive" else run(*arguments)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and message in err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_the_refused_module_names_are_every_module_the_generated_code_imports():
    """Attack 24: ``--name numpy`` wrote ``numpy/numpy.py``, which imports itself as ``np`` when run from there."""
    import ast

    from splitformer.symbolic.names import IMPORTED_MODULES

    imported = set()
    for path in [*(ROOT / "generated").glob("numpy/*.py"), *(ROOT / "generated").glob("torch/*.py")]:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {alias.name.partition(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.partition(".")[0])
    assert imported - {"__future__"} == IMPORTED_MODULES


def test_schemes_may_follow_options(tmp_path, capsys):
    """Attack 24: ``derive post-ln --out DIR pre-ln`` was refused ("unrecognized arguments: pre-ln")."""
    assert main(["derive", "post-ln", "--out", str(tmp_path / "out"), "pre-ln", "--backend", "numpy"]) == 0
    assert sorted(path.name for path in (tmp_path / "out" / "numpy").glob("*_ln.py")) == ["post_ln.py", "pre_ln.py"]
    capsys.readouterr()
    assert main(["compare", "post-ln", "--format", "markdown", "rk2"]) == 0
    out = capsys.readouterr().out
    assert "`post-ln`" in out and "`rk2`" in out
    assert main(["derive", "post-ln", "--out", str(tmp_path / "dashes"), "--", "pre-ln", "--backend", "numpy"]) == 2
    assert "unknown scheme '--backend'" in capsys.readouterr().err  # after '--' everything is a scheme
    assert main(["derive", "post-ln", "--backend", "numpy", "--out", str(tmp_path / "typo"), "no-such.toml"]) == 2
    assert "cannot read scheme or network file no-such.toml" in capsys.readouterr().err  # a file's own message
    assert main(["derive", "post-ln", "--backend", "numpy", "--out", str(tmp_path / "after"), "--", "pre-ln"]) == 0
    assert (tmp_path / "after" / "numpy" / "pre_ln.py").exists()


def test_invalid_scheme_file_writes_nothing_even_after_a_valid_one(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nsummary = "x"\n[operators]\nattn = "attention"\n[[steps]]\noperator = "attn"\nsolver = "projection"\n')
    code, _, err = run("derive", "post-ln", str(bad), "--out", str(tmp_path / "out"))
    assert code == 2 and "is a vector field, not a projection" in err and str(bad) in err
    assert not (tmp_path / "out").exists()


def test_console_script_is_installed():
    import shutil

    script = shutil.which("splitformer", path=str(ROOT / ".venv" / "bin")) or shutil.which("splitformer")
    assert script, "the splitformer console script is not on PATH"
    assert subprocess.run([script, "list"], capture_output=True, text=True).stdout.startswith("post-ln")


_OWN_SECOND = '''name = "two-ffn"
summary = "pre-LN with a second feed-forward naming its own activation"
{top}
[operators]
norm1 = "layer-norm"
ffn = "feed-forward"

[operators.ffn2]
kind = "feed-forward"
activation = "silu"

[[steps]]
operator = "ffn"
solver = "explicit"
on = "norm1"

[[steps]]
operator = "ffn2"
solver = "explicit"
on = "norm1"
'''


@pytest.mark.parametrize("top", ["", 'activation = "gelu"  # the default of this file'])
def test_show_toml_keeps_an_operators_own_activation(top, tmp_path, capsys):
    """Attack 22: ``show --format toml`` replaced the first ``activation = …`` line anywhere, an operator table's own
    (SiLU printed as ReLU) when the file had no top-level one. The file is printed as it is; ``--activation``
    changes only the top-level line, and the printed file computes what was asked."""
    from splitformer.symbolic.scheme_file import parse_scheme

    path = tmp_path / "two.toml"
    path.write_text(_OWN_SECOND.format(top=top))
    assert main(["show", str(path), "--format", "toml"]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip("\n") == path.read_text().rstrip("\n")
    assert main(["show", str(path), "--format", "toml", "--activation", "tanh"]) == 0
    changed = parse_scheme(capsys.readouterr().out)
    assert changed.activation == "tanh" and changed.options["ffn2"]["activation"] == "silu"


def test_a_closed_stdout_is_no_traceback(tmp_path):
    """Attack 25: started with its stdout closed (``>&-``), a command ended with a traceback and status 1 after its
    work was done (``sys.stdout`` is None then)."""
    def closed_stdout():
        os.close(1)

    for arguments in (["list"], ["derive", "post-ln", "--backend", "numpy", "--out", str(tmp_path / "out")]):
        result = subprocess.run([sys.executable, "-m", "splitformer.codegen.cli", *arguments], stderr=subprocess.PIPE,
                                text=True, cwd=ROOT, preexec_fn=closed_stdout)
        assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert (tmp_path / "out" / "numpy" / "post_ln.py").is_file()


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    """Attack 25: under ``ulimit -v`` a derivation ended with a MemoryError traceback."""
    import splitformer.codegen.cli as cli

    def exhausted(argv):
        raise MemoryError

    monkeypatch.setattr(cli, "_run", exhausted)
    assert main(["derive", "post-ln"]) == 2
    assert capsys.readouterr().err == "error: out of memory (files are written whole or not at all)\n"


def test_a_ctrl_c_after_the_command_is_done_changes_nothing():
    """Attack 25: a SIGINT after every "wrote" line ended the process by the signal (status −2 / 130), silently."""
    script = ("import os, signal, sys\nsys.argv = ['splitformer', 'list']\nimport splitformer.codegen.cli as cli\n"
              "exit = sys.exit\nsys.exit = lambda status: (os.kill(os.getpid(), signal.SIGINT), exit(status))\n"
              "cli.console()\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT)
    assert (result.returncode, result.stderr) == (0, "") and result.stdout.startswith("post-ln")


def test_a_caller_of_main_keeps_its_own_ctrl_c(capsys):
    """Review 25: ``main`` with this process's arguments left SIGINT ignored for the rest of a notebook's process."""
    import signal

    handler = signal.getsignal(signal.SIGINT)
    assert main(["list"]) == 0 and signal.getsignal(signal.SIGINT) is handler
