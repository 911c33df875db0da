"""Continuous domains, their uniform grids and the rectangle quadrature rule.

A domain ``Ω`` has a continuous coordinate, a number of grid points ``N`` and a spacing
``Δ``; its measure is ``|Ω| = N Δ``. Several continuous variables may live on one domain
(``x`` and ``x̃`` on the token domain); each gets its own grid index.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy as sp

__all__ = [
    "Domain", "Variable", "TOKENS", "FEATURES", "HEADS", "HEAD_FEATURES", "HIDDEN",
    "X", "X_KEY", "ETA", "Y", "XI", "H", "E", "ZETA", "VARIABLES",
    "KV_HEADS", "GROUP", "PAIR", "FREQUENCIES", "KV_FEATURES", "ATTENTION_FEATURES", "MEMORY",
    "G", "S", "C", "C_IN", "R", "X_MEMORY", "ETA_MEMORY", "H_MIX", "BUCKETS", "B", "SPLITS", "stores",
]


@dataclass(frozen=True)
class Domain:
    """A one-dimensional domain ``Ω_<name>`` discretized by ``size`` uniform cells."""

    name: str
    size: sp.Symbol
    spacing: sp.Symbol
    code_name: str
    description: str

    @property
    def measure(self) -> sp.Symbol:
        """``|Ω|`` as a positive symbol (kept opaque until discretization)."""
        return sp.Symbol(rf"|\Omega_{{{self.name}}}|", positive=True)

    @property
    def latex(self) -> str:
        return rf"\Omega_{{{self.name}}}"


@dataclass(frozen=True)
class Variable:
    """A continuous coordinate on a domain and the grid index that samples it."""

    symbol: sp.Symbol
    domain: Domain
    index: sp.Idx


def _domain(name: str, size: str, code_name: str, description: str) -> Domain:
    return Domain(
        name=name,
        size=sp.Symbol(size, integer=True, positive=True),
        spacing=sp.Symbol(rf"\Delta {name}", positive=True),
        code_name=code_name,
        description=description,
    )


TOKENS = _domain("x", "N_x", "n_tokens", "token positions")
FEATURES = _domain("y", "N_y", "d", "embedding features")
HEADS = _domain("h", "N_h", "n_heads", "attention heads")
HEAD_FEATURES = _domain("e", "N_e", "d_head", "features of one head")
HIDDEN = _domain("z", "N_z", "d_ff", "hidden features of the feed-forward operator")


#: Grouped-query attention: the query heads are the product of a coarser key/value head
#: grid and the members of each group (head ``h = g·N_s + s``, transformers' repeat_kv).
KV_HEADS = _domain("g", "N_g", "n_kv_heads", "key/value heads (grouped-query attention)")
GROUP = _domain("s", "N_s", "n_rep", "query heads sharing one key/value head")
#: Rotary position embedding: a head's features are pairs ``e = c·N_r + r`` (rotate_half's
#: layout), ``c ∈ {0, 1}`` the component and ``r`` the frequency of the pair.
PAIR = Domain("c", sp.Integer(2), sp.Symbol(r"\Delta c", positive=True), "2", "the two components of a rotated pair")
FREQUENCIES = _domain("r", "N_r", "d_half", "rotation frequencies of a head (half its features)")
#: Features of all key/value heads (the canonical layout of ``W_k``, ``W_v``).
KV_FEATURES = _domain("kv", "N_kv", "d_kv", "features of all key/value heads")
#: Features of all attention heads when an attention operator sets its head width (``d_head``):
#: ``n_heads · d_head``, the canonical layout of ``W_q`` and ``W_o`` (without the option: ``d``).
ATTENTION_FEATURES = _domain("q", "N_q", "d_inner", "features of all attention heads (n_heads · d_head)")
#: The memory a decoder's cross-attention reads: its own token domain.
MEMORY = _domain("m", "N_m", "n_memory", "memory token positions (cross-attention)")
#: The buckets of relative token distances a learned score bias is tabulated over (T5).
BUCKETS = _domain("b", "N_b", "n_buckets", "buckets of relative token distances (T5's relative position bias)")


def _variable(name: str, domain: Domain, index: str) -> Variable:
    return Variable(sp.Symbol(name, real=True), domain, sp.Idx(index, domain.size))


#: Continuous coordinates and the grid index each is sampled with. The index letters are
#: also the axis labels of the emitted einsum contractions.
X = _variable("x", TOKENS, "i")
X_KEY = _variable(r"\tilde{x}", TOKENS, "j")
ETA = _variable(r"\eta", TOKENS, "n")
Y = _variable("y", FEATURES, "l")
XI = _variable(r"\xi", FEATURES, "k")
H = _variable("h", HEADS, "m")
E = _variable("e", HEAD_FEATURES, "e")
ZETA = _variable(r"\zeta", HIDDEN, "z")
G = _variable("g", KV_HEADS, "g")
S = _variable("s", GROUP, "s")
C = _variable("c", PAIR, "c")
C_IN = _variable(r"\tilde{c}", PAIR, "p")
R = _variable("r", FREQUENCIES, "r")
X_MEMORY = _variable(r"\hat{x}", MEMORY, "t")
ETA_MEMORY = _variable(r"\hat{\eta}", MEMORY, "o")
#: A second head coordinate: kernels that mix the head axis (talking heads) integrate over it.
H_MIX = _variable(r"\tilde{h}", HEADS, "f")
#: A bucket of relative distances (its grid index is the bucket's number).
B = _variable("b", BUCKETS, "v")
VARIABLES = {variable.symbol: variable for variable in (X, X_KEY, ETA, Y, XI, H, E, ZETA, G, S, C, C_IN, R,
                                                       X_MEMORY, ETA_MEMORY, H_MIX, B)}


#: The stored axes that split into several continuous ones, and what they split into, in order: all heads'
#: features are heads × a head's features (the query heads of grouped attention are key/value heads × group
#: members), a head's features are rotary pairs × frequencies. Any other axis stores its own domain only.
SPLITS: dict[Domain, tuple[tuple[Domain, ...], ...]] = {
    FEATURES: ((HEADS, HEAD_FEATURES),),
    ATTENTION_FEATURES: ((HEADS, HEAD_FEATURES),),
    KV_FEATURES: ((KV_HEADS, HEAD_FEATURES),),
    HEADS: ((KV_HEADS, GROUP),),
    HEAD_FEATURES: ((PAIR, FREQUENCIES),),
}


def stores(shape: tuple[Domain, ...], domains: tuple[Domain, ...], whole: frozenset[Domain] = frozenset()) -> bool:
    """Whether an array stored with axes ``shape`` holds a function of variables on ``domains``: each stored
    axis is the next domain itself, or the next several as a product ``SPLITS`` names (recursively). The axes
    ``whole`` hold their own domain only (d, where an attention sets a head width of its own)."""
    if not shape:
        return not domains
    runs = [(shape[0],)] if shape[0] in whole else _runs(shape[0])
    return any(domains[:len(run)] == run and stores(shape[1:], domains[len(run):], whole) for run in runs)


@functools.cache
def _runs(axis: Domain) -> list[tuple[Domain, ...]]:
    """Every sequence of continuous domains one stored axis may hold."""
    return [(axis,)] + [run for factors in SPLITS.get(axis, ()) for run in _products(factors)]


def _products(axes: tuple[Domain, ...]) -> list[tuple[Domain, ...]]:
    """Every sequence of continuous domains the consecutive stored axes ``axes`` may hold."""
    if not axes:
        return [()]
    return [left + right for left in _runs(axes[0]) for right in _products(axes[1:])]
