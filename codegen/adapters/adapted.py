"""``Adapted``: the one result of every weight adapter.

An adapter reads a source module (``torch.nn.TransformerEncoderLayer``, a ``transformers``
``BertLayer``, …) and returns which scheme computes the same forward, the canonical
parameters, and the forward's configuration. For one block the object *is* the canonical
parameter mapping (``params["attn.W_q"]``, ``Block.load_params(adapted)``,
``forward(u, adapted, **adapted.forward_kwargs)``); for a stack, ``layers`` holds one mapping
per block and ``final_norm`` the stack's last LayerNorm.
"""

from __future__ import annotations

import functools
import numbers
import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from splitformer.symbolic.errors import SplitformerError

from .arrays import floating_dtype
from .inspection import check_runs_its_classes

__all__ = ["Adapted", "AdaptedLayer", "derive_adapted", "is_bias", "same_argument"]

Params = Mapping[str, np.ndarray]


@dataclass(frozen=True)
class Adapted(Mapping[str, np.ndarray]):
    """What an adapter read from a source module.

    - ``scheme``, ``activation``: the built-in scheme and feed-forward activation whose
      generated forward equals the source's (module ``module_name`` under ``generated/``).
    - ``layers``: canonical parameters (NumPy arrays), one mapping per block.
    - ``final_norm``: ``{"gain", "bias"}`` of a stack's final LayerNorm, or ``None``.
    - ``n_heads``, ``eps``, ``bias``: the forward configuration (``bias=False``: the source
      has no biases; ``layers`` then holds zero biases for the NumPy forward).
    - ``options``: further keyword arguments of the generated forward (``causal=True``, …).
    - ``source``: ``(library, class name)`` of the module read; it names the reverse adapter
      that ``to_torch`` uses.
    - ``stack``: read from a stack (use ``forward_stack``/``Stack``) rather than one block.
    - ``notes``: what reading changed, e.g. a dtype conversion and the precision it keeps.
    - ``source_dtype``: the source's parameter dtype (``"bfloat16"``), which ``to_torch`` writes.
    - ``batch_first``: the source's layout ((batch, tokens, d) when True); ``build`` carries it.
    - ``dropout``: the source's one dropout probability, carried by ``build``; ``None`` when the
      source's dropout does not sit where a generated ``Block`` puts it (not carried).
    - ``scheme_file``: the scheme file (TOML text) that computes the source when ``scheme`` is not
      a built-in (composed by ``from_xtransformers``); ``derivation()`` derives it.
    - ``frozen``: names of a built module's parameters that the source holds fixed (x-transformers' final
      LayerNorm has no bias: the Stack's is zero); ``build`` leaves them out of training (``requires_grad``
      False), so a trained module can be written back.
    - ``training``: the source's mode when read (``None``: not a torch module's); ``build`` returns its module in it
      (an eval-mode source with torch's default dropout 0.1 was built in training mode: 0.48 off its output).
    """

    scheme: str
    activation: str
    layers: tuple[Params, ...]
    n_heads: int
    eps: float
    source: tuple[str, str]
    bias: bool = True
    final_norm: Params | None = None
    stack: bool = False
    options: Mapping[str, Any] = field(default_factory=dict)
    #: Every layer runs one block's parameters (x-transformers' ``weight_tie_layers``): ``build`` gives a
    #: ``Stack(tied=True)`` holding them once.
    tied: bool = False
    notes: tuple[str, ...] = ()
    source_dtype: str = "float32"
    batch_first: bool = True
    dropout: float | None = None
    scheme_file: str = ""
    frozen: tuple[str, ...] = ()
    training: bool | None = None

    def __post_init__(self) -> None:  # each layer asks, as the reading does, why a call would not compute it
        reading = _weightless(self)
        object.__setattr__(self, "layers", tuple(AdaptedLayer(layer, reading) for layer in self.layers))

    # --- the canonical mapping of one block ---------------------------------------------
    @property
    def params(self) -> Params:
        """The canonical parameters of the single block read (an error for a stack)."""
        if self.stack:
            raise SplitformerError(
                f"{self.source[1]} is a stack of {len(self.layers)} layers: use .layers[i] and .final_norm"
            )
        return self.layers[0]

    def __getitem__(self, name: str) -> np.ndarray:
        return self.params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)

    # --- configuration ---------------------------------------------------------------------
    @property
    def module_name(self) -> str:
        """The generated module's name: ``post_ln``, ``pre_ln_gelu`` (CONTRACT's naming)."""
        from splitformer.symbolic.builtins import builtin_names, builtin_text

        name = self.scheme.replace("-", "_")
        declared = "relu"
        if self.scheme_file:
            declared = tomllib.loads(self.scheme_file).get("activation", "relu")
        elif self.scheme in builtin_names():  # gpt2 declares gelu-tanh, llama silu
            declared = tomllib.loads(builtin_text(self.scheme)).get("activation", "relu")
        return name if self.activation == declared else f"{name}_{self.activation.replace('-', '_')}"

    def derivation(self) -> Any:
        """``splitformer.derive`` of the scheme that computes the source (a built-in or ``scheme_file``); one
        ``Derivation`` per scheme in a process."""
        return derive_adapted(self.scheme_file, self.scheme, self.activation, bool(self.options.get("causal", False)))

    def computed_scheme(self) -> Any:
        """The ``Scheme`` whose generated forward computes the source (causal where the source is); read once per
        process (a NumPy forward given an ``Adapted`` asks for it at every call)."""
        return _computed_scheme(self.scheme_file, self.scheme, self.activation, bool(self.options.get("causal")))

    @property
    def forward_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of the generated NumPy ``forward``/``forward_stack``."""
        kwargs: dict[str, Any] = {"n_heads": self.n_heads, "eps": self.eps, **self.options}
        if self.stack:
            kwargs["final_norm"] = self.final_norm
        return kwargs

    @property
    def sizes(self) -> dict[str, int]:
        """``d_model`` and ``d_ff`` as the generated ``Block``'s constructor names them."""
        lifting = next(value for name, value in self.layers[0].items()
                       if name.split(".")[0].startswith("ffn") and ".W" in name and value.ndim == 2)
        return {"d_model": lifting.shape[0], "d_ff": lifting.shape[1]}

    @property
    def dtype(self) -> np.dtype:
        return next(iter(self.layers[0].values())).dtype

    def astype(self, dtype: Any) -> Adapted:
        """The same parameters as ``dtype`` (``np.float32``/``np.float64``; any other is refused)."""
        dtype = floating_dtype(dtype)
        layers = tuple({name: value.astype(dtype) for name, value in params.items()} for params in self.layers)
        final = None if self.final_norm is None else {k: v.astype(dtype) for k, v in self.final_norm.items()}
        return replace(self, layers=layers, final_norm=final)

    def with_params(self, layers: Params | list[Params] | tuple[Params, ...],
                    final_norm: Params | None = None) -> Adapted:
        """The same source and configuration holding other (e.g. trained) parameters."""
        if isinstance(layers, Mapping):
            layers = [layers]
        if len(layers) != len(self.layers):
            raise SplitformerError(f"{len(layers)} parameter mappings for a source of {len(self.layers)} layers")
        layers = tuple(self._like(new, old, f"layer {index}")
                       for index, (new, old) in enumerate(zip(layers, self.layers)))
        if (final_norm is None) != (self.final_norm is None):
            raise SplitformerError("final_norm must be given exactly when the source has a final norm")
        if final_norm is not None:
            final_norm = self._like(final_norm, self.final_norm, "final_norm")
        return replace(self, layers=layers, final_norm=final_norm)

    def _like(self, new: Params, old: Params, where: str) -> Params:
        """``new`` as arrays, checked to hold ``old``'s names and shapes; a bias-less source's Block holds no biases,
        so the canonical zeros of ``old`` stand in for them."""
        new = {k: old[k] for k in old if not self.bias and is_bias(k)} | {k: np.asarray(v) for k, v in new.items()}
        mismatched = sorted(set(new) ^ set(old))
        if mismatched:
            name = mismatched[0]
            raise SplitformerError(f"{where}: parameter {name!r} is {'unexpected' if name in new else 'missing'} "
                                   f"(expected {', '.join(old)})")
        for name, value in new.items():
            if value.shape != old[name].shape:
                raise SplitformerError(f"{where}: {name} has shape {value.shape}, expected {old[name].shape}")
        return new

    # --- into generated torch modules ------------------------------------------------------
    def build(self, torch_module: Any, *, device: Any = None, dtype: Any = None, backward: str = "autograd") -> Any:
        """A generated ``Block`` (``Stack`` for a stack) of ``torch_module`` holding these parameters; ``backward`` as
        the Block's (``"derived"``: the derived adjoint)."""
        if not hasattr(torch_module, "Stack" if self.stack else "Block"):
            raise SplitformerError(f"build takes the generated torch module (derive(...).torch_module()), got "
                                   f"{getattr(torch_module, '__name__', type(torch_module).__name__)!r}, which defines "
                                   f"no {'Stack' if self.stack else 'Block'}")
        if getattr(torch_module, "SCHEME", None) is not None:
            _check_scheme(self, vars(torch_module), f"the generated module {torch_module.__name__}")
        factory = {"eps": self.eps, "bias": self.bias, "batch_first": self.batch_first, "device": device,
                   "dtype": dtype or _torch_dtype(self.dtype), "backward": backward}
        if self.dropout is not None:
            factory["dropout"] = self.dropout
        # constructor options of grouped and rotary blocks (llama)
        factory |= {key: self.options[key] for key in ("n_kv_heads", "rope_theta") if key in self.options}
        first = self.layers[0] if self.stack else self.params
        factory |= {"n_buckets": np.shape(first[name])[axes.index("n_buckets")]  # a table over distance buckets (T5)
                    for name, axes in getattr(torch_module, "PARAMETERS", {}).items() if "n_buckets" in axes and name in first}
        if self.stack:
            module = torch_module.Stack(len(self.layers), self.sizes["d_model"], self.n_heads, self.sizes["d_ff"],
                                        final_norm=self.final_norm is not None, tied=self.tied, **factory)
        else:
            module = torch_module.Block(self.sizes["d_model"], self.n_heads, self.sizes["d_ff"], **factory)
        module = self.load_into(module)
        for name in self.frozen:
            module.get_parameter(name).requires_grad_(False)
        return module if self.training is None else module.train(self.training)

    def load_into(self, module: Any) -> Any:
        """Copy these parameters into a generated ``Block``/``Stack``, checked to compute the source's forward."""
        blocks = list(module.layers) if hasattr(module, "layers") else [module]
        if self.stack != hasattr(module, "layers") or len(blocks) != len(self.layers):
            what = f"a stack of {len(self.layers)} layers" if self.stack else "one block"
            raise SplitformerError(f"{self.source[1]} is {what}; got a {type(module).__name__} of {len(blocks)}")
        self.check_computes(module)
        if self.stack:
            if getattr(module, "has_final_norm", False) != (self.final_norm is not None):
                raise SplitformerError(f"the source {'has' if self.final_norm is not None else 'has no'} final norm, "
                                       f"the Stack final_norm={module.has_final_norm}")
            return module.load_params(list(self.layers), self.final_norm)
        return module.load_params(self.params)

    def unlike(self, target: Any, arguments: Mapping[str, Any] | None = None, layer: bool = False) -> str | None:
        """Why a generated module would not compute the source with these parameters, or ``None``: ``target`` a
        generated ``Block`` (``check_computes``), or a NumPy module's globals with the ``arguments`` of its call
        (its scheme, and the keyword arguments read: ``forward_kwargs``). The generated code asks it of ``params``
        that carry it, so ``Block.load_params(adapted)`` and ``forward(u, adapted)`` refuse what ``load_into`` does;
        ``layer``: of one layer of a stack (``AdaptedLayer``), which a stack's forward or ``load_params`` takes."""
        try:
            if arguments is None:
                self.check_computes(target, layout=False)
                return None
            _check_scheme(self, target, f"the module {target.get('__name__', '')}".rstrip())
        except SplitformerError as error:
            return str(error)
        if self.stack and not layer:
            return (f"the source is a stack of {len(self.layers)} layers: give forward_stack its .layers, "
                    "with **forward_kwargs")
        if arguments.get("n_kv_heads", 0) is None:  # the forward's default: as many as the query heads
            arguments = {**arguments, "n_kv_heads": arguments.get("n_heads")}
        call_time = ("causal",) if self.source[0] == "torch" else ()  # torch's layers take their causal mask per call
        for name, value in self.forward_kwargs.items():
            if name not in call_time and name in arguments and not same_argument(arguments[name], value):
                return (f"the source was read with {name}={value!r}, the call has {name}={arguments[name]!r}: "
                        "pass **adapted.forward_kwargs")
        return None

    def check_computes(self, module: Any, layout: bool = True) -> None:
        """Refuse a generated ``Block``/``Stack`` whose scheme or configuration differs from the source's.

        Compared: what the module's scheme computes (its ``COMPUTES`` digest: operators, steps,
        activation, final norm, causality; not its name), a Stack's ``has_final_norm``, ``n_heads``, ``eps``, ``bias``,
        the grouped and rotary options (``n_kv_heads``, ``rope_theta``), a T5 table's rows (``n_buckets``), and with
        ``layout`` ``batch_first`` and a carried ``dropout`` (how the module takes its input and trains, not what its
        parameters compute: ``Block.load_params`` does not compare them).
        """
        namespace = getattr(type(module).forward, "__globals__", {})
        if namespace.get("SCHEME") is None:
            raise SplitformerError(f"{type(module).__name__} is not a generated Block or Stack (no SCHEME)")
        _check_scheme(self, namespace, f"the {type(module).__name__}")
        _check_own_classes(module, namespace)
        check_runs_its_classes(f"the {type(module).__name__}", module)
        wanted = {"n_heads": self.n_heads, "eps": self.eps, "bias": self.bias}
        if not any(is_bias(name) for table in ("PARAMETERS", "FINAL_NORM_PARAMETERS") for name in namespace.get(table, {})):
            del wanted["bias"]  # a scheme without biases (llama): its Blocks' bias flag reads nothing
        if layout:
            wanted["batch_first"] = self.batch_first
        wanted |= {key: self.options[key] for key in ("n_kv_heads", "rope_theta") if key in self.options}
        tables = {table.shape[0] for key, table in self.layers[0].items() if key.endswith(".rel_bias")}
        if tables:  # a T5 table's rows: a generated Block buckets by its own n_buckets
            wanted["n_buckets"] = tables.pop()
        if self.dropout is not None and layout:
            wanted["dropout"] = self.dropout
        if self.stack and hasattr(module, "has_final_norm") and module.has_final_norm != (self.final_norm is not None):
            raise SplitformerError(f"the source {'has' if self.final_norm is not None else 'has no'} final norm, "
                                   f"the {type(module).__name__} has_final_norm={module.has_final_norm!r}")
        blocks = list(module.layers) if hasattr(module, "layers") else [module]
        for index, block in enumerate(blocks):  # every layer: each is read with its own configuration
            where = f"the {type(module).__name__}" + (f" layers[{index}]" if block is not module else "")
            for name, value in wanted.items():
                if not _same(getattr(block, name, None), value):
                    raise SplitformerError(f"the source has {name}={value!r}, {where} {name}={getattr(block, name, None)!r}")
        if blocks[0] is not module:  # a Stack's own attributes: its final norm's eps and bias, how its layers are tied
            for name in ("eps", "bias") if "bias" in wanted else ("eps",):
                if not _same(getattr(module, name, None), wanted[name]):
                    raise SplitformerError(f"the source has {name}={wanted[name]!r}, the Stack {name}="
                                           f"{getattr(module, name, None)!r} (its final norm reads it)")
            shared = len({id(block) for block in blocks}) == 1 < len(blocks)
            if getattr(module, "tied", False) is not shared and len(blocks) > 1:
                raise SplitformerError(f"the Stack has tied={getattr(module, 'tied', None)!r} but its layers are "
                                       f"{'one module' if shared else 'distinct modules'}; load_params reads tied")

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        shape = f"{len(self.layers)} layers{' + final norm' if self.final_norm is not None else ''}" if self.stack else "block"
        extra = "".join(f", {k}={v!r}" for k, v in self.options.items())
        layout = "" if self.batch_first else ", batch_first=False (the source's (tokens, batch, d); NumPy takes batch first)"
        return (f"Adapted({self.source[0]}.{self.source[1]} → {self.scheme} [{self.activation}], {shape}, {sizes}, "
                f"n_heads={self.n_heads}, eps={self.eps}, bias={self.bias}{extra}, dtype={self.dtype}{layout})")


