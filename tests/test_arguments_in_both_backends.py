"""Generated modules refuse each bad argument before any work with the same words in NumPy and torch
(NumPy shows shapes as tuples, torch as lists): parameter names and shapes, widths, head counts, positions,
caches, dtypes; networks' parameter tables and empty grids.

Also: a memory of 0 tokens gives the empty-support result (the output bias ``b_o`` alone) in both
backends, and non-finite values in ``u`` propagate as in torch (README, "Guarantees").
"""

from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
import torch

from conftest import GENERATED, import_path

SIZES = {"d": 8, "d_ff": 12, "d_kv": 4}  # llama below: n_heads=2, n_kv_heads=1, d_head=4


@functools.cache
def _modules(name):
    return import_path(GENERATED / "numpy" / f"{name}.py"), import_path(GENERATED / "torch" / f"{name}.py")


def _params(module, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(tuple(SIZES[axis] for axis in axes)) for name, axes in module.PARAMETERS.items()}


def _u(seed=1, shape=(2, 5, 8)):
    return np.random.default_rng(seed).standard_normal(shape)


def _message(error, call):
    """The message of the ``error`` ``call`` raises, with no warning on the way (no work done)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(error) as raised:
            call()
    return str(raised.value)


def _block(name, **keywords):
    options = {"n_kv_heads": 1} if name == "llama" else {}
    return _modules(name)[1].Block(8, 2, 12, dtype=torch.float64, **options, **keywords)


# --- 1. unknown parameter names --------------------------------------------------------------

@pytest.mark.parametrize("extra, named", [({"attn.W_z": 0}, "parameter 'attn.W_z'"),
                                          ({"attn.W_z": 0, "W_q": 0}, "parameters 'W_q', 'attn.W_z'")])
def test_unknown_parameter_names_are_refused_in_both_backends(extra, named):
    numpy_module, torch_module = _modules("post_ln")
    params, u = {**_params(numpy_module), **extra}, _u()
    expected = f"unexpected {named} (expected: {', '.join(numpy_module.PARAMETERS)})"
    assert _message(ValueError, lambda: numpy_module.forward(u, params, n_heads=2)) == expected
    assert _message(ValueError, lambda: numpy_module.vjp(u, params, u, n_heads=2)) == expected
    assert _message(ValueError, lambda: _block("post_ln").load_params(params)) == expected
    layers = [_params(numpy_module), params]  # a stack names the layer
    assert _message(ValueError, lambda: numpy_module.forward_stack(u, layers, n_heads=2)) == f"layers[1]: {expected}"
    stack = torch_module.Stack(2, 8, 2, 12, dtype=torch.float64)
    assert _message(ValueError, lambda: stack.load_params(layers)) == f"layers[1]: {expected}"


def test_an_unknown_final_norm_name_is_refused_in_both_backends(monkeypatch):
    numpy_module, torch_module = _modules("pre_ln")
    params, u = _params(numpy_module), _u()
    final_norm = {"gain": np.ones(8), "bias": np.zeros(8), "scale": np.ones(8)}
    expected = "unexpected parameter 'final_norm.scale' (expected: final_norm.gain, final_norm.bias)"
    steps = []
    with monkeypatch.context() as patch:  # attack 24: refused only after every layer had run
        patch.setattr(numpy_module, "forward", lambda *args, **kwargs: steps.append(args))
        assert _message(ValueError, lambda: numpy_module.forward_stack(u, [params], final_norm=final_norm,
                                                                       n_heads=2)) == expected
    assert steps == []  # before any work
    assert _message(ValueError, lambda: numpy_module.vjp_stack(u, [params], u, final_norm=final_norm, n_heads=2)) == expected
    stack = torch_module.Stack(1, 8, 2, 12, dtype=torch.float64, final_norm=True)
    assert _message(ValueError, lambda: stack.load_params([params], final_norm)) == expected
    # the negative control: the same mapping without the extra name is accepted
    del final_norm["scale"]
    assert numpy_module.forward_stack(u, [params], final_norm=final_norm, n_heads=2).shape == u.shape


# --- 2. a memory of 0 tokens -----------------------------------------------------------------

@pytest.mark.parametrize("name", ["decoder", "decoder_pre_ln"])
def test_a_memory_of_zero_tokens_gives_the_output_bias_alone_in_both_backends(name):
    """An empty memory is an empty support: the cross-attention term is ``cross.b_o``, as with one
    memory token whose values are zero (``cross.W_v = cross.b_v = 0``), an independent way to it."""
    numpy_module, _ = _modules(name)
    params, u, rng = _params(numpy_module), _u(), np.random.default_rng(2)
    empty = np.zeros((2, 0, 8))
    out = numpy_module.forward(u, empty, params, n_heads=2)
    silent = {**params, "cross.W_v": np.zeros((8, 8)), "cross.b_v": np.zeros(8)}
    reference = numpy_module.forward(u, rng.standard_normal((2, 1, 8)), silent, n_heads=2)
    scale = np.abs(reference).max()
    assert np.abs(out - reference).max() <= 1e-12 * scale
    # the negative control: a memory that is read changes the result
    assert np.abs(numpy_module.forward(u, rng.standard_normal((2, 1, 8)), params, n_heads=2) - out).max() > 1e-3
    grad_out = _u(3)
    grad_u, grad_memory, _ = numpy_module.vjp(u, empty, params, grad_out, n_heads=2)
    for backward in ("autograd", "derived"):  # attack 24: derived's flash kernel divided by zero (SIGFPE) here
        block = _block(name, backward=backward).load_params(params)
        u_torch, memory = torch.tensor(u, requires_grad=True), torch.tensor(empty, requires_grad=True)
        torch_out = block(u_torch, memory)
        assert np.abs(torch_out.detach().numpy() - out).max() <= 1e-10 * scale
        torch_out.backward(torch.tensor(grad_out))
        assert grad_memory.shape == memory.grad.shape == (2, 0, 8)
        assert np.abs(grad_u - u_torch.grad.numpy()).max() <= 1e-10 * np.abs(grad_u).max()
    assert numpy_module.forward_stack(u, empty, [params, params], n_heads=2).shape == u.shape


def test_a_memory_that_is_not_an_array_is_a_type_error():
    numpy_module, _ = _modules("decoder")
    params, u = _params(numpy_module), _u()
    assert _message(TypeError, lambda: numpy_module.forward(u, None, params, n_heads=2)) == \
        "memory must be an array of numbers, got NoneType"
    assert _message(TypeError, lambda: _block("decoder").load_params(params)(torch.tensor(u), np.zeros((2, 1, 8)))) == \
        "memory must be a torch.Tensor, got ndarray"


# --- 3. shape errors name the wrong argument and the expected shape --------------------------

@pytest.mark.parametrize("name, value, expected", [
    ("ffn.W_1", np.zeros((12, 8)), "parameter 'ffn.W_1' has shape (12, 8), expected (8, 12)"),
    ("ffn.b_1", np.zeros(13), "parameter 'ffn.b_1' has shape (13,), expected (12,)"),
    ("attn.W_q", np.zeros((6, 6)), "parameter 'attn.W_q' has shape (6, 6), expected (8, 8)"),
    ("norm2.gain", np.zeros((8, 1)), "parameter 'norm2.gain' has shape (8, 1), expected (8,)"),
])
def test_a_wrong_parameter_shape_names_the_parameter_and_its_shape_in_both_backends(name, value, expected):
    """d comes from ``u``, d_ff from the first parameter whose other axes fit (a transposed
    ``ffn.W_1`` does not decide it)."""
    numpy_module, _ = _modules("post_ln")
    params = {**_params(numpy_module), name: value}
    assert _message(ValueError, lambda: numpy_module.forward(_u(), params, n_heads=2)) == expected
    assert _message(ValueError, lambda: _block("post_ln").load_params(params)) == expected


def test_the_hidden_width_is_shown_by_name_when_no_parameter_gives_it():
    numpy_module, _ = _modules("post_ln")
    params = {name: value for name, value in _params(numpy_module).items() if not name.startswith("ffn.")}
    assert _message(ValueError, lambda: numpy_module.forward(_u(), params, n_heads=2)) == \
        "missing parameter 'ffn.W_1' of shape (8, d_ff)"


@pytest.mark.parametrize("width", [6, 7])
def test_u_of_another_width_than_the_parameters_names_u_in_both_backends(width):
    numpy_module, _ = _modules("post_ln")
    params, u = _params(numpy_module), _u(shape=(2, 5, width))
    message = "u must have shape (batch, tokens, 8) or (tokens, 8), got "
    assert _message(ValueError, lambda: numpy_module.forward(u, params, n_heads=2)) == message + f"(2, 5, {width})"
    assert _message(ValueError, lambda: numpy_module.vjp(u, params, u, n_heads=2)) == message + f"(2, 5, {width})"
    block = _block("post_ln").load_params(params)
    assert _message(ValueError, lambda: block(torch.tensor(u))) == message + f"[2, 5, {width}]"


@pytest.mark.parametrize("n_heads, error, message", [
    (-2, ValueError, "n_heads must be >= 1, got -2"),
    (0, ValueError, "n_heads must be >= 1, got 0"),
    (2.0, TypeError, "n_heads must be an int, got float"),
])
def test_n_heads_is_checked_before_divisibility_in_both_backends(n_heads, error, message):
    numpy_module, torch_module = _modules("post_ln")
    assert _message(error, lambda: numpy_module.forward(_u(), _params(numpy_module), n_heads=n_heads)) == message
    assert _message(error, lambda: torch_module.Block(8, n_heads, 12)) == message


@pytest.mark.parametrize("n_kv_heads, error, message", [
    (True, TypeError, "n_kv_heads must be an int, got bool"),
    (0, ValueError, "n_kv_heads must be >= 1, got 0"),
    (3, ValueError, "n_heads = 2 is not divisible by n_kv_heads = 3"),
])
def test_n_kv_heads_is_checked_alike_in_both_backends(n_kv_heads, error, message):
    numpy_module, torch_module = _modules("llama")
    params = _params(numpy_module)
    assert _message(error, lambda: numpy_module.forward(_u(), params, n_heads=2, n_kv_heads=n_kv_heads)) == message
    assert _message(error, lambda: torch_module.Block(8, 2, 12, n_kv_heads=n_kv_heads)) == message
    # NumPy integers are ints here as for n_heads
    assert numpy_module.forward(_u(), params, n_heads=2, n_kv_heads=np.int64(1)).shape == (2, 5, 8)


# --- 4. rope_theta and positions -------------------------------------------------------------

@pytest.mark.parametrize("rope_theta, error, message", [
    (0, ValueError, "rope_theta must be finite and > 0, got 0"),
    (-1.0, ValueError, "rope_theta must be finite and > 0, got -1.0"),
    (float("nan"), ValueError, "rope_theta must be finite and > 0, got nan"),
    (float("inf"), ValueError, "rope_theta must be finite and > 0, got inf"),
    (10**400, ValueError, f"rope_theta must be finite and > 0, got {10**400}"),  # attack 24: float() overflowed
    (True, TypeError, "rope_theta must be a real number, got bool"),
    ("1e4", TypeError, "rope_theta must be a real number, got str"),
])
def test_rope_theta_is_a_finite_number_above_zero_in_both_backends(rope_theta, error, message):
    numpy_module, torch_module = _modules("llama")
    params, u, cache = _params(numpy_module), _u(), {}
    call = functools.partial(numpy_module.forward, u, params, n_heads=2, n_kv_heads=1, rope_theta=rope_theta)
    assert _message(error, lambda: call(cache=cache)) == message
    assert cache == {}  # refused before any work
    assert _message(error, lambda: numpy_module.vjp(u, params, u, n_heads=2, n_kv_heads=1, rope_theta=rope_theta)) == message
    assert _message(error, lambda: torch_module.Block(8, 2, 12, n_kv_heads=1, rope_theta=rope_theta)) == message
    # the negative control: a small θ (all angles larger) is fine
    assert np.isfinite(numpy_module.forward(u, params, n_heads=2, n_kv_heads=1, rope_theta=0.5)).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_block_reading_positions_refuses_dtypes_narrower_than_float32(dtype):
    """Attack 25: a float16 llama Block took position 70000 as inf (a finite, different output where one token's
    attention cannot depend on its position) and bfloat16 took 257 as 256, default positions in long decoding too.
    Refused at construction and, after ``.to(dtype)``, at the call; control: float32, and blocks without positions."""
    _, torch_module = _modules("llama")
    message = (f"a block that reads token positions runs in float32 or wider, got {dtype}: the positions and the "
               "angles computed from them would be rounded to it")
    assert _message(ValueError, lambda: torch_module.Block(8, 2, 12, n_kv_heads=1, dtype=dtype)) == message
    block = _block("llama").to(dtype)
    assert _message(ValueError, lambda: block(torch.zeros(1, 2, 8, dtype=dtype))) == message
    assert _block("llama").float()(torch.zeros(1, 2, 8)).dtype == torch.float32
    assert _modules("post_ln")[1].Block(8, 2, 12, dtype=dtype)(torch.zeros(1, 2, 8, dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_positions_must_be_finite_in_both_backends(bad):
    numpy_module, _ = _modules("llama")
    params, u, cache = _params(numpy_module), _u(), {}
    positions = np.array([0.0, 1.0, bad, 3.0, 4.0])
    message = f"positions must be finite, got {bad}"
    assert _message(ValueError, lambda: numpy_module.forward(u, params, n_heads=2, n_kv_heads=1, positions=positions,
                                                             cache=cache)) == message
    assert cache == {}
    assert _message(ValueError, lambda: numpy_module.vjp(u, params, u, n_heads=2, n_kv_heads=1, positions=positions)) == message
    block, torch_cache = _block("llama").load_params(params), {}
    assert _message(ValueError, lambda: block(torch.tensor(u), positions=torch.tensor(positions), cache=torch_cache)) == message
    assert torch_cache == {}


def test_positions_must_be_real_in_both_backends():
    numpy_module, _ = _modules("llama")
    params, u = _params(numpy_module), _u()
    message = "positions must be real numbers of shape "
    for positions in (np.arange(5) + 0j, np.ones(5, dtype=bool)):
        assert _message(ValueError, lambda: numpy_module.forward(u, params, n_heads=2, n_kv_heads=1,
                                                                 positions=positions)).startswith(message)
        assert _message(ValueError, lambda: _block("llama").load_params(params)(
            torch.tensor(u), positions=torch.tensor(positions))).startswith(message)
    # integers and fractional positions are fine, and agree; (1, tokens), transformers' position_ids, as (tokens,)
    for positions in (np.arange(5), np.arange(5) * 0.5, np.arange(5)[None] * 0.5):
        out = numpy_module.forward(u, params, n_heads=2, n_kv_heads=1, positions=positions)
        torch_out = _block("llama").load_params(params)(torch.tensor(u), positions=torch.tensor(positions))
        assert np.abs(out - torch_out.detach().numpy()).max() <= 1e-10 * np.abs(out).max()
        assert np.array_equal(out, numpy_module.forward(u, params, n_heads=2, n_kv_heads=1,
                                                        positions=np.broadcast_to(positions, u.shape[:2])))
    for positions in (np.arange(15).reshape(3, 5), np.arange(5)[None, None]):  # control: other shapes are refused
        assert _message(ValueError, lambda: numpy_module.forward(u, params, n_heads=2, n_kv_heads=1,
                                                                 positions=positions)).startswith(message)


# --- 5. grad_out, cache, dtype ---------------------------------------------------------------

def test_grad_out_that_is_not_an_array_is_a_type_error():
    numpy_module, _ = _modules("pre_ln")
    params, u = _params(numpy_module), _u()
    message = "grad_out must be an array of numbers, got NoneType"
    assert _message(TypeError, lambda: numpy_module.vjp(u, params, None, n_heads=2)) == message
    assert _message(TypeError, lambda: numpy_module.vjp_stack(u, [params], None, n_heads=2)) == message
    assert _message(TypeError, lambda: numpy_module.forward(None, params)) == "u must be an array of numbers, got NoneType"


def _corruptions(array):
    """(cache, error, message with {array} for the backend's array type, {list} for its shape brackets)."""
    good = array(np.zeros((2, 3, 1, 2, 2))), array(np.zeros((2, 3, 1, 4)))
    return [
        ({"k": 1}, ValueError, "cache must be empty or hold exactly 'attn.kr', 'attn.v', got 'k'"),
        ({"attn.kr": good[0]}, ValueError, "cache must be empty or hold exactly 'attn.kr', 'attn.v', got 'attn.kr'"),
        ({"attn.kr": 1, "attn.v": good[1]}, TypeError, "cache['attn.kr'] must be {array}, got int"),
        ({"attn.kr": good[0], "attn.v": array(np.zeros((3, 3, 1, 4)))}, ValueError,
         "cache['attn.v'] must be {dtype} of shape (batch=2, tokens, …), got {dtype} {shape}"),
        ({"attn.kr": good[0], "attn.v": array(np.zeros((2, 4, 1, 4)))}, ValueError,
         "cache entries hold different numbers of tokens: 3 and 4"),
    ]


def test_a_corrupted_cache_is_named_in_both_backends():
    numpy_module, _ = _modules("llama")
    params, u = _params(numpy_module), _u()
    backends = [
        (lambda cache: numpy_module.forward(u, params, n_heads=2, n_kv_heads=1, cache=cache),
         np.asarray, {"array": "a NumPy array", "dtype": "float64", "shape": "(3, 3, 1, 4)"}),
        (lambda cache: _block("llama").load_params(params)(torch.tensor(u), cache=cache),
         torch.tensor, {"array": "a torch.Tensor", "dtype": "torch.float64", "shape": "[3, 3, 1, 4]"}),
    ]
    for call, array, words in backends:
        for cache, error, message in _corruptions(array):
            assert _message(error, lambda: call(cache)) == message.format(**words)
        assert _message(TypeError, lambda: call([])) == "cache must be a dict (empty at the first call) or None, got list"
        cache = {}
        call(cache)  # the negative control: a cache it wrote itself is accepted on the next call
        assert call(cache).shape == (2, 5, 8)


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, torch.complex64, "float64", np.float64, torch.float8_e4m3fn])
def test_torch_blocks_take_floating_dtypes_only(dtype):
    """float8 too (a tester's finding: torch's initializer raised NotImplementedError for it)."""
    _, torch_module = _modules("post_ln")
    message = f"dtype must be torch.float16, torch.bfloat16, torch.float32, torch.float64 or None, got {dtype}"
    assert _message(TypeError, lambda: torch_module.Block(8, 2, 12, dtype=dtype)) == message
    assert _message(TypeError, lambda: torch_module.Stack(2, 8, 2, 12, dtype=dtype)) == message
    network = import_path(GENERATED / "torch" / "resnet_block.py")  # an integer dtype failed in torch's requires_grad
    assert _message(TypeError, lambda: network.Model(4, 4, dtype=dtype)) == message
    assert torch_module.Block(8, 2, 12, dtype=torch.float16).attn.W_q.dtype == torch.float16


