"""The numeric routines of the generated PyTorch modules: the masked softmax and attention
(``scaled_dot_product_attention``), one-hot reads and writes of a grid, a local kernel, LayerNorm
and RMSNorm safe from overflow, parameters stored side by side (``_cat``), dropout, the torch masks
narrowing a support, and the first-order guard of a derived backward.

Inlined into each generated module that calls them (``codegen.runtime_source``), which then
imports only torch and the standard library. TorchScript compiles some of them: their annotations
are its types."""

import math
import numbers
import weakref

import torch

from .checks import _dropout_rate, _epsilon, _flag, _integer


def _allowed(support):
    """Where a support (bool, or a float log-weight with −inf outside) is nonzero; a NaN weight is inside, so that
    its NaN reaches the output as in torch's attention (``> −inf`` read it as outside: an all-NaN mask ran as if
    every key were excluded)."""
    return support if support.dtype == torch.bool else support != float("-inf")


def _softmax(scores, support: torch.Tensor | None, dropout_p: float = 0.0):
    """Row softmax over the last axis, weighted by ``support``; dropout on the kernel in training.

    ``support``: bool (True = kept) or a float log-weight added to the scores (−inf = outside).
    A row with empty support gets a zero kernel: the token integral over an empty set
    vanishes (never NaN), so that query's attention term is the output bias alone.
    """
    if support is None:
        return _dropout(torch.softmax(scores, dim=-1), dropout_p)
    allowed = _allowed(support)
    empty = ~allowed.any(dim=-1, keepdim=True)
    scores = scores.masked_fill(~allowed, float("-inf")) if support.dtype == torch.bool else scores + support
    return _dropout(torch.softmax(scores.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0), dropout_p)


def _causal(support: torch.Tensor | None) -> bool:
    """Whether ``support`` keeps exactly each query's own and earlier keys (over the last two axes): attention
    then takes flash attention's ``is_causal``, which skips the keys after each query. Known without a read where
    ``_support`` built it so (``_marked_causal``), on any device; otherwise read where a value may choose the path
    (``_values_choose``; ONNX has no grouped flash attention either); elsewhere the masked kernel."""
    if support is None or support.dtype != torch.bool or support.dim() < 2:
        return False
    n = support.shape[-1]
    if support.shape[-2] != n or n < 2:
        return False
    if torch.jit.is_scripting():
        return support.device.type == "cpu" and bool((support == torch.ones(n, n, dtype=torch.bool).tril()).all())
    if _marked_causal(support):
        return True
    return _values_choose(support) and _holds((support == torch.ones(n, n, dtype=torch.bool).tril()).all())


@torch.jit.unused
def _mark_causal(support: torch.Tensor) -> None:
    """Mark a support (…, n, n) that ``_support`` built from causality alone (each query keeps its own and earlier
    keys; one (n, n) matrix seen per batch entry): its storage records n. Not while a trace, torch.compile or an
    export records the call, nor for a tensor without storage (torch.func's wrapped tensors under ``grad`` or
    ``vmap``, fakes)."""
    if _recorded():
        return
    try:
        support.untyped_storage().splitformer_causal = support.shape[-1]
    except (RuntimeError, NotImplementedError):
        pass


@torch.jit.unused
def _marked_causal(support: torch.Tensor) -> bool:
    """Whether every (n, n) matrix of ``support`` over its last two axes is one that ``_mark_causal`` marked (a view of
    the support, ``chi[:, None]``, included): causal without reading a value, so a GPU's attention takes
    ``is_causal`` with no host synchronization. Not while a trace, torch.compile or an export records the call (a mark
    is no part of a graph), nor for tensors without storage (vmap's batched ones, fakes)."""
    if _recorded():
        return False
    try:
        n = getattr(support.untyped_storage(), "splitformer_causal", 0)
    except (RuntimeError, NotImplementedError):
        return False
    block = n * n
    return (n > 0 and list(support.shape[-2:]) == [n, n] and list(support.stride()[-2:]) == [n, 1]
            and support.storage_offset() % block == 0
            and all(size == 1 or stride % block == 0 for size, stride in zip(support.shape[:-2], support.stride()[:-2])))


@torch.jit.unused
def _values_choose(x) -> bool:
    """Whether a value computed from ``x`` may choose the path a call takes: not while a trace, torch.compile,
    torch.export or an ONNX export records the call (one graph for every input), nor off the CPU (reading the
    value would make the host wait for the device)."""
    return not (_recorded() or x.device.type != "cpu")


@torch.jit.unused
def _eps_as_set(eps: float) -> float:
    """A module's ``eps`` by its constructor's rule (``_epsilon``): a value assigned since it was built (a string,
    ``True``, which computed with ε = 1, −5) is refused in the constructor's words, before any work."""
    return _epsilon(eps)


