"""The rotary sum written out as a rotation of each pair, and grouped heads fused (``unroll-pairs``,
``fused-attention``); parity of the emitted llama with transformers is ``tests/test_llama.py``."""

import mpmath
import pytest
import sympy as sp

from splitformer.codegen.ir import Attention, PairTable, Reduction, Unrolled, flat
from splitformer.codegen.lowering import lower
from splitformer.codegen.passes import DEFAULT, PASSES
from splitformer.symbolic import derive, load_scheme

#: The entries as unroll-pairs writes them (shared-trig then reads each cos φ, sin φ from one statement).
_UNSHARED = tuple(rewrite for rewrite in DEFAULT if rewrite is not PASSES["shared-trig"])


@pytest.fixture(scope="module")
def llama_ops():
    program = derive(load_scheme("llama"))
    return tuple(_first_writers(lower(program, passes)) for passes in ((), _UNSHARED))


def _first_writers(module):
    """Each array's computing op (the cache re-binds the keys after)."""
    ops = {}
    for op in module.ops:
        ops.setdefault(op.out, op)
    return ops


def _rotation(phi):
    return ((sp.cos(phi), -sp.sin(phi)), (sp.sin(phi), sp.cos(phi)))


def _summed_at_50_digits(reduction: Reduction, phi: float, pair: tuple[float, float]) -> list:
    """``Σ_c̃ body(c, c̃)`` at c = 0, 1 for one angle and one pair, from the body as derived (mpmath)."""
    (angle,) = [item for item in reduction.body.atoms(sp.Indexed) if str(item.base.label) == "attn_phi"]
    indices = {str(symbol): symbol for symbol in reduction.body.free_symbols if isinstance(symbol, sp.Idx)}
    c, p = indices["c"], indices["p"]
    values = []
    for row in (0, 1):
        total = mpmath.mpf(0)
        for column in (0, 1):
            term = reduction.body.subs({c: row, p: column, angle: sp.Float(phi, 50)})
            (x,) = term.atoms(sp.Indexed)
            total += mpmath.mpf(str(sp.N(term.subs(x, sp.Float(pair[column], 50)), 50)))
        values.append(total)
    return values


@pytest.mark.parametrize("name", ["attn_qr", "attn_kr"])
def test_the_rotary_sum_becomes_the_rotation_of_each_pair_to_50_digits(llama_ops, name):
    plain, passed = llama_ops
    op = passed[name]
    assert isinstance(op, Unrolled) and (op.axis, op.summed) == ("c", "p")
    (phi,) = {item for row in op.entries for entry in row for item in entry.atoms(sp.Indexed)}
    assert op.entries == _rotation(phi)  # derived by SymPy from cos(φ − (c − c̃)π/2), not typed in
    mpmath.mp.dps = 50
    for angle, pair in ((0.7, (1.3, -0.4)), (-2.9, (0.25, 2.0)), (11.0, (-1.0, 0.5))):
        reference = _summed_at_50_digits(plain[name], angle, pair)
        rotated = [sum(mpmath.mpf(str(sp.N(entry.subs(phi, sp.Float(angle, 50)), 50))) * value
                       for entry, value in zip(row, pair)) for row in op.entries]
        assert max(abs(a - b) for a, b in zip(reference, rotated)) < mpmath.mpf("1e-45")
        # negative control: the rotation by −φ (the transposed matrix) misses the sum
        backwards = [sum(mpmath.mpf(str(sp.N(entry.subs(phi, sp.Float(angle, 50)), 50))) * value
                         for entry, value in zip(column, pair)) for column in zip(*op.entries)]
        assert max(abs(a - b) for a, b in zip(reference, backwards)) > 1e-2


def test_grouped_heads_fuse_into_one_attention_without_repeated_keys(llama_ops):
    plain, passed = llama_ops
    assert isinstance(plain["attn_qr"], Reduction) and "attn_o" in plain and not isinstance(plain["attn_o"], Attention)
    op = passed["attn_o"]
    assert isinstance(op, Attention) and (op.q.name, op.k.name, op.v.name) == ("attn_qr", "attn_kr", "attn_v")
    assert op.q.labels == ("b", "i", "g", "s", "c", "r") and op.k.labels == ("b", "j", "g", "c", "r")
    assert "attn_a" not in passed and "attn_gamma" not in passed


def test_the_emitted_llama_rotates_and_attends_without_the_six_axis_sum():
    from conftest import GENERATED

    swapped = {"torch": ("attn_qr = (attn_q*attn_pair_diagonal[:, :, None, None]).addcmul_(attn_q.flip(4), "
                         "attn_pair_crossed[:, :, None, None])"),
               "numpy": ("attn_qr = attn_q*attn_pair_diagonal[:, :, None, None]\n"
                         "    attn_qr += np.flip(attn_q, 4)*attn_pair_crossed[:, :, None, None]")}
    for backend, library in (("torch", "torch"), ("numpy", "np")):
        source = (GENERATED / backend / "llama.py").read_text(encoding="utf-8")
        # the rotation's tables once (cos φ, cos φ and −sin φ, sin φ), then each pair rotated as a whole
        assert f"attn_pair_diagonal = {library}.stack((attn_phi_cos, attn_phi_cos), {'dim' if library == 'torch' else 'axis'}=2)" in source
        assert swapped[backend] in source
        assert f"attn_phi_cos = {library}.cos(attn_phi)" in source
        assert "attn_o = _grouped_attention(attn_qr, attn_kr, attn_v, 1 / math.sqrt(d_head), chi" in source
        assert f"{library}.sum(attn_q" not in source and "repeat_interleave" not in source and ".repeat(" not in source


def test_the_queries_and_keys_rotations_read_one_pair_of_tables():
    """``pair-tables``: D[c] = M[c][c] and X[c] = M[c][1 − c] of the rotation matrix, built once for both rotations;
    without the pass, each rotation keeps its entries (the stacked rows)."""
    program = derive(load_scheme("llama"))
    module = lower(program)
    tables = {op.out: op for op in flat(module.ops) if isinstance(op, PairTable)}
    rotations = {op.out: op for op in module.ops if isinstance(op, Unrolled)}
    assert set(tables) == {"attn_pair_diagonal", "attn_pair_crossed"} and set(rotations) == {"attn_qr", "attn_kr"}
    for op in rotations.values():
        (cos, minus_sin), (sin, cos_again) = op.entries
        assert [table.name for table in op.tables] == ["attn_pair_diagonal", "attn_pair_crossed"]
        assert tables["attn_pair_diagonal"].entries == (cos, cos_again) and tables["attn_pair_crossed"].entries == (minus_sin, sin)
        assert op.reads() == [op.x.name, "attn_pair_diagonal", "attn_pair_crossed"]
    without = lower(program, tuple(rewrite for rewrite in DEFAULT if rewrite is not PASSES["pair-tables"]))
    assert not any(isinstance(op, PairTable) for op in flat(without.ops))  # negative control
    assert all(op.tables is None for op in without.ops if isinstance(op, Unrolled))
