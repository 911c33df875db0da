"""Emission: lowered modules through a backend's Jinja templates → Python source."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import cache
from importlib import resources

import jinja2

from splitformer.symbolic import __version__
from splitformer.symbolic.domains import BUCKETS, FREQUENCIES, HEADS, HIDDEN, KV_FEATURES, KV_HEADS, VARIABLES
from splitformer.symbolic.errors import SplitformerError
from splitformer.symbolic.inputs import MEMORY_SUPPORT
from splitformer.symbolic.markdown import markdown_text
from splitformer.symbolic.names import check_identifier
from splitformer.symbolic.scheme import Scheme
from splitformer.symbolic.scheme_file import derive_arguments

from .across_layers import across_context
from .adjoint import Backward, differentiated_inputs
from .backends import BACKENDS, DROPOUT, INFERENCE, Spelled
from .constant_names import check_constant_names
from .initialization import init_bounds
from .ir import Branch, Cache, Contraction, Elementwise, LocalKernel, MatMul, Memoized, Module, Op, Reduction, Shared, flat
from .passes.local_kernel import reads_without_support
from .runtime_source import inline_runtime, runtime_mark

__all__ = ["environment", "python_string", "render_module", "unit_context", "backward_context", "narrowest_head"]

#: The grid of each axis label of the IR (``"r"`` → the rotation frequencies).
_LABEL_DOMAINS = {str(variable.index): variable.domain for variable in VARIABLES.values()}


@cache
def environment() -> jinja2.Environment:
    """The Jinja environment of all templates (strict, deterministic whitespace); one per process,
    so each template is compiled once."""
    folder = resources.files("splitformer.templates")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # text from a scheme, a plug-in or a model reaches the code only through these three filters
    env.filters["pystr"] = python_string
    env.filters["doc"] = _escaped
    env.filters["comment"] = _one_line
    env.filters["pyfloat"] = lambda value: repr(float(value))  # a number, or ValueError: never code
    env.filters["pytuple"] = lambda names: "(" + "".join(
        f"{python_string(name) if isinstance(name, str) else int(name)}, " for name in names).rstrip(" ") + ")"
    env.filters["shape"] = lambda names: "(" + ", ".join(names) + ")"
    env.filters["union"] = lambda first, second: set(first) | set(second)
    env.filters["text"] = markdown_text
    # where the runtime helpers a module uses go (codegen.runtime_source)
    env.globals["runtime"] = runtime_mark
    env.globals["binds_head"] = _binds_head
    env.globals["reads_size"] = _reads_size
    return env


def _reads_size(unit: dict, size: str, gradients: list[dict] = ()) -> bool:
    """Whether a derived step's function (templates/backward.py.j2) reads the size ``size``: its statements do, or a
    view of a parameter it binds or of a gradient it returns (``reshape(d, n_heads, d_head, d_ff)``)."""
    views = [parameter["view"] for parameter in unit["parameters"] if parameter["variable"] in unit["arrays"]]
    views += [gradient["reshape"] for gradient in gradients]
    return size in unit["uses"] or any(size in view for view in views if view)


def _binds_head(unit: dict, gradients: list[dict] = ()) -> bool:
    """Whether a derived step's function binds ``d_head``: it reads it (``_reads_size``), or a size it binds from it
    does (grouped heads' ``d_kv``, rotary pairs' ``d_half``, a set head width's ``d_inner``)."""
    return (_reads_size(unit, "d_head", gradients) or unit["grouped"] or unit["half_width"]
            or bool(unit.get("head_width")))


def _one_line(text: str) -> str:
    """``text`` with every character that is not printable (line breaks too) written as its escape."""
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in str(text))


def _escaped(text: str) -> str:
    """``text`` as the inside of a double-quoted (or triple-quoted) Python string: it cannot end it."""
    return _one_line(str(text).replace("\\", "\\\\").replace('"', '\\"'))


def python_string(text: str) -> str:
    """A double-quoted Python literal whose value is ``text``, whatever ``text`` holds."""
    return f'"{_escaped(text)}"'