@torch.jit.unused
def _block_as_set(block) -> float:
    """A Block's settings by its constructor's rules, where one was assigned since it was built (``batch_first = "no"``
    was read as True, ``n_heads = 2.0`` reached torch's view, ``eps = True`` computed with ε = 1), refused in the
    constructor's words before any work; the sizes its parameters were built with (``_as_built``) must stay. Returns
    ``eps``."""
    _integer("n_heads", block.n_heads, 1)
    if hasattr(block, "n_kv_heads"):
        _integer("n_kv_heads", block.n_kv_heads, 1)
    _flag("batch_first", block.batch_first)
    _dropout_rate(block.dropout)
    for name, built in block._as_built:
        value = getattr(block, name)
        integral = isinstance(value, numbers.Integral) and isinstance(value, bool) == isinstance(built, bool)
        if not integral or value != built:  # np.int64(512) is 512; 512.0, and 1 for True, are not
            raise ValueError(f"{name} = {value!r} set after construction: the Block's parameters were built with "
                             f"{name} = {built!r}; build a new Block")
    return _epsilon(block.eps)


@torch.jit.unused
def _recorded() -> bool:
    """Whether a trace, torch.compile or an export records the call (one graph for every input)."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling() or _exported()


@torch.jit.unused
def _exported() -> bool:
    """Whether torch.export records the call, ONNX's exporter too: it runs torch.export (its TorchScript exporter
    traces instead, ``torch.jit.is_tracing``). ``torch.onnx.is_in_onnx_export`` would say so at 30 times the cost
    (two imports a call), a decoding step's 2 %."""
    return torch.compiler.is_exporting()


def _shares(argument: torch.Tensor | None) -> bool:
    """Whether a stack's layers share what they compute from the default positions (``argument`` None): not while a
    trace, torch.compile or an export records the call, whose sizes may be symbolic (the shared key's text would fix
    them to the example's)."""
    return argument is None and (torch.jit.is_scripting() or not _recorded())


def _in_place() -> bool:
    """Whether a call may update its dead temporaries in place: no autograd, no trace or export recording it (the one
    graph they record runs with and without autograd), no autocast (a product's bfloat16 plus the float32 residual is
    float32 out of place, as autograd's path computes it; in place it stayed bfloat16, and a stack's next layer
    refused it)."""
    return (not torch.is_grad_enabled() and not torch.jit.is_tracing()
            and (torch.jit.is_scripting() or not (_exported() or _autocast())))


@torch.jit.unused
def _autocast() -> bool:
    """Whether autocast is on for the CPU or CUDA."""
    return torch.is_autocast_enabled("cpu") or torch.is_autocast_enabled("cuda")


@torch.jit.unused
def _derived_runs_here() -> None:
    """Refuse ``backward="derived"`` where its ``autograd.Function`` cannot run: under autocast (a ValueError: its
    adjoint reads the kept arrays in the parameters' dtype, where autocast computed them in others) and inside
    ``torch.func`` transforms (a RuntimeError: the Function sets up its context in ``forward``, which they cannot
    wrap; torch's own message names neither the option nor the way out), and while ``torch.jit.trace`` or
    ``torch.export`` records it (a ValueError, as a scripted module's: a trace failed its sanity check, an exported
    program's backward ran into an in-place edit)."""
    if torch.jit.is_tracing() or torch.compiler.is_exporting():
        raise ValueError("backward='derived' runs in Python (a torch.autograd.Function), which torch.jit.trace and "
                         "torch.export cannot record: trace or export a module built with backward='autograd' (the "
                         "same forward), or record it without autograd")
    if _autocast():
        raise ValueError("backward='derived' has no adjoint of autocast's mixed dtypes: use backward='autograd' "
                         "under torch.autocast")
    if torch._C._are_functorch_transforms_active():
        raise RuntimeError("backward='derived' does not run inside torch.func transforms (vmap, grad, jacrev, ...): "
                           "use backward='autograd' there, or call the forward alone under torch.no_grad()")


@torch.jit.unused
def _holds(condition: torch.Tensor) -> bool:
    """A one-element bool tensor's value, read on the host; False under torch.func.vmap (one call for every member:
    no value may choose its path)."""
    try:
        return bool(condition)
    except RuntimeError:
        return False


def _attention(q, k, v, scale: float, support: torch.Tensor | None, dropout_p: float = 0.0):
    """Σ_j softmax_j(scale Σ_e q k, support) v for (batch, tokens, heads, features) operands.

    ``support``: bool (True = kept) or a float log-weight added to the scores (−inf = outside).
    A row with empty support gets a zero kernel (the output bias alone, never NaN);
    ``dropout_p`` drops kernel entries in training.
    """
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if support is None or _causal(support):
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale,
                                                               is_causal=support is not None)
    else:
        empty = ~_allowed(support).any(dim=-1, keepdim=True)
        mask = support | empty if support.dtype == torch.bool else support.masked_fill(empty, 0.0)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)
        out = out.masked_fill(empty, 0.0)
    return out.transpose(1, 2)


