"""Emitted networks against the independent evaluator (patch and convolution windows, padding, strided
grids, the class node): they agree in float64, and a module that reads its input wrongly does not."""

from types import SimpleNamespace

import pytest

from splitformer.codegen.verification import network_semantics
from splitformer.codegen.verification.network_semantics import network_semantics_checks


@pytest.mark.parametrize("name", ["vit", "cvt", "resnet-block", "unet-level"])
def test_emitted_networks_compute_what_the_evaluator_defines(name):
    (check,) = network_semantics_checks(name)
    assert check.id == f"semantics/{name}/emitted" and check.holds, check.detail


def test_a_module_reading_the_image_upside_down_is_caught(monkeypatch):
    real = network_semantics.network_module("resnet-block")

    def upside_down(name):
        return SimpleNamespace(PARAMETERS=real.PARAMETERS, TRANSFER_PARAMETERS=real.TRANSFER_PARAMETERS,
                               forward=lambda u, params, **options: real.forward(u[..., ::-1, :], params, **options))

    monkeypatch.setattr(network_semantics, "network_module", upside_down)
    (check,) = network_semantics_checks("resnet-block")
    assert not check.holds