def _parameter_path(parameter: object) -> tuple[str, str]:
    """``group.attribute`` of a parameter's name, each part checked as an identifier: they are
    emitted as code (``self.attn.W_q``), so no text may reach there unchecked."""
    parts = parameter.split(".") if isinstance(parameter, str) else [parameter]
    if len(parts) != 2:
        raise SplitformerError(f"parameter name {str(parameter)[:64]!r} is not 'group.attribute'")
    return check_identifier(parts[0], "parameter group"), check_identifier(parts[1], "parameter attribute")


def _code_shape(domains) -> tuple[str, ...]:
    return tuple(domain.code_name for domain in domains)


#: The ops that read a support as a factor of what they compute (a plug-in's sum over the support, a token map's kernel).
_FACTOR_READERS = (Elementwise, Reduction, Contraction)


def _read_as_factor(module: Module, name: str, kinds: tuple[type, ...]) -> bool:
    """An op of one of ``kinds`` reads the array ``name`` (a support) as a factor of what it computes."""
    return any(isinstance(op, kinds) and name in op.reads() for op in flat(module.ops))


def _read_only_as_factor(module: Module, name: str) -> bool:
    """The support ``name`` is read, and only as a factor (no masked softmax, no local kernel reads it): it is then
    materialized in the state's dtype, so that a sum of it alone (``Σ_n χ[i, n]``, ``Σ_n χ[i, n] χ[n, j]``) counts
    in that dtype: NumPy's einsum of bool operands computes in bool (1 + 1 = 1), torch's has no bool, and NumPy's
    integer count turns a float32 quotient into float64."""
    readers = [op for op in flat(module.ops) if name in op.reads()]
    return bool(readers) and all(isinstance(op, _FACTOR_READERS) for op in readers)


def _check_support_products(module: Module) -> None:
    """``SplitformerError`` for a product of supports alone (``Σ_n χ[i, n] χ[n, j]``) whose support stays bool because
    a masked softmax (an attention) reads it too: NumPy's einsum of bool operands computes in bool (1 + 1 = 1),
    torch's has none. (A support read only as a factor is in the state's dtype: such a product counts there.)"""
    symbols = {"chi": "χ", MEMORY_SUPPORT.name: "χ_m"}
    for op in flat(module.ops):
        reads = set(op.reads())
        if isinstance(op, Contraction) and reads and reads <= set(symbols) and \
                not all(_read_only_as_factor(module, name) for name in reads):
            shown = " and ".join(symbols[name] for name in sorted(reads))
            raise SplitformerError(f"scheme {module.name!r}, {op.section}: a product of the support {shown} alone, "
                                   "where a softmax reads it too, cannot be emitted yet (it would count in bool); "
                                   "compute it in an operator of its own scheme, or multiply it by a field")


