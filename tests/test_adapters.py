"""Adapters: source module → canonical → generated forward equals the source (float64, ≤1e-10);
canonical → ``to_torch`` → the source's state dict, tensor for tensor; every refusal has a
mismatched source."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from splitformer import SplitformerError
from splitformer.adapters import from_hf, from_torch, to_torch
from splitformer.codegen.output import write_files
from splitformer.codegen.pipeline import generate
from splitformer.symbolic import load_scheme

from conftest import GENERATED, import_path

D, HEADS, D_FF = 8, 2, 12


@pytest.fixture(scope="session")
def modules(tmp_path_factory):
    """``(numpy module, torch module)`` of a scheme with an activation, generated once per session."""
    cache = {}
    folder = tmp_path_factory.mktemp("adapters")

    def get(scheme: str, activation: str):
        key = (scheme, activation)
        if key not in cache:
            derived = load_scheme(scheme).with_activation(activation)
            write_files(generate(derived, ("numpy", "torch"), folder))
            name = derived.module_name
            cache[key] = tuple(import_path(folder / backend / f"{name}.py", f"_adapters_{backend}_{name}")
                               for backend in ("numpy", "torch"))
        return cache[key]

    return get


def randomize(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Every parameter random (default inits zero biases and hide bugs); gains near 1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float64).to(parameter.dtype)
            is_gain = "norm" in name.lower() and name.endswith("weight")
            parameter.copy_(1 + 0.3 * noise if is_gain else 0.5 * noise)
    return module.eval()


def encoder_layer(*, norm_first=False, activation="relu", bias=True, eps=1e-5, dtype=torch.float64, seed=0):
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, activation=activation, layer_norm_eps=eps,
                                             batch_first=True, norm_first=norm_first, bias=bias, dtype=dtype)
    return randomize(layer, seed)


def assert_same_state(state, reference):
    assert list(state) == list(reference)
    for key in reference:
        assert state[key].dtype == reference[key].dtype and torch.equal(state[key], reference[key]), key


def parity(modules, adapted, source_forward, u, key_padding_mask=None):
    """max |generated − source| over the NumPy forward and the torch Block/Stack built from ``adapted``."""
    numpy_module, torch_module = modules(adapted.scheme, adapted.activation)
    reference = source_forward(torch.tensor(u)).detach().numpy()
    if adapted.stack:
        out = numpy_module.forward_stack(u, adapted.layers, key_padding_mask=key_padding_mask, **adapted.forward_kwargs)
    else:
        out = numpy_module.forward(u, adapted, key_padding_mask=key_padding_mask, **adapted.forward_kwargs)
    module = adapted.build(torch_module)
    mask = None if key_padding_mask is None else torch.tensor(key_padding_mask)
    with torch.no_grad():
        result = module(torch.tensor(u), key_padding_mask=mask).numpy()
    return max(np.abs(out - reference).max(), np.abs(result - reference).max())


# --- torch.nn.TransformerEncoderLayer / TransformerEncoder -------------------------------------------------


@pytest.mark.parametrize("norm_first", [False, True], ids=["post-ln", "pre-ln"])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_encoder_layer_round_trips(norm_first, activation, bias, modules, rng):
    layer = encoder_layer(norm_first=norm_first, activation=activation, bias=bias, eps=1e-4)
    adapted = from_torch(layer)
    assert (adapted.scheme, adapted.activation, adapted.n_heads, adapted.eps, adapted.bias) == (
        "pre-ln" if norm_first else "post-ln", activation, HEADS, 1e-4, bias)
    assert parity(modules, adapted, layer, rng.standard_normal((2, 5, D))) <= 1e-10
    assert_same_state(to_torch(adapted), layer.state_dict())


def test_an_activation_torch_runs_without_its_fast_path_is_read(modules, rng):
    """Attack 28: ``activation=torch.relu`` (not ``F.relu``: torch's fast path is off, activation_relu_or_gelu = 0,
    and its slow path computes torch.relu) was refused as "replaced after construction". Read as ReLU; control: a
    fast-path flag that contradicts the activation is still refused."""
    layer = encoder_layer(activation=torch.relu)
    assert layer.activation_relu_or_gelu == 0
    adapted = from_torch(layer)
    assert adapted.activation == "relu" and parity(modules, adapted, layer, rng.standard_normal((2, 5, D))) <= 1e-10
    layer.activation_relu_or_gelu = 2
    with pytest.raises(SplitformerError, match="activation_relu_or_gelu"):
        from_torch(layer)


def test_encoder_stack_round_trips_with_final_norm(modules, rng):
    torch.manual_seed(0)
    encoder = torch.nn.TransformerEncoder(encoder_layer(norm_first=True), 3, enable_nested_tensor=False,
                                          norm=torch.nn.LayerNorm(D, dtype=torch.float64))
    randomize(encoder, seed=3)
    adapted = from_torch(encoder)
    assert adapted.stack and len(adapted.layers) == 3 and adapted.final_norm is not None
    mask = np.zeros((2, 5), dtype=bool)
    mask[1, 3:] = True
    u = rng.standard_normal((2, 5, D))
    source = lambda x: encoder(x, src_key_padding_mask=torch.tensor(mask))  # noqa: E731
    assert parity(modules, adapted, source, u, key_padding_mask=mask) <= 1e-10
    assert_same_state(to_torch(adapted), encoder.state_dict())


def test_encoder_stack_without_final_norm(modules, rng):
    encoder = randomize(torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False), seed=4)
    adapted = from_torch(encoder)
    assert adapted.final_norm is None
    assert parity(modules, adapted, encoder, rng.standard_normal((2, 4, D))) <= 1e-10
    assert_same_state(to_torch(adapted), encoder.state_dict())


def test_wrong_mapping_breaks_parity(modules, rng):
    """Negative control: swapping W_q and W_k (a plausible mapping bug) is caught by the parity check."""
    layer = encoder_layer()
    adapted = from_torch(layer)
    params = dict(adapted.params)
    params["attn.W_q"], params["attn.W_k"] = params["attn.W_k"], params["attn.W_q"]
    assert parity(modules, adapted.with_params(params), layer, rng.standard_normal((2, 5, D))) > 1e-3


@pytest.mark.parametrize("dtype, bits", [(torch.bfloat16, 8), (torch.float16, 11)])
def test_half_precision_is_widened_exactly_and_stated(dtype, bits, modules, rng):
    layer = encoder_layer(dtype=dtype)
    adapted = from_torch(layer)
    assert adapted.dtype == np.float32
    assert len(adapted.notes) == 1 and str(dtype).removeprefix("torch.") in adapted.notes[0]
    assert f"2^-{bits}" in adapted.notes[0]
    assert_same_state(to_torch(adapted), layer.state_dict())  # widening lost nothing; written back as the source's dtype
    u = rng.standard_normal((2, 5, D)).astype(np.float32)
    assert parity(modules, adapted, layer.float(), u) <= 1e-4  # the float32 forward of the same weights
    assert from_torch(layer, dtype=np.float64).dtype == np.float64


def test_trained_parameters_go_back_to_torch(modules, rng):
    """Train the generated Block one step; ``to_torch`` hands the result to a fresh torch layer."""
    layer = encoder_layer(norm_first=True, activation="gelu")
    adapted = from_torch(layer)
    block = adapted.build(modules("pre-ln", "gelu")[1])
    u = torch.tensor(rng.standard_normal((2, 5, D)))
    block(u).square().sum().backward()
    with torch.no_grad():
        for parameter in block.parameters():
            parameter -= 1e-3 * parameter.grad
    fresh = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dropout=0.0, activation="gelu", batch_first=True,
                                             norm_first=True, dtype=torch.float64).eval()
    fresh.load_state_dict(to_torch(block, like=adapted), strict=True)
    with torch.no_grad():
        assert (block(u) - fresh(u)).abs().max() <= 1e-10
        assert (layer(u) - fresh(u)).abs().max() > 1e-3  # the step changed the weights


def test_bias_less_block_goes_back_to_torch(modules):
    layer = encoder_layer(bias=False)
    adapted = from_torch(layer)
    block = adapted.build(modules("post-ln", "relu")[1])
    assert_same_state(to_torch(block, like=adapted), layer.state_dict())


@pytest.mark.parametrize("bias", [False, True])
def test_a_stack_with_a_final_norm_goes_back_to_torch(modules, bias):
    """Attack s33 H1: a bias-free encoder with a final norm built into a Stack went back as ``KeyError: 'bias'`` (the
    Stack's final norm has no bias to read); with biases, the control."""
    encoder = torch.nn.TransformerEncoder(encoder_layer(norm_first=True, bias=bias), 2, enable_nested_tensor=False,
                                          norm=torch.nn.LayerNorm(D, bias=bias, dtype=torch.float64))
    randomize(encoder, seed=5)
    adapted = from_torch(encoder)
    stack = adapted.build(modules("pre-ln", "relu")[1])
    assert ("bias" in dict(stack.final_norm.named_parameters())) == bias
    assert_same_state(to_torch(stack, like=adapted), encoder.state_dict())


def test_what_an_adapter_read_is_checked_where_it_is_loaded_or_run(modules, rng):
    """Attack s33 M1: ``Block(...).load_params(adapted)`` and the NumPy ``forward(u, adapted)`` ignored the heads, ε
    and scheme the reading records, and computed something else without a word (2.08 with 2 heads for 4). Now they
    refuse what ``load_into`` refuses, naming ``params``; the right Block and call, and a plain dict, still run."""
    layer = encoder_layer()
    adapted = from_torch(layer)
    u = rng.standard_normal((2, 5, D))
    with torch.no_grad():
        reference = layer(torch.tensor(u)).numpy()
    post_numpy, post_torch = modules("post-ln", "relu")
    pre_numpy, pre_torch = modules("pre-ln", "relu")
    refused = {
        "the source has n_heads=2, the Block n_heads=1": lambda: post_torch.Block(D, 1, D_FF, dtype=torch.float64),
        "the source has eps=1e-05, the Block eps=0.001": lambda: post_torch.Block(D, HEADS, D_FF, eps=1e-3,
                                                                                  dtype=torch.float64),
        "the source computes post-ln with relu; the Block computes pre-ln": lambda: pre_torch.Block(
            D, HEADS, D_FF, dtype=torch.float64),
    }
    for message, block in refused.items():
        with pytest.raises(ValueError, match=f"^params: {message}"):
            block().load_params(adapted)
    right = post_torch.Block(D, HEADS, D_FF, dtype=torch.float64).load_params(adapted)
    with torch.no_grad():
        assert np.abs(right(torch.tensor(u)).numpy() - reference).max() <= 1e-12
    for call, message in (
            (lambda: post_numpy.forward(u, adapted), "the source was read with n_heads=2, the call has n_heads=1"),
            (lambda: post_numpy.forward(u, adapted, n_heads=HEADS, eps=1e-3), "read with eps=1e-05, the call has"),
            (lambda: post_numpy.vjp(u, adapted, u), "the call has n_heads=1"),
            (lambda: pre_numpy.forward(u, adapted, **adapted.forward_kwargs), "the source computes post-ln with relu")):
        with pytest.raises(ValueError, match=f"^params: .*{message}"):
            call()
    assert np.abs(post_numpy.forward(u, adapted, **adapted.forward_kwargs) - reference).max() <= 1e-12
    assert np.abs(post_numpy.forward(u, adapted, n_heads=HEADS, eps=np.float32(1e-5)) - reference).max() <= 1e-10
    assert np.abs(pre_numpy.forward(u, dict(adapted), n_heads=HEADS) - reference).max() > 1e-3  # a dict: not checked


def test_the_reading_check_compares_what_the_parameters_compute(modules, rng, monkeypatch):
    """Review s33 of the check above: an int eps matched any eps read (0 == int(0.5)); a Stack's load_params did not
    check its layers; torch's default layer (batch_first=False, dropout 0.1) was refused by a default Block, though
    neither changes what the parameters compute (adapters.md: the call keeps working); and every NumPy call parsed
    the scheme again (a GPT-2 decoding step 0.77 -> 4.18 ms)."""
    from splitformer.codegen.adapters import adapted as adapted_module

    layer = encoder_layer()
    adapted = from_torch(layer)
    u = rng.standard_normal((2, 5, D))
    post_numpy, post_torch = modules("post-ln", "relu")
    with pytest.raises(ValueError, match="^params: the source was read with eps=1e-05, the call has eps=0:"):
        post_numpy.forward(u, adapted, n_heads=HEADS, eps=0)
    from fractions import Fraction  # the eps argument takes a Fraction: 1/100000 is the 1e-5 read

    assert post_numpy.forward(u, adapted, n_heads=HEADS, eps=Fraction(1, 100000)).shape == u.shape
    layers = [from_torch(encoder_layer(seed=seed)) for seed in (1, 2)]  # each layer's reading, as a list
    with pytest.raises(ValueError, match=r"^layers\[0\]: the source has n_heads=2, the Block n_heads=1$"):
        post_torch.Stack(2, D, 1, D_FF, dtype=torch.float64).load_params(layers)
    post_torch.Stack(2, D, HEADS, D_FF, dtype=torch.float64).load_params(layers)
    default = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, dtype=torch.float64).eval()
    assert not default.self_attn.batch_first and default.dropout.p == 0.1
    block = post_torch.Block(D, HEADS, D_FF, dtype=torch.float64).load_params(from_torch(default)).eval()
    with torch.no_grad():
        source = default(torch.tensor(u).transpose(0, 1)).transpose(0, 1)
        assert (block(torch.tensor(u)) - source).abs().max() <= 1e-12
    parsed = []
    original = adapted_module._computed_scheme.__wrapped__
    monkeypatch.setattr(adapted_module, "_computed_scheme", lambda *key: parsed.append(key) or original(*key))
    adapted_module._fingerprint.cache_clear()
    for _ in range(3):
        post_numpy.forward(u, adapted, **adapted.forward_kwargs)
    assert len(parsed) == 1  # once per process, not per call


