"""The ``scratch-outputs`` pass: a NumPy network program writes each convolution output that dies inside it into
memory kept between calls (``_scratch``), holding that memory while it runs (``_holding_scratch``).

Checked here: which outputs the pass marks in the grid networks (and which it must not: one the program's output is
written into); that a forward's result stays the caller's after the next call; that a forward run inside another on
one thread (a signal handler, a finalizer) leaves the outer's outputs alone; that threads keep their own memory. The
controls mark an output the result is written into, and run the inner forward without holding its memory: both
change a result. Everything in float64 with random parameters, against the modules derived without the pass."""

from __future__ import annotations

import importlib
import re
import threading

import numpy as np
import pytest

import splitformer
from splitformer.codegen.passes import PASSES
from splitformer.codegen.passes.scratch_outputs import scratch_outputs

from conftest import GENERATED, import_path

#: Each grid network: its input's shape, its channels (n_channels, d) and options.
_GRIDS = {"unet-level": ((3, 4, 8, 8), (4, 6), {}),
          "resnet-block": ((3, 4, 8, 8), (4, 4), {"stride": 1})}
_WITHOUT_PASS = ",".join(name for name in PASSES if name != "scratch-outputs")


def _program(source: str, name: str) -> str:
    return re.search(rf"^(?:@_holding_scratch\n)?def {name}\(.*?(?=^\S)", source + "\nend", re.S | re.M).group(0)


def _inputs(name: str, seed: int):
    shape, (n_channels, d), options = _GRIDS[name]
    module = import_path(GENERATED / "numpy" / f"{name.replace('-', '_')}.py")
    rng = np.random.default_rng(seed)
    sizes = {"n_channels": n_channels, "d": d}
    params = {key: rng.standard_normal(tuple(sizes.get(axis, axis) for axis in axes)) * 0.3
              for key, axes in module.PARAMETERS.items()}
    for key in params:
        if key.endswith(".var"):
            params[key] = np.abs(params[key]) + 0.5
    return rng.standard_normal(shape), params, options


def test_the_grid_networks_write_only_their_dying_convolution_outputs_into_scratch():
    unet = (GENERATED / "numpy" / "unet_level.py").read_text()
    step = _program(unet, "_step_identity")
    assert step.startswith("@_holding_scratch\n")
    assert 'down_out = _conv2d(u0, down_W, 2, 1, down_b, slot="down_out")' in step
    assert 'slot="conv_out")' in step
    resnet = _program((GENERATED / "numpy" / "resnet_block.py").read_text(), "_step_with")
    assert 'slot="conv1_out")' in resnet and 'slot="shortcut_out")' in resnet
    # the program's output, relu2_out, is conv2_out's memory (its ReLU in place): never scratch
    assert "conv2_out = _conv2d(relu_out, conv2_W_folded, 1, 1, conv2_b_folded)" in resnet
    assert "relu2_out = np.maximum(np.add(conv2_out, shortcut_out, out=conv2_out)" in resnet
    # the adjoints keep what they compute for the backward sweep; torch's allocator caches blocks itself
    assert "slot=" not in _program(unet, "_step_identity_vjp")
    assert "slot=" not in (GENERATED / "torch" / "unet_level.py").read_text()


def test_an_output_read_in_place_by_the_result_is_marked_only_without_that_reuse():
    """The pass follows the in-place writes of ``reuse-buffers``: without them, conv2_out is read by a fresh ReLU and
    dies inside the program, so it is marked."""
    with_reuse = splitformer.derive("resnet-block").source("numpy")
    without_reuse = splitformer.derive("resnet-block", passes=",".join(name for name in PASSES
                                                                       if name != "reuse-buffers")).source("numpy")
    assert 'slot="conv2_out"' not in with_reuse
    assert 'slot="conv2_out"' in without_reuse