def _weightless(adapted: Adapted) -> Adapted:
    """``adapted`` without its weights, what ``unlike`` reads of it (the configuration, a relative-position table's
    rows): a layer keeps it, so that a layer alive keeps no other's weights and a reading dropped is freed at once
    (with itself, a cycle: freed by the collector only, 78 MB of a reading kept alive a while)."""
    light = object.__new__(Adapted)
    light.__dict__.update(vars(adapted))
    tables = {name: value for name, value in adapted.layers[0].items() if name.endswith(".rel_bias")} \
        if adapted.layers else {}
    object.__setattr__(light, "layers", (tables,))
    object.__setattr__(light, "final_norm", None if adapted.final_norm is None else {})
    return light


class AdaptedLayer(dict):
    """One layer of a stack an adapter read (``Adapted.layers[i]``): its canonical parameters (a dict), carrying the
    reading, so that a generated forward, ``forward_stack`` or ``load_params`` given it refuses a call that would not
    compute the source (another scheme, ``n_heads``, ``eps``, …) as it refuses a block's ``Adapted``. A dict made from
    it (``dict(layer)``, ``layer | {…}``) is a plain one, which nothing refuses."""

    def __init__(self, params: Params, adapted: Adapted):
        super().__init__(params)
        self.adapted = adapted

    def unlike(self, target: Any, arguments: Mapping[str, Any] | None = None) -> str | None:
        """``Adapted.unlike`` for this layer."""
        return self.adapted.unlike(target, arguments, layer=True)


