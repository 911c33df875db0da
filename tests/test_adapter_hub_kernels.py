"""transformers 5.25 depends on the kernels package, which attaches to transformers' classes and modules what their
source does not define (``adapters.hub_kernels``): ``kernel_layer_name`` and a default ``kernel_condition`` on a
class (read by ``kernelize`` only), a module made of a function (``modeling_llama.apply_rotary_pos_emb``), a forward
wrapper routing its calls to a copy made per instance (``LlamaAttention``, ``_kernel_funcs``), and, where
``from_pretrained`` ran ``kernelize``, its record (``_use_kernels``, ``_kernels_mode``). What kernels attaches so is
read; anything else in those places, and every forward ``kernelize`` replaced with a hub kernel's, is refused by name
in one line. Tests that need kernels skip before transformers 5.25, which does not depend on it."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import transformers
from packaging.version import Version
from transformers import activations
from transformers.models.gemma import modeling_gemma
from transformers.models.llama import modeling_llama

from splitformer import SplitformerError
from splitformer.adapters import from_hf
from splitformer.codegen.adapters import hub_kernels
from splitformer.nn import from_hf_lm

from test_adapter_as_built import (_bert_forward, _bert_layer, _generated, _gpt2, _gpt2_forward, _llama, _llama_forward,
                                   _llama_lm)


def _kernels():
    """The kernels package, a dependency of transformers from 5.25 (before, the test is skipped)."""
    if Version(transformers.__version__) < Version("5.25"):
        pytest.skip("transformers before 5.25 does not depend on kernels")
    import kernels

    return kernels


#: Llama's rotary embedding, the function kernels made a module of (``None`` before 5.25).
_ROTARY = hub_kernels.wrapped_function(modeling_llama.apply_rotary_pos_emb)


def _user_rotary(q, k, cos, sin, unsqueeze_dim=1):
    """Llama's rotary embedding with the queries scaled by 1.01, defined here."""
    q_embed, k_embed = _ROTARY(q, k, cos, sin, unsqueeze_dim)
    return 1.01 * q_embed, k_embed


class _DoubledSiLU(torch.nn.Module):
    """A hub kernel's layer for ``SiLU``, defined here: twice the SiLU."""

    def forward(self, input):
        return 2 * torch.nn.functional.silu(input)


class _ScaledRotary(torch.nn.Module):
    """A hub kernel's layer for ``rotary_pos_emb``, defined here: the queries scaled by 1.01."""

    def forward(self, q, k, cos, sin, unsqueeze_dim=1):
        return _user_rotary(q, k, cos, sin, unsqueeze_dim)


class _Repository:
    """A kernel repository that loads ``layer`` from here (the hub's download is what kernels does instead)."""

    def __init__(self, layer):
        self.layer = layer

    def load(self):
        return self.layer


def _kernelized(kernels, name, layer):
    """A Llama layer after ``kernelize`` with ``layer`` as the CPU's hub kernel for ``name``."""
    source = _llama()
    with kernels.use_kernel_mapping({name: {"cpu": _Repository(layer)}}):
        kernels.kernelize(source, mode=kernels.Mode.INFERENCE, device="cpu")
    return source


def test_what_kernels_attaches_as_built_is_read(rng):
    """The attachments are there (so this reads them) and the sources are read equal to their forwards."""
    _kernels()
    for cls, layer_name in ((modeling_llama.LlamaRMSNorm, "RMSNorm"), (activations.SiLUActivation, "SiLU"),
                            (activations.NewGELUActivation, "NewGELU"), (activations.GELUActivation, "GeLU")):
        assert cls.kernel_layer_name == layer_name
        assert hub_kernels.default_condition(cls, "kernel_condition", vars(cls)["kernel_condition"])
    assert hub_kernels.function_module(modeling_llama.apply_rotary_pos_emb)
    wrapper = vars(modeling_llama.LlamaAttention)["forward"]
    assert hub_kernels.unwrapped(wrapper) is not wrapper
    assert hub_kernels.function_module(vars(_llama().self_attn)["_kernel_funcs"]["rotary_pos_emb"])
    for make, forward, d in ((_llama, _llama_forward, 16), (_gpt2, _gpt2_forward, 8), (_bert_layer, _bert_forward, 8)):
        module = make()
        u = rng.standard_normal((2, 5, d))
        assert np.abs(_generated(from_hf(module), u) - forward(module, u)).max() <= 1e-10


