"""Weight adapters: source modules → canonical parameters (see ``splitformer.codegen.adapters``).

``from_hf`` also reads whole causal language models (``GPT2LMHeadModel``, ``GPT2Model``,
``LlamaForCausalLM``, ``LlamaModel``) into a ``splitformer.nn.LanguageModel`` (see
``splitformer.codegen.nn_hf``; torch is imported only then).
"""

from typing import Any

from splitformer.codegen import adapters as _adapters
from splitformer.codegen.adapters import *  # noqa: F403
from splitformer.codegen.adapters import __all__  # noqa: F401
from splitformer.codegen.adapters.inspection import check_computation
from splitformer.symbolic.errors import SplitformerError

#: The transformers classes read as whole language models.
LANGUAGE_MODELS = ("GPT2LMHeadModel", "GPT2Model", "LlamaForCausalLM", "LlamaModel")


def from_hf(module: Any, **expected: Any):
    """``Adapted`` of a ``transformers`` module (``BertLayer``, ``BertModel``, …; see
    ``splitformer.codegen.adapters.from_hf``), or, for a whole causal language model
    (``GPT2LMHeadModel``, ``LlamaForCausalLM``, their bodies), the ``splitformer.nn.LanguageModel``
    holding its parameters (``splitformer.nn.from_hf_lm``)."""
    name = type(module).__name__
    if name not in LANGUAGE_MODELS:
        return _adapters.from_hf(module, **expected)
    if expected:
        raise SplitformerError(f"{name} is read as a whole language model; expectations ({', '.join(sorted(expected))}) "
                               "apply to blocks: adapt one with from_hf(model.…layers[0], …)")
    check_computation(name, module)
    from splitformer.codegen.nn_hf import from_hf_lm

    return from_hf_lm(module)