@functools.lru_cache(maxsize=32)
def _computed_scheme(scheme_file: str, scheme: str, activation: str, causal: bool) -> Any:
    """The ``Scheme`` of ``Adapted.computed_scheme``."""
    from splitformer.codegen.api import as_scheme
    from splitformer.symbolic.scheme_file import parse_scheme

    computed = as_scheme(parse_scheme(scheme_file) if scheme_file else scheme, activation)
    return computed.as_causal() if causal else computed


@functools.lru_cache(maxsize=32)
def _fingerprint(scheme_file: str, scheme: str, activation: str, causal: bool) -> str:
    """The ``COMPUTES`` digest of ``_computed_scheme``."""
    return _computed_scheme(scheme_file, scheme, activation, causal).fingerprint


@functools.lru_cache(maxsize=32)
def derive_adapted(scheme_file: str, scheme: str, activation: str, causal: bool) -> Any:
    """``splitformer.derive`` of an adapted scheme: its ``scheme_file`` when composed, else the built-in ``scheme``;
    derived once per process (the adapters' probe and ``Adapted.derivation`` share it)."""
    from splitformer.codegen.api import derive

    return derive(_computed_scheme(scheme_file, scheme, activation, causal))


def is_bias(name: str) -> bool:
    """Whether a canonical parameter name is a bias (``attn.b_q``, ``norm1.bias``)."""
    attribute = name.rsplit(".", 1)[-1]
    return attribute == "bias" or attribute.startswith("b_")