def test_the_record_of_a_kernelize_that_replaced_nothing_is_read(tmp_path):
    """5.25's ``from_pretrained`` runs ``kernelize`` by default; on the CPU it finds no hub kernel, leaves every
    forward the class's and records ``_use_kernels=True`` with ``_kernels_mode``: read. That record with a mode that
    is not kernels', or ``_use_kernels`` without a mode, is refused."""
    kernels = _kernels()
    _llama_lm().save_pretrained(tmp_path)
    loaded = transformers.LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float64).eval()
    assert loaded._use_kernels is True and loaded._kernels_mode == kernels.Mode.INFERENCE
    from_hf_lm(loaded)
    loaded._kernels_mode = "inference"
    with pytest.raises(SplitformerError, match=r"^LlamaForCausalLM\._kernels_mode is 'inference', but "):
        from_hf_lm(loaded)
    del loaded._kernels_mode
    with pytest.raises(SplitformerError, match=r"^LlamaForCausalLM\._use_kernels is True, but "):
        from_hf_lm(loaded)


@pytest.mark.parametrize("name, layer, part", [
    ("SiLU", _DoubledSiLU, "mlp.act_fn"),
    ("rotary_pos_emb", _ScaledRotary, "self_attn._kernel_funcs['rotary_pos_emb']"),
], ids=["a layer", "a function's copy"])
def test_a_forward_kernelize_replaced_is_refused(name, layer, part, rng):
    """kernels' own ``kernelize``, with a hub kernel for the CPU (loaded from here, not downloaded), replaces the
    forward of a layer or of a function's copy on the instance: refused by name; the source then computes otherwise
    (> 1e-3). ``kernelize`` without that kernel puts the class's forward back: read, equal to the source."""
    kernels = _kernels()
    source = _kernelized(kernels, name, layer)
    with pytest.raises(SplitformerError, match=rf"^LlamaDecoderLayer\.{re.escape(part)} has its forward replaced on "
                                               r"the instance by kernels' kernelize, with the hub kernel ") as error:
        from_hf(source)
    assert "\n" not in str(error.value)
    kernels.kernelize(source, mode=kernels.Mode.INFERENCE, device="cpu")
    u = rng.standard_normal((2, 5, 16))
    read = _generated(from_hf(source), u)
    assert np.abs(read - _llama_forward(source, u)).max() <= 1e-10
    assert np.abs(read - _llama_forward(_kernelized(kernels, name, layer), u)).max() > 1e-3


def _hook(module, request):
    """A forward hook on ``module`` scaling the queries it returns by 1.01, removed after the test."""
    request.addfinalizer(module.register_forward_hook(lambda _, inputs, out: (1.01 * out[0], out[1])).remove)


def _scaled_forward(kernels, monkeypatch):
    """``LlamaAttention``'s forward scaled by 1.01 under kernels' own wrapper, as ``use_kernelized_func`` makes it."""
    forward = hub_kernels.unwrapped(vars(modeling_llama.LlamaAttention)["forward"])

    class Scaled(torch.nn.Module):
        def forward(self, *arguments, **options):
            out = forward(self, *arguments, **options)
            return (1.01 * out[0], *out[1:])

    wrapped = kernels.use_kernelized_func(modeling_llama.apply_rotary_pos_emb)(Scaled)
    monkeypatch.setattr(modeling_llama.LlamaAttention, "forward", vars(wrapped)["forward"])


def _own_call(monkeypatch):
    monkeypatch.setattr(type(modeling_llama.apply_rotary_pos_emb), "__call__",
                        lambda self, *arguments, **options: _user_rotary(*arguments, **options))


_COPY = r"^LlamaDecoderLayer\.self_attn\._kernel_funcs\['rotary_pos_emb'\]"
_MODULE = r"transformers\.models\.llama\.modeling_llama\.apply_rotary_pos_emb"
_ATTENTION = r"^LlamaDecoderLayer\.self_attn \(LlamaAttention\) runs "

