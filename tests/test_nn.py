"""Whole models (``splitformer.nn``): KV-cached decoding equals full passes, heads, pooling."""

import pytest

import torch  # a test dependency: a broken install fails, never skips

import splitformer  # noqa: E402
from splitformer import SplitformerError  # noqa: E402

VOCAB, PROMPT, NEW = 23, 5, 6


def _model(scheme, **options):
    torch.manual_seed(1)  # a draw whose greedy decodes vary (seed 0 repeats one token for pre-ln)
    model = splitformer.nn.LanguageModel(scheme, VOCAB, d_model=8, n_heads=2, d_ff=12, n_layers=2,
                                         tie_weights=False, dtype=torch.float64, **options)
    with torch.no_grad():  # every parameter random and large enough that tokens differ
        for parameter in model.parameters():
            parameter.normal_(0.0, 1.0)
    return model.eval()


def _cached_logits(model, tokens, padding_mask=None):
    """The prompt in one call, then one token per call through the cache."""
    cache, steps = model.new_cache(), []
    mask = None if padding_mask is None else padding_mask[:, :PROMPT]
    steps.append(model(tokens[:, :PROMPT], padding_mask=mask, cache=cache))
    for index in range(PROMPT, tokens.shape[1]):
        mask = None if padding_mask is None else padding_mask[:, :index + 1]
        steps.append(model(tokens[:, index:index + 1], padding_mask=mask, cache=cache))
    return torch.cat(steps, dim=1)


@pytest.mark.parametrize("scheme", ["pre-ln", "llama"])  # learned positions; rotary positions
def test_cached_generate_is_the_full_pass_greedy_decode(scheme):
    model = _model(scheme)
    prompt = torch.randint(0, VOCAB, (1, PROMPT), generator=torch.Generator().manual_seed(1))
    tokens = model.generate(prompt, NEW, greedy=True)
    assert tokens.shape == (1, PROMPT + NEW) and torch.equal(tokens[:, :PROMPT], prompt)
    full = model(tokens)
    assert torch.equal(full[:, PROMPT - 1:-1].argmax(-1), tokens[:, PROMPT:])
    assert len(set(tokens[0, PROMPT:].tolist())) > 1  # a decode that does not repeat one token
    assert torch.allclose(_cached_logits(model, tokens), full, rtol=0, atol=1e-10)
    assert torch.equal(model.generate(prompt, NEW, greedy=True, use_cache=False), tokens)


@pytest.mark.parametrize("scheme", ["pre-ln", "llama"])
def test_left_padded_batch_decodes_each_row_as_alone(scheme):
    model = _model(scheme)
    prompt = torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(2, PROMPT, dtype=torch.bool)
    padding[1, :2] = True
    tokens = model.generate(prompt, NEW, greedy=True, padding_mask=padding)
    alone = model.generate(prompt[1:, 2:], NEW, greedy=True)
    assert torch.equal(tokens[1, 2:], alone[0]) and torch.equal(tokens[0], model.generate(prompt[:1], NEW, greedy=True)[0])
    mask = torch.cat((padding, torch.zeros(2, NEW, dtype=torch.bool)), dim=1)
    full = model(tokens, padding_mask=mask)
    cached = _cached_logits(model, tokens, mask)
    assert torch.allclose(cached[1, 2:], full[1, 2:], rtol=0, atol=1e-10)
    assert torch.allclose(full[1, 2:], model(alone)[0], rtol=0, atol=1e-10)
    # negative control: without the mask the padded row's positions and keys are wrong
    assert not torch.allclose(model(tokens)[1, 2:], full[1, 2:], atol=1e-3)


def test_a_cache_that_lost_earlier_tokens_disagrees():
    model = _model("pre-ln")
    tokens = torch.randint(0, VOCAB, (1, PROMPT + 1), generator=torch.Generator().manual_seed(3))
    full = model(tokens)[:, -1]
    cache = model.new_cache()
    model(tokens[:, :PROMPT], cache=cache)
    assert torch.allclose(model(tokens[:, PROMPT:], cache=cache)[:, -1], full, rtol=0, atol=1e-10)
    stale = model.new_cache()
    model(tokens[:, 1:PROMPT], cache=stale)  # one token short: every position is off by one
    assert not torch.allclose(model(tokens[:, PROMPT:], cache=stale)[:, -1], full, atol=1e-3)