# --- 6. non-finite values propagate as in torch ----------------------------------------------

@pytest.mark.parametrize("name", ["post_ln", "pre_ln", "llama"])
def test_a_nan_in_u_propagates_as_in_torch(name):
    """Not checked (a per-call scan of the weights would cost a pass over them; README): a NaN
    reaches the same outputs in both backends, and every other output is unchanged."""
    numpy_module, _ = _modules(name)
    params, u = _params(numpy_module), _u()
    options = {"n_heads": 2, "n_kv_heads": 1} if name == "llama" else {"n_heads": 2}
    clean = numpy_module.forward(u, params, **options)
    u[0, 2, 3] = np.nan
    out = numpy_module.forward(u, params, **options)
    block = _block(name).load_params(params).eval()
    with torch.no_grad():
        torch_out = block(torch.tensor(u)).numpy()
    poisoned = np.isnan(out)
    assert np.array_equal(poisoned, np.isnan(torch_out)) and poisoned[0].any() and not poisoned[1].any()
    assert np.abs(out[~poisoned] - torch_out[~poisoned]).max() <= 1e-10 * np.abs(clean).max()
    assert np.array_equal(out[1], clean[1])


# --- 1, for the whole models: the names of the vision and grid modules ------------------------

def _table_params(tables, sizes, seed=0):
    rng = np.random.default_rng(seed)
    return {name: rng.standard_normal(tuple(sizes[axis] if isinstance(axis, str) else axis for axis in axes)) + 2.0
            for table in tables for name, axes in table.items()}  # + 2: positive variances


