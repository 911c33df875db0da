"""A generated ``Stack`` under ``torch.distributed``: ``DistributedDataParallel`` on 2 gloo
processes gives the gradients and parameters of single-process training on the whole batch."""

from __future__ import annotations

import pytest
import torch

from conftest import GENERATED, import_path

D, HEADS, D_FF, LAYERS, WORLD, STEPS = 8, 2, 12, 2, 2, 2


def _stack():
    torch.manual_seed(0)
    module = import_path(GENERATED / "torch" / "pre_ln.py", "_distributed_pre_ln")
    stack = module.Stack(LAYERS, D, HEADS, D_FF, dtype=torch.float64)
    with torch.no_grad():  # every parameter random: default inits zero biases and hide bugs
        for parameter in stack.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return stack


def _batch():
    generator = torch.Generator().manual_seed(1)
    inputs = torch.randn(4, 5, D, generator=generator, dtype=torch.float64)
    padding = torch.zeros(4, 5, dtype=torch.bool)
    padding[1, 3:] = padding[2, 4:] = True
    return inputs, padding


def _train(model, inputs, padding):
    """``STEPS`` SGD steps on mean squared output; the first step's gradients and the final parameters."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = None
    for _ in range(STEPS):
        optimizer.zero_grad()
        model(inputs, src_key_padding_mask=padding).square().mean().backward()
        if first is None:
            first = {name: p.grad.clone() for name, p in model.named_parameters()}
        optimizer.step()
    return first, {name: p.detach().clone() for name, p in model.named_parameters()}


def _worker(rank: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        model = torch.nn.parallel.DistributedDataParallel(_stack())
        inputs, padding = _batch()
        shard = slice(rank * 2, rank * 2 + 2)  # equal shards: DDP's mean of shard gradients is the batch gradient
        grads, params = _train(model, inputs[shard], padding[shard])
        strip = lambda table: {name.removeprefix("module."): value for name, value in table.items()}  # noqa: E731
        torch.save((strip(grads), strip(params)), f"{out}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch built without torch.distributed")
def test_ddp_two_processes_equal_single_process(tmp_path):
    try:
        torch.multiprocessing.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=WORLD, join=True)
    except torch.multiprocessing.ProcessExitedException:
        # gloo may abort a worker as it exits, after its results are written ("terminate called without an active
        # exception": once in a session's fresh-clone runs); the results are compared all the same, and a worker that
        # did not write them fails the test
        if not all((tmp_path / f"{rank}.pt").exists() for rank in range(WORLD)):
            raise
    grads, params = _train(_stack(), *_batch())
    for rank in range(WORLD):
        rank_grads, rank_params = torch.load(tmp_path / f"{rank}.pt")
        assert rank_grads.keys() == grads.keys() and len(grads) == LAYERS * 16 + 2
        for name in grads:
            assert (rank_grads[name] - grads[name]).abs().max() <= 1e-12, name
            assert (rank_params[name] - params[name]).abs().max() <= 1e-12, name
    # negative control: one shard alone does not give the batch gradient
    alone, _ = _train(_stack(), *(t[:2] for t in _batch()))
    assert max((alone[name] - grads[name]).abs().max() for name in grads) > 1e-3