# --- transformers BERT ------------------------------------------------------------------------------------------


def bert(layers=2, seed=0, **config):
    import transformers
    settings = dict(hidden_size=D, num_attention_heads=HEADS, intermediate_size=D_FF, num_hidden_layers=layers,
                    vocab_size=30, max_position_embeddings=16, hidden_dropout_prob=0.0,
                    attention_probs_dropout_prob=0.0) | config
    torch.manual_seed(seed)
    return randomize(transformers.BertModel(transformers.BertConfig(**settings)).double(), seed)


def test_bert_layer_round_trips(modules, rng):
    model = bert(layers=1, hidden_act="relu", layer_norm_eps=1e-7)
    layer = model.encoder.layer[0]
    adapted = from_hf(layer)
    assert (adapted.scheme, adapted.activation, adapted.eps, adapted.source) == ("post-ln", "relu", 1e-7, ("hf", "BertLayer"))
    source = lambda x: layer(x)[0] if isinstance(layer(x), tuple) else layer(x)  # noqa: E731
    assert parity(modules, adapted, source, rng.standard_normal((2, 5, D))) <= 1e-10
    assert_same_state(to_torch(adapted), layer.state_dict())


def test_a_bert_layer_with_torchs_tanh_gelu_is_read_as_gelu_tanh(modules, rng):
    """``hidden_act="gelu_pytorch_tanh"`` builds transformers' ``GELUTanh``, ``F.gelu(x, approximate="tanh")``: read as
    gelu-tanh since timm's class of that name is (it was refused); GPT-2's ``gelu_new``, the formula written out in
    Python, stays refused (``test_refuses_bert_configurations``)."""
    layer = bert(layers=1, hidden_act="gelu_pytorch_tanh").encoder.layer[0]
    adapted = from_hf(layer)
    assert adapted.activation == "gelu-tanh"
    source = lambda x: layer(x)[0] if isinstance(layer(x), tuple) else layer(x)  # noqa: E731
    assert parity(modules, adapted, source, rng.standard_normal((2, 5, D))) <= 1e-10


