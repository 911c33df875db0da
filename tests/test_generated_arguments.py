"""Generated modules: every bad argument is a ValueError or TypeError naming it, before any work.

Also: empty batches and token sets give empty results (as torch does), ``bias=False`` never
holds a bias that ``state_dict`` would drop, and LayerNorm is right up to float32's limits.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
import torch

from conftest import GENERATED, import_path


@pytest.fixture(scope="module")
def numpy_module():
    return import_path(GENERATED / "numpy" / "post_ln.py")


@pytest.fixture(scope="module")
def torch_module():
    return import_path(GENERATED / "torch" / "post_ln.py")


def _params(module, d=8, d_ff=12, seed=0, **sizes):
    rng = np.random.default_rng(seed)
    sizes = {"d": d, "d_ff": d_ff, **sizes}
    return {name: rng.standard_normal(tuple(sizes[a] for a in axes)) for name, axes in module.PARAMETERS.items()}


def _u(seed=1, shape=(2, 3, 8)):
    return np.random.default_rng(seed).standard_normal(shape)


@pytest.mark.parametrize("name", ["post_ln", "llama"])
@pytest.mark.parametrize("backward", ["autograd", "derived"])
@pytest.mark.parametrize("shape", [(2, 0, 8), (0, 3, 8), (0, 8)])
def test_empty_batches_and_token_sets_give_empty_results(name, backward, shape):
    """Attack 24: llama's grouped heads reshaped with -1 (no size on 0 elements), and the derived backward's flash
    kernel divided by zero on 0 tokens (SIGFPE: the process died). Empty results and empty gradients now."""
    numpy_module, torch_module = (import_path(GENERATED / backend / f"{name}.py") for backend in ("numpy", "torch"))
    params = _params(numpy_module) if name == "post_ln" else _params(numpy_module, d_kv=8)
    out = numpy_module.forward(np.zeros(shape), params, n_heads=2)
    block = torch_module.Block(8, 2, 12, dtype=torch.float64, backward=backward).load_params(params)
    u = torch.zeros(shape, dtype=torch.float64, requires_grad=True)
    torch_out = block(u)
    torch_out.sum().backward()
    assert out.shape == shape == tuple(torch_out.shape) == tuple(u.grad.shape)


@pytest.mark.parametrize("change, error, message", [
    (lambda p: p.update({"ffn.W_1": np.zeros(8)}), ValueError, r"'ffn.W_1' has shape \(8,\), expected \(8, 12\)"),
    (lambda p: p.update({"ffn.W_1": np.float64(3)}), ValueError, r"'ffn.W_1' has shape \(\), expected \(8, 12\)"),
    (lambda p: p.pop("ffn.W_1"), ValueError, r"missing parameter 'ffn.W_1' of shape \(8, 12\)"),
    (lambda p: p.update({"attn.W_q": torch.zeros(8, 8, requires_grad=True)}), TypeError,
     r"parameter 'attn.W_q' cannot be read as a NumPy array \(Tensor"),
    (lambda p: p.update({"attn.W_q": torch.zeros(8, 8, dtype=torch.bfloat16)}), TypeError,
     "parameter 'attn.W_q' cannot be read as a NumPy array"),
    (lambda p: p.update({"attn.b_q": [1.0, 2.0]}), ValueError, r"'attn.b_q' has shape \(2,\), expected \(8,\)"),
    (lambda p: p.update({"attn.b_q": np.zeros(8, dtype=bool)}), ValueError, "'attn.b_q' has dtype bool"),
])
def test_bad_parameters_are_named(change, error, message, numpy_module):
    params = _params(numpy_module)
    change(params)
    with pytest.raises(error, match=message):
        numpy_module.forward(_u(), params, n_heads=2)


@pytest.mark.parametrize("keywords, error, message", [
    ({"n_heads": True}, TypeError, "n_heads must be an int, got bool"),
    ({"n_heads": 2.0}, TypeError, "n_heads must be an int, got float"),
    ({"n_heads": 0}, ValueError, "n_heads must be >= 1, got 0"),
    ({"eps": -1}, ValueError, "eps must be finite and >= 0, got -1"),
    ({"eps": float("nan")}, ValueError, "eps must be finite and >= 0"),
    ({"eps": 10**400}, ValueError, "eps must be finite and >= 0"),  # attack 24: float() overflowed
    ({"eps": True}, TypeError, "eps must be a real number, got bool"),
    ({"eps": "1e-5"}, TypeError, "eps must be a real number, got str"),
    ({"causal": "yes"}, TypeError, "causal must be a bool, got str"),
])
def test_bad_keywords_are_named(keywords, error, message, numpy_module):
    with pytest.raises(error, match=message):
        numpy_module.forward(_u(), _params(numpy_module), **keywords)


def test_numpy_integers_lists_and_plain_tensors_are_accepted(numpy_module):
    params, u = _params(numpy_module), _u()
    expected = numpy_module.forward(u, params, n_heads=2)
    np.testing.assert_array_equal(numpy_module.forward(u, params, n_heads=np.int64(2)), expected)
    np.testing.assert_array_equal(numpy_module.forward(u.tolist(), params, n_heads=2), expected)
    tensors = {name: torch.from_numpy(value) for name, value in params.items()}
    np.testing.assert_array_equal(numpy_module.forward(u, tensors, n_heads=2), expected)


def test_mappings_and_stacks_are_checked(numpy_module):
    params, u = _params(numpy_module), _u()
    with pytest.raises(TypeError, match="params must be a mapping of canonical names to arrays, got list"):
        numpy_module.forward(u, [params])
    with pytest.raises(ValueError, match="layers is empty: a stack needs at least one layer"):
        numpy_module.forward_stack(u, [])
    with pytest.raises(TypeError, match="layers must be a sequence of parameter mappings, got dict"):
        numpy_module.forward_stack(u, params)
    with pytest.raises(TypeError, match="final_norm must be a mapping"):
        numpy_module.forward_stack(u, [params], final_norm=[1, 2])
    with pytest.raises(TypeError, match="u cannot be read as a NumPy array"):
        numpy_module.forward(torch.zeros(3, 8, dtype=torch.float64, requires_grad=True), params)


@pytest.mark.parametrize("name", ["post_ln", "llama"])
@pytest.mark.parametrize("stack", ["forward_stack", "vjp_stack"])
def test_a_stack_names_the_bad_layer_before_any_work(name, stack, monkeypatch):
    """Every layer is checked before the first step runs, and the error names it (the last layer of three in float32,
    another without a parameter); the control: the same layers run as three steps."""
    module = import_path(GENERATED / "numpy" / f"{name}.py", f"_stack_checks_{name}")
    sizes = {"d_kv": 4} if name == "llama" else {}
    layers, u = [_params(module, seed=seed, **sizes) for seed in range(3)], _u()
    keywords = {"n_heads": 2, "n_kv_heads": 1} if name == "llama" else {"n_heads": 2}
    steps = []
    step = module.forward
    monkeypatch.setattr(module, "forward", lambda *args, **kwargs: steps.append(1) or step(*args, **kwargs))
    run = getattr(module, stack)
    arguments = (u, layers, u) if stack == "vjp_stack" else (u, layers)
    run(*arguments, **keywords)
    assert len(steps) == 3
    first = next(iter(module.PARAMETERS))
    steps.clear()
    layers[2] = {**layers[2], first: layers[2][first].astype(np.float32)}
    with pytest.raises(ValueError, match=rf"^layers\[2\]: u has dtype float64, parameter '{first}' float32$"):
        run(*arguments, **keywords)
    layers[1] = {key: value for key, value in layers[1].items() if key != first}
    with pytest.raises(ValueError, match=rf"^layers\[1\]: missing parameter '{first}'"):
        run(*arguments, **keywords)
    layers[0] = 3
    with pytest.raises(TypeError, match=r"^layers\[0\] must be a mapping of canonical names to arrays, got int$"):
        run(*arguments, **keywords)
    assert steps == []


def test_the_result_is_never_the_callers_array(numpy_module):
    params, u = _params(numpy_module), _u()
    for result in (numpy_module.forward(u, params), numpy_module.forward_stack(u, [params])):
        assert not np.shares_memory(result, u)


@pytest.mark.parametrize("arguments, keywords, error, message", [
    ((16, 4.0, 40), {}, TypeError, "n_heads must be an int, got float"),
    ((16, True, 40), {}, TypeError, "n_heads must be an int, got bool"),
    ((16, 4, -1), {}, ValueError, "d_ff must be >= 1, got -1"),  # >= 0 for a scheme without a feed-forward
    ((0, 1, 4), {}, ValueError, "d_model must be >= 1, got 0"),
    ((16, 3, 40), {}, ValueError, "d_model = 16 is not divisible by n_heads = 3"),
    ((16, 4, 40), {"eps": -1e-5}, ValueError, "eps must be finite and >= 0"),
    ((16, 4, 40), {"bias": 0}, TypeError, "bias must be a bool, got int"),
])
def test_torch_block_arguments_are_checked_when_built(arguments, keywords, error, message, torch_module):
    with pytest.raises(error, match=message):
        torch_module.Block(*arguments, **keywords)


def test_torch_block_and_stack_calls_are_checked(torch_module):
    block = torch_module.Block(8, np.int64(2), 12)
    assert block.n_heads == 2 and type(block.n_heads) is int
    with pytest.raises(TypeError, match="u must be a torch.Tensor, got list"):
        block([[0.0] * 8])
    with pytest.raises(TypeError, match="causal must be a bool, got int"):
        block(torch.zeros(1, 3, 8), causal=1)
    with pytest.raises(TypeError, match="params must be a mapping"):
        block.load_params([1])
    with pytest.raises(ValueError, match="n_layers must be >= 1, got 0"):
        torch_module.Stack(0, 8, 2, 12)
    with pytest.raises(TypeError, match="layers must be a sequence of parameter mappings, got dict"):
        torch_module.Stack(1, 8, 2, 12).load_params({})


def test_bias_false_refuses_biases_it_could_not_save(torch_module, numpy_module):
    params = _params(numpy_module)
    block = torch_module.Block(8, 2, 12, bias=False, dtype=torch.float64)
    with pytest.raises(ValueError, match="parameter 'attn.b_q' is nonzero but the module was built with bias=False"):
        block.load_params(params)
    zero_biases = {name: (0 * value if torch_module._KINDS[name] == "bias" else value) for name, value in params.items()}
    block.load_params(zero_biases)
    u = torch.from_numpy(_u())
    buffer = io.BytesIO()
    torch.save(block.state_dict(), buffer)
    buffer.seek(0)
    restored = torch_module.Block(8, 2, 12, bias=False, dtype=torch.float64)
    restored.load_state_dict(torch.load(buffer))
    torch.testing.assert_close(restored(u), block(u), rtol=0, atol=0)
    np.testing.assert_allclose(block(u).detach().numpy(), numpy_module.forward(_u(), zero_biases, n_heads=2), rtol=0, atol=1e-12)


def _reference_layer_norm(x, gain, bias, eps):
    """LayerNorm in float64 (exact for float32 inputs: their squares stay far below 1e308)."""
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps) * gain + bias


def _extreme_rows(d=16):
    rng = np.random.default_rng(7)
    base = rng.standard_normal((7, d))
    rows = [base[0] * 1e19, base[1] * 1e30, base[2] / np.abs(base[2]).max() * 3.3e38, base[3] * 1e-30,
            np.full(d, 3e38), 1e38 + base[5] * 1e33, base[6]]
    return np.array(rows, dtype=np.float32)[None]


def test_layer_norm_is_right_up_to_the_float32_limits_in_both_backends(numpy_module, torch_module):
    x = _extreme_rows()
    gain = np.random.default_rng(8).standard_normal(16).astype(np.float32)
    bias = np.random.default_rng(9).standard_normal(16).astype(np.float32)
    expected = _reference_layer_norm(x, gain, bias, 1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the overflow that sends rows to the scaled statistics is not the user's
        numpy_out = numpy_module._final_norm(x, {"final_norm.gain": gain, "final_norm.bias": bias}, 1e-5)
    stack = torch_module.Stack(1, 16, 2, 4, final_norm=True)
    stack.load_params([{name: torch.zeros(value.shape) for name, value in stack.layers[0].state_dict().items()}],
                      {"gain": gain, "bias": bias})
    with torch.no_grad():
        torch_out = stack._final_norm(torch.from_numpy(x)).numpy()
    for out in (numpy_out, torch_out):
        assert out.dtype == np.float32 and np.isfinite(out).all()
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
    # negative control: the textbook statistics overflow in float32 on the same rows
    with np.errstate(over="ignore", invalid="ignore"):
        naive = x - x.mean(axis=-1, keepdims=True)
        naive = naive / np.sqrt((naive**2).mean(axis=-1, keepdims=True) + np.float32(1e-5)) * gain + bias
    assert not np.allclose(naive, expected, rtol=1e-4, atol=1e-4)


def test_layer_norm_statistics_keep_float64_parity(numpy_module, torch_module):
    x = np.random.default_rng(3).standard_normal((2, 5, 16)) * 10 + 3
    gain, bias = np.random.default_rng(4).standard_normal((2, 16))
    expected = _reference_layer_norm(x, gain, bias, 1e-5)
    np.testing.assert_allclose(numpy_module._layer_norm(x, gain, bias, 1e-5), expected, rtol=0, atol=1e-13)
    out = torch_module._layer_norm(torch.from_numpy(x), torch.from_numpy(gain), torch.from_numpy(bias), 1e-5)
    np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=1e-13)


def test_rms_norm_is_right_up_to_the_float32_limits_in_both_backends(tmp_path):
    from splitformer.codegen.output import write_files
    from splitformer.codegen.pipeline import generate
    from splitformer.symbolic import parse_scheme

    scheme = parse_scheme('name = "rms-only"\nsummary = "s"\n[operators]\nnorm = "rms-norm"\n'
                          '[[steps]]\noperator = "norm"\nsolver = "projection"\n')
    write_files(generate(scheme, ("numpy", "torch"), tmp_path))
    numpy_rms = import_path(tmp_path / "numpy" / "rms_only.py")
    torch_rms = import_path(tmp_path / "torch" / "rms_only.py")
    x = _extreme_rows()
    gain = np.random.default_rng(8).standard_normal(16).astype(np.float32)
    wide = x.astype(np.float64)
    expected = wide / np.sqrt((wide**2).mean(axis=-1, keepdims=True) + 1e-5) * gain
    block = torch_rms.Block(16, 1, 4).load_params({"norm.gain": gain})
    with torch.no_grad():
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the overflow that sends rows to the scaled statistics is not the user's
            outputs = [numpy_rms.forward(x, {"norm.gain": gain}), block(torch.from_numpy(x)).numpy()]
    for out in outputs:
        assert out.dtype == np.float32 and np.isfinite(out).all()
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_parameters_of_another_floating_dtype_than_u_are_refused_in_both_backends(numpy_module, torch_module):
    params, u = _params(numpy_module), _u().astype(np.float32)
    with pytest.raises(ValueError, match=r"u has dtype float32, parameter 'attn\.W_q' float64"):
        numpy_module.forward(u, params, n_heads=2)
    block = torch_module.Block(8, 2, 12, dtype=torch.float64)
    block.load_params(params)
    with pytest.raises(ValueError, match="u has dtype torch.float32, the block's parameters torch.float64"):
        block(torch.from_numpy(u))
    # controls: one dtype throughout is accepted, integer parameters are cast to u's dtype
    same = {name: value.astype(np.float32) for name, value in params.items()}
    assert numpy_module.forward(u, same, n_heads=2).dtype == np.float32
    integers = {name: np.rint(value * 4).astype(np.int64) for name, value in params.items()}
    assert numpy_module.forward(u, integers, n_heads=2).dtype == np.float32


@pytest.mark.parametrize("wrong", ["ffn.W_1", "ffn.b_1", "ffn.W_2"])
def test_the_one_parameter_whose_hidden_width_disagrees_is_named(numpy_module, wrong):
    """New user, s32: d_ff was read from the first parameter that has it, so a wrong ``ffn.W_1`` was reported as a
    wrong ``ffn.b_1``; the width most parameters agree on is taken now (the wrong one named whichever it is)."""
    params = _params(numpy_module)
    axes = list(numpy_module.PARAMETERS[wrong])
    shape = [12 + 1 if axis == "d_ff" else size for axis, size in zip(axes, params[wrong].shape)]
    params[wrong] = np.ones(shape)
    with pytest.raises(ValueError, match=rf"^parameter '{wrong}' has shape \({shape[0]},"):
        numpy_module.forward(_u(), params, n_heads=2)


def test_a_hidden_width_of_zero_is_named_in_both_backends(numpy_module, torch_module):
    with pytest.raises(ValueError, match=r"d_ff must be >= 1, got 0 \(the d_ff axis of parameter"):
        numpy_module.forward(_u(), _params(numpy_module, d_ff=0), n_heads=2)
    with pytest.raises(ValueError, match="d_ff must be >= 1, got 0"):
        torch_module.Block(8, 2, 0)


def test_big_endian_arrays_are_read_as_the_numbers_they_hold(numpy_module):
    """A tester's finding: float64 stored big-endian (``>f8``: ``np.frombuffer`` of a file's bytes) was refused as
    "u must be float32 or float64, got >f8", or as a parameter of another dtype than ``u``'s, float64 both. The
    block and a network read them as native arrays; control: a big-endian int array is still refused."""
    params, u = _params(numpy_module), _u()
    expected = numpy_module.forward(u, params, n_heads=2)
    swapped = {name: value.astype(">f8") for name, value in params.items()}
    assert np.array_equal(numpy_module.forward(u.astype(">f8"), swapped, n_heads=2), expected)
    with pytest.raises(ValueError, match=r"^u must be float32 or float64, got int32$"):
        numpy_module.forward(u.astype(">i4"), params, n_heads=2)
    network = import_path(GENERATED / "numpy" / "resnet_block.py")
    rng = np.random.default_rng(0)
    net_params = {name: rng.random(tuple(3 if isinstance(axis, str) else axis for axis in axes)) + 0.5
                  for name, axes in network.PARAMETERS.items()}
    x = rng.standard_normal((2, 3, 5, 5))
    assert np.array_equal(network.forward(x.astype(">f8"), net_params), network.forward(x, net_params))


def test_big_endian_parameters_load_into_torch_modules(numpy_module, torch_module):
    """A tester's finding (s45): torch's ``load_params`` refused big-endian arrays as "not a numeric array"
    (``torch.as_tensor`` takes native byte order only), where the NumPy modules read them. A Block, a Stack and a
    network Model load them as the numbers they hold; control: a mapping of strings is still refused."""
    params, u = _params(numpy_module), torch.from_numpy(_u())
    swapped = {name: value.astype(">f8") for name, value in params.items()}
    block, native = (torch_module.Block(8, 2, 12, dtype=torch.float64).load_params(p) for p in (swapped, params))
    assert torch.equal(block(u), native(u))
    stack = torch_module.Stack(2, 8, 2, 12, dtype=torch.float64).load_params([swapped, params])
    assert torch.equal(stack(u), native(native(u)))
    network = import_path(GENERATED / "torch" / "resnet_block.py")
    rng = np.random.default_rng(0)
    net_params = {name: rng.random(tuple(3 if isinstance(axis, str) else axis for axis in axes)) + 0.5
                  for name, axes in network.PARAMETERS.items()}
    model = network.Model(3, 3, dtype=torch.float64)
    x = torch.from_numpy(rng.standard_normal((2, 3, 5, 5)))
    expected = model.load_params(net_params)(x)
    swapped_network = {name: value.astype(">f8") for name, value in net_params.items()}
    assert torch.equal(model.load_params(swapped_network)(x), expected)
    with pytest.raises(ValueError, match=r"^parameter 'attn.W_q' is not a numeric array$"):
        block.load_params({**params, "attn.W_q": np.array([["a"]])})


@pytest.mark.parametrize("network", [False, True], ids=["block", "network"])
def test_a_parameter_beyond_the_modules_range_is_refused_not_loaded_as_inf(torch_module, network):
    """A tester's finding: a float64 1e6 loaded into a float16 module became inf silently (a NumPy module refuses any
    rounding). Refused naming the parameter, nothing loaded; controls: inf itself loads as inf, and 6e4 loads."""
    if network:
        module = import_path(GENERATED / "torch" / "resnet_block.py")
        build, name, index = (lambda dtype: module.Model(3, 3, dtype=dtype)), "conv1.W", (0, 0, 0, 0)
    else:
        build, name, index = (lambda dtype: torch_module.Block(8, 2, 12, dtype=dtype)), "ffn.W_1", (0, 0)
    params = {key: value.detach().double().clone() for key, value in build(torch.float64).named_parameters()}
    target = build(torch.float16)
    before = {key: value.detach().clone() for key, value in target.named_parameters()}
    params[name][index] = -1e6
    with pytest.raises(ValueError, match=rf"^parameter '{name}' holds 1e\+06, beyond torch.float16's range \(±65504\)"):
        target.load_params(params)
    assert all(torch.equal(value, before[key]) for key, value in target.named_parameters())
    for value, loaded in ((float("-inf"), float("-inf")), (-6e4, -6e4)):
        params[name][index] = value
        assert target.load_params(params).get_parameter(name)[index].item() == loaded