def unit_context(module: Module, backend: str, keep: set[str] | None = None) -> dict:
    """One emitted function: its parameters, its statements grouped by substep, its output.

    With ``keep`` (the names the function returns), every other local array is deleted
    after its last reader, so that memory holds only live arrays; a backend that frees dead
    arrays (``Backend.frees_dead_arrays``) keeps only the output by default.
    """
    spelling = BACKENDS[backend]
    _check_support_products(module)
    if keep is None and spelling.frees_dead_arrays:
        keep = {module.output} | ({module.stream} if module.stream else set())
    parameters = []
    hidden = buckets = None
    for info in module.parameters():
        group, attribute = _parameter_path(info.parameter)
        shape = _code_shape(info.shape)
        view = _code_shape(info.view) if info.view is not None else shape
        if hidden is None and HIDDEN in info.shape:
            hidden = (info.parameter, info.shape.index(HIDDEN))
        if buckets is None and BUCKETS in info.shape:
            buckets = (info.parameter, info.shape.index(BUCKETS))
        parameters.append({
            "name": info.parameter, "variable": info.name, "group": group, "attribute": attribute,
            "shape": shape, "view": view if view != shape else None, "kind": info.kind,
        })
    domains = {domain for info in module.tensors.values() for domain in (info.view or ()) + (info.shape or ())}
    domains |= {_LABEL_DOMAINS[label] for op in flat(module.ops) for label in op.labels if label in _LABEL_DOMAINS}
    sections: list[dict] = []
    statements = _statements(module, spelling)
    spelled = [statement.spelled for statement in statements]
    free = _last_reads(module, keep, statements, spelling.frees_in_branches) if keep is not None else {}
    for position, statement in enumerate(statements):
        if not sections or sections[-1]["title"] != statement.op.section:
            sections.append({"title": statement.op.section, "statements": []})
        sections[-1]["statements"].append({"comment": statement.comment, "code": statement.spelled.lines,
                                           "free": free.get(position, []), "indent": statement.indent})
    return {
        "parameters": parameters,
        "groups": list(dict.fromkeys(parameter["group"] for parameter in parameters)),
        "hidden": hidden,
        # the parameter (and axis) whose length is the number of buckets of relative distances
        "buckets": buckets,
        "sections": sections,
        "uses_support": "chi" in module.tensors,
        # χ read as a factor of a formula (a token map's kernel, a plug-in's sum over the support), not by a masked
        # softmax: an indicator array
        "dense_support": _read_as_factor(module, "chi", _FACTOR_READERS),
        # the memory's support χ_m read so (a plug-in's): an indicator array when no mask is given too
        "dense_memory_support": _read_as_factor(module, MEMORY_SUPPORT.name, _FACTOR_READERS),
        # read only so: materialized in the state's dtype (``_read_only_as_factor``)
        "float_support": _read_only_as_factor(module, "chi"),
        "float_memory_support": _read_only_as_factor(module, MEMORY_SUPPORT.name),
        # χ read as a factor (by a local kernel (``_window``) too: bool, but never materialized as ones): a float
        # mask (additive log-weights) is refused
        "factor_support": _read_as_factor(module, "chi", (*_FACTOR_READERS, LocalKernel)),
        # the names the statements read besides arrays (runtime helpers, sizes, flags), as the backend spelled them
        "uses": set().union(*(statement.used for statement in spelled)),
        # the arrays the statements read or write (the parameters a function binds are those)
        "arrays": {name for statement in statements for name in statement.names},
        # parameters a fused product reads side by side (names, axis): stored as views of one tensor
        "side_by_side": _side_by_side(module),
        "output": module.output,
        # the second result: the increment of the second state (``Substep.stream``), or None
        "stream": module.stream,
        # what the operators declare they read (symbolic.inputs), and the grids the arrays live on
        "positions": any(field.role == "positions" for field in module.inputs),
        "memory": any(field.role == "memory" for field in module.inputs),
        "constants": [constant for constant in module.constants if check_identifier(constant.name, "constant")],
        # the optional keyword arguments the declared inputs come from (memory_key_padding_mask, positions)
        "keywords": [field.argument for field in module.inputs if field.role != "memory"],
        "grouped": bool({KV_HEADS, KV_FEATURES} & domains),
        "half_width": FREQUENCIES in domains,
        "per_head": any(HEADS in info.shape for info in module.parameters()),
        "cached": [op.key for op in module.ops if isinstance(op, Cache)],
        # where kinds read χ(x̃, x), whose cached step would need the earlier tokens as queries: why a cache is refused
        "uncached": _cache_refusal(module.uncached),
        # what a cache keeps once per memory: the key of the memory's copy and those of the fields computed from it
        "memoized": [{"memory": op.key, "fields": list(op.keys)} for op in module.ops if isinstance(op, Memoized)],
        # what a stack's layers compute once from the positions (``Shared``), where the backend shares it
        "shared": [operand.name for op in module.ops if isinstance(op, Shared) and spelling.shares_across_layers
                   for operand in op.outputs],
        # cached key positions a kernel reads without χ: (cache key, ((low, high), …)), checked against new positions
        "unmasked_reads": _unmasked_reads(module),
    }