def test_bert_model_stack_round_trips_with_padding(modules):
    model = bert(layers=3)
    adapted = from_hf(model)
    assert adapted.stack and adapted.final_norm is None and adapted.activation == "gelu"
    input_ids = torch.tensor([[1, 5, 7, 9, 2, 3], [4, 8, 6, 0, 0, 0]])
    attention_mask = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    with torch.no_grad():
        embedded = model.embeddings(input_ids=input_ids)
        reference = model(input_ids, attention_mask=attention_mask).last_hidden_state
    numpy_module, torch_module = modules(adapted.scheme, adapted.activation)
    padding = ~attention_mask.bool()
    out = numpy_module.forward_stack(embedded.numpy(), adapted.layers, key_padding_mask=padding.numpy(),
                                     **adapted.forward_kwargs)
    kept = attention_mask.bool().numpy()  # padded positions' outputs are not defined by BERT either
    assert np.abs(out - reference.numpy())[kept].max() <= 1e-10
    with torch.no_grad():
        result = adapted.build(torch_module)(embedded, key_padding_mask=padding)
    assert (result - reference)[attention_mask.bool()].abs().max() <= 1e-10
    assert_same_state(to_torch(adapted), model.encoder.state_dict())
    assert any("embeddings" in note for note in adapted.notes)


