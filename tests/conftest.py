"""Shared fixtures: the repository root, the committed ``generated/`` modules, references."""

from __future__ import annotations

import functools
import importlib.util
import signal
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))  # development tools (demos, mutation driver): not a package, not installed
GENERATED = ROOT / "generated"


def pytest_addoption(parser):
    parser.addoption("--update-golden", action="store_true",
                     help="rewrite generated/ from the generator instead of comparing")


@pytest.fixture(scope="session")
def update_golden(request) -> bool:
    return request.config.getoption("--update-golden")


def import_path(path: Path, name: str | None = None):
    """Import a Python file by path."""
    spec = importlib.util.spec_from_file_location(name or f"_test_{path.stem}_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@functools.cache
def derived_now(name: str):
    """The built-in network or scheme ``name`` derived now (modules and report generated from the templates,
    in memory): tests of these see a template or codegen change that ``generated/`` would hide until
    ``make generate`` (the golden tests tie ``generated/`` to the same text)."""
    import splitformer

    return splitformer.derive(name)


def derived_plugin(folder: Path, plugin: str, scheme: str):
    """The scheme whose TOML text is ``scheme`` (written into ``folder``), derived with the test plug-in
    ``tests/plugins/<plugin>`` loaded."""
    import splitformer

    splitformer.load_plugin(ROOT / "tests" / "plugins" / plugin)
    path = folder / f"{plugin.removesuffix('.py')}.toml"
    path.write_text(scheme, encoding="utf-8")
    return splitformer.derive(str(path))


def plugin_scheme(name: str, **operators: str) -> str:
    """A scheme's TOML: ``operators`` (name → kind) and one explicit step of the last, on the one before it where it
    has two (a normalization)."""
    *before, last = operators
    kinds = [f'{key} = "{kind}"' for key, kind in operators.items()]
    on = [f'on = "{before[-1]}"'] if before else []
    return "\n".join([f'name = "{name}"', f'summary = "{name}"', "[operators]", *kinds,
                      "[[steps]]", f'operator = "{last}"', 'solver = "explicit"', *on, ""])


def post_ln_scheme(name: str, kind: str, activation: str = "relu") -> str:
    """A post-LN scheme's TOML with the token mixer ``kind``: its explicit step, LayerNorm, the feed-forward, LayerNorm."""
    steps = "".join(f'[[steps]]\noperator = "{key}"\nsolver = "{solver}"\n' for key, solver in (
        ("mix", "explicit"), ("norm1", "projection"), ("ffn", "explicit"), ("norm2", "projection")))
    return (f'name = "{name}"\nsummary = "post-LN with {kind}"\nactivation = "{activation}"\n[operators]\n'
            f'mix = "{kind}"\nnorm1 = "layer-norm"\nffn = "feed-forward"\nnorm2 = "layer-norm"\n' + steps)


def generated_now(network: str):
    """(NumPy, PyTorch) modules of the built-in ``network`` generated now (``derived_now``)."""
    return derived_now(network).numpy_module(), derived_now(network).torch_module()


def lowered_backward(name: str, passes):
    """The derived adjoint of the built-in scheme ``name`` lowered with ``passes`` (``codegen.adjoint.Backward``)."""
    from splitformer.codegen.adjoint import lower_adjoint
    from splitformer.symbolic import derive, load_scheme
    from splitformer.symbolic.adjoint import derive_adjoint

    return lower_adjoint(derive_adjoint(derive(load_scheme(name))), passes)


def unfused_backward(name: str):
    """The forward and adjoint of ``name`` lowered without passes as one module (no kernel recomputed): what the
    passes of ``lower_adjoint`` see."""
    from dataclasses import replace

    backward = lowered_backward(name, ())
    adjoint = [op for op in backward.adjoint.ops if not op.section.startswith("recomputed")]
    return replace(backward.forward, ops=[*backward.forward.ops, *adjoint])


def random_encoder_layer(d, n_heads, d_ff, eps, *, norm_first=False, activation="relu", seed=0):
    """A float64 ``TransformerEncoderLayer`` whose every parameter (biases, gains) is random."""
    from demo import random_layer  # tools/demo.py

    layer = random_layer(d, n_heads, d_ff, eps, norm_first, seed, activation)
    for name, parameter in layer.named_parameters():  # the default init zeroes biases: would hide bugs
        assert (parameter != 0).all() and (parameter != 1).any(), name
    return layer


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


def pytest_configure(config):
    """A fresh derivation cache per session: tests exercise the derivations themselves.

    And Ctrl-C acts as it does for a user however the suite was started: a shell that starts a
    command in the background (``make test &``, ``nohup``) ignores SIGINT in it and, across
    exec, in its children, and the interrupt tests would then see nothing.
    """
    import os
    import tempfile

    os.environ["SPLITFORMER_CACHE"] = tempfile.mkdtemp(prefix="splitformer-cache-")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