def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    return {np.dtype(np.float32): torch.float32, np.dtype(np.float64): torch.float64}[np.dtype(dtype)]


def _same(value: Any, wanted: Any) -> bool:
    """``value == wanted`` for a number or flag of a plain type (an object defining its own ``==`` never is)."""
    numbers = (int, float)
    plain = type(value) is type(wanted) or (type(value) in numbers and type(wanted) in numbers)
    return plain and value == wanted


def same_argument(value: Any, wanted: Any) -> bool:
    """Whether a call's keyword argument is the value read: numbers by value (``np.float32(1e-5)`` is ``1e-5`` read
    in float32), flags by truth, anything else only as the same plain value."""
    if isinstance(value, (bool, np.bool_)) or isinstance(wanted, bool):
        return isinstance(value, (bool, np.bool_)) and bool(value) == wanted
    if isinstance(value, numbers.Real) and isinstance(wanted, numbers.Real):
        if isinstance(value, np.floating):  # the value read, rounded as the call's float type holds it
            return bool(value == np.asarray(wanted, dtype=value.dtype))
        return value == wanted or (not isinstance(value, numbers.Integral) and float(value) == wanted)  # a Fraction
    return _same(value, wanted)


def _check_own_classes(module: Any, namespace: Mapping[str, Any]) -> None:
    """Refuse a generated ``Block``/``Stack`` with a part that is not exactly a class of its own generated module
    (a ``Block`` of another scheme in ``layers``, a subclass overriding ``forward``): its ``COMPUTES`` then does
    not describe what runs."""
    import torch

    own = {namespace.get(name) for name in ("Block", "Stack", "_Group")} - {None} | {torch.nn.ModuleList}
    for path, part in module.named_modules():
        if type(part) not in own or (not path and type(part) not in (namespace.get("Block"), namespace.get("Stack"))):
            where = "".join(f"[{word}]" if word.isdigit() else f".{word}" for word in path.split(".")) if path else ""
            raise SplitformerError(f"the {type(module).__name__}{where} is {type(part).__module__}.{type(part).__qualname__}, "
                                   f"not a class of the generated module {namespace.get('__name__')}; a generated "
                                   "Stack runs its own module's Block, as emitted")