def _kept_layer_norm(x, gain, bias, eps: float):
    """gain P + bias over the last axis, and what its derived adjoint reads: P = (x − mean x)/√(var x + eps), var x.
    The variance as the centred values' mean square (torch's ``var_mean`` over the last axis took 1.3 ms where this
    takes 0.12, at 1024 rows of 512, float32, 2 threads)."""
    centred = x - x.mean(dim=-1, keepdim=True)
    variance = torch.sum(centred * centred, dim=-1).div_(x.shape[-1])
    p = centred.mul_(torch.rsqrt(variance + eps).unsqueeze(-1))
    return torch.addcmul(bias, p, gain), p, variance


def _layer_norm_adjoint(costate, p, variance, gain, eps: float):
    """x̄ of ``gain P + bias``, ``P = (x − mean x)/√(variance + eps)`` over the last axis, for its ``costate``:
    (P̄ − mean P̄ − P mean(P̄ P))/√(variance + eps) with P̄ = gain · costate; and the gradients of gain and bias,
    Σ P costate and Σ costate over the other axes. torch's fused LayerNorm backward read at ``P`` (mean 0, 1/σ = 1)."""
    rows = p.shape[:-1]  # the bias's values are never read: its argument only shapes its gradient (gain's shape)
    x_bar, gain_bar, bias_bar = torch.ops.aten.native_layer_norm_backward(
        costate, p, [p.shape[-1]], p.new_zeros(rows), p.new_ones(rows), gain, gain, [True, True, True])
    return x_bar.mul_(torch.rsqrt(variance + eps).unsqueeze(-1)), gain_bar, bias_bar


def _flash_normalized(q, k, support: torch.Tensor | None, dropout_p: float) -> bool:
    """Whether flash attention's CPU kernel gives the rows' log normalizers: on CPU, without dropout, with no support
    or a causal one, with tokens and keys (it divides by zero on none: SIGFPE, the process dies)."""
    return ((support is None or _causal(support)) and not dropout_p and q.device.type == "cpu" and q.numel() > 0
            and k.numel() > 0)


def _attention_normalized(q, k, v, scale: float, support: torch.Tensor | None, dropout_p: float = 0.0):
    """``_attention`` and the log of each row's normalizer Σ_j exp(scale Σ_e q k), which ``_attention_adjoint``
    reads: flash attention's on CPU without dropout, with no support or a causal one (``_causal``), else None (the
    adjoint recomputes the kernel). No tokens or no keys take ``_attention`` too: the flash kernel divides by zero
    there (SIGFPE, the process dies)."""
    if not _flash_normalized(q, k, support, dropout_p):
        return _attention(q, k, v, scale, support, dropout_p), None
    out, log_total = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=support is not None, scale=scale)
    return out.transpose(1, 2), log_total


def _attention_adjoint(o_bar, q, k, v, o, log_total, scale: float, support: torch.Tensor | None):
    """(q̄, k̄, v̄) of the output o of ``_attention(q, k, v, scale, support)`` for the costate ``o_bar``, all (batch,
    tokens, heads, features): flash attention's backward where the forward kept ``log_total`` (causal where a support
    was given: ``_attention_normalized`` keeps it for a causal one only), else with the kernel γ recomputed:
    ā = γ ∘ (ō vᵀ − Σ_e ō o), q̄ = scale ā k, k̄ = scale āᵀ q, v̄ = γᵀ ō."""
    q, k, v, o, o_bar = (x.transpose(1, 2) for x in (q, k, v, o, o_bar))
    if log_total is not None:
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            o_bar, q, k, v, o, log_total, 0.0, support is not None, scale=scale)
    else:
        kernel = _softmax(torch.matmul(q, k.transpose(2, 3)).mul_(scale), support)
        scores_bar = torch.matmul(o_bar, v.transpose(2, 3)).sub_(torch.sum(o_bar * o, dim=3, keepdim=True)).mul_(kernel)
        grads = (torch.matmul(scores_bar, k).mul_(scale), torch.matmul(scores_bar.transpose(2, 3), q).mul_(scale),
                 torch.matmul(kernel.transpose(2, 3), o_bar))
    return tuple(grad.transpose(1, 2) for grad in grads)


def _grid_rows(index, size: int):
    """``index`` as row numbers; a value that is no grid point 0 … size − 1 (δ(v, index) = 0 for every v) → ``size``."""
    rows = index.long()
    return torch.where((rows == index) & (rows >= 0) & (rows < size), rows, size)


def _gather(table, index):
    """Σ_v table[…, v] δ(v, index): ``table`` (its last axis) read at ``index``, 0 where the index is no grid point;
    the table's other axes first."""
    padded = torch.cat((table, table.new_zeros(table.shape[:-1] + (1,))), -1)
    return padded[..., _grid_rows(index, table.shape[-1])]


def _scatter(values, index, size: int, kept: int):
    """out[v, r…] = Σ_s δ(v, index[s…]) values[r…, s…] for v < size (the first ``kept`` axes of ``values`` are r…):
    one ``scatter_add_`` into ``size + 1`` bins per row r (the last takes the indices that are no row)."""
    values, index = torch.broadcast_tensors(values, index)
    shape = values.shape[:kept]
    values = values.reshape(math.prod(shape), -1)
    rows = _grid_rows(index[(0,) * kept].reshape(1, -1), size).expand(values.shape[0], -1)
    out = values.new_zeros(values.shape[0], size + 1).scatter_add_(1, rows, values)
    return out[:, :size].T.reshape((size,) + tuple(shape))


