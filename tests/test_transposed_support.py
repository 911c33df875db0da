"""A kind that reads the support with a key in the query's place, ``χ(x̃, x)`` (a tester's mean over the tokens that see
each other, ``∫ χ(x, x̃) χ(x̃, x) u(x̃) dx̃ / ∫ χ(x, η) χ(η, x) dη``), in a causal scheme: the whole sequence is computed
as the formula says, but a cached step would need the earlier tokens as queries of the new ones, which no cache holds.
The emitted code refuses a cache at once, naming it (NumPy and torch, a block and a stack); it crashed in a reshape
inside the step at the second token."""

import numpy as np
import pytest
import torch

_PLUGIN = '''
from dataclasses import dataclass
from typing import ClassVar

from splitformer.symbolic.domains import ETA, FEATURES, X, X_KEY, XI, Y
from splitformer.symbolic.operators import STATE, SUPPORT, Definition, Operator, apply, integral, kernel, register_operator


@register_operator
@dataclass(frozen=True)
class MutualMean(Operator):
    """An affine map of the mean over the tokens that see each other."""

    kind: ClassVar[str] = "qa-mutual-mean"
    symbol: ClassVar[str] = r"\\mathcal{M}"

    def parameters(self):
        return (kernel("W", "W", (XI, Y), (FEATURES, FEATURES), (XI,)), kernel("b", "b", (Y,), (FEATURES,)))

    def definitions(self):
        mutual = lambda key: apply(SUPPORT, X, key) * apply(SUPPORT, key, X)
        mean = integral(mutual(X_KEY) * apply(STATE, X_KEY, Y), X_KEY) / integral(mutual(ETA), ETA)
        return (Definition("m", "m", (X, Y), mean, "the mean over the tokens that see each other"),
                Definition("out", self.symbol, (X, Y), integral(apply("W", XI, Y) * apply("m", X, XI), XI)
                           + apply("b", Y), "an affine map of it"))

    def uses_support(self):
        return True
'''
_SCHEME = '''name = "mutual"
summary = "u + M(u), causal"
causal = true
[operators]
mix = "qa-mutual-mean"
[[steps]]
operator = "mix"
solver = "explicit"
'''
D = 4


@pytest.fixture(scope="module")
def derivation(tmp_path_factory):
    import splitformer

    folder = tmp_path_factory.mktemp("mutual")
    (folder / "mutual_mean.py").write_text(_PLUGIN)
    (folder / "mutual.toml").write_text(_SCHEME)
    splitformer.load_plugin(folder / "mutual_mean.py")
    return splitformer.derive(str(folder / "mutual.toml"))


def _inputs():
    rng = np.random.default_rng(0)
    return rng.standard_normal((2, 5, D)), {"mix.W": rng.standard_normal((D, D)), "mix.b": rng.standard_normal(D)}


def test_the_whole_sequence_is_the_formula(derivation):
    """Causal: each token sees itself alone among those that see it back, so the mean is the token's own state."""
    u, params = _inputs()
    expected = u + u @ params["mix.W"] + params["mix.b"]
    np.testing.assert_allclose(derivation.numpy_module().forward(u, params, causal=True), expected, rtol=0, atol=1e-12)
    block = derivation.torch_module().Block(D, 1, D, dtype=torch.float64).load_params(params)
    np.testing.assert_allclose(block(torch.tensor(u)).detach().numpy(), expected, rtol=0, atol=1e-12)


def test_numpy_refuses_a_cache(derivation):
    module = derivation.numpy_module()
    u, params = _inputs()
    with pytest.raises(ValueError, match=r"^cache: qa-mutual-mean reads the support with a key in the query's place"):
        module.forward(u[:, :1], params, causal=True, cache={})
    with pytest.raises(ValueError, match=r"^cache: qa-mutual-mean"):
        module.forward_stack(u[:, :1], [params, params], causal=True, cache=[{}, {}])


def test_torch_refuses_a_cache(derivation):
    module = derivation.torch_module()
    u, params = _inputs()
    block = module.Block(D, 1, D, dtype=torch.float64).load_params(params)
    with pytest.raises(ValueError, match=r"^cache: qa-mutual-mean reads the support with a key in the query's place"):
        block(torch.tensor(u[:, :1]), cache={})
    stack = module.Stack(2, D, 1, D, dtype=torch.float64, final_norm=False).load_params([params, params])
    with pytest.raises(ValueError, match=r"^cache: qa-mutual-mean"):
        stack(torch.tensor(u[:, :1]), cache=[{}, {}])


def test_check_says_why_it_does_not_decode(tmp_path):
    """``check``'s cached-decoding statement is skipped with the reason (it crashed on the refusal)."""
    import json
    import subprocess
    import sys

    (tmp_path / "mutual_mean.py").write_text(_PLUGIN)
    (tmp_path / "mutual.toml").write_text(_SCHEME)
    result = subprocess.run([sys.executable, "-m", "splitformer", "check", "--load", str(tmp_path / "mutual_mean.py"),
                             str(tmp_path / "mutual.toml"), "--only", "causality", "--format", "json"],
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    checks = {check["id"]: check for check in json.loads(result.stdout)["checks"]}
    assert checks["causality/mutual/cache"]["method"] == "skipped"
    assert "refuses a cache (qa-mutual-mean" in checks["causality/mutual/cache"]["detail"]
    assert checks["causality/mutual/block"]["holds"]
