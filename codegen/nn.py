"""Whole models around an emitted ``Stack``: a causal language model, a sequence classifier, a text encoder.

``LanguageModel(scheme, vocab_size)`` derives ``scheme`` causal in memory
(``derive(scheme, causal=True).torch_module()``) and puts around its ``Stack`` a token
embedding, learned positions (unless the scheme places its tokens itself, ``PLACES_TOKENS``:
rotary attention, ALiBi, relative buckets; its ``Stack`` then takes the ``positions``), and a
head tied to the embedding or separate; ``generate`` decodes with the stack's KV cache.
``Classifier(scheme, n_classes, ...)`` pools a non-causal stack's output (mean over the
unpadded tokens, or a learned class token) into a linear head.
``TextEncoder(scheme, vocab_size, ...)`` is a BERT-style encoder: token, position and
token-type embeddings, a LayerNorm, the stack, and BERT's pooler. For example::

    import splitformer

    model = splitformer.nn.LanguageModel("macaron", vocab_size=128, d_model=64, n_heads=4)
    tokens = model.generate(prompt, 20, top_k=8)
"""

from __future__ import annotations

import functools
import inspect
import numbers
import sys
import types
from collections.abc import Sequence
from pathlib import Path

import torch

from splitformer.symbolic.builtins import builtin_names
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.scheme import Scheme

__all__ = ["LanguageModel", "Classifier", "TextEncoder", "stack_module"]


@functools.lru_cache(maxsize=32)
def _builtin_module(name: str, causal: bool) -> types.ModuleType:
    """A built-in scheme's module, derived once per process (a scheme file is read each time: it may change)."""
    from .api import derive

    return derive(name, causal=causal).torch_module()


def stack_module(scheme: Scheme | str | Path | types.ModuleType, *, causal: bool) -> types.ModuleType:
    """The emitted torch module of ``scheme`` (causal with a KV cache when ``causal``), checked to
    hold a self-attention ``Stack`` without a memory. A module passed in is used as it is."""
    if isinstance(scheme, types.ModuleType):
        module = scheme
    elif isinstance(scheme, str) and scheme in builtin_names():
        module = _builtin_module(scheme, causal)
    else:
        from .api import as_scheme, derive

        module = derive(as_scheme(scheme), causal=causal).torch_module()
    # torch.compile looks the module up by name to reach its globals: an in-memory one must be findable
    sys.modules[module.__name__] = module
    stack = getattr(module, "Stack", None)
    if stack is None:
        raise SplitformerError(f"{getattr(module, 'SCHEME', module.__name__)}: the module has no Stack")
    accepted = inspect.signature(stack.forward).parameters
    if "memory" in accepted:
        raise SplitformerError(f"{module.SCHEME}: a decoder attends to a memory; a whole model here needs a "
                               "self-attention scheme")
    if causal and "cache" not in accepted:
        raise SplitformerError(
            f"{module.SCHEME}: the emitted Stack keeps no cache of earlier tokens, which a language model decodes "
            "with: a causal scheme keeps one for the operators that read earlier tokens through the support χ or steps "
            "of their positions, and this one's read none (a kind that reads every token, or none)"
            if getattr(accepted.get("causal"), "default", False) is True
            else f"{module.SCHEME}: the emitted Stack has no KV cache (derive it with causal=True)")
    return module


def encoder_module(scheme: Scheme | str | Path | types.ModuleType, model: str) -> types.ModuleType:
    """``stack_module`` of ``scheme`` for a ``model`` that attends both ways: a scheme declaring
    ``causal = true`` (a decoder-only scheme such as ``gpt2``) is refused by name."""
    if not isinstance(scheme, types.ModuleType):
        from .api import as_scheme

        if not (isinstance(scheme, str) and scheme in builtin_names()):
            scheme = as_scheme(scheme)  # the file read once
        declared = as_scheme(scheme)
        if declared.causal:
            raise SplitformerError(f"{declared.name}: the scheme declares causal = true, but a {model} attends both "
                                   "ways; build it over a non-causal scheme (a causal one suits LanguageModel)")
    return stack_module(scheme, causal=False)


