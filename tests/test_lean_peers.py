"""The statements of the Lean formalization that ``check`` lacked: causality of a block, a stack and the
next-token distribution; the attention kernel's rows, convex hull and constant rows. Each holds on the
emitted code and fails on a module that breaks it."""

from types import SimpleNamespace

import numpy as np
import pytest
import sympy as sp

import splitformer
from splitformer.codegen.verification import attention_kernel
from splitformer.codegen.verification.attention_kernel import attention_kernel_checks
from splitformer.codegen.verification.causality import causality_checks
from splitformer.codegen.verification.circuits import circuits_check
from splitformer.codegen.verification.emitted import emitted_modules
from splitformer.codegen.verification.statements.rms_norm_scale import rms_norm_scale_check
from splitformer.symbolic import derive, load_scheme
from splitformer.symbolic.scheme import Scheme, Sequence, Substep

from conftest import ROOT


def _emitted(name_or_scheme):
    scheme = load_scheme(name_or_scheme) if isinstance(name_or_scheme, str) else name_or_scheme
    program = derive(scheme)
    return scheme, program, emitted_modules(scheme, program, ("numpy",))["numpy"]


def _ignoring_the_mask(module):
    """The module with ``causal`` dropped: every call attends to the whole sequence."""
    def forward(*args, causal=False, **options):
        return module.forward(*args, causal=False, **options)

    def forward_stack(*args, causal=False, **options):
        return module.forward_stack(*args, causal=False, **options)

    return SimpleNamespace(forward=forward, forward_stack=forward_stack,
                           FINAL_NORM_PARAMETERS=module.FINAL_NORM_PARAMETERS)


def _leaking_late(module):
    """The module with a leak that a causal call adds at positions ≥ 3 only: the last token's state, a tenth of it
    (a cut at 3 that changes positions ≥ 3 and watches < 3 does not see it; the cut at 3 or 4 does)."""
    def leak(out, u, causal):
        if causal:
            out = out.copy()
            out[:, 3:] += u[:, -1:] / 10
        return out

    def forward(u, *args, causal=False, **options):
        return leak(module.forward(u, *args, causal=causal, **options), u, causal)

    def forward_stack(u, *args, causal=False, **options):
        return leak(module.forward_stack(u, *args, causal=causal, **options), u, causal)

    return SimpleNamespace(forward=forward, forward_stack=forward_stack,
                           FINAL_NORM_PARAMETERS=module.FINAL_NORM_PARAMETERS)


@pytest.mark.parametrize("name", ["gpt2", "llama", "decoder"])
def test_block_stack_and_next_token_are_causal_and_the_cache_decodes_the_full_pass(name):
    scheme, _, module = _emitted(name)
    checks = causality_checks(scheme, module)
    assert [check.id for check in checks] == [f"causality/{name}/{kind}"
                                              for kind in ("block", "stack", "next-token", "cache")]
    assert all(check.holds and check.method == "numeric" for check in checks), [c.detail for c in checks]


def test_a_cache_error_other_than_the_modules_late_read_refusal_is_not_skipped():
    """The cached decoding statement is skipped only on the module's own ``LateTokenRead`` (a token shift reading
    later tokens), not on another ValueError whatever its text (it matched the message text before); control: the
    module's class is skipped."""
    scheme, _, module = _emitted("llama")

    def refusing(error):
        def forward_stack(*args, cache=None, **options):
            if cache is not None and any(cache):
                raise error
            return module.forward_stack(*args, cache=cache, **options)
        return SimpleNamespace(forward=module.forward, forward_stack=forward_stack, LateTokenRead=LateTokenRead,
                               FINAL_NORM_PARAMETERS=module.FINAL_NORM_PARAMETERS)

    class LateTokenRead(ValueError):
        pass

    with pytest.raises(ValueError, match="cached decoding cannot"):
        causality_checks(scheme, refusing(ValueError("positions: cached decoding cannot")))
    cache = causality_checks(scheme, refusing(LateTokenRead("positions: cached decoding cannot")))[-1]
    assert cache.id.endswith("/cache") and cache.method == "skipped" and "refuses this cached decoding" in cache.detail


def test_causality_fails_when_the_mask_is_ignored():
    scheme, _, module = _emitted("gpt2")
    assert not any(check.holds for check in causality_checks(scheme, _ignoring_the_mask(module)))


def test_causality_fails_on_a_leak_that_starts_after_the_first_cuts():
    """Review s32, F6: the check changed the tokens at positions ≥ 3 and watched < 3 only, so a leak into positions
    ≥ 3 passed; every cut is checked now (the last token's state added to positions ≥ 3 under the causal mask)."""
    scheme, _, module = _emitted("gpt2")
    checks = causality_checks(scheme, _leaking_late(module))
    assert not any(check.holds for check in checks), [check.detail for check in checks]


