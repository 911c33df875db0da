"""Modules derived in memory (``codegen.in_memory.load_source``): registered in ``sys.modules`` under their text's
digest once they have run, one load at a time, so a caller never gets a module another thread is still running."""

from __future__ import annotations

import sys
import threading
import types

import pytest

import splitformer
from splitformer.codegen.in_memory import load_source


@pytest.fixture(scope="module")
def source():
    return splitformer.derive("pre-ln").source("numpy")


def _race(text: str, trials: int = 10) -> int:
    """Loads of ``text`` (a new text each trial) by two threads at once, threads switching every microsecond: how
    many returned a module without its ``forward_stack`` (half run)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    incomplete = 0
    try:
        for trial in range(trials):
            barrier, complete = threading.Barrier(2), []

            def load(trial=trial):
                barrier.wait()
                complete.append(hasattr(load_source(f"{text}\n# trial {trial}\n", "numpy", "pre_ln"), "forward_stack"))
            threads = [threading.Thread(target=load) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            incomplete += complete.count(False)
    finally:
        sys.setswitchinterval(interval)
    return incomplete


def test_the_same_text_loads_once_and_is_importable_by_name(source):
    module = load_source(source, "numpy", "pre_ln")
    assert load_source(source, "numpy", "pre_ln") is module
    assert sys.modules[module.__name__] is module and module.__name__.startswith("splitformer._generated.numpy.pre_ln_")
    other = load_source(source + "\n# another text\n", "numpy", "pre_ln")
    assert other is not module and other.__name__ != module.__name__


def test_a_load_that_raises_leaves_nothing_registered():
    text = "x = 1\nraise RuntimeError('generated code that fails')\n"
    with pytest.raises(RuntimeError, match="generated code that fails"):
        load_source(text, "numpy", "failing")
    assert not any(name.startswith("splitformer._generated.numpy.failing_") for name in sys.modules)


def test_two_threads_loading_one_text_both_get_the_whole_module(source):
    assert _race(source) == 0


def test_control_a_module_registered_before_it_runs_is_seen_half_run(source, monkeypatch):
    """Control: registering the module before running its code (unlocked) hands the other thread a module without
    ``forward_stack`` (20 of 40 loads in the review's runs; the count varies with the scheduling)."""
    def early(text, backend, name):
        module_name = f"splitformer_generated.{backend}.{name}_{hash(text)}_early"
        if module_name in sys.modules:
            return sys.modules[module_name]
        module = sys.modules[module_name] = types.ModuleType(module_name)
        exec(compile(text, module_name, "exec", dont_inherit=True), module.__dict__)  # noqa: S102
        return module

    monkeypatch.setattr(sys.modules[__name__], "load_source", early)
    assert _race(source, trials=20) > 0


def test_objects_of_a_module_derived_in_memory_pickle_in_its_process():
    """A tester's finding: ``pickle.dumps`` and ``torch.save`` of a ``LanguageModel`` (its stack derived in memory) or a
    ``derive(...).torch_module()`` Block failed: pickle imports the class's module by its dotted name, and the packages
    above it were in no ``sys.modules``. The loaded copy computes what the original does."""
    import io
    import pickle

    import torch

    model = splitformer.nn.LanguageModel("llama", vocab_size=30, d_model=32, n_heads=4, n_layers=2)
    tokens = torch.tensor([[1, 2, 3]])
    buffer = io.BytesIO()
    torch.save(model, buffer)
    buffer.seek(0)
    with torch.no_grad():
        assert torch.equal(torch.load(buffer, weights_only=False)(tokens), model(tokens))
        assert torch.equal(pickle.loads(pickle.dumps(model))(tokens), model(tokens))
    block = splitformer.derive("pre-ln").torch_module().Block(16, 4, 32)
    assert type(pickle.loads(pickle.dumps(block))) is type(block)
    assert sys.modules[type(block).__module__.rpartition(".")[0]].__path__ == []  # the package above it, empty


def test_another_process_loading_such_an_object_is_told_how_to_keep_a_model(tmp_path):
    """A reviewer's finding: ``torch.save`` of a model derived in memory now succeeds, and loading the file in another
    process ended in "No module named 'splitformer_generated'"; the package of such modules is splitformer's, and
    says what to save instead."""
    import subprocess

    import torch

    path = tmp_path / "model.pt"
    torch.save(splitformer.nn.LanguageModel("gpt2", vocab_size=20, d_model=16, n_heads=2, n_layers=1), path)
    result = subprocess.run([sys.executable, "-c", f"import torch; torch.load({str(path)!r}, weights_only=False)"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    assert result.stderr.rstrip().splitlines()[-1].startswith(
        "ModuleNotFoundError: No module named 'splitformer._generated.torch': modules splitformer derives in memory "
        "live in the process that derived them"), result.stderr
    assert "save the model's state_dict" in result.stderr