def _window(values, pos_out, pos_in, low: float, high: float, support: torch.Tensor | None):
    """Σ_c 1[low < p_out[a] − p_in[c] < high] χ[a, c] values[c] for (batch, tokens, d) ``values``: a relative
    kernel of local support. The tokens sorted by position and each window's first one found by
    bisection: O(N m) reads for m tokens in a window (``support``: bool, None for χ = 1).
    """
    ranked, order = torch.sort(pos_in, dim=-1, stable=True)
    first = torch.searchsorted(ranked, pos_out - high, side="left")
    last = torch.searchsorted(ranked, pos_out - low, side="right")  # a superset: the bounds are checked below
    out = values.new_zeros(pos_out.shape[0], pos_out.shape[1], values.shape[2])
    width = int((last - first).max()) if first.numel() > 0 else 0
    for step in range(width):
        token = order.gather(1, (first + step).clamp_max(max(order.shape[1] - 1, 0)))
        distance = pos_out - pos_in.gather(1, token)
        weight = (first + step < last) & (distance > low) & (distance < high)
        if support is not None:
            weight = weight & support.gather(2, token[:, :, None])[:, :, 0]
        out = out + weight[:, :, None].to(values.dtype) * values.gather(1, token[:, :, None].expand(-1, -1, values.shape[2]))
    return out


def _grouped_attention(q, k, v, scale: float, support: torch.Tensor | None, dropout_p: float = 0.0):
    """``_attention`` of query head (g, s) against the keys and values of head g (grouped heads):
    q (batch, tokens, groups, members, features…), k (batch, keys, groups, features…), v (batch,
    keys, groups, value features), support (batch, tokens, keys) or None. The members of a group
    are further query rows of its head, so no key or value is repeated; the result is
    (batch, tokens, groups, members, value features).
    """
    batch, n_queries, groups, members = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    if _causal(support):  # flash attention over the groups' heads (query head g·members + s reads head g)
        heads = _group_heads(q)
        out = torch.nn.functional.scaled_dot_product_attention(
            heads, k.flatten(3).transpose(1, 2), v.transpose(1, 2), dropout_p=dropout_p, scale=scale, is_causal=True,
            enable_gqa=True)
        return out.transpose(1, 2).reshape(batch, n_queries, groups, members, out.shape[-1])
    rows = _member_rows(q, batch, n_queries, groups, members)
    out = _attention(rows, k.flatten(3), v, scale, _member_support(support, batch, members, n_queries), dropout_p)
    return out.reshape(batch, members, n_queries, groups, out.shape[-1]).permute(0, 2, 3, 1, 4)


def _group_heads(x):
    """A grouped query-side array (batch, tokens, groups, members, features…) as flash attention's operand over the
    groups' heads: (batch, groups·members, tokens, features), query head g·members + s reading key head g."""
    return x.flatten(4).flatten(2, 3).transpose(1, 2)


def _member_rows(x, batch: int, n_queries: int, groups: int, members: int):
    """A grouped query-side array (batch, tokens, groups, members, features…) as ``_attention``'s operand: the members
    of a group further query rows of its head, (batch, members·tokens, groups, features)."""
    rows = x.flatten(4).permute(0, 3, 1, 2, 4)  # sizes, not -1: empty inputs have no -1
    return rows.reshape(batch, members * n_queries, groups, rows.shape[-1])


def _full_support(u0: torch.Tensor, dtype: torch.dtype = torch.bool) -> torch.Tensor:
    """χ ≡ 1 over the tokens of a state (batch, n_tokens, d): the indicator a formula reads as a factor (a view), bool or
    of ``dtype``."""
    return torch.ones((), dtype=dtype, device=u0.device).expand(u0.shape[0], u0.shape[1], u0.shape[1])


def _member_support(support: torch.Tensor | None, batch: int, members: int, n_queries: int):
    """A support (batch, tokens, keys) for ``_member_rows``: (batch, 1, members·tokens, keys), or None."""
    if support is None:
        return None
    if members == 1:
        return support[:, None]
    if (torch.jit.is_scripting() or not _recorded()) and n_queries == 1:  # a decoding step: its row for each member
        return support.expand(batch, members, support.shape[-1])[:, None]
    # the members' copies side by side (torch.export cannot prove the guards of reshaping an expanded view)
    return torch.cat([support] * members, dim=1)[:, None]