def _cache_refusal(kinds: tuple[str, ...]) -> str:
    """The message refusing a cache for ``kinds`` that read the support with a key in the query's place, or the count
    of every token; "" for none."""
    if not kinds:
        return ""
    return (f"cache: {', '.join(kinds)} {'reads' if len(kinds) == 1 else 'read'} the support with a key in the query's "
            "place, χ(x̃, x), or the count of every token, |Ω_x|: a cached step would need the earlier tokens as "
            "queries of the new ones, or the tokens after them, which no cache holds; call the whole sequence "
            "without a cache")


def _unmasked_reads(module: Module) -> list[tuple[str, tuple[tuple[float, float], ...]]]:
    """Per cached positions array that a token map's kernel reads without ``χ`` (``reads_without_support``): its
    cache key and windows. A cached token read a later one there in the full pass; cached decoding cannot."""
    keys = {op.out: op.key for op in module.ops if isinstance(op, Cache)}
    return [(keys[far], tuple((float(low), float(high)) for low, high in windows))
            for far, windows in reads_without_support(module).items() if far in keys]


def _side_by_side(module: Module) -> list[tuple[tuple[str, ...], int]]:
    """The kernels (axis 1) and biases (axis 0) of each fused product over parameters, once each."""
    groups = []
    for op in flat(module.ops):
        if isinstance(op, MatMul) and len(op.weights) > 1:
            for names, axis in ((op.weights, 1), (op.biases, 0)):
                infos = [module.tensors.get(name) for name in names]
                if all(info is not None and info.role == "param" for info in infos):
                    groups.append((tuple(info.parameter for info in infos), axis))
    return list(dict.fromkeys(groups))


@dataclass(frozen=True)
class _Statement:
    """One statement of an emitted function: the op it belongs to, its spelling, the arrays it reads or writes
    (``names``), its indent, and the ``Memoized`` op whose branch holds it (its position among the statements)."""

    op: Op
    spelled: Spelled
    names: tuple[str, ...]
    comment: list[str]
    indent: str = ""
    branch: int | None = None


def _statements(module: Module, spelling) -> list[_Statement]:
    """The statements of ``module``'s ops; a branch op's (``Memoized``, ``Shared`` where the backend shares): its
    head (outputs read from where they were kept), its own ops' statements in its ``else`` branch, their results
    stored there, and an empty statement after the branch (where arrays the branch read from outside are deleted)."""
    statements = []
    for op in module.ops:
        if isinstance(op, Shared) and not spelling.shares_across_layers:  # computed in every layer
            statements += [_statement(module, item, spelling) for item in op.ops]
            continue
        if not isinstance(op, Branch):
            statements.append(_statement(module, op, spelling))
            continue
        head = len(statements)
        inner = [_statement(module, item, spelling, head) for item in op.ops]
        if isinstance(op, Shared):  # keyed by the default positions' sizes, and the sizes and constants it reads
            read = set().union(*(statement.spelled.used for statement in inner)) - {INFERENCE, DROPOUT}
            offset = ("offset",) if any(isinstance(item, Cache) for item in module.ops) else ()
            sizes = sorted(name for name in read - {"batch", "n_tokens"}
                           if name.isidentifier() and not name.startswith("_"))  # not helpers, not torch.cos
            op = replace(op, key=(*offset, "batch", "n_tokens", *sizes))
        statements.append(_Statement(op, spelling.spell(module, op), (*op.sources(), *op.writes()),
                                     op.comment.splitlines()))
        statements += inner
        statements.append(_Statement(op, spelling.spell_store(module, op), (*op.sources(), *op.writes()), [], "    ",
                                     head))
        statements.append(_Statement(op, Spelled([], frozenset()), (), []))
    return statements


def _statement(module: Module, op: Op, spelling, branch: int | None = None) -> _Statement:
    """The statement computing ``op`` (in the branch of the statement at ``branch``, if any)."""
    return _Statement(op, spelling.spell(module, op), (*op.reads(), *op.writes(), op.out), op.comment.splitlines(),
                      "" if branch is None else "    ", branch)


