"""cvt's derived adjoint: NumPy ``vjp``/``vjp_logits`` against transformers' CvT under autograd (float64)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
import transformers

from splitformer.adapters import from_hf

from conftest import generated_now

NUMPY, TORCH = generated_now("cvt")

#: Two stages at a tiny size: stride_kv 2 (K, V on a coarser grid), several heads, the class node in the last.
CONFIG = dict(patch_sizes=[3, 3], patch_stride=[2, 2], patch_padding=[1, 1], embed_dim=[4, 6], num_heads=[1, 2],
              depth=[1, 2], mlp_ratio=[2.0, 1.5], cls_token=[False, True])
#: BatchNorm's running statistics are buffers in transformers, not parameters: no autograd gradient to compare.
STATISTICS = (".mean", ".var")


def _cvt(classifier: bool):
    stages = len(CONFIG["depth"])
    config = transformers.CvtConfig(
        num_channels=3, stride_kv=[2] * stages, stride_q=[1] * stages, padding_kv=[1] * stages, padding_q=[1] * stages,
        kernel_qkv=[3] * stages, qkv_bias=[True] * stages, drop_path_rate=[0.0] * stages,
        attention_drop_rate=[0.0] * stages, drop_rate=[0.0] * stages, qkv_projection_method=["dw_bn"] * stages,
        num_labels=3, **CONFIG)
    torch.manual_seed(0)
    cls = transformers.CvtForImageClassification if classifier else transformers.CvtModel
    model = cls(config).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():  # default inits zero biases: would hide bugs
            parameter.normal_(0, 0.3)
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):  # random statistics, not 0 and 1
                module.running_mean.normal_()
                module.running_var.uniform_(0.5, 2.0)
    return model


def _hf_gradients(model, pixels, seeds):
    """transformers' autograd gradients, renamed to the canonical names by the weight adapter itself."""
    pixels = pixels.clone().requires_grad_(True)
    output = model(pixels)
    if hasattr(output, "logits"):
        output.logits.backward(seeds[0])
    else:
        torch.autograd.backward((output.last_hidden_state, output.cls_token_value), seeds)
    gradients = copy.deepcopy(model)
    with torch.no_grad():
        for parameter, target in zip(model.parameters(), gradients.parameters()):
            target.copy_(parameter.grad if parameter.grad is not None else torch.zeros_like(parameter))
    expected = {name: value for name, value in from_hf(gradients).params.items() if not name.endswith(STATISTICS)}
    return pixels.grad.numpy(), expected


#: Gradients that are zero in exact arithmetic (a shift of every key adds a per-query constant to the scores,
#: which the softmax cancels; in a stage without the class node BatchNorm's shift of K, through its bias and
#: its mean, is one), measured on the scale of their neighbour's.
_ZERO_IN_EXACT_ARITHMETIC = {".attn.b_k": ".attn.W_k", ".kbn.bias": ".kbn.gain", ".kbn.mean": ".kbn.var"}


def _relative(got: dict, expected: dict) -> float:
    """The worst relative error over every array, the gradients zero in exact arithmetic on a neighbour's scale."""
    assert set(got) == set(expected), set(got) ^ set(expected)
    worst = 0.0
    for name, value in expected.items():
        scale = np.abs(value).max()
        for suffix, neighbour in _ZERO_IN_EXACT_ARITHMETIC.items():
            if name.endswith(suffix):
                scale = np.abs(expected[name[:-len(suffix)] + neighbour]).max()
        # exactly zero (the last step's query projection of the grid with only the class node read): exactly zero
        worst = max(worst, np.abs(got[name] - value).max() / scale if scale else np.abs(got[name]).max())
    return worst


@pytest.mark.parametrize("classifier", [False, True], ids=["CvtModel", "CvtForImageClassification"])
def test_vjp_matches_transformers_autograd(classifier):
    _check_vjp(NUMPY, classifier)


