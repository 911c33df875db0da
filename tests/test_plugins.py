"""A user's own file adds an operator, a projection and a solver; TOML and Python use them.

The CLI runs in subprocesses (``--load``); the Python API test loads the file in-process.
"""

import os
import subprocess
import sys

import numpy as np
import pytest
import sympy as sp

import splitformer
from splitformer.codegen.cli import main
from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic.constraints import Bound, ConstraintSet, U
from splitformer.symbolic.projections import SYMBOLS, derive_projection

from conftest import ROOT, import_path

PLUGIN = ROOT / "tests" / "plugins" / "my_kinds.py"
SCHEME = ROOT / "tests" / "plugins" / "plugin-scheme.toml"


def _cli(*arguments, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "splitformer", *arguments], capture_output=True, text=True, cwd=cwd)


def _reference(u, params):
    """Ralston's method for G(u) = (u − mean u) W + b, written from the formulas."""
    def field(v):
        return (v - v.mean(-1, keepdims=True)) @ params["lin.W"] + params["lin.b"]

    k1 = field(u)
    k2 = field(u + 2 / 3 * k1)
    return u + k1 / 4 + 3 * k2 / 4


def test_scheme_files_do_not_load_code_by_themselves(tmp_path):
    result = _cli("derive", str(SCHEME), "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "unknown operator 'centre'" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def test_cli_load_derives_emits_and_checks(tmp_path):
    result = _cli("derive", "--load", str(PLUGIN), str(SCHEME), "--out", str(tmp_path), "--backend", "numpy")
    assert result.returncode == 0, result.stderr
    module = import_path(tmp_path / "numpy" / "plugin_scheme.py")
    rng = np.random.default_rng(5)
    params = {"lin.W": rng.standard_normal((6, 6)) * 0.5, "lin.b": rng.standard_normal(6)}
    u = rng.standard_normal((2, 3, 6))
    assert np.abs(module.forward(u, params) - _reference(u, params)).max() <= 1e-12
    check = _cli("check", "--load", str(PLUGIN), str(SCHEME), "--format", "json")
    assert check.returncode == 0, check.stdout
    assert '"order": 2' in check.stdout and '"order/plugin-scheme"' in check.stdout
    assert _cli("show", "--load", str(PLUGIN), str(SCHEME)).returncode == 0


@pytest.mark.parametrize("path, message", [
    ("tests/plugins/missing.py", "no such file"),
    ("tests/plugins/plugin-scheme.toml", "expected a Python file"),
])
def test_bad_load_is_one_clear_error(path, message):
    result = _cli("derive", "--load", path, str(SCHEME))
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def test_a_failing_user_file_is_one_clear_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    result = _cli("derive", "--load", str(broken), "post-ln", "--out", str(tmp_path / "out"))
    assert result.returncode == 2 and "RuntimeError: boom" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("source, message", [
    ("class Custom(BaseException):\n    pass\nraise Custom('boom')\n", "Custom: boom"),
    ("import sys\nsys.stdout.close()\n", "the plug-in closed sys.stdout"),
    ("import sys\nsys.stderr.close()\n", "the plug-in closed sys.stderr"),
])
def test_a_base_exception_or_a_closed_stream_is_a_failed_load(source, message, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text(source)
    result = _cli("show", "post-ln", "--load", str(broken))
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"error: --load {broken}: {message}\n")


def test_python_api_loads_the_same_file_and_derives(tmp_path):
    module = splitformer.load_plugin(PLUGIN)
    assert splitformer.load_plugin(PLUGIN) is module  # loading twice registers nothing twice
    scheme = splitformer.load_scheme(str(SCHEME))
    write_files(generate(scheme, ("numpy", "torch"), tmp_path))
    numpy_module = import_path(tmp_path / "numpy" / "plugin_scheme.py")
    torch_module = import_path(tmp_path / "torch" / "plugin_scheme.py")
    rng = np.random.default_rng(6)
    params = {"lin.W": rng.standard_normal((4, 4)), "lin.b": rng.standard_normal(4)}
    u = rng.standard_normal((1, 5, 4))
    expected = _reference(u, params)
    assert np.abs(numpy_module.forward(u, params) - expected).max() <= 1e-12
    import torch

    block = torch_module.Block(4, 1, 4, dtype=torch.float64).load_params(params)
    assert np.abs(block(torch.tensor(u)).detach().numpy() - expected).max() <= 1e-12
    assert module.Centre.projection().formula == SYMBOLS.v - SYMBOLS.alpha


def test_the_deriver_handles_a_box_by_its_kkt_cases():
    """Negative space of the deriver: a two-sided bound splits into three KKT cases → clip."""
    box = ConstraintSet("box", r"[0, 1]", bounds=(Bound(U), Bound(1 - U)))
    formula = derive_projection(box).formula
    for value, expected in ((-2, 0), (sp.Rational(1, 3), sp.Rational(1, 3)), (5, 1)):
        assert formula.subs(SYMBOLS.v, value) == expected


def test_python_built_scheme_with_the_users_kinds_and_tableau():
    from splitformer.codegen.verification.statements.order import splitting_order
    from splitformer.symbolic.scheme import RungeKutta, Scheme, Sequence, Substep

    module = splitformer.load_plugin(PLUGIN)
    scheme = Scheme("ralston-python", "built in Python", {"centre": "centre", "lin": "affine-field"},
                    Sequence((RungeKutta((Substep("lin", "explicit", on="centre"),), module.RALSTON),)))
    scheme.check()
    assert splitting_order(scheme).order == 2 and module.RALSTON.order() == 2


def test_options_of_a_users_kind_are_checked():
    splitformer.load_plugin(PLUGIN)
    base = 'name = "s"\nsummary = "s"\n[operators]\nf = {}\n[[steps]]\noperator = "f"\nsolver = "explicit"\n'
    scheme = splitformer.parse_scheme(base.replace("f = {}", 'f = { kind = "scaled-field", scale = 0.5 }'))
    assert scheme.instantiate()["f"].scale == 0.5
    with pytest.raises(splitformer.SplitformerError, match="needs the option 'scale'"):
        splitformer.parse_scheme(base.replace("f = {}", 'f = "scaled-field"'))
    with pytest.raises(splitformer.SplitformerError, match="expected a number, string or boolean"):
        splitformer.parse_scheme(base.replace("f = {}", 'f = { kind = "scaled-field", scale = [1] }'))


def test_a_users_box_projection_emits_a_clip(tmp_path):
    import torch

    splitformer.load_plugin(PLUGIN)
    scheme = splitformer.parse_scheme('name = "clipped"\nsummary = "s"\n[operators]\nbox = "clip"\n'
                                      '[[steps]]\noperator = "box"\nsolver = "projection"\n')
    write_files(generate(scheme, ("numpy", "torch"), tmp_path))
    u = np.random.default_rng(7).standard_normal((2, 3, 5)) * 2
    numpy_module = import_path(tmp_path / "numpy" / "clipped.py")
    torch_module = import_path(tmp_path / "torch" / "clipped.py")
    assert np.array_equal(numpy_module.forward(u, {}), np.clip(u, 0, 1))
    assert np.array_equal(torch_module.Block(5, 1, 1, dtype=torch.float64)(torch.tensor(u)).numpy(), np.clip(u, 0, 1))


def test_the_deriver_refuses_what_it_cannot_decide():
    """Negative controls of the deriver's own checks: case split and root selection."""
    from splitformer.symbolic.constraints import G, Moment, Statistic
    from splitformer.symbolic.errors import SplitformerError

    empty = ConstraintSet("empty", "", bounds=(Bound(U - 1), Bound(-U)))  # u ≥ 1 and u ≤ 0
    with pytest.raises(SplitformerError, match="do not cover the real line"):
        derive_projection(empty)
    radius = sp.Symbol("r", real=True)  # its sign unknown: which root is nearer cannot be decided
    sphere = ConstraintSet("sphere", "", moments=(Moment(U**2, radius**2, G**2),), ghost=True,
                           statistics=(Statistic("rho", sp.Symbol("rho", positive=True), r"\rho", SYMBOLS.v**2, ""),))
    with pytest.raises(SplitformerError, match="cannot decide which stationary point is nearest"):
        derive_projection(sphere)
    cubic = ConstraintSet("cubic", "", moments=(Moment(U**3, 1),))
    with pytest.raises(SplitformerError, match="at most quadratic"):
        derive_projection(cubic)


_SIGMOID = """
from dataclasses import dataclass, replace
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import ETA, H, X, X_KEY
from splitformer.symbolic.operators import SUPPORT, Attention, apply, integral, register_operator


@register_operator
@dataclass(frozen=True)
class {name}(Attention):
    kind: ClassVar[str] = "{kind}"

    def definitions(self):
        definitions = list(super().definitions())
        at = [definition.function for definition in definitions].index("gamma")
        gamma = apply(SUPPORT, X, X_KEY) / (1 + sp.exp(-apply("a", H, X, X_KEY)))
        definitions[at] = replace(definitions[at], rhs=gamma{normalized}, absorbs={absorbs})
        return tuple(definitions)
"""


@pytest.mark.parametrize("name, normalized, absorbs, refused", [
    ("RawSigmoid", "", "()", True),  # ∫ γ v dx̃ keeps its Δx̃
    ("AbsorbedSigmoid", "", "(X_KEY,)", True),  # declared, but nothing in γ brings the spacing to cancel it
    ("MeanSigmoid", " / integral(apply(SUPPORT, X, ETA), ETA)", "(X_KEY,)", False),  # the count brings it
])
def test_a_spacing_left_over_names_itself_and_the_remedy(tmp_path, name, normalized, absorbs, refused):
    kind = f"qa-{name.lower()}-attention"
    plugin = tmp_path / f"{name.lower()}.py"
    plugin.write_text(_SIGMOID.format(name=name, kind=kind, normalized=normalized, absorbs=absorbs))
    splitformer.load_plugin(plugin)
    scheme = splitformer.parse_scheme(f'name = "s"\nsummary = "s"\n[operators]\nattn = "{kind}"\n'
                                      '[[steps]]\noperator = "attn"\nsolver = "explicit"\n')
    if not refused:
        assert splitformer.derive(scheme).numpy_module() is not None
        return
    with pytest.raises(splitformer.SplitformerError) as error:
        splitformer.derive(scheme).numpy_module()
    assert str(error.value).startswith("attn: the grid spacing Δx did not cancel in ")
    assert ("nothing in its formula brings that spacing" if absorbs != "()" else "absorbs=(…,) on the Definition") \
        in str(error.value) and str(error.value).endswith("'Quadrature weights'")


_ALIBI = ROOT / "tests" / "plugins" / "alibi.py"
_MEANING = r", plus the head's linear bias in $|p(x) - p(\tilde{x})|$"


def _derive_alibi_meaning(tmp_path, meaning):
    """``derive`` of one ALiBi step with the plug-in's meaning replaced by ``meaning`` (the shipped one: ``None``)."""
    plugin = tmp_path / "alibi_markup.py"
    text = _ALIBI.read_text()
    plugin.write_text(text if meaning is None else text.replace(_MEANING, meaning.replace("\\", "\\\\")))
    assert (_MEANING in plugin.read_text()) == (meaning is None)
    scheme = tmp_path / "s.toml"
    scheme.write_text('name = "s"\nsummary = "ALiBi"\nactivation = "relu"\n[operators]\nnorm1 = "layer-norm"\n'
                      'attn = "alibi-attention"\n[[steps]]\noperator = "attn"\nsolver = "explicit"\non = "norm1"\n')
    return subprocess.run([sys.executable, "-m", "splitformer", "derive", str(scheme), "--load", str(plugin),
                           "--backend", "numpy", "--out", str(tmp_path / "out")], capture_output=True, text=True)


@pytest.mark.parametrize("meaning, message", [
    (", plus <img src=x onerror=alert(6)>", "meaning: must hold no markup"),
    (", plus [click](http://evil.example/)", "meaning: must hold no markup"),
    (", plus $x", "meaning: must hold no markup (no '<', link, image or \\href, its '$' in pairs)"),
    (r", plus $\\href{javascript:alert(1)}{x}$", "meaning: must hold no markup"),
    (r", plus $\\mmlToken{mi}[href='javascript:alert(1)']{m}$", "meaning: must hold no markup"),  # attack 20
    (", plus [x]: javascript:alert(1)", "meaning: must hold no markup"),
    (", plus *x*{: onclick=alert(1) }", "meaning: must hold no markup"),
])
def test_a_plugin_whose_text_holds_markup_is_refused(tmp_path, meaning, message):
    """Attack 18: a plug-in definition's meaning (one printable line) went into the report as live HTML and links.
    Refused when the kind is checked, in one line naming it."""
    result = _derive_alibi_meaning(tmp_path, meaning)
    assert result.returncode == 2 and message in result.stderr and result.stderr.count("\n") == 1, result.stderr
    assert not (tmp_path / "out").exists()


def test_the_plugin_with_its_own_meaning_derives(tmp_path):
    """The control of the test above: the same plug-in and scheme with the meaning as shipped."""
    result = _derive_alibi_meaning(tmp_path, None)
    assert result.returncode == 0 and (tmp_path / "out" / "numpy" / "s.py").exists(), result.stderr


def test_an_unreadable_plugin_is_the_same_one_line_as_an_unreadable_folder(tmp_path, monkeypatch):
    """Attack 25: an unreadable file said "PermissionError: [Errno 13] Permission denied: '…'" (its import's text),
    the same file in an unreadable folder "Permission denied". (The suite runs as root: the refusal is simulated.)"""
    import splitformer.symbolic.plugins as plugins

    path = tmp_path / "unread.py"
    path.write_text("raise SystemExit('never run')\n")
    real = os.open

    def refused(name, flags, *rest):
        if os.fspath(name) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real(name, flags, *rest)

    monkeypatch.setattr(plugins.os, "open", refused)
    with pytest.raises(splitformer.SplitformerError) as error:
        splitformer.load_plugin(path)
    assert str(error.value) == f"plug-in {path}: Permission denied"


def test_the_python_api_names_no_command_line_option(tmp_path, capsys):
    """``load_plugin`` names the plug-in; the command line names its ``--load`` option, with the same reason."""
    missing = tmp_path / "missing.py"
    with pytest.raises(splitformer.SplitformerError) as error:
        splitformer.load_plugin(missing)
    assert str(error.value) == f"plug-in {missing}: no such file"
    assert (error.value.path, error.value.reason) == (missing, "no such file")
    assert main(["show", "--load", str(missing), "post-ln"]) == 2
    assert capsys.readouterr().err == f"error: --load {missing}: no such file\n"


_LINEAR = """
from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import {domains}, XI, X, Y
from splitformer.symbolic.operators import STATE, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class {name}(Operator):
    kind: ClassVar[str] = "{kind}"
    symbol: ClassVar[str] = "L"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), ({shape}), absorbs=(XI,)),)

    def definitions(self):
        w = self.parameters()[0].applied()
        return (Definition("out", "L", (X, Y), integral(w * apply(STATE, X, XI), XI), "a linear map"),)
"""


@pytest.mark.parametrize("shape, refused", [("HIDDEN, FEATURES", True), ("FEATURES, FEATURES", False)])
def test_a_kernel_stored_unlike_its_arguments_is_refused(tmp_path, shape, refused):
    """New user L2 (session 32): ``kernel("W", …, (ξ, y), (d_ff, d))`` derived, and its module then listed a ``(d_ff,
    d)`` parameter that failed inside NumPy's matmul. Refused at derive, exit 2, one line; the control stores (d, d)."""
    name = "Hidden" if refused else "Square"
    plugin = tmp_path / f"{name.lower()}.py"
    plugin.write_text(_LINEAR.format(domains="FEATURES, HIDDEN", name=f"{name}Linear", kind=f"qa-{name.lower()}-linear",
                                     shape=shape))
    scheme = tmp_path / "s.toml"
    scheme.write_text(f'name = "s"\nsummary = "s"\n[operators]\nf = "qa-{name.lower()}-linear"\n'
                      '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    result = subprocess.run([sys.executable, "-m", "splitformer", "derive", str(scheme), "--load", str(plugin),
                             "--backend", "numpy", "--out", str(tmp_path / "out")], capture_output=True, text=True)
    if not refused:
        assert result.returncode == 0 and (tmp_path / "out" / "numpy" / "s.py").exists(), result.stderr
        return
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "parameter W: stored as (d_ff, d), but its arguments run over (d, d)" in result.stderr
    assert not (tmp_path / "out").exists()


