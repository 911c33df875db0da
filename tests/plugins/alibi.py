"""ALiBi (Press et al. 2022) as a user's plug-in: attention whose scores carry a bias per head.

The score of query ``x`` against key ``x̃`` in head ``h`` gains ``−m(h) |p(x) − p(x̃)|``, with
``p`` the token positions (an input every kind may declare) and the slopes ``m`` a learned
control over the heads (``alibi.slopes``, shape ``(n_heads,)``). Under a causal support
(``x̃ ≤ x``) this is ``m(h) (p(x̃) − p(x))``, the form ``symmetric = false`` writes.

Loaded explicitly (``splitformer derive --load tests/plugins/alibi.py scheme.toml``); a scheme
uses it as ``attn = "alibi-attention"`` or ``attn = { kind = "alibi-attention", symmetric = false }``.
"""

from dataclasses import dataclass, replace
from typing import ClassVar

import sympy as sp

from splitformer.symbolic.domains import HEADS, H, X, X_KEY
from splitformer.symbolic.inputs import POSITIONS
from splitformer.symbolic.operators import Attention, apply, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class AlibiAttention(Attention):
    """Multi-head attention with the linear position bias ``−m(h) |p(x) − p(x̃)|`` on its scores."""

    symmetric: bool = True
    kind: ClassVar[str] = "alibi-attention"
    symbol: ClassVar[str] = r"\mathcal{A}^{\mathrm{ALiBi}}"
    input_fields: ClassVar[tuple] = (POSITIONS,)

    def parameters(self):
        return (*super().parameters(), kernel("slopes", "m", (H,), (HEADS,)))

    def definitions(self):
        definitions = list(super().definitions())
        slope, query, key = apply("slopes", H), apply(POSITIONS.name, X), apply(POSITIONS.name, X_KEY)
        bias = -slope * sp.Abs(query - key) if self.symmetric else slope * (key - query)
        position = [definition.function for definition in definitions].index("a")
        score = definitions[position]
        definitions[position] = replace(score, rhs=score.rhs + bias,
                                        meaning=score.meaning + r", plus the head's linear bias in $|p(x) - p(\tilde{x})|$")
        return tuple(definitions)