# --- refusals: each with a mismatched source --------------------------------------------------------------------


def _replace(layer, name, module):
    setattr(layer, name, module)
    return layer


REFUSED_LAYERS = {
    "tanh-gelu": (lambda: encoder_layer(activation=torch.nn.GELU(approximate="tanh")),
                  r"GELU\(approximate='tanh'\).*its fast path \(eval, no grad\) computes the exact GELU"),
    "custom activation": (lambda: encoder_layer(activation=lambda x: x * 2), "activation"),
    "eps differs": (lambda: _replace(encoder_layer(), "norm2", torch.nn.LayerNorm(D, eps=1e-6, dtype=torch.float64)),
                    "norm1.eps=1e-05, norm2.eps=1e-06"),
    "norm without affine": (lambda: _replace(encoder_layer(), "norm1",
                                             torch.nn.LayerNorm(D, elementwise_affine=False, dtype=torch.float64)),
                            "no elementwise affine"),
    "rms norm": (lambda: _replace(encoder_layer(), "norm1", torch.nn.RMSNorm(D, dtype=torch.float64)), "RMSNorm"),
    "mixed bias": (lambda: _replace(encoder_layer(), "linear1", torch.nn.Linear(D, D_FF, bias=False, dtype=torch.float64)),
                   "biases in some parts"),
    "bias_kv": (lambda: _replace(encoder_layer(), "self_attn", torch.nn.MultiheadAttention(
        D, HEADS, add_bias_kv=True, batch_first=True, dtype=torch.float64)), "add_bias_kv"),
    "mixed dtypes": (lambda: _replace(encoder_layer(), "norm1", torch.nn.LayerNorm(D, dtype=torch.float32)),
                     "dtypes float32, float64"),
    "unknown class": (lambda: torch.nn.Linear(D, D), "no torch adapter for Linear"),
}