def _grouped_attention_normalized(q, k, v, scale: float, support: torch.Tensor | None, dropout_p: float = 0.0):
    """``_grouped_attention`` and the log of each row's normalizer, which ``_grouped_attention_adjoint`` reads: flash
    attention's over the groups' heads (``_group_heads``) where its kernel gives them (``_flash_normalized``), else None."""
    if not _flash_normalized(q, k, support, dropout_p):
        return _grouped_attention(q, k, v, scale, support, dropout_p), None
    batch, n_queries, groups, members = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    out, log_total = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        _group_heads(q), k.flatten(3).transpose(1, 2), v.transpose(1, 2), is_causal=support is not None, scale=scale)
    return out.transpose(1, 2).reshape(batch, n_queries, groups, members, out.shape[-1]), log_total


def _grouped_attention_adjoint(o_bar, q, k, v, o, log_total, scale: float, support: torch.Tensor | None):
    """(q̄, k̄, v̄) of ``o = _grouped_attention(q, k, v, scale, support)`` for the costate ``o_bar``, each shaped as its
    array: flash attention's backward over the groups' heads where the forward kept ``log_total``, else
    ``_attention_adjoint`` of the members as further query rows of their group's head (k̄, v̄ summed over them)."""
    batch, n_queries, groups, members = q.shape[0], q.shape[1], q.shape[2], q.shape[3]
    if log_total is not None:
        heads = [_group_heads(x) for x in (o_bar, q, o)]
        q_bar, k_bar, v_bar = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            heads[0], heads[1], k.flatten(3).transpose(1, 2), v.transpose(1, 2), heads[2], log_total, 0.0,
            support is not None, scale=scale)
        return (q_bar.transpose(1, 2).reshape(q.shape), k_bar.transpose(1, 2).reshape(k.shape),
                v_bar.transpose(1, 2))
    rows = [_member_rows(x, batch, n_queries, groups, members) for x in (o_bar, q, o)]
    q_bar, k_bar, v_bar = _attention_adjoint(rows[0], rows[1], k.flatten(3), v, rows[2], None, scale,
                                             _member_support(support, batch, members, n_queries))
    q_bar = q_bar.reshape(batch, members, n_queries, groups, q_bar.shape[-1]).permute(0, 2, 3, 1, 4)
    return q_bar.reshape(q.shape), k_bar.reshape(k.shape), v_bar


def _max_exponent(dtype: torch.dtype) -> int:
    """The largest e with 2^e finite in ``dtype`` (a table: TorchScript has no ``torch.finfo``)."""
    if dtype == torch.float64:
        return 1023
    if dtype == torch.float16:
        return 15
    return 127  # float32, bfloat16


def _row_scale(x):
    """Per row, a power of two s ≥ max|x| (at least 1): x/s is exact and its squares cannot overflow."""
    with torch.no_grad():
        peak = x.abs().amax(dim=-1, keepdim=True)
        if not torch.jit.is_scripting():
            # ONNX has no frexp, and torch.compile's C++ kernels of its clamped float64 exponent fail to build (torch
            # 2.13's inductor, under autograd): the exponent is ⌊log₂ peak⌋ + 1 (where log₂ rounds across a power of
            # two, s is the neighbouring power: x/s is as exact)
            if _onnx_exporting() or torch.compiler.is_compiling():
                return torch.pow(2.0, (torch.floor(torch.log2(peak)) + 1).clamp(0, _max_exponent(x.dtype)))
        exponent = torch.frexp(peak).exponent.clamp(0, _max_exponent(x.dtype))
        return torch.ldexp(torch.ones_like(peak), exponent)


@torch.jit.unused
def _onnx_exporting() -> bool:
    """Whether ``torch.onnx.export`` (either path) is running."""
    return torch.onnx.is_in_onnx_export()


def _root(mean_square, eps: float, scale):
    """√(mean square + eps/s²), 1 where it is 0 (a constant row, whose centred values are 0)."""
    root = torch.sqrt(mean_square + eps / scale / scale)
    return torch.where(root == 0, torch.ones_like(root), root)


def _layer_norm(x, gain, bias, eps: float):
    """gain (x − mean)/√(var + eps) + bias over the last axis.

    torch's fused LayerNorm where its statistics are representable (``_fused_layer_norm``),
    else, and in TorchScript, ``_scaled_layer_norm``: the same map, overflow-safe.
    """
    if torch.jit.is_scripting():
        return _scaled_layer_norm(x, gain, bias, eps)
    return _fused_layer_norm(x, gain, bias, eps)


@torch.jit.unused
def _fused_layer_norm(x, gain, bias, eps: float):
    """torch's one-pass LayerNorm, kept where ``_representable``; otherwise ``_scaled_layer_norm``. Where no value may
    choose the path (``_values_choose``): off the CPU, the fused LayerNorm of ``_prescaled`` rows; while a trace,
    torch.compile or an export records the call, and where no prescaling keeps every row's result,
    ``_scaled_layer_norm``."""
    if not _values_choose(x):
        y = None if _recorded() else _prescaled(x, eps)
        if y is None:
            return _scaled_layer_norm(x, gain, bias, eps)
        return torch.native_layer_norm(y, [x.shape[-1]], gain, bias, eps)[0]
    out, _, rstd = torch.native_layer_norm(x, [x.shape[-1]], gain, bias, eps)
    return out if _representable(rstd) else _scaled_layer_norm(x, gain, bias, eps)