def _check_vjp(module, classifier: bool) -> None:
    model = _cvt(classifier)
    adapted = from_hf(model)
    pixels = torch.randn(2, 3, 12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(2)
    if classifier:
        seeds = (torch.randn(2, 3, dtype=torch.float64, generator=generator),)
    else:
        seeds = (torch.randn(2, 6, 3, 3, dtype=torch.float64, generator=generator),
                 torch.randn(2, 1, 6, dtype=torch.float64, generator=generator))
    expected_image, expected = _hf_gradients(model, pixels, seeds)
    if classifier:
        grad_image, grads = module.vjp_logits(pixels.numpy(), adapted.params, seeds[0].numpy(), **adapted.config)
    else:
        grad_image, grads = module.vjp(pixels.numpy(), adapted.params, seeds[0].numpy(), grad_cls=seeds[1].numpy(),
                                      **adapted.config)
    assert np.abs(grad_image - expected_image).max() / np.abs(expected_image).max() <= 1e-10
    grads = {name: value for name, value in grads.items() if not name.endswith(STATISTICS)}
    assert _relative(grads, expected) <= 1e-10




def _generated(adapted, backward: str, dtype=torch.float64):
    stages = adapted.config["stages"]
    d_ffs = [adapted.params[f"stages.{index}.layers.0.ffn.W_1"].shape[1] for index in range(len(stages))]
    n_classes = adapted.params["head.W"].shape[1] if "head.W" in adapted.params else 0
    model = TORCH.Model(3, CONFIG["embed_dim"], CONFIG["depth"], d_ffs, stages, n_classes=n_classes, eps=adapted.config["eps"],
                        dtype=dtype, backward=backward)
    return model.load_params(adapted.params)


def _torch_gradients(model, pixels, seed):
    pixels = pixels.clone().requires_grad_(True)
    model.logits(pixels).backward(seed)
    return pixels.grad.numpy(), {name: parameter.grad.numpy() for name, parameter in model.named_parameters()}


def test_derived_backward_matches_autograd_and_transformers():
    """``backward="derived"`` against autograd through the generated module (every parameter, BatchNorm's
    statistics included) and against transformers' CvT under autograd."""
    model = _cvt(True)
    adapted = from_hf(model)
    pixels = torch.randn(2, 3, 12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    seed = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    derived_image, derived = _torch_gradients(_generated(adapted, "derived"), pixels, seed)
    autograd_image, autograd = _torch_gradients(_generated(adapted, "autograd"), pixels, seed)
    assert np.abs(derived_image - autograd_image).max() / np.abs(autograd_image).max() <= 1e-10
    assert _relative(derived, autograd) <= 1e-10
    expected_image, expected = _hf_gradients(model, pixels, (seed,))
    assert np.abs(derived_image - expected_image).max() / np.abs(expected_image).max() <= 1e-10
    assert _relative({name: value for name, value in derived.items() if not name.endswith(STATISTICS)}, expected) <= 1e-10


def test_derived_backward_of_the_hidden_states():
    """The costate of both outputs (grid and class node) through ``backward="derived"``."""
    adapted = from_hf(_cvt(False))
    pixels = torch.randn(2, 3, 12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    results = []
    for backward in ("derived", "autograd"):
        model, image = _generated(adapted, backward), pixels.clone().requires_grad_(True)
        hidden, cls = model(image)
        (hidden.sin().sum() + cls.cos().sum()).backward()
        results.append((image.grad.numpy(), {name: p.grad.numpy() for name, p in model.named_parameters()
                                             if p.grad is not None}))
    (derived_image, derived), (autograd_image, autograd) = results
    assert np.abs(derived_image - autograd_image).max() / np.abs(autograd_image).max() <= 1e-10
    assert _relative(derived, autograd) <= 1e-10


def test_derived_backward_in_float32():
    """``backward="derived"`` in float32 is as accurate as autograd in float32: both against the float64
    gradients (which equal transformers' to 1e-10 above). A fixed bound would measure the weights' draw:
    the BatchNorm variance's gradient cancels, and both float32 paths miss it by 1e-4 relative."""
    adapted = from_hf(_cvt(True))
    pixels = torch.randn(2, 3, 12, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    seed = torch.randn(2, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    exact_image, exact = _torch_gradients(_generated(adapted, "autograd"), pixels, seed)
    (derived_image, derived), (autograd_image, autograd) = (
        _torch_gradients(_generated(adapted, backward, torch.float32), pixels.float(), seed.float())
        for backward in ("derived", "autograd"))
    assert derived_image.dtype == np.float32 and all(value.dtype == np.float32 for value in derived.values())

    def image_error(image):
        return np.abs(image - exact_image).max() / np.abs(exact_image).max()

    assert image_error(derived_image) <= max(2 * image_error(autograd_image), 1e-6) <= 1e-4
    assert _relative(derived, exact) <= max(2 * _relative(autograd, exact), 1e-6) <= 1e-3


def test_the_chaining_is_derived():
    """The step's chaining is in the program (split, concatenations, residual sums) and its adjoint comes from
    reverse mode: the projected tokens' costate collects Q, K, V at the class node and the grid at its rows;
    the residual sum passes the costate on."""
    import sympy as sp

    from splitformer.symbolic.adjoint import derive_adjoint
    from splitformer.symbolic.cvt import derive_cvt

    step = derive_cvt().pieces["step_cls"].program
    targets = [assignment.target for assignment in step.assignments]
    assert {"grid", "q_in", "k_in", "v_in", "u1", "u2"} <= set(targets)
    written = {str(a.lhs) for a in derive_adjoint(step).assignments}
    reads = {a.target: {str(r) for r in a.rhs.atoms(sp.Indexed)} for a in derive_adjoint(step).assignments}
    assert "norm1_out_bar1[0, l]" in written and reads["norm1_out_bar1"] == {"q_in_bar[0, l]", "k_in_bar[0, l]",
                                                                             "v_in_bar[0, l]"}
    assert "norm1_out_bar2[N_2*p + q + 1, l]" in written and reads["norm1_out_bar2"] == {"grid_bar[l, p, q]"}
    assert "u2_bar[i, l]" in reads["u1_bar"]