@pytest.mark.parametrize("case", list(REFUSED_LAYERS))
def test_refuses_what_no_scheme_implements(case):
    make, message = REFUSED_LAYERS[case]
    with pytest.raises(SplitformerError, match=message):
        from_torch(make())


@pytest.mark.parametrize("expected, message", [
    ({"scheme": "post-ln"}, "scheme='pre-ln', asked for scheme='post-ln'"),
    ({"eps": 1e-6}, "eps=1e-05, asked for eps=1e-06"),
    ({"activation": "relu"}, "activation='gelu'"),
    ({"bias": True}, "bias=False, asked for bias=True"),
    ({"n_heads": 4}, "n_heads=2"),
    ({"norm_first": True}, "unknown expectation 'norm_first'"),
])
def test_refuses_explicit_expectations_the_source_does_not_meet(expected, message):
    layer = encoder_layer(norm_first=True, activation="gelu", bias=False)
    with pytest.raises(SplitformerError, match=message):
        from_torch(layer, **expected)
    assert from_torch(layer, scheme="pre-ln", eps=1e-5, bias=False).scheme == "pre-ln"


def test_refuses_stacks_whose_layers_differ():
    encoder = torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False)
    encoder.layers[1].norm_first = True
    with pytest.raises(SplitformerError, match="layer 1 has scheme='pre-ln'"):
        from_torch(encoder)


def test_refuses_a_final_norm_with_another_eps():
    encoder = torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False,
                                          norm=torch.nn.LayerNorm(D, eps=1e-6, dtype=torch.float64))
    with pytest.raises(SplitformerError, match="final norm has eps=1e-06"):
        from_torch(encoder)


@pytest.mark.parametrize("config, message", [
    ({"is_decoder": True}, "decoder"),
    ({"hidden_act": "gelu_new"}, "activation"),
])
def test_refuses_bert_configurations(config, message):
    with pytest.raises(SplitformerError, match=message):
        from_hf(bert(layers=1, **config))


