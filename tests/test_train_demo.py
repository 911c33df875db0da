"""The NumPy-only training demo: same parameters as torch.autograd + torch.optim.Adam."""

import numpy as np

import train_demo  # tools/ (on the path through conftest)
from conftest import GENERATED, import_path


def test_thirty_adam_steps_agree_with_torch_autograd_to_1e_8():
    module = import_path(GENERATED / "numpy" / "pre_ln.py")
    rng = np.random.default_rng(3)
    tokens, labels = train_demo.make_task(32, rng)
    init = train_demo.init_model(module, rng)
    model = train_demo._copy(init)
    losses = train_demo.train_numpy(module, model, tokens, labels, 30)
    assert losses[-1] < losses[0]
    reference = train_demo.train_torch(train_demo._copy(init), tokens, labels, 30)
    assert train_demo.parameter_gap(model, reference) <= 1e-8
    assert train_demo.parameter_gap(model, init) > 1e-2  # the parameters did move
