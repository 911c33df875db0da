"""An ``nn.TransformerEncoder`` with nested tensors (torch's default) zeroes padded tokens on its eval fast path;
the generated Stack computes them. The adapter says so in its notes; valid tokens agree (float64, random)."""

import pytest
import torch

from splitformer.adapters import from_torch

from conftest import GENERATED, import_path


def _encoder(nested):
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(16, 4, 32, dropout=0.0, batch_first=True, dtype=torch.float64)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=nested).eval()
    for parameter in encoder.parameters():
        torch.nn.init.normal_(parameter, std=0.3)
    return encoder


@pytest.mark.parametrize("nested", [True, False])
def test_padded_rows_of_the_nested_fast_path_are_named_in_the_notes(nested):
    encoder = _encoder(nested)
    adapted = from_torch(encoder)
    assert any("padded" in note for note in adapted.notes) == nested
    u = torch.randn(2, 5, 16, dtype=torch.float64)
    padding = torch.tensor([[False] * 5, [False, False, False, True, True]])
    stack = adapted.build(import_path(GENERATED / "torch" / "post_ln.py"))
    with torch.no_grad():
        ours, theirs = stack(u, key_padding_mask=padding), encoder(u, src_key_padding_mask=padding)
    assert torch.allclose(ours[~padding], theirs[~padding], atol=1e-10)
