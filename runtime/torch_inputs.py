"""The declared inputs of a generated PyTorch block besides the state: the memory an operator reads and
its support, token positions, grid coordinates, and the cache of cached decoding (each key-side field of
the tokens so far, the fields of the memory kept once per memory, and the refusal of new positions a kernel
without χ would read). Inlined where used (``codegen.runtime_source``)."""

import threading
import weakref

import torch

from .torch_helpers import _check_mask, _in_place, _mask_on, _one_sequence, _recorded, _restrict, _shares


def _memory(memory: torch.Tensor, batch: int, d: int, like: torch.Tensor) -> torch.Tensor:
    """The memory M[b, t, k] an operator reads (its declared input), held fixed over the step."""
    given = memory
    memory = memory[None] if memory.dim() == 2 else memory  # (memory tokens, d): one sequence's
    if memory.dim() != 3 or memory.shape[0] != batch or memory.shape[2] != d or memory.dtype != like.dtype:
        raise ValueError(f"memory must be {like.dtype} of shape (batch={batch}, memory tokens, d={d})"
                         f"{', or (memory tokens, d) for one sequence' if batch == 1 else ''}, got "
                         f"{given.dtype} {list(given.shape)}")
    if memory.device != like.device:
        raise ValueError(f"memory is on {memory.device}, u on {like.device}")
    return memory


def _memory_support(memory_key_padding_mask: torch.Tensor | None, batch: int, n_tokens: int, n_memory: int,
                    device: torch.device) -> torch.Tensor | None:
    """The indicator χ_m[b, i, t] of the integral over memory tokens, or None when it is 1 everywhere."""
    if memory_key_padding_mask is None:
        return None
    mask = _one_sequence(memory_key_padding_mask, batch, device, "memory_key_padding_mask")
    if mask.dtype != torch.bool or list(mask.shape) != [batch, n_memory]:
        raise ValueError(f"memory_key_padding_mask must be bool of shape {[batch, n_memory]}"
                         f"{' or [' + str(n_memory) + '] for one sequence' if batch == 1 else ''}, got "
                         f"{mask.dtype} {list(mask.shape)}")
    return (~mask[:, None, :]).expand(batch, n_tokens, n_memory)


def _positions_dtype(like: torch.Tensor) -> None:
    """A ValueError when ``like`` (the state, or an empty tensor of the block's dtype) is narrower than float32 in a
    block that reads positions: they, and what the block computes from them (rotary angles p θ^(−2r/d)), are in its
    dtype here, which rounds them (bfloat16 holds the integers exactly up to 256 only, float16 up to 2048 and no
    position past 65504); transformers computes its rotary angles in float32 instead."""
    if like.is_floating_point() and like.element_size() < 4:
        raise ValueError(f"a block that reads token positions runs in float32 or wider, got {like.dtype}: the "
                         "positions and the angles computed from them would be rounded to it")


def _positions(positions: torch.Tensor | None, batch: int, n_tokens: int, offset: int,
               like: torch.Tensor) -> torch.Tensor:
    """Token positions p[b, i]: ``offset … offset + n_tokens − 1`` unless given ((tokens,), (1, tokens), as
    transformers' ``position_ids``, or (batch, tokens); checked finite unless a trace, torch.compile or an export
    records the call), in the dtype of ``like`` (float32 or wider: ``_positions_dtype``)."""
    _positions_dtype(like)
    if positions is None:
        return torch.arange(offset, offset + n_tokens, dtype=like.dtype, device=like.device).expand(batch, n_tokens)
    positions = torch.as_tensor(positions, device=like.device)
    shape = list(positions.shape)
    if positions.dtype == torch.bool or positions.is_complex() or (
            shape != [n_tokens] and shape != [1, n_tokens] and shape != [batch, n_tokens]):
        raise ValueError(f"positions must be real numbers of shape {[n_tokens]}, {[1, n_tokens]} or "
                         f"{[batch, n_tokens]}, got {positions.dtype} {shape}")
    # a meta tensor has no values to check; a recorded graph runs on any positions (NaN reaches the result, as in u)
    if positions.is_floating_point() and not positions.is_meta and (torch.jit.is_scripting() or not _recorded()):
        outside = positions[~torch.isfinite(positions)]
        if outside.numel() > 0:
            raise ValueError(f"positions must be finite, got {outside[0].item()}")
    return positions.to(like.dtype).expand(batch, n_tokens)


