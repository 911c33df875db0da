"""The LLM checks hold for the derived formulas and fail for wrong ones (negative controls)."""

import sympy as sp

from splitformer.symbolic.checks import llm
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
    assert not llm.rope_relative_check(lambda angle, c, c_in: sp.cos(angle) if c == c_in else sp.sin(angle)).holds


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


def test_recovery_of_each_block_fails_without_its_causal_support():
    """Negative control of ``recovery/<block>``: the derived program read without the causal support."""
    from dataclasses import replace

    from splitformer.symbolic import derive, load_scheme
    from splitformer.symbolic.checks.recovery import recovery_checks

    for name in ("llama", "decoder"):
        scheme = load_scheme(name)
        program = derive(scheme)
        assert all(check.holds for check in recovery_checks(scheme, program)), name
        assert not any(check.holds for check in recovery_checks(replace(scheme, causal=False), program)), name


def test_llama_recovery_fails_with_interleaved_pairs(monkeypatch):
    """Negative control: a reference rotating interleaved pairs (2r, 2r + 1) is not the derived layout."""
    from splitformer.symbolic import derive, load_scheme, references
    from splitformer.symbolic.checks.recovery import recovery_checks

    def interleaved(x, head_width, theta, positions):
        def entry(i, column):
            e, base = column % head_width, column - column % head_width
            r, partner = e // 2, base + (e ^ 1)
            angle = positions[i] * theta ** (-sp.Rational(2 * r, head_width))
            sign = -1 if e % 2 == 0 else 1
            return x[i, column] * sp.cos(angle) + sign * x[i, partner] * sp.sin(angle)

        return sp.Matrix(x.shape[0], x.shape[1], entry)

    monkeypatch.setattr(references, "rotary", interleaved)
    scheme = load_scheme("llama")
    checks = recovery_checks(scheme, derive(scheme))
    assert not next(check for check in checks if check.id == "recovery/llama/numeric").holds