def test_what_a_stored_axis_may_hold():
    """The layouts of the built-in kinds hold (d as heads × head features, grouped and rotary heads); a wrong axis,
    a wrong order, a missing or a left-over argument do not."""
    from splitformer.symbolic.domains import (
        FEATURES as D, FREQUENCIES as R, GROUP as S, HEAD_FEATURES as E, HEADS as H, HIDDEN as Z, KV_FEATURES as KV,
        KV_HEADS as G, PAIR as C, stores,
    )

    assert stores((D, D), (D, H, E)) and stores((D, D), (G, S, E, D)) and stores((D, D), (D, G, S, C, R))
    assert stores((D, KV), (D, G, C, R)) and stores((D, KV), (D, G, E)) and stores((), ())
    assert not stores((Z, D), (D, D)) and not stores((D, D), (D, E, H)) and not stores((D, KV), (D, H, E))
    assert not stores((D,), (D, D)) and not stores((D, D), (D,)) and not stores((D,), ())


def test_a_kernel_absorbing_the_spacing_of_a_domain_it_is_not_on_is_refused():
    """A kernel absorbs the spacing of a domain one of its arguments is on, whichever variable it is read at there
    (review s33, F3: a control on (h,) read at h̃ absorbs h̃); the tokens' spacing, for a kernel on the features, not."""
    from splitformer.symbolic.domains import FEATURES, H, H_MIX, HEADS, HIDDEN, X_KEY, XI, Y, ZETA
    from splitformer.symbolic.operators import kernel

    assert kernel("W", "W", (XI, ZETA), (FEATURES, HIDDEN), absorbs=(XI,)).absorbs == (XI,)
    assert kernel("W", "W", (XI, ZETA), (FEATURES, HIDDEN), absorbs=(Y,)).absorbs == (Y,)
    assert kernel("m", "m", (H,), (HEADS,), absorbs=(H_MIX,)).absorbs == (H_MIX,)
    with pytest.raises(splitformer.SplitformerError, match="parameter W: absorbs the spacing of a domain none of its"):
        kernel("W", "W", (XI, ZETA), (FEATURES, HIDDEN), absorbs=(X_KEY,))


