"""Network modules carry what they compute (``COMPUTES``, a digest of the network's operators,
composition, steps and final norm, not its name), and an adapter building into a network compares
it: a network module from a file that computes otherwise is refused by name, a copy under another
name is accepted (third attacker's finding 09)."""

from __future__ import annotations

import types
from importlib import resources

import pytest
import torch
import transformers

import splitformer
from splitformer import SplitformerError
from splitformer.adapters import from_hf
from splitformer.symbolic.network_spec import load_network, network_names, network_fingerprint, parse_network

from conftest import GENERATED, import_path
from test_adapters import randomize


def _text(name: str, *replace: tuple[str, str]) -> str:
    text = (resources.files("splitformer.symbolic") / "networks" / f"{name}.toml").read_text(encoding="utf-8")
    for old, new in replace:
        assert old in text
        text = text.replace(old, new)
    return text


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_every_generated_network_module_carries_its_networks_digest(backend):
    digests = {}
    for name in network_names():
        module = import_path(GENERATED / backend / f"{name.replace('-', '_')}.py", f"_computes_{backend}_{name}")
        assert "COMPUTES" in module.__all__
        digests[name] = module.COMPUTES
        assert module.COMPUTES == network_fingerprint(load_network(name))
    assert len(set(digests.values())) == len(digests) == 4


@pytest.mark.parametrize("name, replace, same", [
    ("vit", [('name = "vit"', 'name = "my-vit"'), ("summary = ", 'summary = "other" #')], True),
    ("vit", [('scheme = "pre-ln"', 'scheme = "post-ln"')], False),
    ("vit", [('activation = "gelu"', 'activation = "relu"')], False),
    ("vit", [("final_norm = true", "final_norm = false")], False),
    ("vit", [('operator = "head"', 'operator = "classifier"')], False),
    ("resnet-block", [('name = "resnet-block"', 'name = "other"')], True),
    ("resnet-block", [("kernel = 3", "kernel = 5")], False),
    ("unet-level", [('name = "unet-level"', 'name = "other"')], True),
    ("cvt", [('name = "cvt"', 'name = "other"')], True),
])
def test_the_digest_is_the_computation_not_the_name(name, replace, same):
    edited = parse_network(_text(name, *replace), "edited.toml")
    assert (network_fingerprint(edited) == network_fingerprint(load_network(name))) is same


def _vit_source():
    config = transformers.ViTConfig(image_size=16, patch_size=8, hidden_size=16, num_attention_heads=2,
                                    num_hidden_layers=1, intermediate_size=32, layer_norm_eps=1e-6, num_labels=3)
    torch.manual_seed(0)
    return randomize(transformers.ViTForImageClassification(config).double().eval())


def test_build_refuses_a_network_module_computing_another_network(tmp_path):
    """The docs' own-network example (post-LN steps) has vit's parameter names; its logits differ."""
    source = _vit_source()
    adapted = from_hf(source)
    pixels = torch.randn(2, 3, 16, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    copy = tmp_path / "my-vit.toml"
    copy.write_text(_text("vit", ('name = "vit"', 'name = "my-vit"')), encoding="utf-8")
    for module in (import_path(GENERATED / "torch" / "vit.py", "_computes_vit"),  # controls: same computation
                   splitformer.derive(str(copy)).torch_module()):
        with torch.no_grad():
            assert (adapted.build(module).logits(pixels) - source(pixels).logits).abs().max() <= 1e-10
    post = tmp_path / "vit-post.toml"
    post.write_text(_text("vit", ('name = "vit"', 'name = "vit-post"'), ('scheme = "pre-ln"', 'scheme = "post-ln"')),
                    encoding="utf-8")
    with pytest.raises(SplitformerError, match=r"computes another network than ViTForImageClassification "
                                               r"\(the built-in 'vit': COMPUTES") as error:
        adapted.build(splitformer.derive(str(post)).torch_module())
    assert "\n" not in str(error.value)


def test_build_refuses_a_network_module_without_a_digest():
    vit = import_path(GENERATED / "torch" / "vit.py", "_computes_vit_old")
    older = types.SimpleNamespace(__name__="old_vit", PARAMETERS=vit.PARAMETERS, Model=vit.Model)
    with pytest.raises(SplitformerError, match="'old_vit' has no COMPUTES digest .* derive it again"):
        from_hf(_vit_source()).build(older)