def test_unknown_names_are_refused_by_the_numpy_vit_as_by_torchs():
    numpy_module = import_path(GENERATED / "numpy" / "vit.py")
    sizes = {"n_channels": 3, "patch_size": 2, "d": 8, "d_ff": 12, "n_tokens": 5, "n_classes": 3}
    params = _table_params([numpy_module.PARAMETERS, numpy_module.HEAD_PARAMETERS], sizes)
    params.update({f"layers.0.{name}": value for name, value in _table_params([numpy_module.LAYER_PARAMETERS], sizes).items()})
    image = _u(shape=(1, 3, 4, 4))
    assert numpy_module.logits(image, params, patch_size=2, n_heads=2).shape == (1, 3)
    for extra in ("layers.1.attn.W_q", "embed.scale"):  # a second layer without its ffn.W_1 was ignored before
        assert _message(ValueError, lambda: numpy_module.forward(image, {**params, extra: np.zeros((8, 8))},
                                                                 patch_size=2, n_heads=2)) == \
            f"unexpected parameter {extra!r}"


def test_unknown_and_partial_transfer_names_are_refused_by_the_numpy_resnet_block():
    numpy_module = import_path(GENERATED / "numpy" / "resnet_block.py")
    params, u = _table_params([numpy_module.PARAMETERS], {"n_channels": 4, "d": 4}), _u(shape=(1, 4, 5, 5))
    assert numpy_module.forward(u, params).shape == u.shape
    assert _message(ValueError, lambda: numpy_module.forward(u, {**params, "conv3.W": 0})) == "unexpected parameter 'conv3.W'"
    # a transfer (shortcut) given in part was taken for no transfer at all
    assert _message(ValueError, lambda: numpy_module.forward(u, {**params, "shortcut.b": np.zeros(4)})) == \
        "missing parameter 'shortcut.W' of shape (4, 1, 1, 4)"


