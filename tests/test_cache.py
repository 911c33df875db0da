"""The derivation cache: nothing read from it runs code or changes what is emitted."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time

import pytest
import sympy as sp

from splitformer.codegen.cli import main
from splitformer.symbolic import cache
from splitformer.symbolic.expression_json import MAX_DEPTH, MAX_NODES, from_json, to_json
from splitformer.symbolic.projection_verifiers import verify_layer_norm_projection, verify_relu_projection
from splitformer.symbolic.projections import SYMBOLS as S, Projection, derive_layer_norm_projection, derive_relu_projection

CACHED = (derive_layer_norm_projection, derive_relu_projection)


def _derive(out, capsys) -> tuple[dict[str, bytes], list[str]]:
    """``splitformer derive post-ln`` in a fresh process state: its files and its stderr lines."""
    for function in CACHED:
        function.cache_clear()
    cache._warned = False
    capsys.readouterr()
    assert main(["derive", "post-ln", "--out", str(out)]) == 0
    files = {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}
    return files, capsys.readouterr().err.splitlines()


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """The files of a derivation without any cache."""
    folder = tmp_path_factory.mktemp("clean")
    previous = os.environ.get("SPLITFORMER_CACHE")
    os.environ["SPLITFORMER_CACHE"] = "off"
    try:
        for function in CACHED:
            function.cache_clear()
        assert main(["derive", "post-ln", "--out", str(folder)]) == 0
        return {str(path.relative_to(folder)): path.read_bytes() for path in sorted(folder.rglob("*")) if path.is_file()}
    finally:
        os.environ["SPLITFORMER_CACHE"] = previous


def _entry(function, projection: Projection) -> str:
    return cache._document(function, projection)


def _poison(name: str) -> dict:
    """Entries (file text by function) that parse but are wrong."""
    layer_norm = derive_layer_norm_projection.__wrapped__()
    relu = derive_relu_projection.__wrapped__()
    ln, rl = derive_layer_norm_projection, derive_relu_projection
    if name == "drops-eps":
        wrong = Projection(layer_norm.theorem, layer_norm.steps, layer_norm.distance, layer_norm.theorem, layer_norm.gap)
        return {ln: _entry(ln, wrong)}
    if name == "swapped":
        return {ln: _entry(ln, relu), rl: _entry(rl, layer_norm)}
    if name == "leaky-relu":
        return {rl: _entry(rl, Projection(sp.Max(0, S.v) + S.v / 1000, relu.steps))}
    if name == "forty-two":
        return {ln: "42", rl: "null"}
    if name == "wrong-type":
        return {ln: json.dumps({"format": cache.FORMAT, "function": ln.__qualname__, "key": cache._key(ln),
                                "fields": {"formula": 42}})}
    if name == "corrupt":
        return {ln: '{"format": 1, "fie', rl: "\x00\xff"}
    if name == "deep":
        return {ln: "[" * 100_000 + "]" * 100_000}
    if name == "relu-as-abs":  # the same values in an operation the printers cannot spell
        return {rl: _entry(rl, Projection((S.v + sp.Abs(S.v)) / 2, relu.steps))}
    if name in ("relu-cancellation", "layer-norm-cancellation"):
        # exactly equal in value (so every 50-digit condition holds), catastrophic in float: c = 10^20
        c = sp.Integer(10) ** 20
        cancelling = sp.Mul(sp.Add(sp.Pow(sp.Add(S.v, c), 2), -c * c), sp.Pow(sp.Add(S.v, 2 * c), -1), evaluate=False)
        if name == "relu-cancellation":
            return {rl: _entry(rl, Projection(sp.Max(0, cancelling), relu.steps))}
        formula = layer_norm.formula.xreplace({S.v: cancelling})
        return {ln: _entry(ln, Projection(formula, layer_norm.steps, layer_norm.distance, layer_norm.theorem,
                                          layer_norm.gap))}
    if name == "power-tower":  # attack 24: five nodes that SymPy computed for minutes before the verifier ran
        document = json.loads(_entry(ln, layer_norm))
        document["fields"]["distance"] = {"sympy": _power_tower(4)}
        return {ln: json.dumps(document)}
    if name == "narrative-href":
        steps = ((relu.steps[0][0], relu.steps[0][1] + r"\href{javascript:alert(1)}{x}"), *relu.steps[1:])
        return {rl: _entry(rl, Projection(relu.formula, steps))}
    raise AssertionError(name)


@pytest.mark.parametrize("name", ["drops-eps", "swapped", "leaky-relu", "forty-two", "wrong-type", "corrupt", "deep",
                                  "relu-as-abs", "narrative-href", "relu-cancellation", "layer-norm-cancellation",
                                  "power-tower"])
def test_poisoned_entries_never_change_the_emitted_files(name, clean, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPLITFORMER_CACHE", str(tmp_path / "cache"))
    _derive(tmp_path / "warm", capsys)  # writes the genuine entries
    for function, text in _poison(name).items():
        function.entry_path().write_text(text, encoding="utf-8", errors="surrogateescape")
    files, errors = _derive(tmp_path / "out", capsys)
    assert files == clean
    assert len(errors) == 1 and errors[0].startswith("splitformer: warning: ignored the cache entry"), errors
    # the bad entry was replaced by a verified one: the next run is silent
    files, errors = _derive(tmp_path / "again", capsys)
    assert files == clean and errors == []


def test_a_pickle_in_the_cache_is_never_executed(clean, tmp_path, monkeypatch, capsys):
    marker = tmp_path / "executed"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    monkeypatch.setenv("SPLITFORMER_CACHE", str(tmp_path / "cache"))
    path = derive_layer_norm_projection.entry_path()
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps(Payload()))
    path.with_suffix(".pickle").write_bytes(pickle.dumps(Payload()))  # the former format, under its old suffix
    files, errors = _derive(tmp_path / "out", capsys)
    assert not marker.exists()
    assert files == clean and len(errors) == 1


def test_a_fifo_in_place_of_an_entry_does_not_stall_the_run(clean, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPLITFORMER_CACHE", str(tmp_path / "cache"))
    path = derive_relu_projection.entry_path()
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    files, errors = _derive(tmp_path / "out", capsys)
    assert files == clean
    assert len(errors) == 1 and "not a regular file" in errors[0], errors


def test_a_warm_cache_gives_the_same_files_silently(clean, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPLITFORMER_CACHE", str(tmp_path / "cache"))
    assert _derive(tmp_path / "cold", capsys) == (clean, [])
    assert _derive(tmp_path / "warm", capsys) == (clean, [])
    assert sorted(path.suffix for path in (tmp_path / "cache").iterdir()) == [".json", ".json"]


@pytest.mark.parametrize("where", ["long-component", "under-a-file", "unwritable"])
def test_an_unusable_cache_folder_falls_back_with_one_warning(where, clean, tmp_path, monkeypatch, capsys):
    folder = {"long-component": tmp_path / ("x" * 300), "under-a-file": tmp_path / "file" / "cache",
              "unwritable": tmp_path / "locked"}[where]
    (tmp_path / "file").write_text("")
    if where == "unwritable":
        if os.geteuid() == 0:
            pytest.skip("root ignores folder permissions")
        folder.mkdir(mode=0o000)
    monkeypatch.setenv("SPLITFORMER_CACHE", str(folder))
    files, errors = _derive(tmp_path / "out", capsys)
    assert files == clean
    assert len(errors) == 1 and errors[0].startswith("splitformer: warning: "), errors


def test_no_home_folder_falls_back_with_one_warning(clean, tmp_path, monkeypatch, capsys):
    import pwd

    monkeypatch.delenv("SPLITFORMER_CACHE")
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.setattr(pwd, "getpwuid", lambda uid: (_ for _ in ()).throw(KeyError(uid)))
    files, errors = _derive(tmp_path / "out", capsys)
    assert files == clean
    assert errors == ["splitformer: warning: no home folder to hold the derivation cache; set SPLITFORMER_CACHE; "
                      "deriving instead"]


def test_a_tilde_of_no_user_falls_back_with_one_warning(clean, tmp_path, monkeypatch, capsys):
    """Attack 19: ``~nosuchuser/cache`` raised from ``expanduser`` past the fallback: every derivation failed, the
    error blamed on the layer-norm operator."""
    monkeypatch.setenv("SPLITFORMER_CACHE", "~nosuchuser-splitformer/cache")
    files, errors = _derive(tmp_path / "out", capsys)
    assert files == clean
    assert errors == ["splitformer: warning: SPLITFORMER_CACHE='~nosuchuser-splitformer/cache': its '~' names no home "
                      "folder; set SPLITFORMER_CACHE; deriving instead"]


def test_the_key_covers_generator_sympy_and_source(monkeypatch):
    import splitformer.symbolic as symbolic

    key = cache._key(derive_layer_norm_projection.__wrapped__)
    assert key != cache._key(derive_relu_projection.__wrapped__)
    monkeypatch.setattr(sp, "__version__", "0.0.1")
    assert cache._key(derive_layer_norm_projection.__wrapped__) != key
    monkeypatch.undo()
    monkeypatch.setattr(symbolic, "__version__", "9.9.9")
    assert cache._key(derive_layer_norm_projection.__wrapped__) != key
    monkeypatch.undo()
    monkeypatch.setattr(cache, "_sources", lambda function: "changed source")
    assert cache._key(derive_layer_norm_projection.__wrapped__) != key


def test_verifiers_accept_the_derivations_and_reject_each_poison():
    layer_norm, relu = derive_layer_norm_projection.__wrapped__(), derive_relu_projection.__wrapped__()
    for _ in range(3):  # fresh random points each time
        verify_layer_norm_projection(layer_norm)
        verify_relu_projection(relu)
    s = S
    wrong_layer_norm = [
        layer_norm.theorem,  # drops ε
        s.sigma_1 - s.sigma_2 * (s.v - s.alpha) / sp.sqrt(s.beta + s.epsilon),  # the maximizing root
        s.sigma_1 + s.sigma_2 * (s.v - s.alpha) / sp.sqrt(s.beta + 2 * s.epsilon),
        layer_norm.formula + (s.alpha - s.sigma_1) * s.epsilon / 1000,
        s.sigma_1 + s.sigma_2 * (s.v - s.alpha) ** 3 / sp.sqrt(s.beta + s.epsilon),
    ]
    for formula in wrong_layer_norm:
        with pytest.raises(ValueError):
            verify_layer_norm_projection(Projection(formula, layer_norm.steps, layer_norm.distance,
                                                    layer_norm.theorem, layer_norm.gap))
    with pytest.raises(ValueError, match="distance"):
        verify_layer_norm_projection(Projection(layer_norm.formula, layer_norm.steps, 2 * layer_norm.distance,
                                                layer_norm.theorem, layer_norm.gap))
    with pytest.raises(ValueError, match="gap"):
        verify_layer_norm_projection(Projection(layer_norm.formula, layer_norm.steps, layer_norm.distance,
                                                layer_norm.theorem, -layer_norm.gap))
    for tiny in (sp.Rational(1, 10**60), sp.Rational(1, 10**60) * s.sigma_2):  # a tester: within the 1e-30 tolerance
        for field in ("distance", "gap"):
            fields = {"distance": layer_norm.distance, "gap": layer_norm.gap}
            fields[field] += tiny
            with pytest.raises(ValueError, match=f"{field} is not in the canonical form"):
                verify_layer_norm_projection(Projection(layer_norm.formula, layer_norm.steps, fields["distance"],
                                                        layer_norm.theorem, fields["gap"]))
    with pytest.raises(ValueError, match="distance uses Max"):  # value-equal, but no series expands it
        verify_layer_norm_projection(Projection(layer_norm.formula, layer_norm.steps,
                                                sp.Max(layer_norm.distance, -1 - S.sigma_2**2),
                                                layer_norm.theorem, layer_norm.gap))
    for formula in (sp.Max(0, s.v) + s.v / 1000, s.v, sp.Abs(s.v), sp.Max(0, s.v - sp.Rational(1, 10**6))):
        with pytest.raises(ValueError):
            verify_relu_projection(Projection(formula, relu.steps))
    with pytest.raises(ValueError):
        verify_relu_projection(layer_norm)
    for markup in ("$x$", "<img src=x>", "[a](http://x)", "`code`", "two\nlines"):
        steps = relu.steps[:-1] + ((relu.steps[-1][0], relu.steps[-1][1] + markup),)
        with pytest.raises(ValueError, match="holds markup"):
            verify_relu_projection(Projection(relu.formula, steps))
    for command in (r"\href{javascript:x}{y}", r"\input{/etc/passwd}", r"\end{align*}", r"\def\x{y}"):
        steps = relu.steps[:-1] + ((relu.steps[-1][0], relu.steps[-1][1] + command),)
        with pytest.raises(ValueError, match="LaTeX command"):
            verify_relu_projection(Projection(relu.formula, steps))
    with pytest.raises(ValueError, match="Abs, which the code printers do not spell"):
        verify_relu_projection(Projection((s.v + sp.Abs(s.v)) / 2, relu.steps))


def test_expression_trees_round_trip_and_reject_what_they_do_not_know():
    v, beta = sp.Symbol("v", real=True), sp.Symbol("beta", positive=True)
    for expression in (v / sp.sqrt(beta + sp.Rational(1, 3)), sp.Max(0, v) * sp.pi, sp.Piecewise((v, v > 0), (0, True)),
                       sp.erf(v) ** 2 - sp.exp(-v) + sp.tanh(v), sp.Integer(-10) ** 30 * v):
        assert from_json(json.loads(json.dumps(to_json(expression)))) == expression
    with pytest.raises(TypeError):
        to_json(sp.Function("f")(v))
    bad = [["Function", "os.system"], ["Symbol", "x", {"__class__": True}], ["Rational", "1" * 200, "1"],
           ["Rational", "1", "0"], ["Pow", ["Rational", "10", "1"], ["Rational", "1000000", "1"]],
           ["S", "__import__"], ["Symbol", "x"], 42, [], "Add", ["Add"] + [["Rational", "1", "1"]] * 30_000]
    deep = ["Rational", "1", "1"]
    for _ in range(500):
        deep = ["Abs", deep]
    for tree in bad + [deep]:
        with pytest.raises(ValueError):
            from_json(tree)


def _power_tower(height: int) -> list:
    """(…((10^100 − 1)^64)^64…)^64, ``height`` powers: each node within the bounds on digits and exponents."""
    tower = ["Rational", "9" * 100, "1"]
    for _ in range(height):
        tower = ["Pow", tower, ["Rational", "64", "1"]]
    return tower


def test_numbers_too_large_to_compute_are_refused_before_sympy_computes_them():
    """Attack 24: SymPy folds the numbers of a sum, product or power while building the node, before any check."""
    factors = [["Pow", ["Rational", "9" * 30, "1"], ["Rational", "64", "1"]]] * 5000  # 6400 bits each
    fractions = [["Rational", "1", str(prime)] for prime in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29)] * 1000
    root = ["Pow", ["Rational", "9" * 100, "1"], ["Rational", "1", "2"]]  # review: √B stays, its 63rd power folds
    roots = [["Pow", ["Rational", "9" * 100, "1"], ["Rational", "49", "64"]]] * 200  # each 16 317 bits, 50 826 in all
    for tree in (_power_tower(1), _power_tower(4), ["Mul", *factors], ["Add", *fractions],
                 ["Pow", ["Pow", root, ["Rational", "63", "1"]], ["Rational", "63", "1"]], ["Mul", *roots]):
        start = time.perf_counter()
        with pytest.raises(ValueError, match="whose result could exceed 16384 bits"):
            from_json(tree)
        assert time.perf_counter() - start < 2
    # control: the largest results within the bound are built, and equal what SymPy computes
    big = sp.Integer(int("9" * 38))  # 127 bits: to the 64th, 8128 bits of numerator and 1 of denominator
    assert from_json(["Pow", to_json(big), ["Rational", "64", "1"]]) == big**64
    assert from_json(["Mul", *factors[:2]]) == sp.Integer(int("9" * 30)) ** 128
    assert from_json(["Add", *fractions[:10]]) == sum(sp.Rational(1, p) for p in (2, 3, 5, 7, 11, 13, 17, 19, 23, 29))


def test_trees_of_exactly_the_largest_depth_and_size_are_read_and_one_more_is_not():
    def nested(depth):  # the leaf at depth ``depth`` (the root is at 0)
        return ["Rational", "1", "1"] if depth == 0 else ["Abs", nested(depth - 1)]

    def wide(nodes):
        return ["Add"] + [["Rational", "1", "1"]] * (nodes - 1)

    assert from_json(nested(MAX_DEPTH)) == 1 and from_json(wide(MAX_NODES)) == MAX_NODES - 1
    for tree in (nested(MAX_DEPTH + 1), wide(MAX_NODES + 1)):
        with pytest.raises(ValueError, match="too large or too deep"):
            from_json(tree)


def test_cache_warnings_are_one_line(monkeypatch, capsys):
    monkeypatch.setattr(cache, "_warned", False)
    cache._warn_once("first\nsecond line")
    cache._warn_once("never printed")
    assert capsys.readouterr().err == "splitformer: warning: first\\nsecond line\n"  # escaped, as error lines are


def test_a_warning_stderr_cannot_take_is_dropped_and_the_derivation_goes_on(clean, tmp_path, monkeypatch, capsys):
    """Attack 25: with a bad cache and stderr full (2>/dev/full), the failed warning ended the derive: status 2,
    nothing written, an error line blaming the LayerNorm operator."""
    class Full:
        def write(self, text):
            raise OSError(28, "No space left on device")

        def flush(self):
            raise OSError(28, "No space left on device")

    (tmp_path / "file").write_text("")
    monkeypatch.setenv("SPLITFORMER_CACHE", str(tmp_path / "file" / "cache"))
    for function in CACHED:
        function.cache_clear()
    monkeypatch.setattr(cache, "_warned", False)
    monkeypatch.setattr(sys, "stderr", Full())
    assert main(["derive", "post-ln", "--out", str(tmp_path / "out")]) == 0
    monkeypatch.undo()
    out = tmp_path / "out"
    assert {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()} == clean


def test_an_interrupt_while_writing_the_cache_leaves_no_temporary(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITFORMER_CACHE", str(tmp_path))
    real = os.replace

    def interrupted(source, target):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache.os, "replace", interrupted)
    derive_relu_projection.cache_clear()
    with pytest.raises(KeyboardInterrupt):
        derive_relu_projection()
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(cache.os, "replace", real)
    derive_relu_projection.cache_clear()


def test_a_new_process_warns_about_an_unusable_cache(tmp_path):
    """Nothing is warned at import: the first unusable cache of a process is reported."""
    (tmp_path / "file").write_text("")
    code = "from splitformer.symbolic.projections import derive_relu_projection as d; d()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**os.environ, "SPLITFORMER_CACHE": str(tmp_path / "file" / "cache")})
    assert result.returncode == 0 and result.stderr.startswith("splitformer: warning: "), result.stderr


@pytest.mark.parametrize("setting, folder", [
    *((spelling, "default") for spelling in ("", "on", "ON", "1", "true", "Yes", " on ")),
    *((spelling, None) for spelling in ("off", "OFF", "0", "false", "no")),
    ("cache", "cache"), ("/somewhere/cache", "/somewhere/cache"), ("~/mine", "home/mine"),
])
def test_the_cache_setting_names_a_folder_only_when_it_is_not_a_switch(setting, folder, tmp_path, monkeypatch):
    """``on`` (a natural guess next to ``off``) was a folder named ``on`` in the current folder (found by an
    attacker, and the repository held one by accident); the switches mean the default folder or none."""
    monkeypatch.setenv("SPLITFORMER_CACHE", setting)
    monkeypatch.setenv("HOME", str(tmp_path))
    expected = {"default": tmp_path / ".cache" / "splitformer", None: None, "home/mine": tmp_path / "mine"}.get(
        folder, folder)  # '~' (quoted past the shell) is the home folder: attack 15 found a folder named '~' made
    assert cache.cache_folder() == (expected if expected is None or isinstance(expected, os.PathLike)
                                    else type(tmp_path)(expected))


def test_a_stored_piecewise_is_rebuilt_as_stored(monkeypatch):
    """Attack 20: a 10,931-node tree of nested piecewise nodes (within the node and size bounds) took 68 s to decode,
    SymPy canonicalizing its conditions at every level, before the verifier saw it. Rebuilt as stored, without
    SymPy's constructor; control: a stored piecewise decodes equal to the original."""
    import sympy as sp
    from sympy.functions.elementary.piecewise import ExprCondPair

    from splitformer.symbolic.expression_json import from_json, to_json

    v = sp.Symbol("v", real=True)
    original = sp.Piecewise((v + 1, v < 0), (v, True))
    assert from_json(to_json(original)) == original
    tree = ["Symbol", "v", {}]
    for level in range(7):
        tree = ["Piecewise", ["ExprCondPair", ["Add", tree, ["Rational", str(level), "1"]],
                              ["StrictLessThan", tree, ["Rational", str(level), "1"]]],
                ["ExprCondPair", tree, ["S", "BooleanTrue"]]]
    calls = []
    for cls in (sp.Piecewise, ExprCondPair, sp.StrictLessThan):
        monkeypatch.setattr(cls, "__new__", lambda *arguments, **options: calls.append(arguments[0]))
    decoded = from_json(tree)
    assert calls == [] and isinstance(decoded, sp.Piecewise)


def test_with_stderr_closed_a_warning_never_reaches_stdout(tmp_path):
    """Review 25: started with stderr closed (``2>&-``), ``sys.stderr`` is None and ``print(file=None)`` writes to
    stdout: the cache warning came out in ``show --format toml``'s text."""
    (tmp_path / "file").write_text("")
    environment = {**os.environ, "SPLITFORMER_CACHE": str(tmp_path / "file" / "cache")}
    command = [sys.executable, "-m", "splitformer", "show", "post-ln", "--format", "toml"]
    result = subprocess.run(command, capture_output=True, text=True, env=environment, preexec_fn=lambda: os.close(2))
    clean = subprocess.run(command, capture_output=True, text=True, env={**environment, "SPLITFORMER_CACHE": "off"})
    assert result.returncode == 0 and result.stdout == clean.stdout and "warning" not in result.stdout