def test_logits_shape_dtype_and_heads():
    torch.manual_seed(0)
    tied = splitformer.nn.LanguageModel("pre-ln", VOCAB, d_model=8, n_heads=2, n_layers=1)
    separate = splitformer.nn.LanguageModel("pre-ln", VOCAB, d_model=8, n_heads=2, n_layers=1, tie_weights=False)
    tokens = torch.randint(0, VOCAB, (3, 4))
    assert tied(tokens).shape == (3, 4, VOCAB) and tied(tokens).dtype == torch.float32
    one = tied(tokens[1])  # (tokens,): one sequence, a batch of one
    assert one.shape == (1, 4, VOCAB) and torch.allclose(one, tied(tokens)[1:2], rtol=0, atol=1e-5)
    assert tied.head.weight.data_ptr() == tied.embed.weight.data_ptr()
    assert separate.head.weight.data_ptr() != separate.embed.weight.data_ptr()
    assert sum(p.numel() for p in separate.parameters()) - sum(p.numel() for p in tied.parameters()) == VOCAB * 8
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert tied(tokens).dtype == torch.bfloat16


def test_reset_parameters_dropout_and_sampling():
    model = splitformer.nn.LanguageModel("pre-ln", VOCAB, d_model=8, n_heads=2, n_layers=1, dropout=0.5)
    tokens = torch.randint(0, VOCAB, (2, 4))
    torch.manual_seed(5)
    model.reset_parameters()
    first = model.eval()(tokens)
    torch.manual_seed(5)
    model.reset_parameters()
    assert torch.equal(model(tokens), first)
    model.train()
    assert not torch.equal(model(tokens), model(tokens))  # dropout acts in training mode
    sampled = model.generate(tokens, 3, top_k=1, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, model.generate(tokens, 3, greedy=True)) and model.training


def test_classifier_pooling_ignores_padding():
    torch.manual_seed(0)
    for pooling in ("mean", "class"):
        model = splitformer.nn.Classifier("post-ln", 3, d_input=5, pooling=pooling, d_model=8, n_heads=2,
                                          n_layers=1, dtype=torch.float64)
        features = torch.randn(2, 4, 5, dtype=torch.float64)
        padding = torch.tensor([[False] * 4, [False, False, True, True]])
        logits = model(features, padding_mask=padding)
        changed = features.clone()
        changed[1, 2:] += 1.0
        assert logits.shape == (2, 3)
        assert torch.allclose(model(changed, padding_mask=padding), logits, rtol=0, atol=1e-12)
        assert not torch.allclose(model(changed)[1], model(features)[1], atol=1e-6)  # control: no mask


def test_a_row_with_no_token_and_features_of_another_dtype_are_refused():
    """Attack 24: mean pooling over a row padded throughout returned the head's bias; float32 features into a float64
    model raised torch's RuntimeError from inside the embedding. Control: class pooling has its class node."""
    torch.manual_seed(0)
    features, empty = torch.randn(2, 4, 5, dtype=torch.float64), torch.tensor([[False] * 4, [True] * 4])
    mean, first = (splitformer.nn.Classifier("post-ln", 3, d_input=5, pooling=pooling, d_model=8, n_heads=2,
                                             n_layers=1, dtype=torch.float64) for pooling in ("mean", "class"))
    with pytest.raises(ValueError, match="padding_mask pads every token of a row: mean pooling has no token"):
        mean(features, padding_mask=empty)
    assert torch.isfinite(first(features, padding_mask=empty)).all()
    with pytest.raises(TypeError, match="inputs must be torch.float64, the model's dtype, got torch.float32"):
        mean(features.float())