#: What kernels does not attach so, each made on (a Llama layer, kernels, monkeypatch, request), with the message it
#: is refused with, and whether the source then computes otherwise (a kernel_condition is read by kernelize only).
CHANGES = {
    "a kernel_condition of another function": (
        lambda layer, kernels, patch, request: patch.setattr(modeling_llama.LlamaRMSNorm, "kernel_condition",
                                                             staticmethod(lambda module: False), raising=False),
        r"^LlamaDecoderLayer\.input_layernorm \(LlamaRMSNorm\) runs LlamaRMSNorm\.kernel_condition, which is not "
        r"the installed library's own \(defined in .*test_adapter_hub_kernels", False),
    "kernels' default kernel_condition on a class kernels left alone": (
        lambda layer, kernels, patch, request: patch.setattr(
            modeling_llama.LlamaMLP, "kernel_condition", vars(activations.SiLUActivation)["kernel_condition"],
            raising=False),
        r"^LlamaDecoderLayer\.mlp \(LlamaMLP\) runs LlamaMLP\.kernel_condition, which is not the installed "
        r"library's own \(defined in .*kernels", False),
    "kernels' forward wrapper around another forward": (
        lambda layer, kernels, patch, request: _scaled_forward(kernels, patch),
        _ATTENTION + r"LlamaAttention\.forward, which is not the installed library's own \(defined in "
                     r".*test_adapter_hub_kernels", True),
    "the module-level function module made of another function": (
        lambda layer, kernels, patch, request: patch.setattr(
            modeling_llama, "apply_rotary_pos_emb",
            kernels.use_kernel_forward_from_hub("rotary_pos_emb")(_user_rotary)),
        _ATTENTION + _MODULE + r", which is defined in .*test_adapter_hub_kernels", True),
    "a method of the function module's class": (
        lambda layer, kernels, patch, request: _own_call(patch),
        _ATTENTION + _MODULE + r", a module kernels made of a function, but its class's __call__ is not kernels' own",
        True),
    "a forward hook on the module-level function module": (
        lambda layer, kernels, patch, request: _hook(modeling_llama.apply_rotary_pos_emb, request),
        rf"^{_MODULE} has a forward hook", True),
    "the module-level function module's forward replaced on the instance": (
        lambda layer, kernels, patch, request: patch.setitem(vars(modeling_llama.apply_rotary_pos_emb), "forward",
                                                             _user_rotary),
        rf"^{_MODULE} has its forward replaced on the instance; ", True),
    "the copy made of another function": (
        lambda layer, kernels, patch, request: vars(layer.self_attn)["_kernel_funcs"].update(
            rotary_pos_emb=kernels.use_kernel_forward_from_hub("rotary_pos_emb")(_user_rotary)),
        _COPY + r" is a module kernels made of test_adapter_hub_kernels\._user_rotary, not of a library's function",
        True),
    "a forward hook on the copy": (
        lambda layer, kernels, patch, request: _hook(layer.self_attn._kernel_funcs["rotary_pos_emb"], request),
        _COPY + r" has a forward hook", True),
    "a copy of another model's function module (the same computation)": (
        lambda layer, kernels, patch, request: vars(layer.self_attn)["_kernel_funcs"].update(
            rotary_pos_emb=type(modeling_gemma.apply_rotary_pos_emb)()),
        r"^LlamaDecoderLayer\.self_attn\._kernel_funcs is \{'rotary_pos_emb': Func\(\)\}, but LlamaAttention is built "
        r"with \{'rotary_pos_emb': Func\(\)\}", False),
}


@pytest.mark.parametrize("case", list(CHANGES))
def test_what_kernels_does_not_attach_so_is_refused(case, monkeypatch, request, rng):
    """Each change is refused by name in one line (control: the layer unchanged is read); where the source then
    computes otherwise, by more than 1e-3 in float64."""
    change, message, material = CHANGES[case]
    kernels = None if case == "a kernel_condition of another function" else _kernels()
    u = rng.standard_normal((2, 5, 16))
    layer = _llama()
    before = _generated(from_hf(layer), u)
    change(layer, kernels, monkeypatch, request)
    with pytest.raises(SplitformerError, match=message) as error:
        from_hf(layer)
    assert "\n" not in str(error.value)
    assert bool(np.abs(_llama_forward(layer, u) - before).max() > 1e-3) == material