#: Per dtype of ``_prescaled``: the integer type of its width, its significand's stored bits, its exponent's bias.
_FLOAT_BITS = {torch.float64: (torch.int64, 52, 1023), torch.float32: (torch.int32, 23, 127),
               torch.bfloat16: (torch.int16, 7, 127), torch.float16: (torch.int16, 10, 15)}


@torch.jit.unused
def _prescaled(x, eps: float) -> torch.Tensor | None:
    """The rows of ``x`` divided by powers of two s that torch's fused LayerNorm and RMSNorm, and their derivatives, take
    without overflow or underflow and that change no row's result past rounding, read from no value: the fused norms'
    path where none may choose it, off the CPU (an overflow check would make the host wait for the device); None where
    there are none.

    s is 1 for every row below 2^E and brings a larger row exactly into [2^(E−1), 2^E) (s built from its bits), which
    stands eps·s² for eps. A row that is not constant then has variance at least 2^(2E−3−2p)/N (its values differ by one
    unit in the p-bit significand of 2^(E−1) or more), so eps's share of it, and of its mean square, is at most 2^−p,
    and the norm's change from it at most 2^(−p−1), when 2E ≥ 3p + 3 + log₂(eps·N): E is the least such exponent (at
    least 1). It must also keep the statistic's sum of N squares below the accumulation type's largest value
    (2E + 3 + log₂ N ≤ 128 for float32, bfloat16 and float16, 1024 for float64) and 1/√(statistic + eps) cubed, which the
    kernels' derivatives take, above its smallest normal one (3E ≤ 125, 1021): else, or where eps is 0 (a constant
    row's 0/0) or below that normal range, None, and the caller takes the scaled path; so it does under forward-mode
    derivatives (``torch.func.jvp``, ``forward_ad``), whose kernel formulas multiply the tangent, scaled by 2^−k too,
    by that cube (an underflow past 1e30 in float32). float32 at 512 features and eps 1e-5: E = 34. A reduction, four
    small operations over the rows and one over x, where the scaled path takes some twenty; but without the scaled
    path's first-value shift, a row far from zero whose values differ in their last bits gets what the kernel gives it
    (its float mean does not resolve them), as the CPU path does below the kernel's overflow."""
    if x.dtype not in _FLOAT_BITS or torch.autograd.forward_ad.unpack_dual(x).tangent is not None:
        return None
    if x.numel() == 0:  # no row to scale (and no largest value of an empty one)
        return x
    integer, stored, bias = _FLOAT_BITS[x.dtype]
    accumulated = torch.finfo(torch.float64 if x.dtype == torch.float64 else torch.float32)
    count = max(1, x.shape[-1])
    if not eps >= accumulated.tiny:
        return None
    exponent = max(1, math.ceil((3 * (stored + 1) + 3 + math.log2(eps * count)) / 2))
    largest, smallest = math.log2(accumulated.max), -math.log2(accumulated.tiny)
    if 2 * exponent + 3 + math.log2(count) > largest or 3 * exponent > smallest - 1:
        return None
    with torch.no_grad():
        peak = torch.linalg.vector_norm(x, float("inf"), dim=-1, keepdim=True)
        # 2^−k, k = max(0, e − E) with 2^(e−1) ≤ peak < 2^e, from its biased exponent's bits (out of place: vmap)
        biased = torch.clamp((bias + exponent) - torch.frexp(peak).exponent, 1, bias).to(integer)
        factor = torch.bitwise_left_shift(biased, stored).view(x.dtype)
    return x * factor


@torch.jit.unused
def _representable(rstd) -> bool:
    """Whether every row's 1/√(statistic + eps) is positive with a finite square: then no statistic overflowed (an
    infinite one gives 0), none is NaN, and none is lost below the dtype's normal range. One reduction (the rows'
    extremes), read on the host: False under torch.func.vmap, as ``_holds``."""
    if rstd.numel() == 0:
        return True
    try:  # one row (a decoding step's): its value, one read and no reduction
        low, high = ((rstd.item(),) * 2 if rstd.numel() == 1 else
                     (bound.item() for bound in torch.aminmax(rstd.detach())))
    except RuntimeError:
        return False
    return low > 0 and high * high <= torch.finfo(rstd.dtype).max


def _scaled_layer_norm(x, gain, bias, eps: float):
    """gain (x − mean)/√(var + eps) + bias over the last axis, for every representable row.

    The statistics are those of x/s (``_row_scale``), with eps/s² in place of eps, so every
    row whose LayerNorm is representable gets it, up to the dtype's largest values; the
    row's first value is subtracted before the mean (shifted data; it cancels, so it
    carries no gradient), so rows far from zero keep their deviations.
    """
    scale = _row_scale(x)
    y = x / scale
    y = y - y[..., :1].detach()
    centred = y - y.mean(dim=-1, keepdim=True)
    return centred / _root((centred * centred).mean(dim=-1, keepdim=True), eps, scale) * gain + bias