def test_refuses_bert_with_differing_eps():
    model = bert(layers=1)
    model.encoder.layer[0].output.LayerNorm.eps = 1e-5
    with pytest.raises(SplitformerError, match="different LayerNorm eps"):
        from_hf(model)


def test_refuses_loading_into_a_block_of_another_configuration(modules):
    torch_module = modules("post-ln", "relu")[1]
    adapted = from_torch(encoder_layer(bias=False))
    with pytest.raises(SplitformerError, match="the source has bias=False, the Block bias=True"):
        adapted.load_into(torch_module.Block(D, HEADS, D_FF, dtype=torch.float64))
    with pytest.raises(SplitformerError, match="eps"):
        adapted.load_into(torch_module.Block(D, HEADS, D_FF, eps=1e-6, bias=False, dtype=torch.float64))
    with pytest.raises(SplitformerError, match="one block; got a Stack"):
        adapted.load_into(torch_module.Stack(1, D, HEADS, D_FF, bias=False, dtype=torch.float64))
    with pytest.raises(SplitformerError, match="computes pre-ln with gelu"):
        from_torch(encoder_layer(norm_first=True, activation="gelu")).build(torch_module)


def test_refuses_partial_and_inconsistent_parameters(modules):
    adapted = from_torch(encoder_layer(bias=False))
    params = dict(adapted.params)
    del params["ffn.W_2"]
    with pytest.raises(SplitformerError, match="'ffn.W_2' is missing"):
        adapted.with_params(params)
    nonzero = dict(adapted.params) | {"attn.b_q": np.ones(D)}
    with pytest.raises(SplitformerError, match="self_attn.in_proj_bias is nonzero but the source module has no biases"):
        to_torch(nonzero, like=adapted)
    with pytest.raises(ValueError, match="missing parameter 'ffn.W_2'"):
        modules("post-ln", "relu")[1].Block(D, HEADS, D_FF, dtype=torch.float64).load_params(
            {k: v for k, v in from_torch(encoder_layer()).items() if k != "ffn.W_2"})


def test_notes_state_the_layout_and_unknown_classes_are_named():
    layer = torch.nn.TransformerEncoderLayer(D, HEADS, D_FF, batch_first=False, dtype=torch.float64)
    assert any("batch_first=False" in note for note in from_torch(layer).notes)
    with pytest.raises(SplitformerError, match=r"no hf adapter for TransformerEncoderLayer \(supported: .*BertLayer"):
        from_hf(layer)


def test_a_stack_is_not_one_mapping():
    adapted = from_torch(torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False))
    with pytest.raises(SplitformerError, match="stack of 2 layers: use .layers"):
        adapted["attn.W_q"]


# --- fuzzing: any configuration a TransformerEncoderLayer can have that a scheme implements ---------------------

@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(heads=st.sampled_from([1, 2, 4]), head_size=st.integers(1, 4), d_ff=st.integers(1, 20),
       eps=st.sampled_from([1e-12, 1e-6, 1e-5, 0.1]), norm_first=st.booleans(), activation=st.sampled_from(["relu", "gelu"]),
       bias=st.booleans(), tokens=st.integers(1, 6), seed=st.integers(0, 2**16))
def test_any_encoder_layer_round_trips(heads, head_size, d_ff, eps, norm_first, activation, bias, tokens, seed):
    d = heads * head_size
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(d, heads, d_ff, dropout=0.0, activation=activation, layer_norm_eps=eps,
                                             batch_first=True, norm_first=norm_first, bias=bias, dtype=torch.float64)
    layer = randomize(layer, seed)
    adapted = from_torch(layer)
    numpy_module = import_path(GENERATED / "numpy" / f"{adapted.module_name}.py", f"_fuzz_{adapted.module_name}")
    u = np.random.default_rng(seed).standard_normal((2, tokens, d))
    with torch.no_grad():
        reference = layer(torch.tensor(u)).numpy()
    assert np.abs(numpy_module.forward(u, adapted, **adapted.forward_kwargs) - reference).max() <= 1e-10
    assert_same_state(to_torch(adapted), layer.state_dict())