def _shared_positions(shared: dict[str, list[torch.Tensor]] | None, positions: torch.Tensor | None, batch: int,
                      n_tokens: int, offset: int, like: torch.Tensor) -> torch.Tensor:
    """``_positions``; the default ones computed once per stack call and read from ``shared`` by its later layers
    (every layer of one call steps the same tokens: a decoding step's four layers make one arange and expand, not
    four; torch's profiler put an arange at about 9 µs on a loaded two-core machine)."""
    if shared is None or not _shares(positions):
        return _positions(positions, batch, n_tokens, offset, like)
    key = f"positions {offset} {batch} {n_tokens} {like.dtype} {like.device}"  # a dict reused by other calls too
    if key not in shared:
        shared[key] = [_positions(positions, batch, n_tokens, offset, like)]
    return shared[key][0]


def _grid(size: int, like: torch.Tensor) -> torch.Tensor:
    """The grid coordinates 0, 1, …, size − 1 in the dtype and device of ``like``."""
    return torch.arange(size, dtype=like.dtype, device=like.device)


def _cache(cache: dict[str, torch.Tensor] | None, key: str, new: torch.Tensor) -> torch.Tensor:
    """The key-side field of every token so far: the cached values, then ``new`` (stored back, ``_extended``; the
    first store is a copy, since ``new`` may view the caller's arguments, which the caller may refill in place)."""
    if cache is None:
        return new
    if key not in cache:
        cache[key] = new.clone()
        return new
    old = cache[key]
    if old.shape[0] != new.shape[0] or old.shape[2:] != new.shape[2:] or old.dtype != new.dtype:
        raise ValueError(f"cache['{key}'] holds {old.dtype} {list(old.shape)}, incompatible with "
                         f"{new.dtype} {list(new.shape)}")
    cache[key] = _extended(old, new)
    return cache[key]