def _check_scheme(adapted: Adapted, namespace: Mapping[str, Any], module: str) -> None:
    """Refuse a generated module (its globals ``namespace``) that computes another scheme than the source's."""
    computed = (namespace.get("SCHEME"), namespace.get("ACTIVATION"))
    if computed == (None, None):  # a network's module: the source was read as a block stack
        raise SplitformerError(f"the source was read as a stack of {adapted.scheme} blocks (with {adapted.activation}); "
                               f"{module} is a network's module, which takes a whole model's reading (from_timm(model, "
                               "network=\"vit\"), from_hf(model, network=...): docs/guide/adapters.md)")
    if computed != (adapted.scheme, adapted.activation):
        raise SplitformerError(f"the source computes {adapted.scheme} with {adapted.activation}; "
                               f"{module} computes {computed[0]} with {computed[1]}")
    digest = namespace.get("COMPUTES")
    if digest is None:
        raise SplitformerError(f"{module} has no COMPUTES digest (emitted by an older splitformer): derive it again")
    if digest == _fingerprint(adapted.scheme_file, adapted.scheme, adapted.activation, bool(adapted.options.get("causal"))):
        return  # a NumPy forward given an Adapted asks at every call: the digest is computed once
    scheme = adapted.computed_scheme()
    if not scheme.causal and digest == scheme.as_causal().fingerprint:
        raise SplitformerError(f"{module} computes causal {computed[0]} (derived with causal=True); "
                               f"the source computes non-causal {adapted.scheme}")
    raise SplitformerError(f"{module} computes another scheme under the name {computed[0]} (other operators, steps, "
                           f"final norm or causality: COMPUTES {digest}, the source's {scheme.fingerprint}); "
                           "derive the module from adapted.derivation()")