def test_trained_layers_and_their_final_norm_go_back_to_torch():
    """Attack s33 L2: a list of trained mappings of a source with a final norm was refused ("final_norm must be
    given"), and to_torch took no final norm. L1: a whole network's AdaptedModel got messages pointing elsewhere."""
    encoder = torch.nn.TransformerEncoder(encoder_layer(norm_first=True), 2, enable_nested_tensor=False,
                                          norm=torch.nn.LayerNorm(D, dtype=torch.float64))
    randomize(encoder, seed=6)
    adapted = from_torch(encoder)
    layers = [dict(layer) for layer in adapted.layers]
    assert_same_state(to_torch(layers, like=adapted, final_norm=adapted.final_norm), encoder.state_dict())
    with pytest.raises(SplitformerError, match=r"^the source ends with a final norm: pass its parameters"):
        to_torch(layers, like=adapted)
    plain = from_torch(torch.nn.TransformerEncoder(encoder_layer(), 2, enable_nested_tensor=False))
    with pytest.raises(SplitformerError, match="^the source has no final norm: final_norm must be None$"):
        to_torch([dict(layer) for layer in plain.layers], like=plain, final_norm=adapted.final_norm)
    with pytest.raises(SplitformerError, match="^final_norm goes with plain parameters"):
        to_torch(adapted, final_norm=adapted.final_norm)


@pytest.mark.parametrize("where, value, message", [
    ("linear1.weight", float("nan"), "TransformerEncoderLayer.linear1.weight holds NaN or infinite values"),
    ("self_attn.in_proj_bias", float("inf"), "TransformerEncoderLayer.self_attn.in_proj_bias holds NaN or infinite"),
    ("norm1.weight", 2.0, None),  # the control: a finite value reads
])
def test_weights_that_are_not_finite_are_refused_by_name(where, value, message):
    """Attack s33 L9: NaN or infinite weights were read, and every output was NaN."""
    layer = encoder_layer()
    with torch.no_grad():
        layer.get_parameter(where).view(-1)[3] = value
    if message is None:
        assert from_torch(layer).params["norm1.gain"][3] == 2.0
        return
    with pytest.raises(SplitformerError, match="^" + message):
        from_torch(layer)


def test_a_decoder_reading_is_run_with_or_without_its_causal_mask(modules, rng):
    """Review s33: a torch decoder layer takes its causal mask at call time, as the encoder does; the reading check
    refused ``forward(u, memory, adapted, causal=False)``, which computes ``layer(tgt, memory)``."""
    torch.manual_seed(0)
    layer = randomize(torch.nn.TransformerDecoderLayer(D, HEADS, D_FF, dropout=0.0, batch_first=True,
                                                       dtype=torch.float64))
    adapted = from_torch(layer)
    numpy_module, _ = modules(adapted.scheme, adapted.activation)
    u, memory = rng.standard_normal((2, 5, D)), rng.standard_normal((2, 4, D))
    with torch.no_grad():
        unmasked = layer(torch.tensor(u), torch.tensor(memory)).numpy()
    out = numpy_module.forward(u, memory, adapted, **{**adapted.forward_kwargs, "causal": False})
    assert np.abs(out - unmasked).max() <= 1e-12


def test_a_final_norm_given_to_to_torch_is_checked():
    """Review s33: ``to_torch(layers, like=, final_norm=)`` wrote what it was given: a gain alone, torch's names, a
    gain of another length; the state dict then failed ``load_state_dict(strict=True)``."""
    encoder = torch.nn.TransformerEncoder(encoder_layer(norm_first=True), 2, enable_nested_tensor=False,
                                          norm=torch.nn.LayerNorm(D, dtype=torch.float64))
    adapted = from_torch(randomize(encoder, seed=7))
    layers, norm = [dict(layer) for layer in adapted.layers], adapted.final_norm
    for final_norm, message in (({"gain": norm["gain"]}, "final_norm: parameter 'bias' is missing"),
                                ({"weight": norm["gain"], "bias": norm["bias"]}, "final_norm: parameter 'gain' is missing"),
                                ({"gain": norm["gain"][:3], "bias": norm["bias"]}, r"final_norm: gain has shape \(3,\)")):
        with pytest.raises(SplitformerError, match="^" + message):
            to_torch(layers, like=adapted, final_norm=final_norm)
    encoder.load_state_dict(to_torch(layers, like=adapted, final_norm=dict(norm)), strict=True)
