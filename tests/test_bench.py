"""The benchmark harness times what it claims and its one table says what the figures show."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import GENERATED, ROOT

sys.path.insert(0, str(ROOT / "bench"))

import benchmark  # noqa: E402
import figure  # noqa: E402
import gpu  # noqa: E402
import machine  # noqa: E402
import rows  # noqa: E402
import sources  # noqa: E402
import table  # noqa: E402
from shapes import SHAPES  # noqa: E402


@pytest.mark.parametrize("scheme", list(rows.BLOCKS))
def test_reference_and_candidates_compute_the_same_block(scheme, tmp_path):
    """What the rows time: the source module, the generated Block and the NumPy forward on the
    stored inputs agree (float32, default initialization)."""
    source, adapted, inputs = sources.block_source(scheme, *SHAPES["tiny"])
    with torch.inference_mode():
        expected = source.eval()(*inputs).numpy()
    block, tensors = rows.candidate_block(scheme, "tiny", GENERATED)
    with torch.inference_mode():
        np.testing.assert_allclose(block.eval()(*tensors).numpy(), expected, atol=1e-5)
    numpy_row = rows.row(f"{scheme}/tiny/numpy")
    numpy_row.prepare(tmp_path)
    args, params, kwargs = pickle.loads((tmp_path / f"{scheme}-tiny-numpy.pickle").read_bytes())
    np.testing.assert_allclose(rows.generated(GENERATED, "numpy", scheme).forward(*args, params, **kwargs), expected,
                               atol=1e-5)
    # negative control: another seed's input gives another output
    assert np.abs(source(torch.randn_like(inputs[0]), *inputs[1:]).detach().numpy() - expected).max() > 1e-2


def test_a_training_row_times_a_step_and_counts_what_it_keeps_for_backward(tmp_path):
    for name in ("post-ln/tiny/training", "post-ln/tiny/derived"):
        for role in figure.ROLES:
            timed = rows.row(name).timed(role, GENERATED, tmp_path)
            times = figure.sustained(timed, 0.01, min_calls=2)
            assert len(times) >= 2 and min(times) > 0
            assert timed.kept() > 0
    # negative control: an inference call keeps nothing for a backward pass
    assert rows.row("post-ln/tiny/torch").timed("candidate", GENERATED, tmp_path).kept is None


def test_a_numpy_candidate_process_never_imports_torch(tmp_path):
    rows.row("post-ln/tiny/numpy").prepare(tmp_path)
    script = (f"import sys; sys.path.insert(0, {str(ROOT / 'bench')!r}); import figure; "
              f"figure.main(['post-ln/tiny/numpy', 'candidate', '--inputs', {str(tmp_path)!r}, '--seconds', '0.01', "
              "'--min-calls', '1']); print('torch' in sys.modules)")
    output = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    result, imported = output.splitlines()
    assert json.loads(result)["calls"] >= 1 and imported == "False"


def _row(rate=False, training=False):
    return rows.Row("x/N128/torch", "B 8", "ref", 1.00, build=None, limit="torch", flops=2e9, rate=rate,
                    training=training)


def _pairs(ratios):
    return [{"median_s": 1.0, "kept_bytes": 2**20}] * len(ratios), [
        {"median_s": ratio, "gflops": 2.0 / ratio, "kept_bytes": 2**21} for ratio in ratios]


@pytest.mark.parametrize("ratios, expected", [([0.8, 0.9, 0.95], "met"),
                                              ([0.8, 0.95, 1.1], "missed (target inside the spread)"),
                                              ([1.05, 1.2, 1.3], "missed")])
def test_a_target_inside_the_spread_counts_as_missed(ratios, expected):
    assert table.verdict(ratios, 1.0) == expected
    measured = table.Measured(_row(), *_pairs(ratios))
    cells = table.cells(measured, {"torch": 20.0})
    assert cells[5] == f"{np.median(ratios):.2f}× ({min(ratios):.2f}–{max(ratios):.2f})" and cells[7] == expected
    assert cells[8] == f"{2.0 / np.median(ratios):.1f} ({2.0 / np.median(ratios) / 20:.0%} of torch)"
    assert cells[9] == ""  # not a training row


def test_a_rate_row_compares_rates_and_a_training_row_prints_what_it_keeps():
    reference, candidate = _pairs([2.0, 2.0])  # the candidate takes twice as long: half the rate
    rate = table.Measured(_row(rate=True), reference, candidate)
    assert rate.ratios == [0.5, 0.5] and table.cells(rate, {})[6:8] == ["≥ 1.00 (rate)", "missed"]
    assert table.verdict([0.5], 0.4, rate=True) == "met"
    training = table.Measured(_row(training=True), *_pairs([0.9]))
    assert table.cells(training, {"torch": 20.0})[9] == "1.0 / 2.0 MiB"


def test_make_bench_prints_one_table_of_the_chosen_rows(monkeypatch, capsys):
    monkeypatch.setattr(benchmark, "header", lambda threads: (["cpu: test"], {"torch": 50.0, "numpy": 50.0}))
    monkeypatch.setattr(benchmark, "closing", lambda threads: "rates at the end: test")
    benchmark.main(["--rows", "post-ln/tiny/training,post-ln/tiny/torch", "--pairs", "2", "--seconds", "0.01",
                    "--min-calls", "2", "--interleaved"])
    printed = capsys.readouterr().out
    final = printed[printed.rindex("cpu: test"):].splitlines()
    assert "IN-PROCESS" in final[1] and final[2] == "rates at the end: test" and final[4].startswith("| row | shapes |")
    lines = [line for line in final if line.startswith("| post-ln/tiny/")]
    assert [line.split(" | ")[0] for line in lines] == ["| post-ln/tiny/training", "| post-ln/tiny/torch"]
    assert lines[0].endswith(" MiB |") and "≤ 0.90" in lines[0] and lines[1].endswith(" |  |")


def test_rows_are_named_and_a_wrong_name_is_refused():
    assert benchmark.selected("post-ln/N128/*") == ["post-ln/N128/torch", "post-ln/N128/training",
                                                    "post-ln/N128/numpy", "post-ln/N128/derived"]
    assert len(benchmark.selected("*")) == len(rows.NAMES) == 29
    with pytest.raises(SystemExit, match="no benchmark row 'post-ln/N64/torch'"):
        benchmark.selected("post-ln/N64/torch")


def test_the_gpu_table_has_every_torch_row_and_runs_dry_on_the_cpu(capsys):
    """``bench/gpu.py``: the CPU table's torch rows (no NumPy row), each figure in its own process; without CUDA it
    says so and measures nothing; ``--device cpu`` runs the rows' builds and the harness (a training row with its
    memory)."""
    assert gpu.NAMES == tuple(name for name in rows.NAMES if "numpy" not in name) and len(gpu.NAMES) == 17
    assert gpu.selected("decoding/*") == ["decoding/b1/torch", "decoding/b8/torch"]
    with pytest.raises(SystemExit, match="post-ln/tiny/numpy is a NumPy row"):
        gpu.selected("post-ln/tiny/numpy")
    if not torch.cuda.is_available():
        assert gpu.main(["--rows", "post-ln/N128/torch"]) == 0
        assert capsys.readouterr().out.startswith("no CUDA device is present")
    assert gpu.main(["--device", "cpu", "--rows", "post-ln/tiny/torch,llama/tiny/derived", "--pairs", "1",
                     "--seconds", "0.01"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("splitformer GPU benchmark: DRY RUN on the CPU") and "each figure in its own process" in printed
    lines = printed.splitlines()[-2:]
    assert lines[0].startswith("| post-ln/tiny/torch | B 2, N 16") and "≤ 1.00" in lines[0]
    assert lines[1].startswith("| llama/tiny/derived |") and lines[1].endswith(" MiB |") and "– / –" not in lines[1]


def test_a_gpu_row_whose_candidate_computes_otherwise_fails_alone(monkeypatch, capsys):
    """Each block row compares candidate and reference on the device before timing (here on the CPU: they agree,
    and decoding's four tokens too); a row that differs, or raises, says so in its line, and the other rows run."""
    assert gpu.difference("gpt2/tiny/torch", "cpu") <= 1e-5 and gpu.difference("vit/torch", "cpu") is None
    differences = {"post-ln/tiny/torch": 0.5, "gpt2/tiny/torch": 0.0}
    monkeypatch.setattr(gpu, "difference", lambda name, device: differences[name])
    assert gpu.main(["--device", "cpu", "--rows", "post-ln/tiny/torch,gpt2/tiny/torch", "--pairs", "1",
                     "--seconds", "0.01"]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == ("| post-ln/tiny/torch | failed: RuntimeError: the candidate's output differs from the "
                         "reference's by 5.00e-01 (> 0.001) |") and lines[-2].startswith("| gpt2/tiny/torch | B 2")


def test_the_gpu_tables_host_sync_check_runs_the_candidate_and_a_cached_decoding(monkeypatch):
    """What runs under CUDA's sync debug mode "error" (CUDA's calls stand-ins here): an inference candidate's call, and
    for a decoding row the generated Stack's prompt and two steps with its cache."""
    modes, calls = [], []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    gpu._no_host_sync("post-ln/tiny/torch", rows.Timed(lambda: calls.append(modes[-1])), "cpu")
    assert calls == ["error"] and modes == ["error", "default"]
    seen = []
    import decoding

    stack_of = decoding.generated_stack

    def recorded(model, modules=ROOT / "generated"):
        stack = stack_of(model, modules)
        original = stack.forward
        stack.forward = lambda u, cache: seen.append((u.shape[1], modes[-1])) or original(u, cache=cache)
        return stack
    monkeypatch.setattr(decoding, "generated_stack", recorded)
    gpu._no_host_sync("decoding/b1/torch", None, "cpu")
    assert seen == [(128, "error"), (1, "error"), (1, "error")] and modes[-1] == "default"


def test_the_machines_probes_run():
    """The header's elementwise rate and small-GEMM convolution time are measured for real (briefly here): positive
    figures, the convolution's in milliseconds."""
    assert machine.elementwise_rate(0.01) > 0
    assert 0 < machine.convolution_ms(0.01) < 10_000


def test_the_header_and_the_closing_line_give_the_machines_rates(monkeypatch):
    """The GEMM limit, the elementwise rate (what memory-bound NumPy statements move with) and a small-GEMM convolution's
    time, at the start and again at the end of a run: from ``bench/machine.py``'s JSON (a stand-in here)."""
    machine = {"torch": "t", "numpy": "n", "cpu": "c", "blas": ["b"], "gemm_gflops": {"numpy": 100.0, "torch": 90.0},
               "elementwise_gbs": 12.34, "convolution_ms": 9.87}
    monkeypatch.setattr(benchmark, "run", lambda *arguments, **options: machine)
    lines, gemm = benchmark.header(2)
    assert gemm == {"numpy": 100.0, "torch": 90.0} and "at the start: 12.3 GB/s;" in lines[-1]
    assert lines[-1].endswith("64 channels): 9.9 ms")
    assert benchmark.closing(2).endswith("at the end: 12.3 GB/s; a 3x3 convolution as nine K=64 GEMMs summed (numpy, "
                                         "16 images 32x32, 64 channels): 9.9 ms; GEMM numpy 100.0, torch 90.0 GFLOP/s")
