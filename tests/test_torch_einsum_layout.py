"""The torch printer orders a product's two operands so that ``torch.einsum`` returns it in the output's layout
(``codegen.backends._laid_out``). torch lays a product of two out as (the axes both keep, the first operand's own, the
second's) and permutes that to the output's order; a weight's gradient ``W̄[k, z] = Σ_i w̄[i, z] x[i, k]`` written
with ``w̄`` first came out transposed at batch 1, and autograd copied it into the parameter's layout at every step."""

import random
import re

import pytest
import torch

from splitformer.codegen import backends
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme

from conftest import GENERATED, import_path

_TWO_OPERANDS = re.compile(r'torch\.einsum\("([a-z]+),([a-z]+)->([a-z]+)", \w+(?:\.to\(\w+\.dtype\))?, \w+')


def _post_ln_torch(folder) -> str:
    """post-ln's torch module as the generator writes it now."""
    return generate(load_scheme("post-ln"), ("torch",), folder)[folder / "torch" / "post_ln.py"]


def _specs(sources) -> set[tuple[str, str, str]]:
    return {match.groups() for source in sources for match in _TWO_OPERANDS.finditer(source)}


def _contiguous(first: str, second: str, output: str, draws: int = 48) -> bool:
    """Whether ``torch.einsum`` of random operands returns a contiguous result at every draw of the axes' sizes (1
    among them: torch's layout differs there)."""
    rng = random.Random(f"{first},{second}->{output}")
    for _ in range(draws):
        sizes = {label: rng.choice([1, 1, 2, 3, 5]) for label in set(first + second)}
        x, y = (torch.zeros([sizes[label] for label in labels]) for labels in (first, second))
        if not torch.einsum(f"{first},{second}->{output}", x, y).is_contiguous():
            return False
    return True


def _worse_than_swapped(specs) -> list[str]:
    """The specs whose result is laid out otherwise than the output where the operands swapped would give it so."""
    return [f"{first},{second}->{output}" for first, second, output in sorted(specs)
            if not _contiguous(first, second, output) and _contiguous(second, first, output)]


def test_every_emitted_product_takes_the_better_operand_order():
    """Every built-in's and network's torch module (``generated/``, tied to the generator by test_emission)."""
    specs = _specs(path.read_text() for path in sorted(GENERATED.glob("torch/*.py")))
    assert len(specs) >= 20
    assert _worse_than_swapped(specs) == []


def test_a_weight_gradient_comes_out_in_the_parameters_layout(tmp_path):
    """post-ln's derived backward at batch 1: the feed-forward kernels' and W_O's gradients as torch.einsum returns
    them, with no copy."""
    specs = _specs([_post_ln_torch(tmp_path)])
    assert {("bik", "biz", "kz"), ("biz", "bil", "zl"), ("bime", "bil", "mel")} <= specs
    assert all(_contiguous(*spec) for spec in [("bik", "biz", "kz"), ("biz", "bil", "zl"), ("bime", "bil", "mel")])


def test_control_without_the_order_the_gradients_come_out_transposed(monkeypatch, tmp_path):
    monkeypatch.setattr(backends, "_laid_out", lambda op: op)
    specs = _specs([_post_ln_torch(tmp_path)])
    assert {"biz,bik->kz", "bil,biz->zl", "bil,bime->mel"} <= set(_worse_than_swapped(specs))


@pytest.mark.parametrize("batch", [1, 3])
def test_the_derived_gradients_are_unchanged(batch, tmp_path):
    """The reordered products compute what autograd through the same block does (float64)."""
    path = tmp_path / "post_ln.py"
    path.write_text(_post_ln_torch(tmp_path), encoding="utf-8")
    module = import_path(path)
    torch.manual_seed(batch)
    derived = module.Block(16, 2, 32, backward="derived", dtype=torch.float64)
    plain = module.Block(16, 2, 32, dtype=torch.float64).load_params(
        {name: torch.randn_like(value) for name, value in derived.state_dict().items()})
    derived.load_params(dict(plain.state_dict()))
    u = torch.randn(batch, 5, 16, dtype=torch.float64)
    grads = [torch.autograd.grad(block(u).square().sum(), list(block.parameters())) for block in (derived, plain)]
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