@pytest.mark.parametrize("plugin, kind, option, message", [
    ("layouts", "head-table", "", "f.c: stored on d_head, which a block's code does not size"),
    ("layouts", "head-out-3d", "", "f.W_o: stored on d_head"),
    ("layouts", "token-param", "", "f.pe: stored on n_tokens"),
    ("layouts", "head-table-flat", "", None),
    ("layouts", "head-mix-absorb", "", None),
    ("head_gain", "gain-attention", ", d_head = 8", "f.v_gain: stores heads × head features on d, but the scheme sets "
                                                     "d_head = 8: store them on d_inner"),
    ("head_gain", "gain-attention-control", ", d_head = 8", None),
    ("head_gain", "gain-attention", "", None),
])
def test_a_block_parameter_is_stored_on_axes_its_code_sizes(tmp_path, plugin, kind, option, message):
    """Review s33: parameters stored on (n_heads, d_head), (n_tokens, d), or on d as heads × head features where
    d_head sets the heads apart, derived and then failed in the forward (KeyError 'd_head', a reshape) and crashed
    check. Refused at derive in one line; each has a control that derives and runs."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / f"{plugin}.py")
    scheme = splitformer.parse_scheme(f'name = "s"\nsummary = "s"\n[operators]\nf = {{ kind = "{kind}"{option} }}\n'
                                      '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
    if message is not None:
        with pytest.raises(splitformer.SplitformerError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
            splitformer.derive(scheme).numpy_module()
        return
    module = splitformer.derive(scheme).numpy_module()
    rng = np.random.default_rng(0)
    sizes = {"d": 8, "d_inner": 16, "n_heads": 2}
    params = {name: rng.standard_normal(tuple(sizes[axis] for axis in axes)) for name, axes in module.PARAMETERS.items()}
    assert np.isfinite(module.forward(rng.standard_normal((2, 3, 8)), params, n_heads=2)).all()


def _reading_kind(kind, output):
    """A kind of one parameter ``g(y)`` whose output is ``output(u(x, y), apply, x, y)`` (a SymPy expression)."""
    from dataclasses import dataclass
    from typing import ClassVar

    from splitformer.symbolic.domains import FEATURES, X, Y
    from splitformer.symbolic.operators import STATE, Definition, Operator, apply, kernel, register_operator

    @dataclass(frozen=True)
    class Reading(Operator):
        symbol: ClassVar[str] = r"\mathcal{R}"

        def parameters(self):
            return (kernel("g", "g", (Y,), (FEATURES,)),)

        def definitions(self):
            return (Definition("out", self.symbol, (X, Y), output(apply(STATE, X, Y), apply, X, Y), "a reading"),)

    Reading.kind = kind
    if kind not in splitformer.symbolic.kinds.OPERATOR_KINDS:
        register_operator(Reading)


def test_a_kind_that_reads_the_support_and_says_it_does_not_is_refused():
    """A reviewer's finding: a kind reading χ whose ``uses_support()`` returns False failed at derive with a bare
    ``KeyError: 'chi'``; it is refused when the scheme is read (the default reads it from the definitions)."""
    from dataclasses import dataclass
    from typing import ClassVar

    from splitformer.symbolic.domains import ETA, X, X_KEY, Y
    from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, register_operator

    @dataclass(frozen=True)
    class Denied(Operator):
        kind: ClassVar[str] = "qa-support-denied"
        symbol: ClassVar[str] = r"\mathcal{D}"

        def parameters(self):
            return ()

        def definitions(self):
            weight = apply(SUPPORT, X, X_KEY) / integral(apply(SUPPORT, X, ETA), ETA)
            return (Definition("out", self.symbol, (X, Y), integral(weight * apply(STATE, X_KEY, Y), X_KEY), "a mean",
                               absorbs=(X_KEY,)),)

        def uses_support(self):
            return False

    if Denied.kind not in splitformer.symbolic.kinds.OPERATOR_KINDS:
        register_operator(Denied)
    with pytest.raises(splitformer.SplitformerError, match=r"read the support χ, but its uses_support\(\) says False"):
        splitformer.parse_scheme('name = "s"\nsummary = "s"\n[operators]\nf = "qa-support-denied"\n[[steps]]\n'
                                 'operator = "f"\nsolver = "explicit"\n')


@pytest.mark.parametrize("kind, output, message", [
    ("qa-undeclared-positions", lambda u, apply, x, y: u * sp.tanh(apply("pos", x)),
     r"definition 'out': reads the input field 'pos' \(positions\) without declaring it: input_fields = \(POSITIONS,\)"),
    ("qa-parameter-arity", lambda u, apply, x, y: u * apply("g", y, x),
     r"definition 'out': applies 'g' to 2 arguments; it takes 1"),
], ids=["positions-undeclared", "parameter-read-with-two"])
def test_a_kind_reading_a_function_it_cannot_is_refused_naming_it(kind, output, message):
    """Testers' findings: an undeclared input field read (``pos``) was a bare ``KeyError: 'pos'`` at derive time, and a
    function read with the wrong number of arguments was shown as a malformed program (``g[l, i]`` of a (d,) array)
    and failed at derive naming no kind; both are refused when the scheme is read, naming the definition."""
    import splitformer.symbolic.kinds  # noqa: F401

    _reading_kind(kind, output)
    with pytest.raises(splitformer.SplitformerError, match=message):
        splitformer.parse_scheme(f'name = "s"\nsummary = "s"\n[operators]\nf = "{kind}"\n[[steps]]\noperator = "f"\n'
                                 'solver = "explicit"\n')


def test_abs_and_floor_of_the_state_derive_with_their_almost_everywhere_derivatives(tmp_path):
    """A tester's finding: ``Abs`` or ``floor`` of the state (functions the guide allows) could not be derived ("Can't
    calculate derivative wrt 1": the adjoint differentiated with respect to symbols that were not real, so |x|'
    was written with re and im). The adjoint now reads sign(x) and 0; the vjp equals those by hand."""
    import splitformer.symbolic.kinds  # noqa: F401

    rng = np.random.default_rng(3)
    u, weight = rng.standard_normal((2, 4, 3)) * 3, rng.standard_normal((2, 4, 3))
    g = {"f.g": rng.standard_normal(3)}
    for kind, output, forward, derivative in (
            ("qa-abs-state", lambda u, apply, x, y: sp.Abs(u) * apply("g", y), np.abs, np.sign),
            ("qa-floor-state", lambda u, apply, x, y: sp.floor(u) * apply("g", y) / 5, lambda v: np.floor(v) / 5,
             np.zeros_like),
            ("qa-floor-twice", lambda u, apply, x, y: sp.floor(2 * u) * apply("g", y) / 2, lambda v: np.floor(2 * v) / 2,
             np.zeros_like)):  # the chain rule's Subs(0, …) (a reviewer's finding: NameError 'Subs' in vjp)
        _reading_kind(kind, output)
        scheme = splitformer.parse_scheme(f'name = "{kind}"\nsummary = "s"\n[operators]\nf = "{kind}"\n'
                                          '[[steps]]\noperator = "f"\nsolver = "explicit"\n')
        module = splitformer.derive(scheme).numpy_module()
        assert np.abs(module.forward(u, g) - (u + forward(u) * g["f.g"])).max() < 1e-14
        grad_u, grads = module.vjp(u, g, weight)
        assert np.abs(grad_u - weight * (1 + derivative(u) * g["f.g"])).max() < 1e-14
        assert np.abs(grads["f.g"] - (weight * forward(u)).sum(axis=(0, 1))).max() < 1e-12


def test_a_plugin_edited_after_it_was_loaded_warns_when_loaded_again(tmp_path):
    """A tester's finding: ``load_plugin`` of a file edited since this process loaded it returned the first version
    without a word (a notebook's edit ignored). It still does (its kinds stay registered) and says so; loading the
    unchanged file again says nothing (control)."""
    import warnings

    path = tmp_path / "edited_kinds.py"
    path.write_text("VALUE = 1\n", encoding="utf-8")
    first = splitformer.load_plugin(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert splitformer.load_plugin(path) is first
    path.write_text("VALUE = 2\n", encoding="utf-8")
    with pytest.warns(UserWarning, match="changed since this process loaded it"):
        assert splitformer.load_plugin(path) is first and first.VALUE == 1


def _attention_kind(kind: str, constants=(), edit=lambda definitions: definitions):
    """A registered ``Attention`` subclass named ``kind`` declaring ``constants``, its definitions through ``edit``."""
    from dataclasses import dataclass

    from splitformer.symbolic.operators import Attention, register_operator

    @dataclass(frozen=True)
    class Edited(Attention):
        def definitions(self):
            return edit(super().definitions())

    Edited.kind, Edited.constants = kind, constants
    if kind not in splitformer.symbolic.kinds.OPERATOR_KINDS:
        register_operator(Edited)
    return kind


def _scaled_scores(symbol):
    """The scores ``a`` divided by ``symbol``."""
    def edit(definitions):
        return tuple(d if d.function != "a" else type(d)(d.function, d.latex, d.arguments, d.rhs / symbol, d.meaning,
                                                        d.absorbs) for d in definitions)
    return edit


T = sp.Symbol("T")


@pytest.mark.parametrize("kind, constants, edit, message", [
    ("qa-unread-constant", "T", lambda definitions: definitions,
     r"declares the constant 'T', but no definition reads it: the emitted keyword argument T= would change nothing"),
    ("qa-other-symbol", "T", _scaled_scores(sp.Symbol("T", positive=True)),
     r"definition 'a': reads a symbol 'T' made with the assumptions positive=True, but the declared 'T' has none"),
    ("qa-output-off-the-state", "", lambda definitions: definitions[:-1],
     r"its last definition, 'o', is its output, but it is on \(x, h, e\): .* end definitions\(\) with its value on "
     r"\(x, y\)"),
    ("qa-constant-read", "T", _scaled_scores(T), None),
], ids=["constant-unread", "constant-of-other-assumptions", "output-off-the-state", "control"])
def test_a_kind_whose_constants_or_output_its_code_cannot_honour_is_refused(kind, constants, edit, message):
    """A plug-in author's findings (s45): a declared constant no formula read was emitted as a keyword argument
    that changed nothing (``check`` passed all 51 checks); a formula reading ``Symbol("T", positive=True)`` where
    ``Symbol("T")`` was declared derived (the printer prints names) and ``check`` crashed with ``KeyError: T``; a
    kind without ``out`` had its last definition, on (x, h, e), added to the state and the forward failed in
    NumPy's broadcasting. Each is refused when the scheme is read; the control, the constant read, derives."""
    from splitformer.symbolic.inputs import Constant

    declared = (Constant(T, 2.0, "a temperature"),) if constants else ()
    text = f'name = "s"\nsummary = "s"\n[operators]\nf = "{_attention_kind(kind, declared, edit)}"\n' \
           '[[steps]]\noperator = "f"\nsolver = "explicit"\n'
    if message is None:
        splitformer.derive(splitformer.parse_scheme(text))
        return
    with pytest.raises(splitformer.SplitformerError, match=message):
        splitformer.parse_scheme(text)


def test_a_malformed_kind_is_refused_naming_what_it_lacks():
    """A plug-in author's findings (s45): a subclass that forgot ``kind`` was told the inherited kind "is already
    registered"; an ``Operator`` without ``definitions()`` failed with an empty ``NotImplementedError``; a
    ``ProjectionOperator`` without ``constraints`` registered and failed at use with an ``AttributeError``."""
    from dataclasses import dataclass
    from typing import ClassVar

    from splitformer.symbolic.operators import Attention, Operator, ProjectionOperator, register_operator

    @dataclass(frozen=True)
    class Unnamed(Attention):
        pass

    with pytest.raises(splitformer.SplitformerError, match=r"Unnamed sets no kind of its own \(it inherits "
                                                           r"'attention'\); give it one"):
        register_operator(Unnamed)

    @dataclass(frozen=True)
    class Unconstrained(ProjectionOperator):
        kind: ClassVar[str] = "qa-unconstrained"
        symbol: ClassVar[str] = "P"

    with pytest.raises(splitformer.SplitformerError, match="Unconstrained is a ProjectionOperator without its "
                                                           "constraint set"):
        register_operator(Unconstrained)

    @dataclass(frozen=True)
    class Bare(Operator):
        kind: ClassVar[str] = "qa-bare"
        symbol: ClassVar[str] = "B"

    if Bare.kind not in splitformer.symbolic.kinds.OPERATOR_KINDS:
        register_operator(Bare)
    with pytest.raises(splitformer.SplitformerError, match=r"NotImplementedError: Bare defines no parameters\(\)"):
        splitformer.parse_scheme('name = "s"\nsummary = "s"\n[operators]\nf = "qa-bare"\n[[steps]]\noperator = "f"\n'
                                 'solver = "explicit"\n')