@pytest.mark.parametrize("name", sorted(_GRIDS))
def test_a_result_stays_the_callers_after_the_next_call(name):
    module = import_path(GENERATED / "numpy" / f"{name.replace('-', '_')}.py")
    plain = splitformer.derive(name, passes=_WITHOUT_PASS).numpy_module()
    u, params, options = _inputs(name, 0)
    other, other_params, _ = _inputs(name, 1)
    first = module.forward(u, params, **options)
    kept = first.copy()
    second = module.forward(other, other_params, **options)
    assert np.array_equal(first, kept)
    assert np.array_equal(first, plain.forward(u, params, **options))
    assert np.array_equal(second, plain.forward(other, other_params, **options))


def test_control_an_output_the_result_is_written_into_would_change_with_the_next_call(monkeypatch):
    """Negative control: marking every convolution output (conv2_out too, which the result is) lets the next call
    write over the first call's result."""
    monkeypatch.setenv("SPLITFORMER_CACHE", "off")
    monkeypatch.setattr(importlib.import_module(scratch_outputs.__module__), "_dies_inside", lambda *args: True)
    module = splitformer.derive("resnet-block").numpy_module()
    assert 'slot="conv2_out"' in splitformer.derive("resnet-block").source("numpy")
    u, params, options = _inputs("resnet-block", 0)
    first = module.forward(u, params, **options)
    kept = first.copy()
    module.forward(*_inputs("resnet-block", 1)[:2], **options)
    assert not np.array_equal(first, kept)


def _interrupted(module, inner, monkeypatch):
    """unet-level's forward with ``inner`` (another input's step) run when its second convolution starts, while the
    program holds its first's output in scratch (as a signal handler or finalizer running a forward would)."""
    convolution, entered = module._conv2d, []

    def interrupting(field, W, stride, padding, bias=None, slot=None):
        if slot == "conv_out" and not entered:
            entered.append(True)
            other, other_params, _ = _inputs("unet-level", 1)
            inner(other, module._checked(other, other_params, 1, 1e-5)[1][0][1], {"stride": 1}, 1e-5)
        return convolution(field, W, stride, padding, bias, slot)
    monkeypatch.setattr(module, "_conv2d", interrupting)
    u, params, _ = _inputs("unet-level", 0)
    result = module.forward(u, params)
    assert entered
    return result


def test_a_forward_inside_another_leaves_the_outer_outputs_alone(monkeypatch):
    module = import_path(GENERATED / "numpy" / "unet_level.py", "unet_level_nested")
    u, params, _ = _inputs("unet-level", 0)
    expected = module.forward(u, params)
    assert np.array_equal(_interrupted(module, module._step_identity, monkeypatch), expected)


def test_control_a_forward_inside_another_not_holding_its_memory_overwrites_the_outer(monkeypatch):
    """Negative control: the inner step run without holding its level of scratch writes its first convolution's output
    over the outer's."""
    module = import_path(GENERATED / "numpy" / "unet_level.py", "unet_level_unheld")
    u, params, _ = _inputs("unet-level", 0)
    expected = module.forward(u, params)
    assert not np.array_equal(_interrupted(module, module._step_identity.__wrapped__, monkeypatch), expected)


def test_threads_keep_their_own_scratch():
    module = import_path(GENERATED / "numpy" / "unet_level.py")
    cases = [_inputs("unet-level", seed) for seed in range(4)]
    expected = [module.forward(u, params) for u, params, _ in cases]
    wrong = []

    def run(index):
        u, params, _ = cases[index]
        for _ in range(25):
            if not np.array_equal(module.forward(u, params), expected[index]):
                wrong.append(index)
    threads = [threading.Thread(target=run, args=(index,)) for index in range(len(cases))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not wrong


def test_the_pass_leaves_a_module_without_convolutions_alone():
    from splitformer.codegen.lowering import lower
    from splitformer.symbolic import derive, load_scheme

    module = lower(derive(load_scheme("post-ln")))
    assert scratch_outputs(module) == module