def _takes_positions(module: types.ModuleType) -> bool:
    """Whether the scheme places tokens itself (``PLACES_TOKENS``: rotary attention, ALiBi, relative buckets), so that
    the model hands its ``Stack`` the ``positions`` and adds no learned ones. A token shift's ``Stack`` takes
    ``positions`` too, but only to find the token before: a model around it learns positions."""
    places = getattr(module, "PLACES_TOKENS", None)
    if places is None:
        raise SplitformerError(f"{module.__name__} has no PLACES_TOKENS (emitted by an older splitformer): derive it again")
    return places


def _compiling() -> bool:
    """Whether ``torch.compile`` traces the call: value checks (a sync and a graph break) are left out."""
    is_compiling = getattr(torch.compiler, "is_compiling", None)
    return bool(is_compiling and is_compiling())


def _check_tokens(name: str, tokens, vocab_size: int) -> torch.Tensor:
    if not isinstance(tokens, torch.Tensor) or tokens.dtype.is_floating_point or tokens.dtype == torch.bool \
            or tokens.is_complex():
        raise TypeError(f"{name} must be an integer torch.Tensor, got "
                        f"{tokens.dtype if isinstance(tokens, torch.Tensor) else type(tokens).__name__}")
    if tokens.dim() not in (1, 2) or tokens.shape[-1] == 0:
        raise ValueError(f"{name} must have shape (batch, tokens) or (tokens,) with tokens ≥ 1, got {list(tokens.shape)}")
    if tokens.dtype not in (torch.int64, torch.int32):  # the embeddings read only these, and uint16 … uint64 have no
        tokens = tokens.long()  # min or max to check (a uint64 past int64's range turns negative: refused below)
    if not _compiling() and not tokens.is_meta and tokens.numel() and (int(tokens.min()) < 0 or
                                                                      int(tokens.max()) >= vocab_size):
        raise ValueError(f"{name} must lie in [0, {vocab_size}), got values in [{int(tokens.min())}, {int(tokens.max())}]")
    return tokens if tokens.dim() == 2 else tokens[None]


def _check_dtype(dtype: object) -> None:
    """A TypeError unless ``dtype`` is None or a floating torch dtype torch computes in (an integer one failed inside
    torch's layers, a float8 one in its initializers)."""
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float16, torch.bfloat16, torch.float32, torch.float64 or None, got {dtype!r}")