def _last_reads(module: Module, keep: set[str], statements: list[_Statement],
                in_branches: bool = True) -> dict[int, list[str]]:
    """Statement position → the local arrays read there for the last time (not kept, not controls).

    A grid coordinate (``_grid(size, u0)``) reads the state ``u0`` for its dtype. An array last read in a
    ``Memoized`` op's branch that the branch did not write is deleted after the branch; one it wrote, there
    (``in_branches``) or never.
    """
    last: dict[str, int] = {}
    for position, statement in enumerate(statements):
        grid = ["u0"] if "_grid" in statement.spelled.used else []
        for name in [*statement.names, *grid]:  # out: a fused product's buffer, split into writes()
            last[name] = position
    free: dict[int, list[str]] = {}
    for name, position in last.items():
        info = module.tensors.get(name)
        if name in keep or (info is not None and info.role == "param"):
            continue
        branch = statements[position].branch
        if branch is not None and name in statements[branch].op.inner() and not in_branches:
            continue
        if branch is not None and name not in statements[branch].op.inner():
            position = next(after for after in range(position, len(statements))
                            if statements[after].branch is None)  # the empty statement after the branch
        free.setdefault(position, []).append(name)
    return {position: sorted(names) for position, names in free.items()}


def render_module(scheme: Scheme, block: Module, final_norm: Module, backend: str,
                  backward=None, final_backward=None) -> str:
    """The source of the generated ``backend`` module: the block and a stack's final norm.

    ``backward`` and ``final_backward`` (``codegen.adjoint.Backward``) add their derived adjoints.
    """
    template = environment().get_template(f"{backend}/module.py.j2")
    units = {}
    if backward is not None:
        units = {"vjp": backward_context(backward, backend), "final_vjp": backward_context(final_backward, backend)}
    block_unit, final_unit = unit_context(block, backend), unit_context(final_norm, backend)
    # the head width the attention operators set (None: d / n_heads), a number of the emitted block
    block_unit["head_width"] = final_unit["head_width"] = scheme.head_width()
    for part in ("forward", "adjoint") if backward is not None else ():
        units["vjp"][part]["head_width"] = block_unit["head_width"]
    parameters = block_unit["parameters"] + final_unit["parameters"]
    source = inline_runtime(template.render(
        vjp=units.get("vjp"),
        final_vjp=units.get("final_vjp"),
        scheme=scheme,
        regenerate=derive_arguments(scheme),
        module=block,
        version=__version__,
        block=block_unit,
        final=final_unit,
        init_bounds=init_bounds(parameters, scheme.operators),
        across=across_context(scheme.across_layers),
        # (max_distance, bidirectional) of each T5 bucketing: the table's n_buckets is checked against them
        bucketings=sorted({(operator.max_distance, operator.rel_pos_bias == "bidirectional")
                           for operator in scheme.instantiate().values() if getattr(operator, "rel_pos_bias", "")}),
        head_bound=narrowest_head(scheme),
    ), backend)
    return check_constant_names(source, block.constants + final_norm.constants, f"scheme {scheme.name!r}")


def narrowest_head(scheme: Scheme) -> dict | None:
    """``{"width", "option"}``: the widest head that an operator's ``head_width_option`` asks heads to hold
    (``attn.rotary_dim = 8``), which the emitted code refuses narrower heads than; ``None``: any width."""
    widest = None
    for key, operator in scheme.instantiate().items():
        option = type(operator).head_width_option
        if not option:
            continue
        if type(option) is not str or not option.isidentifier() or option not in {field.name for field in fields(operator)}:
            raise SplitformerError(f"operator {key!r}: head_width_option {str(option)[:64]!r} is not one of its options "
                                   "(an identifier)")  # ``@dataclass`` takes any text as a field name
        width = getattr(operator, option)
        if type(width) is not int or width < 0:
            raise SplitformerError(f"operator {key!r}: {option} must be an int >= 0 to bound the head width, "
                                   f"got {str(width)[:64]!r}")
        if width and (widest is None or width > widest["width"]):
            widest = {"width": width, "option": f"{key}.{option} = {width}"}
    fixed = scheme.head_width()
    if widest is not None and fixed is not None and fixed < widest["width"]:
        raise SplitformerError(f"scheme {scheme.name!r}: d_head = {fixed}, but {widest['option']} needs heads at least "
                               f"{widest['width']} features wide (the emitted code would refuse every size)")
    return widest