def _extended(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``old`` then ``new`` along the tokens (axis 1). A call that nothing records (no autograd, trace, export or
    compilation) writes ``new`` into spare tokens (``_spare_extended``), so a decoding step copies its own keys and
    values only; ``torch.cat`` copies the whole cache at every step, quadratic in the length of a generation."""
    if torch.jit.is_scripting() or not _in_place() or torch.compiler.is_compiling():
        return torch.cat((old, new), dim=1)
    return _spare_extended(old, new)


@torch.jit.unused
def _spare_extended(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """``old`` then ``new`` along the tokens, a view of a buffer with zeroed spare tokens after them. Written in place
    when this function allocated the buffer ``old`` begins and no other cache has written past ``old`` since (its
    storage records the tokens written: copies of one cache and a cache cut back to fewer tokens never write over
    each other; a step moves the record past its tokens, under the record's lock, before it writes them, so threads
    never write the same tokens); else a new buffer of the tokens and half as many again (at least 16 spare), or of
    the tokens alone where ``old`` is not such a buffer (a first store; a cache rebuilt at every step gets no slack).
    The writes bypass the version counter of ``old``'s views (``.data``): they reach tokens no view has shown. Tensors
    without storage (vmap's batched steps, fakes) and steps with forward-mode tangents (which ``.data`` would drop)
    are concatenated; a buffer allocated under ``torch.inference_mode`` is written under it only (torch refuses the
    update elsewhere)."""
    size, tokens = list(old.shape), old.shape[1] + new.shape[1]
    try:
        storage, _ = old.untyped_storage(), new.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return torch.cat((old, new), dim=1)
    if torch.autograd.forward_ad.unpack_dual(new).tangent is not None or \
            torch.autograd.forward_ad.unpack_dual(old).tangent is not None:
        return torch.cat((old, new), dim=1)
    record = getattr(storage, "splitformer_spare", None)  # [lock, tokens written, capacity, strides]
    writes = False
    if record is not None and old.storage_offset() == 0 and record[3] == old.stride() and tokens <= record[2] \
            and (torch.is_inference_mode_enabled() or not old.is_inference()):
        with record[0]:
            writes = record[1] == old.shape[1]
            if writes:
                record[1] = tokens
    if writes:
        grown = old.as_strided([size[0], tokens] + size[2:], old.stride())
    else:
        capacity = tokens if record is None else tokens + max(16, tokens // 2)
        buffer = old.new_empty([size[0], capacity] + size[2:])
        buffer[:, tokens:].zero_()
        grown = buffer[:, :tokens]
        grown[:, :old.shape[1]].copy_(old)
        grown.untyped_storage().splitformer_spare = [threading.Lock(), tokens, capacity, grown.stride()]
    grown.data[:, old.shape[1]:].copy_(new)
    return grown


def _log_weights(mask: torch.Tensor | None, batch: int, n_keys: int, device: torch.device) -> torch.Tensor:
    """A key padding mask as log-weights (float64): a bool mask's True is −inf, a float mask is one; None: zeros."""
    weights = torch.zeros(batch, n_keys, dtype=torch.float64, device=device)
    if mask is None:
        return weights
    mask = mask.to(device)
    return weights.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else mask.to(torch.float64)


def _cached_padding(cache: dict[str, torch.Tensor] | None, key_padding_mask: torch.Tensor | None, batch: int,
                    n_keys: int, device: torch.device) -> None:
    """Record in ``cache["key_padding_mask"]`` the key padding of every token so far (``key_padding_mask``, checked;
    None: none padded, one False on the host seen as (batch, tokens), so that decoding without padding reads neither
    the device nor a record as long as the tokens). A ValueError when it marks the cached tokens otherwise than the
    calls that cached them: their keys and values hold that padding, so no full pass would equal the result. A cache
    without the record (one rebuilt from transformers' ``Cache``) is taken as it is."""
    if cache is None:
        return
    mask = None if key_padding_mask is None else torch.as_tensor(key_padding_mask, device=device)
    if "key_padding_mask" in cache:
        old = cache["key_padding_mask"]
        cached = old.shape[1]
        if mask is None and old.dtype == torch.bool:  # a step without padding: one read of the record
            if old.numel() > 0 and old.stride(0) == 0 and old.stride(1) == 0:
                # every entry is one (the record of calls without a mask): read it, no reduction; the new record
                # is that entry seen as every key (a new tensor per layer cost a decoding step more than the read)
                entry = old.as_strided([], [])
                agrees = not bool(entry.item())
                if agrees:
                    cache["key_padding_mask"] = entry.expand(batch, n_keys)
                    return
            else:
                agrees = not bool(old.any())
        else:
            agrees = torch.equal(_log_weights(old, batch, cached, device),
                                 _log_weights(mask, batch, n_keys, device)[:, :cached])
        if not agrees:
            raise ValueError("key_padding_mask marks the cached tokens otherwise than the calls that cached them (their "
                             "keys and values hold that padding): give them the padding they were cached with")
    cache["key_padding_mask"] = (torch.zeros((), dtype=torch.bool, device="cpu").expand(batch, n_keys)
                                 if mask is None else mask.detach().clone())


def _cached_options(cache: dict[str, torch.Tensor] | None, names: list[str], values: list[float]) -> None:
    """Record in ``cache["options"]`` the options the cached keys and values were computed with (``names``:
    ``values``, float64, on the host: checking them reads no device). A ValueError naming those a later call changes
    (a Block's ``eps`` or ``rope_theta`` set between two calls): the cached tokens hold the old ones, so no full pass
    with either would equal the result."""
    if cache is None:
        return
    if "options" not in cache:
        cache["options"] = torch.tensor(values, dtype=torch.float64, device="cpu")
        return
    old = cache["options"]
    if old.dim() != 1 or old.shape[0] != len(values):
        raise ValueError(f"cache['options'] holds {old.shape[0]} options, the block's are {', '.join(names)}")
    cached: list[float] = old.tolist()  # one read of the record, not one per option (a decoding step's overhead)
    changed: list[str] = []
    for index in range(len(names)):
        if cached[index] != float(values[index]):
            changed.append(f"{names[index]}={float(values[index])} (cached with {cached[index]})")
    if len(changed) > 0:
        raise ValueError(", ".join(changed) + ": the cached tokens' keys and values were computed with the "
                         "options of the calls that cached them; give every call of one cache the same options")


def _same_tensor(old: torch.Tensor, new: torch.Tensor) -> bool:
    """Whether ``old`` and ``new`` have one shape, dtype, device and values: known without reading a value where both
    are empty or, off the CPU, where ``old`` is ``_kept``'s copy of the very tensor ``new`` and ``new`` has not changed
    since (its version; a read there would be a synchronization); compared otherwise (on the CPU always: writes that
    bypass the version counter, through ``.numpy()`` or ``.data``, are seen)."""
    if not (old.shape == new.shape and old.dtype == new.dtype and old.device == new.device):
        return False
    if new.numel() == 0:
        return True
    if new.device.type != "cpu" and not torch.jit.is_scripting() and _unchanged_source(old, new):
        return True
    return torch.equal(old, new)


def _kept(tensor: torch.Tensor) -> torch.Tensor:
    """A copy of ``tensor`` for a cache's record of what it was computed from (the caller may refill its tensor in
    place: the copy keeps the values), remembering off the CPU and outside TorchScript which tensor it copies and that
    tensor's version (``_unchanged_source``)."""
    copy = tensor.detach().clone()
    if tensor.device.type != "cpu" and not torch.jit.is_scripting():
        _remember_source(copy, tensor)
    return copy


@torch.jit.unused
def _remember_source(copy: torch.Tensor, source: torch.Tensor) -> None:
    """Record on ``copy``'s storage weak references to ``copy`` itself (its storage's other views are not it) and to
    ``source``, with both versions. An inference tensor keeps no version (its values are compared instead); nor does a
    tensor without storage."""
    try:
        copy.untyped_storage().splitformer_source = (weakref.ref(source), source._version, weakref.ref(copy),
                                                     copy._version)
    except (RuntimeError, NotImplementedError, TypeError):
        pass


@torch.jit.unused
def _unchanged_source(copy: torch.Tensor, tensor: torch.Tensor) -> bool:
    """Whether ``copy`` is ``_kept``'s copy of ``tensor`` itself, neither changed by an in-place operation since (every
    one raises a version, under ``torch.no_grad`` too; a cache reordered in place, as beam search may, changes the
    copy): then they hold the same values, and no value is read (on a GPU, a synchronization)."""
    try:
        source = getattr(copy.untyped_storage(), "splitformer_source", None)
        return (source is not None and source[0]() is tensor and tensor._version == source[1]
                and source[2]() is copy and copy._version == source[3])
    except (RuntimeError, NotImplementedError):
        return False


def _stacked_memory(caches: list[dict[str, torch.Tensor]] | None, memory: torch.Tensor,
                    memory_key_padding_mask: torch.Tensor | None) -> None:
    """Record in the first layer's cache the memory and memory padding a stack decodes with (``"memory"``,
    ``"memory_key_padding_mask"``: copies; no padding: an empty tensor). A ValueError when a later call gives others:
    every layer after the first cached its tokens' keys and values from states that read them (one layer recomputes
    its memory's own keys and values; a stack cannot recompute its cached tokens')."""
    if caches is None or len(caches) < 2:
        return
    mask = torch.zeros(0, dtype=torch.bool, device=memory.device) if memory_key_padding_mask is None else \
        _mask_on("memory_key_padding_mask", memory_key_padding_mask, memory.device)
    first = caches[0]
    if "memory" in first and "memory_key_padding_mask" in first:
        if not (_same_tensor(first["memory"], memory) and _same_tensor(first["memory_key_padding_mask"], mask)):
            cached, given = list(first["memory"].shape), list(memory.shape)
            shapes = "" if cached == given else f" (this memory's shape {given}, theirs {cached})"
            raise ValueError(f"memory and memory_key_padding_mask must be those the cached tokens were decoded with{shapes}: "
                             "a stack's later layers cached their keys and values from states that read them (start a "
                             "new cache for another memory)")
        return
    first["memory"] = _kept(memory)
    first["memory_key_padding_mask"] = _kept(mask)


def _memoized(cache: dict[str, torch.Tensor] | None, key: str, memory: torch.Tensor, inference: bool) -> bool:
    """Whether ``cache`` holds fields computed from a memory equal to ``memory``: ``cache[key]``, the copy of the
    memory they were computed from, has its shape, dtype, device and values (``_same_tensor``: that very tensor,
    unchanged, or compared: O(memory), not the O(memory · d²) of computing them). Any other memory, a tensor refilled
    in place included, has them computed again; so does every call with autograd on (not ``inference``), whose
    gradients reach this call's memory and parameters."""
    return cache is not None and inference and key in cache and _same_tensor(cache[key], memory)


def _memoized_field(cache: dict[str, torch.Tensor] | None, key: str, shape: list[int]) -> torch.Tensor:
    """The field ``cache[key]`` computed from the cached memory, which must have ``shape`` (the one computing it
    here would give: another means another head count or other parameters, refused)."""
    assert cache is not None
    value = cache[key]
    if list(value.shape) != shape:
        raise ValueError(f"cache['{key}'] holds {value.dtype} {list(value.shape)}, but this call's would be {shape} "
                         "(another n_heads or other parameters): start a new cache")
    return value


def _memoize(cache: dict[str, torch.Tensor] | None, key: str, memory: torch.Tensor, fields: dict[str, torch.Tensor]):
    """Store ``fields`` computed from ``memory``, and a copy of the memory as ``cache[key]`` (the caller may
    refill its tensor in place: the copy keeps the values they were computed from)."""
    if cache is not None:
        cache[key] = _kept(memory)
        cache.update(fields)


class LateTokenRead(ValueError):
    """A cached decoding step refused: a cached token reads a new, later one through a kernel without χ (a token
    shift's), as the full pass would; the cache holds no such read (``_late_reads``)."""


def _late_reads(cache: dict[str, torch.Tensor] | None, key: str, pos: torch.Tensor, windows: list[tuple[float, float]]):
    """Refuse new positions p that a cached token (position q in ``cache[key]``) reads with a kernel window
    ``low < q − p < high`` carrying no χ: the full pass would have it read this later token, cached decoding cannot."""
    if cache is None or key not in cache:
        return
    cached = torch.sort(cache[key], dim=1).values.contiguous()
    for low, high in windows:
        first = torch.searchsorted(cached, (pos + low).contiguous(), right=True)
        inside = torch.searchsorted(cached, (pos + high).contiguous()) > first
        if bool(inside.any()):
            b, token = [int(index) for index in inside.nonzero()[0]]
            raise LateTokenRead(f"positions: new token {token} at {float(pos[b, token])} is read by a cached token at "
                             f"{float(cached[b, int(first[b, token])])} (q − p in ({low}, {high}), a kernel without χ): the "
                             f"full pass has the earlier token read the later one, cached decoding cannot; keep new "
                             f"positions at least {-low} above the cached ones, or call without a cache")


def _given(names: list[str], values: list[torch.Tensor | None]) -> torch.Tensor | None:
    """The one of ``values`` given, or None: one argument under torch's names for it (``names``); a ValueError naming
    two that are given."""
    given: list[str] = []
    chosen: torch.Tensor | None = None
    for name, value in zip(names, values):
        if value is not None:
            given.append(name)
            chosen = value
    if len(given) > 1:
        raise ValueError(f"give {given[0]} or {given[1]}, not both")
    return chosen


def _with_memory_mask(chi_m: torch.Tensor | None, memory_mask: torch.Tensor | None, batch: int, n_tokens: int,
                      n_memory: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """χ_m narrowed by torch's ``memory_mask`` (``nn.TransformerDecoderLayer``'s): (tokens, memory tokens) or (batch,
    tokens, memory tokens) for the new tokens' rows; bool True excludes a memory token from a query's integral, a
    float mask is added to the scores (χ_m then the log-weight, −inf outside)."""
    if memory_mask is None:
        return chi_m
    mask = _mask_on("memory_mask", memory_mask, device)
    _check_mask("memory_mask", mask, [[n_tokens, n_memory], [batch, n_tokens, n_memory]])
    support = torch.ones(batch, n_tokens, n_memory, dtype=torch.bool, device=device) if chi_m is None else chi_m
    if mask.is_floating_point():
        support = torch.zeros(batch, n_tokens, n_memory, dtype=dtype, device=device).masked_fill(~support, float("-inf"))
    return _restrict(support, mask)
