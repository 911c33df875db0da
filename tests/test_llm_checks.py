"""The LLM checks hold for the derived formulas and fail for wrong ones (negative controls)."""

import numpy as np
import pytest
import sympy as sp

from splitformer.codegen.verification.statements import llm
from splitformer.symbolic.projections import SYMBOLS
from splitformer.symbolic.rms_norm import MEAN_SQUARE, RADIUS


def test_every_llm_check_holds():
    checks = llm.llm_checks()
    assert [check.id for check in checks] == ["rms-norm/kkt", "rms-norm/distance", "rope/relative-kernel",
                                              "gqa/repeated-heads"]
    assert all(check.holds for check in checks), [check.detail for check in checks if not check.holds]


def test_rms_norm_checks_catch_a_wrong_projection():
    assert not llm.rms_norm_kkt_check(2 * RADIUS * SYMBOLS.v / sp.sqrt(MEAN_SQUARE)).holds  # off the sphere
    assert not llm.rms_norm_distance_check(RADIUS * SYMBOLS.v / MEAN_SQUARE).holds


def test_rope_check_catches_a_kernel_that_is_not_a_rotation():
    """[[cos, sin], [sin, cos]]: its scores depend on p + p̃."""
    check = llm.rope_relative_check(lambda angle, c, c_in: sp.cos(angle) if c == c_in else sp.sin(angle))
    assert not check.holds and check.detail.startswith("(∂_p + ∂_p̃) s = ") and "p + p_tilde" in check.detail
    assert llm.rope_relative_check().detail == "both residuals expand to 0"


def test_rope_kernel_is_read_from_the_operator():
    kernel = llm.rotary_kernel()
    phi = sp.Symbol("phi")
    rotation = sp.Matrix(2, 2, lambda c, c_in: kernel(phi, c, c_in))
    assert sp.simplify(rotation - sp.Matrix([[sp.cos(phi), -sp.sin(phi)], [sp.sin(phi), sp.cos(phi)]])) == sp.zeros(2)


def test_gqa_check_catches_tiled_heads():
    """Repeating the key/value heads as k0 k1 k0 k1 (tiling) is not transformers' repeat_kv."""
    def tiled(matrix, n_kv, n_rep, width):
        return sp.Matrix.hstack(*[matrix[:, g * width:(g + 1) * width] for _ in range(n_rep) for g in range(n_kv)])

    assert not llm.gqa_repeat_check(tiled).holds


def _numeric_error(scheme, program):
    """max |derived − reference| of the numeric recovery, at 30 digits."""
    from splitformer.codegen.verification.statements.recovery import _difference, evaluation_sizes

    values = iter(sp.Float(value, 30) for value in np.random.default_rng(0).uniform(-1, 1, 4000))
    cells: dict = {}

    def value(name, i, j):
        return cells.setdefault((name, i, j), next(values))

    difference = _difference(program, scheme, evaluation_sizes(3, 8, 2, 6), value, sp.Float("1e-5", 30), lambda i: sp.Float(i, 30))
    return max(abs(sp.N(entry, 30)) for entry in difference)


@pytest.mark.parametrize("name", ["gpt2", "decoder"])
def test_recovery_fails_without_the_causal_support(name):
    """Negative control of ``recovery/<block>``: the derived program read without the causal support."""
    from dataclasses import replace

    from splitformer.symbolic import derive, load_scheme

    scheme = load_scheme(name)
    program = derive(scheme)
    assert _numeric_error(scheme, program) < 1e-25
    assert _numeric_error(replace(scheme, causal=False), program) > 1e-3


def test_llama_recovery_fails_with_interleaved_pairs(monkeypatch):
    """Negative control: a reference rotating interleaved pairs (2r, 2r + 1) is not the derived layout."""
    from splitformer.symbolic import derive, load_scheme, references

    def interleaved(x, head_width, theta, positions):
        def entry(i, column):
            e, base = column % head_width, column - column % head_width
            r, partner = e // 2, base + (e ^ 1)
            angle = positions[i] * theta ** (-sp.Rational(2 * r, head_width))
            sign = -1 if e % 2 == 0 else 1
            return x[i, column] * sp.cos(angle) + sign * x[i, partner] * sp.sin(angle)

        return sp.Matrix(x.shape[0], x.shape[1], entry)

    scheme = load_scheme("llama")
    program = derive(scheme)
    assert _numeric_error(scheme, program) < 1e-25  # the numeric recovery at 30 digits, as the check does at 50
    monkeypatch.setattr(references, "rotary", interleaved)
    assert _numeric_error(scheme, program) > 1e-3