def _data(module: Module, grouped: bool) -> dict[str, str]:
    """The step's data (supports, sizes, positions, constants): arguments of both functions, not
    differentiated, each with its kind (``support``, ``size``, ``positions``, ``constant``)."""
    data = {field.name: field.role for field in module.inputs if field.role == "support"}
    data.update({"n_kv_heads": "size"} if grouped else {})
    data.update({field.name: field.role for field in module.inputs if field.role == "positions"})
    data.update({constant.name: "constant" for constant in module.constants})
    return data


def _input_costate_last(adjoint: Module, costate: str, gradients: set[str]) -> tuple[Module, int]:
    """The adjoint with the statements that only the input's costate reads moved to its end,
    and their number (the emitted backward runs them when the input needs its gradient).

    A statement moved past another that updated one of its operands in place would read
    the update: such updates are turned off.
    """
    needed = set(gradients)
    wanted = []
    for op in reversed(adjoint.ops):  # the statements the other gradients need
        wanted.append(bool(set(op.writes()) & needed))
        if wanted[-1]:
            needed |= set(op.reads())
    wanted.reverse()
    rest = [op for op, keep in zip(adjoint.ops, wanted) if not keep]
    if not rest or costate not in {name for op in rest for name in op.writes()}:
        return adjoint, 0
    read_later = {name for op in rest for name in op.reads()}
    first = [replace(op, reuse=None) if isinstance(op, Elementwise) and op.reuse in read_later else op
             for op, keep in zip(adjoint.ops, wanted) if keep]
    return replace(adjoint, ops=first + rest), len(rest)


def _sections(sections: list[dict], part: slice) -> list[dict]:
    """The statements ``part`` of ``sections`` (in order), regrouped by section."""
    statements = [(section["title"], statement) for section in sections for statement in section["statements"]]
    chosen: list[dict] = []
    for title, statement in statements[part]:
        if not chosen or chosen[-1]["title"] != title:
            chosen.append({"title": title, "statements": []})
        chosen[-1]["statements"].append(statement)
    return chosen


def backward_context(backward: Backward, backend: str) -> dict:
    """Template variables of ``backward_functions`` (templates/backward.py.j2)."""
    differentiated = differentiated_inputs(backward.forward)
    gradients = []
    for name, variable in backward.gradients.items():
        if name in ("u", *(field.argument for field in differentiated)):
            continue
        info = backward.adjoint.tensors[variable]
        shape = tuple(domain.code_name for domain in info.shape)
        view = tuple(domain.code_name for domain in info.view) if info.view is not None else shape
        gradients.append({"name": name, "variable": variable, "reshape": shape if view != shape else None})
    order = [info.parameter for info in backward.forward.parameters()]
    gradients.sort(key=lambda gradient: order.index(gradient["name"]))
    forward = unit_context(backward.forward, backend, keep={*backward.saved, backward.forward.output})
    adjoint, input_only = backward.adjoint, 0
    if BACKENDS[backend].input_costate_last:
        adjoint, input_only = _input_costate_last(backward.adjoint, backward.gradients["u"],
                                                  {*backward.gradients.values()} - {backward.gradients["u"]})
    adjoint = unit_context(adjoint, backend, keep=set(backward.gradients.values()))
    return {
        "forward": forward,
        "adjoint": {**adjoint, "sections": _sections(adjoint["sections"], slice(None, -input_only or None))},
        "input_adjoint": {"sections": _sections(adjoint["sections"], slice(-input_only or None, None))}
        if input_only else None,
        "saved": [name for name in backward.saved if name != "chi"],
        "seed": backward.seed,
        "flags": BACKENDS[backend].adjoint_flags,
        "output": backward.forward.output,
        # the step's inputs besides the state (a decoder's memory): kept, and their gradients returned
        "inputs": [field.name for field in differentiated],
        "input_gradients": [backward.gradients[field.argument] for field in differentiated],
        "data": _data(backward.forward, forward["grouped"]),
        "gradient_u": backward.gradients["u"],
        "gradients": gradients,
    }