def test_generate_refuses_a_prompt_padded_on_its_right():
    """Attack 24: the next token was read after a padded position (logits 0.04 off the unpadded prompt's)."""
    torch.manual_seed(1)
    model = splitformer.nn.LanguageModel("llama", VOCAB, d_model=16, n_heads=2, n_layers=1, dtype=torch.float64)
    prompt = torch.tensor([[5, 6, 3, 1, 4]])
    with pytest.raises(ValueError, match="a prompt's padding is on its left only"):
        model.generate(prompt, 2, greedy=True, padding_mask=torch.tensor([[False, False, False, True, True]]))
    left = model.generate(prompt, 2, greedy=True, padding_mask=torch.tensor([[True, True, False, False, False]]))
    assert torch.equal(left[:, 2:], model.generate(prompt[:, 2:], 2, greedy=True))  # control: left padding works


def test_bad_schemes_and_arguments():
    with pytest.raises(SplitformerError, match="not a block scheme"):
        splitformer.nn.LanguageModel("vit", VOCAB)
    with pytest.raises(SplitformerError, match="memory"):
        splitformer.nn.LanguageModel("decoder", VOCAB)
    model = splitformer.nn.LanguageModel("pre-ln", VOCAB, d_model=8, n_heads=2, n_layers=1, max_tokens=6)
    with pytest.raises(ValueError, match="prompt must lie in"):
        model.generate(torch.tensor([[VOCAB]]), 1)
    with pytest.raises(ValueError, match="temperature"):
        model.generate(torch.tensor([[1]]), 1, temperature=0)
    with pytest.raises(ValueError, match="max_tokens"):
        model.generate(torch.tensor([[1]]), 7)
    with pytest.raises(TypeError, match="^greedy must be a bool, got str$"):  # attack 24: "false" decoded greedily
        model.generate(torch.tensor([[1]]), 1, greedy="false")
    with pytest.raises(TypeError, match="^use_cache must be a bool, got int$"):
        model.generate(torch.tensor([[1]]), 1, use_cache=0)
    assert model.generate(torch.tensor([[1]]), 1, greedy=True, use_cache=False).shape == (1, 2)  # control
    with pytest.raises(ValueError, match="position 6 is past max_tokens"):
        model(torch.ones(1, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must be ≥ 0 .*, got -1"):  # attack11 F6: was nn.Embedding's IndexError
        model(torch.ones(1, 3, dtype=torch.long), positions=torch.tensor([[-1, 0, 1]]))
    with pytest.raises(ValueError, match="positions must be integer positions"):
        model(torch.ones(1, 3, dtype=torch.long), positions=torch.tensor([[0.0, 1.0, 2.0]]))
    assert model(torch.ones(1, 3, dtype=torch.long), positions=torch.tensor([[0, 1, 5]])).shape == (1, 3, VOCAB)  # control


def test_rotary_positions_are_refused_as_learned_ones():
    """A rotary LanguageModel (llama) refuses negative and non-integer positions as the learned-position one
    does, naming positions (issue 25: it rotated by the negative angle, a result no source computes for them)."""
    model = splitformer.nn.LanguageModel("llama", VOCAB, d_model=8, n_heads=2, n_layers=1, max_tokens=6)
    tokens = torch.ones(1, 3, dtype=torch.long)
    with pytest.raises(ValueError, match="positions must be ≥ 0 .*, got -1"):
        model(tokens, positions=torch.tensor([[-1, 0, 1]]))
    with pytest.raises(ValueError, match="positions must be integer positions"):
        model(tokens, positions=torch.tensor([[0.0, 1.0, 2.0]]))
    assert model(tokens, positions=torch.tensor([[0, 1, 5]])).shape == (1, 3, VOCAB)  # control


@pytest.mark.parametrize("scheme", ["pre-ln", "llama"])
def test_an_empty_batch_gives_empty_logits_and_tokens(scheme):
    """Batch 0, as the generated Blocks take it (a new user's torch RuntimeError from checking the positions of no
    token); positions past max_tokens are still refused in a batch that has tokens (control)."""
    model = splitformer.nn.LanguageModel(scheme, VOCAB, d_model=8, n_heads=2, n_layers=1, max_tokens=6)
    empty = torch.zeros(0, 3, dtype=torch.long)
    assert model(empty).shape == (0, 3, VOCAB)
    assert model(empty, padding_mask=torch.zeros(0, 3, dtype=torch.bool)).shape == (0, 3, VOCAB)
    assert model.generate(empty, 2).shape == model.generate(empty, 2, greedy=True, use_cache=False).shape == (0, 5)
    with pytest.raises(ValueError, match="positions must be ≥ 0 .*, got -1"):
        model(torch.ones(1, 3, dtype=torch.long), positions=torch.tensor([[-1, 0, 1]]))
    if scheme == "pre-ln":  # learned positions: an empty batch longer than them is refused as a full one is
        with pytest.raises(ValueError, match="^7 tokens are past max_tokens = 6$"):
            model(torch.zeros(0, 7, dtype=torch.long))


@pytest.mark.parametrize("model", ["TextEncoder", "Classifier"])
@pytest.mark.parametrize("scheme", ["gpt2", "llama"])
def test_an_encoder_over_a_causal_scheme_is_refused(model, scheme):
    """TextEncoder and Classifier attend both ways; a scheme declaring causal = true was run bidirectionally (found
    by an attacker: the last token moved earlier outputs by 0.11 for gpt2). Control: a non-causal scheme builds."""
    build = getattr(splitformer.nn, model)
    first = (VOCAB,) if model == "TextEncoder" else (3,)
    sizes = {"d_model": 8, "n_heads": 2, "n_layers": 1, **({} if model == "TextEncoder" else {"vocab_size": VOCAB})}
    assert build("pre-ln", *first, **sizes).scheme == "pre-ln"  # control
    with pytest.raises(SplitformerError, match=rf"^{scheme}: the scheme declares causal = true, but a {model} "
                                               "attends both ways"):
        build(scheme, *first, **sizes)


@pytest.mark.parametrize("make", ["language_model", "classifier", "text_encoder"])
def test_a_layout_option_for_the_stack_is_refused(make):
    """Attack 17: ``batch_first=False`` went on to the Stack, which then read the wrapper's (batch, tokens, d) as
    (tokens, batch, d): rows attended to each other (logits 0.27–1.36 off)."""
    from splitformer.nn import Classifier, LanguageModel, TextEncoder

    scheme = splitformer.load_scheme("pre-ln")
    build = {"language_model": lambda **o: LanguageModel(scheme, 30, d_model=16, n_heads=2, **o),
             "classifier": lambda **o: Classifier(scheme, 3, d_input=4, d_model=16, n_heads=2, **o),
             "text_encoder": lambda **o: TextEncoder(scheme, 30, d_model=16, n_heads=2, **o)}[make]
    build()  # control
    with pytest.raises(ValueError, match="^batch_first: the model hands its Stack"):
        build(batch_first=False)


@pytest.mark.parametrize("options, message", [
    ({"batch_first": False}, "^batch_first: the model hands its Stack"),  # refused where every wrapper is
    ({"dropout": 0.5}, "'dropout' is not a Stack option here"),
    ({"dtype": "float64"}, "'dtype' is not a Stack option here"),
])
def test_a_configs_stack_options_are_checked(options, message):
    from splitformer.codegen.hf_native import SplitformerConfig

    with pytest.raises(ValueError, match=message):
        SplitformerConfig(scheme="pre-ln", vocab_size=30, d_model=16, n_heads=2, stack_options=options).language_model()


def test_a_token_shift_model_learns_positions_and_decodes_as_alone(tmp_path):
    """A tester's finding: a token shift's Stack takes ``positions`` (to find the token before), which the model took
    for rotary attention, so it learned no positions (and a study matched its parameters against models that do).
    ``PLACES_TOKENS`` says whether positions reach what a block computes: rotary, ALiBi, relative buckets."""
    from conftest import ROOT

    text = (ROOT / "tests" / "schemes" / "shifted-pre-ln.toml").read_text(encoding="utf-8")
    path = tmp_path / "shifted.toml"
    path.write_text(text.replace("reach = 1 }", "reach = 1, causal = true }"), encoding="utf-8")
    model = _model(splitformer.load_scheme(str(path)))
    assert isinstance(model.positions, torch.nn.Embedding)
    assert _model("llama").positions is None  # the control: rotary attention places its tokens
    prompt = torch.randint(0, VOCAB, (2, PROMPT), generator=torch.Generator().manual_seed(2))
    padding = torch.zeros(2, PROMPT, dtype=torch.bool)
    padding[1, :2] = True
    tokens = model.generate(prompt, NEW, greedy=True, padding_mask=padding)
    assert torch.equal(tokens[1, 2:], model.generate(prompt[1:, 2:], NEW, greedy=True)[0])
    mask = torch.cat((padding, torch.zeros(2, NEW, dtype=torch.bool)), dim=1)
    full = model(tokens, padding_mask=mask)
    assert torch.allclose(_cached_logits(model, tokens, mask)[1, 2:], full[1, 2:], rtol=0, atol=1e-10)
    with torch.no_grad():  # the learned positions are read
        model.positions.weight.normal_()
    assert (model(tokens, padding_mask=mask) - full).abs().max() > 1e-3


@pytest.mark.parametrize("options, places", [({"alibi": True}, True), ({"rel_pos_bias": "causal"}, True),
                                             ({"qk_norm": True}, False)])
def test_relative_position_attention_places_tokens(options, places):
    from splitformer.symbolic.kinds import OPERATOR_KINDS

    assert OPERATOR_KINDS["scored-attention"](key="attn", **options).places_tokens() is places


def test_dtypes_tokens_temperatures_and_the_meta_device_a_tester_tried():
    """A tester's findings: an integer ``dtype`` failed inside torch ("Only Tensors of floating point … can require
    gradients"); uint8 tokens passed the check and failed in the embedding; a temperature of 1e-40 passed ``> 0`` and
    made the sampling probabilities NaN (logits / t overflowed); a model on the meta device built but its token and
    position checks read values. Now: a TypeError naming dtype; uint8 tokens read as int64 (the same logits); a tiny
    temperature samples the most likely token (control: greedy); meta tensors run through."""
    for dtype in (torch.int32, torch.float8_e4m3fn):
        with pytest.raises(TypeError, match="^dtype must be torch.float16, torch.bfloat16, torch.float32, torch.float64"):
            splitformer.nn.LanguageModel("gpt2", vocab_size=30, dtype=dtype)
    torch.manual_seed(0)
    model = splitformer.nn.LanguageModel("llama", vocab_size=30, d_model=32, n_heads=4, n_layers=2)
    with torch.no_grad():
        for dtype in (torch.uint8, torch.uint16, torch.uint32, torch.uint64, torch.int16):
            assert torch.equal(model(torch.tensor([[1, 2]], dtype=dtype)), model(torch.tensor([[1, 2]])))
    prompt = torch.tensor([[1, 2], [3, 4]])
    sampled = model.generate(prompt, 4, temperature=1e-40, generator=torch.Generator().manual_seed(0))
    assert torch.equal(sampled, model.generate(prompt, 4, greedy=True))
    meta = splitformer.nn.LanguageModel("gpt2", vocab_size=30, d_model=32, n_heads=4, n_layers=2, device="meta")
    assert meta(torch.tensor([[1, 2, 3]], device="meta")).shape == (1, 3, 30)


def test_a_one_dimensional_prompt_takes_a_one_dimensional_padding_mask():
    """A tester's finding: ``generate`` took a 1-D prompt but refused its 1-D ``padding_mask``. Taken as the one row's;
    control: the same row batched gives the same tokens."""
    torch.manual_seed(0)
    model = splitformer.nn.LanguageModel("llama", VOCAB, d_model=8, n_heads=2, n_layers=1)
    prompt, mask = torch.tensor([0, 0, 5, 7]), torch.tensor([True, True, False, False])
    tokens = model.generate(prompt, 3, greedy=True, padding_mask=mask)
    assert tokens.shape == (7,) and torch.equal(tokens, model.generate(prompt[None], 3, greedy=True,
                                                                       padding_mask=mask[None])[0])