def _token_ids(name: str, value: object, vocab_size: int, several: bool = True) -> tuple[int, ...]:
    """``value`` (None, one token id or, ``several``, a sequence of them) as a tuple of ids below ``vocab_size``; a
    ValueError naming ``name`` otherwise."""
    ids = () if value is None else (value,) if isinstance(value, numbers.Integral) else value if several else None
    if not isinstance(ids, (tuple, list)) or not all(
            isinstance(i, numbers.Integral) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        kinds = "a token id or a sequence of them (each" if several else "a token id (one"
        raise ValueError(f"{name} must be None or {kinds} in 0 … {vocab_size - 1}), got {value!r}")
    return tuple(int(i) for i in ids)


def _check_flags(**flags: object) -> None:
    """A TypeError naming the first of ``flags`` that is not a bool (a string "false" would be true)."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")


def _check_padding(padding_mask, shape: tuple[int, int], one_sequence: bool = False) -> torch.Tensor | None:
    """``padding_mask`` of ``shape`` (batch, tokens), or of (tokens,) for ``one_sequence`` (a 1-D prompt's)."""
    if padding_mask is None:
        return None
    if not isinstance(padding_mask, torch.Tensor) or padding_mask.dtype != torch.bool:
        raise TypeError("padding_mask must be a bool torch.Tensor (True marks a padded token)")
    if one_sequence and padding_mask.dim() == 1:
        padding_mask = padding_mask[None]
    if tuple(padding_mask.shape) != shape:
        raise ValueError(f"padding_mask must have shape {list(shape)}, got {list(padding_mask.shape)}")
    return padding_mask


class _Embedded(torch.nn.Module):
    """Shared parts of the two models: stack, learned positions, dropout, initialization."""

    def _build_stack(self, module, n_layers, d_model, n_heads, d_ff, max_tokens, dropout, final_norm,
                     factory, stack_options):
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0.0 <= dropout <= 1.0:
            raise ValueError(f"dropout must be a real number in [0, 1], got {dropout!r}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
        if "batch_first" in stack_options:  # the model lays out its tokens: another layout mixes the batch's rows
            raise ValueError("batch_first: the model hands its Stack (batch, tokens, d) itself; it takes no layout")
        d_ff = 4 * d_model if d_ff is None else d_ff
        if final_norm is not None:
            stack_options = {**stack_options, "final_norm": final_norm}
        self.stack = module.Stack(n_layers, d_model, n_heads, d_ff, dropout=dropout, **stack_options, **factory)
        self.places_tokens = _takes_positions(module)
        self.max_tokens, self.d_model = max_tokens, d_model
        self.positions = None if self.places_tokens else torch.nn.Embedding(max_tokens, d_model, **factory)
        self.dropout = torch.nn.Dropout(dropout)

    def _place(self, u: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, dict]:
        """``u`` plus learned positions, or the ``positions`` keyword of a stack that places its tokens; either counts
        from 0."""
        checked = not _compiling() and not positions.is_meta and positions.numel() > 0  # an empty batch (or meta
        # tensors) has no position to check …
        if not checked and not self.places_tokens and positions.shape[-1] > self.max_tokens:  # … but its length
            raise ValueError(f"{positions.shape[-1]} tokens are past max_tokens = {self.max_tokens}")
        if checked and int(positions.min()) < 0:
            counted = ("positions the scheme places count from 0" if self.places_tokens
                       else "learned positions 0 … max_tokens − 1")
            raise ValueError(f"positions must be ≥ 0 ({counted}), got {int(positions.min())}")
        if self.places_tokens:
            return u, {"positions": positions}
        if checked and int(positions.max()) >= self.max_tokens:
            raise ValueError(f"position {int(positions.max())} is past max_tokens = {self.max_tokens}")
        return u + self.positions(positions), {}

    def _reset_embeddings(self, *embeddings) -> None:
        for embedding in embeddings:
            if embedding is not None:
                torch.nn.init.normal_(embedding.weight, std=0.02)


def _positions(padding_mask: torch.Tensor | None, batch: int, offset: int, n_tokens: int,
               device: torch.device) -> torch.Tensor:
    """Positions of the new tokens: counted from each row's first unpadded token (left padding)."""
    if padding_mask is None:
        return torch.arange(offset, offset + n_tokens, device=device).expand(batch, n_tokens)
    counted = (~padding_mask).long().cumsum(dim=1) - 1
    return counted.clamp_min(0)[:, offset:]


class LanguageModel(_Embedded):
    """A causal language model: embedding, positions, the ``Stack`` of ``scheme`` made causal, head.

    ``scheme``: a built-in name, a scheme file, a ``Scheme`` or an emitted causal torch module.
    ``tie_weights``: the head is the embedding matrix (one storage). ``final_norm``: ``None``
    keeps the scheme's choice. Other keywords (``n_kv_heads``, ``eps``, ``bias``) go to ``Stack``.
    """

    def __init__(self, scheme, vocab_size: int, *, d_model: int = 64, n_heads: int = 4, d_ff: int | None = None,
                 n_layers: int = 2, max_tokens: int = 512, tie_weights: bool = True, dropout: float = 0.0,
                 final_norm: bool | None = None, device=None, dtype=None, **stack_options):
        super().__init__()
        _check_dtype(dtype)
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        _check_flags(tie_weights=tie_weights)
        if isinstance(scheme, (str, Path)) and str(scheme) not in builtin_names():
            from .api import as_scheme

            scheme = as_scheme(scheme)  # the file read once: the arguments hold what this model computes
        module = stack_module(scheme, causal=True)
        factory = {"device": device, "dtype": dtype}
        self.scheme, self.vocab_size, self.tie_weights = module.SCHEME, vocab_size, tie_weights
        #: The arguments that rebuild this model (``to_hf`` writes them into its config).
        self.arguments = {"scheme": scheme, "vocab_size": vocab_size, "d_model": d_model, "n_heads": n_heads,
                          "d_ff": d_ff, "n_layers": n_layers, "max_tokens": max_tokens, "tie_weights": tie_weights,
                          "dropout": dropout, "final_norm": final_norm, **stack_options}
        #: The tokens that end a row in ``generate`` by default (``from_hf_lm``: the source's generation config).
        self.eos_token_id: int | tuple[int, ...] | None = None
        #: What ``generate`` writes after a row's end token by default (None: the first end token).
        self.pad_token_id: int | None = None
        self.embed = torch.nn.Embedding(vocab_size, d_model, **factory)
        self._build_stack(module, n_layers, d_model, n_heads, d_ff, max_tokens, dropout, final_norm, factory,
                          stack_options)
        self.head = torch.nn.Linear(d_model, vocab_size, bias=False, **factory)
        if tie_weights:
            self.head.weight = self.embed.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings (and a separate head) N(0, 0.02²); the stack's own initialization."""
        self._reset_embeddings(self.embed, self.positions, None if self.tie_weights else self.head)
        self.stack.reset_parameters()

    def new_cache(self) -> list[dict]:
        """An empty KV cache: one dict per layer, filled by ``forward(..., cache=...)``."""
        return [{} for _ in self.stack.layers]

    def forward(self, tokens: torch.Tensor, *, padding_mask: torch.Tensor | None = None,
                cache: list[dict] | None = None, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, tokens, vocab) of the next token after each of ``tokens`` (batch, tokens).

        ``padding_mask`` (batch, cached + new tokens), True = padded (left padding: positions
        count from each row's first real token). ``cache`` (``new_cache()``): ``tokens`` are
        the new ones; keys and values of the earlier ones come from the cache, which grows.
        ``positions`` (batch, tokens): the new tokens' positions, if not counted so.
        """
        tokens = _check_tokens("tokens", tokens, self.vocab_size)
        batch, n_tokens = tokens.shape
        offset = next(iter(cache[0].values())).shape[1] if cache and cache[0] else 0
        padding_mask = _check_padding(padding_mask, (batch, offset + n_tokens))
        if positions is None:
            positions = _positions(padding_mask, batch, offset, n_tokens, tokens.device)
        elif not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point \
                or positions.dtype == torch.bool or positions.shape[-1:] != (n_tokens,) or positions.dim() > 2 \
                or (positions.dim() == 2 and positions.shape[0] not in (1, batch)):
            raise ValueError(f"positions must be integer positions of shape ({batch}, {n_tokens}), (1, {n_tokens}) or "
                             f"({n_tokens},)")
        else:
            positions = positions.expand(batch, n_tokens)
        u, placed = self._place(self.embed(tokens), positions)
        u = self.stack(self.dropout(u), key_padding_mask=padding_mask, causal=True, cache=cache, **placed)
        return self.head(u)

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                 top_k: int | None = None, greedy: bool = False, padding_mask: torch.Tensor | None = None,
                 use_cache: bool = True, generator: torch.Generator | None = None,
                 eos_token_id: int | Sequence[int] | None = None, pad_token_id: int | None = None) -> torch.Tensor:
        """``prompt`` (batch, tokens) followed by up to ``max_new_tokens`` sampled tokens (eval mode).

        ``greedy``: the most likely token; else sampled from softmax(logits / ``temperature``)
        restricted to the ``top_k`` most likely. ``padding_mask``: True on the prompt's left
        padding. ``use_cache=False`` reruns the whole sequence each step (the reference).
        ``eos_token_id`` (one id or several; None: the model's ``eos_token_id``, which ``from_hf_lm`` reads from the
        source's generation config; ``()``: none) ends a row at its first end token: its later tokens are
        ``pad_token_id`` (None: the model's, else the first end token), and generation stops once every row has
        ended, as transformers' ``generate`` does.
        """
        tokens = _check_tokens("prompt", prompt, self.vocab_size)
        ends = _token_ids("eos_token_id", self.eos_token_id if eos_token_id is None else eos_token_id, self.vocab_size)
        pad = _token_ids("pad_token_id", self.pad_token_id if pad_token_id is None else pad_token_id, self.vocab_size,
                         several=False)
        pad = pad[0] if pad else ends[0] if ends else None
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be an int ≥ 0, got {max_new_tokens!r}")
        if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real) or not temperature > 0:
            raise ValueError(f"temperature must be a real number > 0, got {temperature!r}")
        if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
            raise ValueError(f"top_k must be None or a positive int, got {top_k!r}")
        _check_flags(greedy=greedy, use_cache=use_cache)
        padding_mask = _check_padding(padding_mask, tuple(tokens.shape), one_sequence=prompt.dim() == 1)
        if padding_mask is not None and bool((padding_mask[:, 1:] & ~padding_mask[:, :-1]).any()):
            raise ValueError("padding_mask: generate continues each row after its last token, so a prompt's padding "
                             "is on its left only (True before the row's first token, never after it)")
        if not self.places_tokens and tokens.shape[1] + max_new_tokens - 1 > self.max_tokens:
            raise ValueError(f"{tokens.shape[1]} prompt tokens and max_new_tokens = {max_new_tokens} go past "
                             f"max_tokens = {self.max_tokens}")
        was_training = self.training
        self.eval()
        try:
            cache = self.new_cache() if use_cache else None
            new = tokens
            running = torch.ones(len(tokens), 1, dtype=torch.bool, device=tokens.device)  # rows without an end token
            for _ in range(max_new_tokens):
                logits = self(new, padding_mask=padding_mask, cache=cache)[:, -1]
                chosen = self._choose(logits, temperature, top_k, greedy, generator)
                if ends:
                    chosen = torch.where(running, chosen, pad)
                    running = running & ~torch.isin(chosen, torch.tensor(ends, device=chosen.device))
                tokens = torch.cat((tokens, chosen), dim=1)
                if padding_mask is not None:
                    padding_mask = torch.cat((padding_mask, padding_mask.new_zeros(len(tokens), 1)), dim=1)
                new = chosen if use_cache else tokens
                if ends and not bool(running.any()):
                    break
        finally:
            self.train(was_training)
        return tokens if prompt.dim() == 2 else tokens[0]

    @staticmethod
    def _choose(logits, temperature, top_k, greedy, generator) -> torch.Tensor:
        if greedy:
            return logits.argmax(dim=-1, keepdim=True)
        # the same softmax from logits less their largest, each ≤ 0: a small temperature sends the others to −∞, not
        # the largest to ∞ (inf − inf was NaN for temperature 1e-40)
        logits = (logits - logits.amax(dim=-1, keepdim=True)) / temperature
        if top_k is not None and top_k < logits.shape[-1]:
            kth = logits.topk(top_k, dim=-1).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1, generator=generator)


class Classifier(_Embedded):
    """A sequence classifier over the (non-causal) ``Stack`` of ``scheme``.

    Input: integer tokens when ``vocab_size`` is given, else features (batch, tokens,
    ``d_input``) mapped by a linear layer. ``pooling``: ``"mean"`` over the unpadded tokens,
    or ``"class"``: a learned class token is put first and its final state is read out.
    """

    def __init__(self, scheme, n_classes: int, *, vocab_size: int | None = None, d_input: int | None = None,
                 pooling: str = "mean", d_model: int = 64, n_heads: int = 4, d_ff: int | None = None,
                 n_layers: int = 2, max_tokens: int = 512, dropout: float = 0.0, final_norm: bool | None = None,
                 device=None, dtype=None, **stack_options):
        super().__init__()
        _check_dtype(dtype)
        if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 1:
            raise ValueError(f"n_classes must be a positive int, got {n_classes!r}")
        if (vocab_size is None) == (d_input is None):
            raise ValueError("give exactly one of vocab_size (token input) and d_input (feature input)")
        for name, size in (("vocab_size", vocab_size), ("d_input", d_input)):
            if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
                raise ValueError(f"{name} must be a positive int, got {size!r}")
        if pooling not in ("mean", "class"):
            raise ValueError(f"pooling must be 'mean' or 'class', got {pooling!r}")
        module = encoder_module(scheme, "Classifier")
        factory = {"device": device, "dtype": dtype}
        self.scheme, self.vocab_size, self.pooling = module.SCHEME, vocab_size, pooling
        self.embed = (torch.nn.Embedding(vocab_size, d_model, **factory) if vocab_size is not None
                      else torch.nn.Linear(d_input, d_model, **factory))
        self._build_stack(module, n_layers, d_model, n_heads, d_ff, max_tokens, dropout, final_norm, factory,
                          stack_options)
        self.class_token = torch.nn.Parameter(torch.empty(d_model, **factory)) if pooling == "class" else None
        self.head = torch.nn.Linear(d_model, n_classes, **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings and class token N(0, 0.02²), a feature projection and the head as torch's
        ``Linear``, the stack's own initialization."""
        if isinstance(self.embed, torch.nn.Embedding):
            self._reset_embeddings(self.embed)
        else:
            self.embed.reset_parameters()
        self._reset_embeddings(self.positions)
        if self.class_token is not None:
            torch.nn.init.normal_(self.class_token, std=0.02)
        self.head.reset_parameters()
        self.stack.reset_parameters()

    def forward(self, inputs: torch.Tensor, *, padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, n_classes); ``padding_mask`` (batch, tokens), True = padded."""
        if self.vocab_size is not None:
            inputs = _check_tokens("inputs", inputs, self.vocab_size)
        elif not isinstance(inputs, torch.Tensor) or inputs.dim() != 3 or inputs.shape[-1] != self.embed.in_features:
            raise ValueError(f"inputs must be a tensor (batch, tokens, {self.embed.in_features}), got "
                             f"{list(inputs.shape) if isinstance(inputs, torch.Tensor) else type(inputs).__name__}")
        elif inputs.dtype != self.embed.weight.dtype:
            raise TypeError(f"inputs must be {self.embed.weight.dtype}, the model's dtype, got {inputs.dtype}")
        padding_mask = _check_padding(padding_mask, tuple(inputs.shape[:2]))
        if padding_mask is not None and self.class_token is None and bool(padding_mask.all(dim=1).any()):
            raise ValueError("padding_mask pads every token of a row: mean pooling has no token to average")
        u = self.embed(inputs)
        batch = u.shape[0]
        if self.class_token is not None:
            u = torch.cat((self.class_token.expand(batch, 1, -1), u), dim=1)
            if padding_mask is not None:
                padding_mask = torch.cat((padding_mask.new_zeros(batch, 1), padding_mask), dim=1)
        positions = _positions(padding_mask, batch, 0, u.shape[1], u.device)
        u, placed = self._place(u, positions)
        u = self.stack(self.dropout(u), key_padding_mask=padding_mask, causal=False, **placed)
        if self.class_token is not None:
            return self.head(u[:, 0])
        if padding_mask is None:
            return self.head(u.mean(dim=1))
        kept = (~padding_mask).to(u.dtype)[..., None]
        return self.head((u * kept).sum(dim=1) / kept.sum(dim=1))


class TextEncoder(_Embedded):
    """A BERT-style encoder over the (non-causal) ``Stack`` of ``scheme``: the sum of token,
    learned position (counted from 0 in every row; none for schemes that place their tokens) and token-type
    embeddings, a LayerNorm (``embedding_norm``), dropout, the stack; ``pool`` is BERT's pooler
    (the first token's final state through a dense layer and tanh).

    ``n_token_types``: 0 for none. ``eps``: the embedding norm's and the stack's. Other keywords
    (``bias``, …) go to ``Stack``.
    """

    def __init__(self, scheme, vocab_size: int, *, d_model: int = 64, n_heads: int = 4, d_ff: int | None = None,
                 n_layers: int = 2, max_tokens: int = 512, n_token_types: int = 2, embedding_norm: bool = True,
                 pooler: bool = True, eps: float = 1e-5, dropout: float = 0.0, final_norm: bool | None = None,
                 device=None, dtype=None, **stack_options):
        super().__init__()
        _check_dtype(dtype)
        for name, size, least in (("vocab_size", vocab_size, 1), ("n_token_types", n_token_types, 0)):
            if isinstance(size, bool) or not isinstance(size, int) or size < least:
                raise ValueError(f"{name} must be an int ≥ {least}, got {size!r}")
        _check_flags(embedding_norm=embedding_norm, pooler=pooler)
        module = encoder_module(scheme, "TextEncoder")
        factory = {"device": device, "dtype": dtype}
        self.scheme, self.vocab_size, self.n_token_types = module.SCHEME, vocab_size, n_token_types
        self.embed = torch.nn.Embedding(vocab_size, d_model, **factory)
        self.token_types = torch.nn.Embedding(n_token_types, d_model, **factory) if n_token_types else None
        self.embedding_norm = torch.nn.LayerNorm(d_model, eps=eps, **factory) if embedding_norm else None
        self._build_stack(module, n_layers, d_model, n_heads, d_ff, max_tokens, dropout, final_norm, factory,
                          {**stack_options, "eps": eps})
        self.pooler = torch.nn.Linear(d_model, d_model, **factory) if pooler else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Embeddings N(0, 0.02²), the embedding norm's unit gain and zero bias, the pooler as
        torch's ``Linear``, the stack's own initialization."""
        self._reset_embeddings(self.embed, self.positions, self.token_types)
        for part in (self.embedding_norm, self.pooler):
            if part is not None:
                part.reset_parameters()
        self.stack.reset_parameters()

    def forward(self, tokens: torch.Tensor, *, token_types: torch.Tensor | None = None,
                padding_mask: torch.Tensor | None = None, token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Final hidden states (batch, tokens, d) of ``tokens`` (batch, tokens).

        ``token_types`` (batch, tokens): segment ids (default 0); ``token_type_ids``, BERT's name, is taken too.
        ``padding_mask`` (batch, tokens), True = padded: no token attends to a padded one.
        """
        types_name = "token_types"
        if token_type_ids is not None:
            if token_types is not None:
                raise ValueError("give token_types or token_type_ids (BERT's name for it), not both")
            token_types, types_name = token_type_ids, "token_type_ids"
        tokens = _check_tokens("tokens", tokens, self.vocab_size)
        batch, n_tokens = tokens.shape
        padding_mask = _check_padding(padding_mask, (batch, n_tokens))
        u = self.embed(tokens)
        if token_types is not None or self.token_types is not None:
            if self.token_types is None:
                raise ValueError(f"{types_name} given, but this TextEncoder has n_token_types = 0")
            types = tokens.new_zeros(tokens.shape) if token_types is None else \
                _check_tokens(types_name, token_types, self.n_token_types)
            if tuple(types.shape) != (batch, n_tokens):
                raise ValueError(f"{types_name} must have shape {[batch, n_tokens]}, got {list(types.shape)}")
            u = u + self.token_types(types)
        u, placed = self._place(u, _positions(None, batch, 0, n_tokens, u.device))
        if self.embedding_norm is not None:
            u = self.embedding_norm(u)
        return self.stack(self.dropout(u), key_padding_mask=padding_mask, causal=False, **placed)

    def pool(self, hidden: torch.Tensor) -> torch.Tensor:
        """BERT's pooler: ``tanh(dense(hidden[:, 0]))`` of the final hidden states (batch, tokens, d)."""
        if self.pooler is None:
            raise ValueError("this TextEncoder has no pooler (pooler=False)")
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or hidden.shape[-1] != self.d_model:
            raise ValueError(f"hidden must be a tensor (batch, tokens, {self.d_model}), got "
                             f"{list(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__}")
        return torch.tanh(self.pooler(hidden[:, 0]))
