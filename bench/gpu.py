"""The torch rows of ``make bench`` on a CUDA device, when one is present (otherwise it says so).

    python bench/gpu.py [--rows 'llama/*,decoding/*'] [--pairs 5] [--seconds 1.0] [--device cuda]

Every torch row of ``bench/rows.py`` (``--list`` prints them): the blocks' inference, training
step and derived training step, the networks, and KV-cached decoding, each reference and
candidate built as the CPU table builds them, on the device (under ``torch.device``: the random
weights and inputs are drawn there). As in ``make bench``, each figure runs in its own process
(``bench/figure.py --device``): back-to-back calls for at least ``--seconds`` after a warm-up,
the device synchronized after each call (decoding gives its own time per token); reference and
candidate alternate for ``--pairs`` pairs, the order swapped every other pair. The table is
``make bench``'s (a target inside the spread counts as missed).

Before timing, a block's candidate and reference must agree on the device (float32, within
``TOLERANCE``; decoding: four tokens), and each inference candidate runs once under
``torch.cuda.set_sync_debug_mode("error")``, as do a prompt and two decoding steps of the generated
``Stack`` with its cache, without padding: a host synchronization there fails the row. A row that
fails says why in its line and the run goes on (exit status 1). TF32 is off: the figures are
float32's. ``--device cpu`` is a dry run of the same rows on the CPU (the harness and every row's
build; its figures are not the GPU's).
"""

from __future__ import annotations

import argparse
import fnmatch
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import rows  # noqa: E402
from benchmark import run  # noqa: E402
from shapes import SHAPES  # noqa: E402
from table import Measured, table  # noqa: E402

#: The torch rows of the CPU table (the NumPy ones have no device).
NAMES = tuple(name for name in rows.NAMES if not name.endswith("/numpy"))
#: CPU threads of each figure's process (the CPU table's).
THREADS = 2
#: The largest difference of a candidate's float32 output from its reference's that a row runs with.
TOLERANCE = 1e-3


def selected(patterns: str) -> list[str]:
    """The torch rows matching any of the comma-separated patterns (``fnmatch``, or a row's name)."""
    chosen = [name for name in NAMES if any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns.split(","))]
    extra = [pattern for pattern in patterns.split(",") if not any(fnmatch.fnmatchcase(name, pattern) for name in NAMES)]
    for name in extra:
        if rows.row(name).numpy_build is not None:  # a row outside the table (the tiny shape) or an error
            raise SystemExit(f"error: {name} is a NumPy row: it has no device")
    return chosen + extra


def _no_host_sync(name: str, candidate: rows.Timed, device: str) -> None:
    """The candidate's inference call, or a decoding Stack's prompt and two steps, under CUDA's sync debug mode
    "error" (a host synchronization raises)."""
    import torch

    if name.startswith("decoding/"):
        import decoding

        with torch.device(device):
            stack = decoding.generated_stack(decoding.reference_model(torch.float32))
            tokens = [torch.randn(1, count, decoding.SIZES["d"]) for count in (decoding.SIZES["prompt"], 1, 1)]
        cache = [{} for _ in stack.layers]

        def call():
            with torch.inference_mode():
                for u in tokens:
                    stack(u, cache=cache)
    else:
        call = candidate.call
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        call()
    finally:
        torch.cuda.set_sync_debug_mode("default")


def difference(name: str, device: str) -> float | None:
    """The largest difference of the candidate's output from the reference's on ``device``: a block's forward (float32),
    or four tokens decoded after the prompt; None for a network (its outputs are compared by the test suite only)."""
    import numpy as np
    import torch

    parts = name.split("/")
    if parts[0] in rows.NETWORKS:
        return None
    with torch.device(device):
        if parts[0] == "decoding":
            import decoding

            outputs = [decoding.generate(decoding.decoder(figure, "float32"), int(parts[1][1:]), 4, np.float32)[1]
                       for figure in ("reference", "torch")]
        else:
            from sources import block_source, first

            source, _, inputs = block_source(parts[0], *SHAPES[parts[1]])
            block, tensors = rows.candidate_block(parts[0], parts[1], ROOT / "generated")
            with torch.inference_mode():
                outputs = [first(source.eval()(*inputs)).cpu().numpy(), block.eval()(*tensors).cpu().numpy()]
    return float(np.abs(outputs[0] - outputs[1]).max())


def measure(name: str, device: str, pairs: int, seconds: float) -> Measured:
    """One row on ``device``: its parity and host-sync checks here, then alternating pairs of reference and candidate
    figures, each in its own process (``bench/figure.py --device``)."""
    import torch

    row = rows.row(name)
    found = difference(name, device)
    if found is not None and not found <= TOLERANCE:
        raise RuntimeError(f"the candidate's output differs from the reference's by {found:.2e} (> {TOLERANCE})")
    if torch.device(device).type == "cuda" and not row.training:
        with torch.device(device):
            candidate = row.build("candidate", ROOT / "generated")
        _no_host_sync(name, candidate, device)
    measured = Measured(row)
    with tempfile.TemporaryDirectory() as inputs:  # torch rows read no stored inputs
        for pair in range(pairs):
            for role in ("reference", "candidate") if pair % 2 == 0 else ("candidate", "reference"):
                getattr(measured, role).append(run("figure.py", name, role, "--inputs", inputs, "--device", device,
                                                   "--seconds", str(seconds), threads=THREADS))
    return measured


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/gpu.py", description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="*", help="comma-separated row names or patterns (default: all; see --list)")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0, help="back-to-back time per figure")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run)")
    parser.add_argument("--list", action="store_true", help="print the rows and exit")
    arguments = parser.parse_args(argv)
    if arguments.list:
        print("\n".join(NAMES))
        return 0
    import torch

    if arguments.device != "cpu" and not torch.cuda.is_available():
        print(f"no CUDA device is present (torch {torch.__version__}): the GPU table is not measured")
        return 0
    names = selected(arguments.rows)
    if arguments.device == "cpu":
        header = f"DRY RUN on the CPU ({torch.get_num_threads()} threads): the harness and every row's build, not GPU figures"
    else:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        header = f"{torch.cuda.get_device_name(arguments.device)}, CUDA {torch.version.cuda}, TF32 off"
    import transformers

    print(f"splitformer GPU benchmark: {header}, torch {torch.__version__}, transformers {transformers.__version__}, "
          f"float32; {arguments.pairs} alternating pairs per row, each figure in its own process, >= "
          f"{arguments.seconds} s of back-to-back calls each", flush=True)
    measured, failed = [], []
    for name in names:
        try:
            measured.append(measure(name, arguments.device, arguments.pairs, arguments.seconds))
        except (Exception, SystemExit) as error:  # one row's failure (a figure's process too) is that row's line
            failed.append(f"| {name} | failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''} |")
            print(failed[-1], flush=True)
            continue
        print(table(measured[-1:], {})[-1], flush=True)
    print("\n" + "\n".join(table(measured, {}) + failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