@pytest.mark.parametrize("name", ["resnet_block", "unet_level"])
def test_grid_networks_give_empty_batches_empty_results_and_refuse_grids_of_no_nodes(name):
    """Attack 24: NumPy's resnet-block reshaped with -1 on an empty batch, and a 0x0 image met NumPy's and torch's
    raw convolution errors naming no argument. Empty batches give empty results (and gradients) in both backends;
    a grid of no nodes is refused naming u."""
    numpy_module, torch_module = _modules(name)
    options = {"stride": 2, "transfer": True} if name == "resnet_block" else {}
    model = torch_module.Model(3, 6, dtype=torch.float64, backward="derived", **options)
    params = {key: value.detach().numpy() for key, value in model.state_dict().items()}
    x = torch.zeros(0, 3, 8, 8, dtype=torch.float64, requires_grad=True)
    out = model(x)
    out.sum().backward()
    options.pop("transfer", None)
    assert numpy_module.forward(np.zeros((0, 3, 8, 8)), params, **options).shape == tuple(out.shape) == \
        ((0, 6, 4, 4) if name == "resnet_block" else (0, 3, 8, 8))
    assert x.grad.shape == x.shape
    expected = "u must hold at least one node along height and width, got (2, 3, 0, 0)"
    assert _message(ValueError, lambda: numpy_module.forward(np.zeros((2, 3, 0, 0)), params, **options)) == expected
    assert _message(ValueError, lambda: model(torch.zeros(2, 3, 0, 0, dtype=torch.float64))) == expected
    assert _message(ValueError, lambda: model(torch.zeros(2, 3, 4, 0, dtype=torch.float64))) == expected.replace(
        "height and width, got (2, 3, 0, 0)", "width, got (2, 3, 4, 0)")


def test_the_torch_vit_gives_an_empty_batch_empty_logits():
    """Attack 24: the torch ViT network reshaped its patch tokens with -1 (no size on 0 elements)."""
    torch_module = import_path(GENERATED / "torch" / "vit.py")
    model = torch_module.Model(n_layers=1, d_model=8, n_heads=2, d_ff=12, n_channels=3, patch_size=2,
                               image_size=(4, 4), n_classes=5, dtype=torch.float64)
    assert tuple(model.logits(torch.zeros(0, 3, 4, 4, dtype=torch.float64)).shape) == (0, 5)
    assert tuple(model(torch.zeros(0, 3, 4, 4, dtype=torch.float64)).shape) == (0, 5, 8)