def test_causality_fails_on_a_token_integral_that_reads_no_support():
    """Review s32, F1: a plug-in pooling over every token without χ (tests/plugins/token_pool.py) was skipped as
    token-wise because its program reads no χ, and ``check`` exited 0 while the causal module leaked."""
    splitformer.load_plugin(ROOT / "tests" / "plugins" / "token_pool.py")
    scheme = Scheme("causal-pool", "a pool over every token", {"norm": "layer-norm", "pool": "token-pool"},
                    Sequence((Substep("pool", "explicit", on="norm"),)), causal=True)
    checks = causality_checks(*_emitted(scheme)[::2])
    assert not any(check.holds for check in checks), [check.detail for check in checks]
    # no χ and no steps of positions: nothing makes it causal, so no cache keeps its reads (a language model refuses it)
    assert [check.id.rsplit("/", 1)[1] for check in checks] == ["block", "stack", "next-token"]
    assert all("negative control (causal=False)" in check.detail for check in checks)


def test_a_token_wise_scheme_holds_as_such():
    """No output reads another position's token, with or without the mask: the statement holds, saying why (its
    negative control cannot differ)."""
    scheme = Scheme("ffn-only", "one feed-forward substep", {"ffn": "feed-forward"},
                    Sequence((Substep("ffn", "explicit"),)))
    checks = causality_checks(*_emitted(scheme)[::2])
    assert all(check.holds and check.method == "numeric" and "token-wise" in check.detail for check in checks)


def test_attention_kernel_statements_hold():
    checks = attention_kernel_checks()
    assert [check.id for check in checks] == ["attention/kernel-rows", "attention/convex-hull",
                                              "attention/constant-rows"]
    assert all(check.holds for check in checks), [check.detail for check in checks]


def test_attention_kernel_statements_fail_on_an_unnormalized_kernel(monkeypatch):
    """Emitted attention whose kernel is not normalized (the exponentials used as weights) fails all three."""
    real = attention_kernel.emitted_modules

    def unnormalized(scheme, program, backends):
        module = real(scheme, program, backends)["numpy"]
        exponentials = module._exponentials  # the module is cached: monkeypatch puts it back for the other tests
        monkeypatch.setattr(module, "_exponentials",
                            lambda scores, support, *shift: (exponentials(scores, support, *shift)[0], 1.0))
        return {"numpy": module}

    monkeypatch.setattr(attention_kernel, "emitted_modules", unnormalized)
    assert not any(check.holds for check in attention_kernel_checks())


def test_rms_norm_is_scale_invariant_at_eps_zero_only():
    check = rms_norm_scale_check()
    assert check.holds and "differences 0, 0, 0" in check.detail, check.detail


def test_rms_norm_scale_check_fails_on_an_operator_that_is_not_scale_invariant(monkeypatch):
    """The derived RMSNorm's output multiplied by √|x₀| (scaling with the input): the check fails."""
    import sympy as sp

    from splitformer.symbolic import evaluate as evaluate_module

    real = evaluate_module.evaluate

    def wrong(program, sizes, inputs, **options):
        values = real(program, sizes, inputs, **options)
        output = values[program.output]
        values[program.output] = {index: value * sp.sqrt(sp.Abs(inputs["u0"](0, 0))) for index, value in output.items()}
        return values

    monkeypatch.setattr(evaluate_module, "evaluate", wrong)
    assert not rms_norm_scale_check().holds


def test_attention_reads_the_qk_and_ov_circuits_only():
    check = circuits_check()
    assert check.id == "attention/circuits" and check.holds, check.detail


def test_circuits_check_fails_when_the_keys_projection_is_ignored(monkeypatch):
    """Emitted attention whose keys skip W^K (k = u + b^K): the gauge moves the scores, the check fails."""
    from splitformer.codegen.verification import circuits

    scheme, module = circuits.attention_only()
    forward = module.forward

    def without_key_kernel(u, params, **options):
        return forward(u, {**params, "attn.W_k": np.eye(u.shape[-1])}, **options)

    monkeypatch.setattr(circuits, "attention_only", lambda: (scheme, SimpleNamespace(forward=without_key_kernel)))
    assert not circuits_check().holds


def test_the_stack_check_of_layers_without_parameters_has_a_control_that_differs():
    """Review s32, F4: reversed layers without parameters are the same layers, so the stack check failed on every
    parameter-free scheme (deviation 0, control 0); its control is then the stack of one layer fewer. Control: a
    stack that runs one layer fewer fails it."""
    from splitformer.codegen.verification.structure import stack_check

    splitformer.load_plugin(ROOT / "tests" / "plugins" / "support_mean.py")
    scheme = Scheme("sum-only", "the state summed over the support", {"sum": "support-sum"},
                    Sequence((Substep("sum", "explicit", fraction=sp.Rational(1, 4)),)))
    scheme, _, module = _emitted(scheme)
    check = stack_check(scheme, module)
    assert check.holds and "one layer fewer" in check.statement, check.detail

    def short(u, *args, **options):
        layers = args[-1]
        return module.forward_stack(u, *args[:-1], layers[:-1], **options)
    assert not stack_check(scheme, SimpleNamespace(forward=module.forward, forward_stack=short)).holds
    # the same across layers (heavy-ball), whose stack check had the same control
    from dataclasses import replace

    from splitformer.codegen.verification.structure import across_stack_check
    from splitformer.symbolic.across_layers import AcrossLayers

    momentum = replace(scheme, name="sum-momentum", across_layers=AcrossLayers("heavy-ball", momentum="1/2"))
    momentum, _, module = _emitted(momentum)
    check = across_stack_check(momentum, module)
    assert check.holds and "one layer fewer" in check.statement, check.detail