def _cat(tensors: list[torch.Tensor], dim: int):
    """``torch.cat(tensors, dim)``, read without a copy where the parts lie side by side in one
    storage (a block's query, key and value kernels: ``_side_by_side``); every edit of a part
    (an optimizer step, ``.data.mul_``, a NumPy view) is then in the result, as nothing is kept.
    Under autograd, tracing or compiling: ``torch.cat`` (the graph must reach each part)."""
    if torch.jit.is_scripting():
        return torch.cat(tensors, dim)
    joined = _joined_view(tensors, dim)
    return torch.cat(tensors, dim) if joined is None else joined


@torch.jit.unused
def _joined_view(tensors: list[torch.Tensor], dim: int) -> torch.Tensor | None:
    """The view of one storage equal to ``torch.cat(tensors, dim)``, or None where there is none.

    Parts of equal strides and equal shapes but along ``dim``, each starting where the one before
    ends (``shape[dim] · stride[dim]`` further), are the consecutive blocks of one strided tensor:
    that tensor is their concatenation (Q, K and V kernels of unequal widths under grouped heads too).
    """
    if ((torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or torch.jit.is_tracing()
            or torch.compiler.is_compiling()):
        return None
    first = tensors[0]
    try:
        layout = (dim, torch.is_inference_mode_enabled(),
                  tuple((t.device, t.data_ptr(), t.dtype, t.shape, t.stride()) for t in tensors))
        known = _JOINED.pop(id(first), None)  # a view of where the parts no longer lie is not kept
        if known is not None and known[0]() is first and known[1] == layout:
            _JOINED[id(first)] = known
            return known[2]
        storage, offset = first.untyped_storage().data_ptr(), first.storage_offset()
        if storage == 0:
            return None
        for t in tensors:
            if (t.untyped_storage().data_ptr() != storage or t.dim() != first.dim() or t.stride() != first.stride()
                    or t.dtype != first.dtype or t.storage_offset() != offset
                    or any(size != first.shape[axis] for axis, size in enumerate(t.shape) if axis != dim)):
                return None
            offset += t.shape[dim] * t.stride(dim)
    except (RuntimeError, NotImplementedError):  # no storage (torch.func transforms, meta tensors)
        return None
    shape = list(first.shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    joined = first.detach().as_strided(shape, first.stride(), first.storage_offset())
    key = id(first)
    _JOINED[key] = (weakref.ref(first, lambda _, joined=_JOINED: joined.pop(key, None)), layout, joined)
    return joined


#: The last view ``_joined_view`` built of each first part, by its id: (a weak reference to that part, the axis, mode
#: and where and how the parts lay, the view). A call along that axis whose parts lie where they lay, in the same
#: inference mode, reads the view again (its storage is theirs, so it holds every edit); any other call drops it (no
#: storage is held after the parts moved: ``.to()``), and the entry goes with its first part.
_JOINED: dict[int, tuple[weakref.ref, tuple, torch.Tensor]] = {}


def _side_by_side(module, groups) -> None:
    """Store each group of ``module``'s parameters (names, axis) in one tensor, each name a view
    of it, so that ``_cat`` reads them without a copy; a group already side by side stays."""
    with torch.no_grad():
        for names, dim in groups:
            parts = [getattr(module.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]) for name in names]
            if _joined_view(parts, dim) is not None:
                continue
            whole, start = torch.cat([part.detach() for part in parts], dim), 0
            for part in parts:
                part.data, start = whole.narrow(dim, start, part.shape[dim]), start + part.shape[dim]


def _rms_norm(x, gain, eps: float):
    """gain x/√(mean x² + eps) over the last axis.

    torch's fused RMSNorm where its statistic is representable (``_fused_rms_norm``), else, and in
    TorchScript, ``_scaled_rms_norm``: the same map, overflow-safe.
    """
    if torch.jit.is_scripting():
        return _scaled_rms_norm(x, gain, eps)
    return _fused_rms_norm(x, gain, eps)


@torch.jit.unused
def _fused_rms_norm(x, gain, eps: float):
    """torch's one-pass RMSNorm, kept where ``_representable``; otherwise ``_scaled_rms_norm``. Where no value may
    choose the path (``_values_choose``), as ``_fused_layer_norm``: off the CPU the fused RMSNorm of ``_prescaled``
    rows, else ``_scaled_rms_norm``."""
    if not _values_choose(x):
        y = None if _recorded() else _prescaled(x, eps)
        if y is None:
            return _scaled_rms_norm(x, gain, eps)
        return torch.ops.aten._fused_rms_norm(y, [x.shape[-1]], gain, eps)[0]
    out, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], gain, eps)
    return out if _representable(rstd) else _scaled_rms_norm(x, gain, eps)


def _scaled_rms_norm(x, gain, eps: float):
    """gain x/√(mean x² + eps) over the last axis, with the statistics of x/s (``_row_scale``)."""
    scale = _row_scale(x)
    y = x / scale
    return y / _root((y * y).mean(dim=-1, keepdim=True), eps, scale) * gain


def _dropout(x, p: float):
    """torch's dropout (kept entries scaled by 1/(1 − p)) when ``p`` > 0, else ``x`` itself."""
    return torch.nn.functional.dropout(x, p) if p > 0.0 else x


def _restrict(support, mask):
    """``support`` narrowed by a torch mask: bool True excludes; a float mask adds to the log-weight."""
    if support.dtype == torch.bool:
        return support & ~mask
    if mask.dtype == torch.bool:
        return support.masked_fill(mask, float("-inf"))
    return support + mask.to(support.dtype)


def _check_mask(name: str, mask, shapes: list[list[int]]):
    """A ValueError naming ``name`` unless ``mask`` is bool or float of one of ``shapes``."""
    known = False
    for shape in shapes:
        known = known or list(mask.shape) == shape
    if not (mask.dtype == torch.bool or mask.is_floating_point()) or not known:
        expected = " or ".join([str(shape) for shape in shapes])
        batch = shapes[-1][0]
        per_head = ""
        if len(shapes[-1]) == 3 and mask.dim() == 3 and batch > 0 and mask.shape[0] > batch \
            and mask.shape[0] % batch == 0:
            per_head = ("; torch's per-head 3-D masks (batch·heads, tokens, keys) are not taken: give one mask per "
                        "batch entry, the same for every head")
        raise ValueError(f"{name} must be bool or float of shape {expected}, got {mask.dtype} {list(mask.shape)}"
                         + per_head)


def _first_order_only():
    """Refuse a derived backward asked to build a graph (``create_graph=True``): its gradients are
    computed outside autograd, so their own derivatives (gradient penalties, Hessian-vector
    products) would be silently wrong."""
    if torch.is_grad_enabled():
        raise RuntimeError("backward='derived' computes first-order gradients only; use backward='autograd' "
                           "for create_graph=True (gradient penalties; second derivatives through attention need a "
                           "device whose attention kernel has one: torch's CPU flash attention has none)")


def _mask_on(name: str, mask, device: torch.device) -> torch.Tensor:
    """``mask`` as a tensor on ``device``; a ValueError naming it where it is on the meta device and ``device`` is not
    (a meta tensor holds no values to read: torch's own error names no argument)."""
    if not isinstance(mask, torch.Tensor):
        mask = _mask_tensor(name, mask)
    if mask.device.type == "meta" and device.type != "meta":
        raise ValueError(f"{name} is on the meta device (it holds no values), u on {device.type}")
    return torch.as_tensor(mask, device=device)


@torch.jit.unused
def _mask_tensor(name: str, mask) -> torch.Tensor:
    """``mask`` given as an array or nested lists, as a tensor; the TypeError naming ``name`` where it holds no
    numbers (a string, an object array: torch's own error names no argument)."""
    try:
        return torch.as_tensor(mask)
    except (TypeError, ValueError, RuntimeError):
        dtype = getattr(mask, "dtype", None)
        got = type(mask).__name__ if dtype is None else f"{type(mask).__name__} of {dtype}"
        raise TypeError(f"{name} must be a bool or float tensor or array, got {got}") from None


def _loads_finite(name: str, value: torch.Tensor, dtype: torch.dtype) -> None:
    """A ValueError naming parameter ``name`` where a finite entry of ``value`` lies beyond ``dtype``'s range: the copy
    into the module would hold inf (a float64 1e6 loaded into float16), where a NumPy module refuses any rounding."""
    if value.is_meta or not dtype.is_floating_point:
        return
    finite = torch.isfinite(value)
    if bool((finite & ~torch.isfinite(value.to(dtype))).any()):
        largest = float(value[finite].abs().max())
        raise ValueError(f"parameter {name!r} holds {largest:.6g}, beyond {dtype}'s range "
                         f"(±{torch.finfo(dtype).max:.6g}): it would load as inf")


def _floating(dtype):
    """``dtype`` when it is None or a floating torch dtype torch computes in (parameters must be able to require grad;
    the float8 types hold weights but have no products)."""
    if dtype is not None and dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float16, torch.bfloat16, torch.float32, torch.float64 or None, got {dtype}")
    return dtype


def _one_sequence(key_padding_mask, batch: int, device: torch.device, name: str = "key_padding_mask") -> torch.Tensor:
    """The padding mask ``name`` as a tensor on ``device``, one sequence's (keys,) mask as (1, keys), as torch's layers
    take it."""
    mask = _mask_on(name, key_padding_mask, device)
    return mask[None] if batch == 1 and mask.dim() == 1 else mask


def _as_tensor(name, value):
    """``value`` (an array, a tensor, numbers) as a tensor, or the ValueError naming parameter ``name``; a NumPy array
    of the other byte order (``>f8``, which ``torch.as_tensor`` refuses) is read in this machine's first."""
    dtype = getattr(value, "dtype", None)
    if getattr(dtype, "isnative", True) is False:
        value = value.astype(dtype.newbyteorder("="))
    try:
        return torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(f"parameter {name!r} is not a numeric array") from None
