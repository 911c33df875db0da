"""The inputs of a generated NumPy block: any argument read as an array (``_array``), and the inputs it
declares besides the state: the memory an operator reads and its support, token positions, grid
coordinates, and the cache of cached decoding (each key-side field of the tokens so far, the fields of the
memory kept once per memory, and the refusal of new positions a kernel without χ would read). Inlined where used (``codegen.runtime_source``)."""

import threading
import weakref

import numpy as np

from .numpy_helpers import _unmasked


def _array(name, value):
    """``value`` as a NumPy array of numbers; a TypeError for what NumPy cannot read (None, a tensor that requires grad)
    or would read wrongly (a masked array)."""
    _unmasked(name, value)
    try:
        array = np.asarray(value)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(f"{name} cannot be read as a NumPy array ({type(value).__name__}: {error}); "
                        "pass NumPy arrays (a torch tensor: t.detach().cpu().numpy())") from None
    if array.dtype == object:
        raise TypeError(f"{name} must be an array of numbers, got {type(value).__name__}")
    return array.astype(array.dtype.newbyteorder("="), copy=False)  # big-endian data (a file's) in this machine's order


def _memory(memory, batch, d, dtype):
    """The memory M[b, t, k] an operator reads (its declared input), held fixed over the step."""
    given = _array("memory", memory)
    memory = given[None] if given.ndim == 2 else given
    if not np.issubdtype(memory.dtype, np.floating) or memory.ndim != 3 or memory.shape[0] != batch \
            or memory.shape[2] != d:
        raise ValueError(f"memory must be floating of shape (batch={batch}, memory tokens, d={d})"
                         f"{', or (memory tokens, d) for one sequence' if batch == 1 else ''}, got "
                         f"{given.dtype} {given.shape}")
    if memory.dtype != dtype:  # as the parameters: a state of one precision, as the torch Block asks
        raise ValueError(f"memory has dtype {memory.dtype}, u {np.dtype(dtype)}")
    return memory


def _memory_support(memory_key_padding_mask, batch, n_tokens, n_memory):
    """The indicator χ_m[b, i, t] of the integral over memory tokens, or None when it is 1 everywhere."""
    if memory_key_padding_mask is None:
        return None
    mask = np.asarray(memory_key_padding_mask)
    mask = mask[None] if batch == 1 and mask.ndim == 1 else mask  # one sequence's (memory tokens,)
    if mask.dtype != np.bool_ or mask.shape != (batch, n_memory):
        raise ValueError(f"memory_key_padding_mask must be bool of shape {(batch, n_memory)}"
                         f"{f' or ({n_memory},) for one sequence' if batch == 1 else ''}, got {mask.dtype} {mask.shape}")
    return np.broadcast_to(~mask[:, None, :], (batch, n_tokens, n_memory))


def _positions(positions, batch, n_tokens, offset, dtype):
    """Token positions p[b, i]: ``offset … offset + n_tokens − 1`` unless given ((tokens,), (1, tokens), as
    transformers' ``position_ids``, or (batch, tokens))."""
    if positions is None:
        return np.broadcast_to(np.arange(offset, offset + n_tokens, dtype=dtype), (batch, n_tokens))
    positions = _array("positions", positions)
    if positions.dtype.kind not in "fiu" or positions.shape not in ((n_tokens,), (1, n_tokens), (batch, n_tokens)):
        raise ValueError(f"positions must be real numbers of shape {(n_tokens,)}, {(1, n_tokens)} or "
                         f"{(batch, n_tokens)}, got {positions.dtype} {positions.shape}")
    if positions.dtype.kind == "f" and not np.isfinite(positions).all():
        raise ValueError(f"positions must be finite, got {positions[~np.isfinite(positions)][0]}")
    return np.broadcast_to(positions.astype(dtype), (batch, n_tokens))


def _grid(size, like):
    """The grid coordinates 0, 1, …, size − 1 in the dtype of ``like``."""
    return np.arange(size, dtype=like.dtype)


def _cache(cache, key, new):
    """The key-side field of every token so far: the cached values, then ``new`` (stored back, ``_extended``)."""
    if cache is None:
        return new
    if key in cache:
        old = cache[key]
        if old.shape[0] != new.shape[0] or old.shape[2:] != new.shape[2:] or old.dtype != new.dtype:
            raise ValueError(f"cache[{key!r}] holds {old.dtype} {old.shape}, incompatible with {new.dtype} {new.shape}")
        new = _extended(old, new)
    cache[key] = new
    return new


#: The buffers ``_extended`` allocated, by id: (a weak reference to the buffer, the tokens written into it); the lock
#: guards it: a step moves the record past its tokens before it writes them, so two threads extending copies of one
#: cache never write the same tokens.
_SPARE = {}
_SPARE_LOCK = threading.Lock()


def _extended(old, new):
    """``old`` then ``new`` along the tokens (axis 1), a view of a buffer with zeroed spare tokens after them, so a
    decoding step copies its own keys and values only (``np.concatenate`` copies the whole cache at every step:
    quadratic in the length of a generation). Written in place when this function allocated the buffer ``old``
    begins and no other cache has written past ``old`` since (copies of one cache and a cache cut back to fewer
    tokens never write over each other); else a new buffer of the tokens and half as many again (at least 16 spare),
    or of the tokens alone where ``old`` is not such a buffer (a first store; a cache rebuilt at every step gets no
    slack)."""
    tokens, buffer = old.shape[1] + new.shape[1], old.base
    with _SPARE_LOCK:
        entry = _SPARE.get(id(buffer))
        ours = entry is not None and entry[0]() is buffer
        writes = (ours and entry[1] == old.shape[1] and tokens <= buffer.shape[1] and old.strides == buffer.strides
                  and old.shape[:1] + old.shape[2:] == buffer.shape[:1] + buffer.shape[2:]
                  and old.__array_interface__["data"][0] == buffer.__array_interface__["data"][0])
        if writes:
            _SPARE[id(buffer)] = (entry[0], tokens)
    if not writes:
        capacity = tokens + max(16, tokens // 2) if ours else tokens
        buffer = np.empty((old.shape[0], capacity) + old.shape[2:], dtype=old.dtype)
        buffer[:, tokens:] = 0
        buffer[:, :old.shape[1]] = old
        forget = weakref.ref(buffer, lambda ref, key=id(buffer): _SPARE.get(key, (None,))[0] is ref and _SPARE.pop(key))
        with _SPARE_LOCK:
            _SPARE[id(buffer)] = (forget, tokens)
    buffer[:, old.shape[1]:tokens] = new
    return buffer[:, :tokens]


def _cached_padding(cache, key_padding_mask, batch, n_keys):
    """Record in ``cache["key_padding_mask"]`` the key padding of every token so far (``key_padding_mask``, checked;
    None: none padded). A ValueError when it marks the cached tokens otherwise than the calls that cached them: their
    keys and values hold that padding, so no full pass would equal the result. A cache without the record (one
    rebuilt from transformers' ``Cache``) is taken as it is."""
    if cache is None:
        return
    mask = np.zeros((batch, n_keys), dtype=bool) if key_padding_mask is None else np.asarray(key_padding_mask)
    old = cache.get("key_padding_mask")
    if old is not None and not np.array_equal(old, mask[:, :old.shape[1]]):
        raise ValueError("key_padding_mask marks the cached tokens otherwise than the calls that cached them (their "
                         "keys and values hold that padding): give them the padding they were cached with")
    cache["key_padding_mask"] = mask.copy()


def _cached_options(cache, options):
    """Record in ``cache["options"]`` the options the cached keys and values were computed with (``options``: name →
    value). A ValueError naming those a later call changes: the cached tokens hold the old ones, so no full pass with
    either would equal the result."""
    if cache is None:
        return
    old = cache.get("options", options)
    changed = [f"{name}={value!r} (cached with {old.get(name)!r})" for name, value in options.items()
               if old.get(name) != value]
    if changed:
        raise ValueError(f"{', '.join(changed)}: the cached tokens' keys and values were computed with the options of "
                         "the calls that cached them; give every call of one cache the same options")
    cache["options"] = dict(options)


def _same_array(old, new):
    """Whether ``old`` and ``new`` are both None, or arrays of one shape, dtype and values."""
    return (old is None) == (new is None) and (new is None or (old.shape == new.shape and old.dtype == new.dtype
                                                               and np.array_equal(old, new)))


def _stacked_memory(caches, memory, memory_key_padding_mask):
    """Record in the first layer's cache the memory and memory padding a stack decodes with (``"memory"``,
    ``"memory_key_padding_mask"``: copies). A ValueError when a later call gives others: every layer after the first
    cached its tokens' keys and values from states that read them (one layer recomputes its memory's own keys and
    values; a stack cannot recompute its cached tokens')."""
    if caches is None or len(caches) < 2:
        return
    memory = np.asarray(memory)
    mask = None if memory_key_padding_mask is None else np.asarray(memory_key_padding_mask)
    first = caches[0]
    if "memory" in first and not (_same_array(first["memory"], memory)
                                  and _same_array(first.get("memory_key_padding_mask"), mask)):
        cached = np.shape(first["memory"])
        shapes = "" if cached == memory.shape else f" (this memory's shape {memory.shape}, theirs {cached})"
        raise ValueError(f"memory and memory_key_padding_mask must be those the cached tokens were decoded with{shapes}: a "
                         "stack's later layers cached their keys and values from states that read them (start a new "
                         "cache for another memory)")
    first["memory"], first["memory_key_padding_mask"] = memory.copy(), None if mask is None else mask.copy()


def _memoized(cache, key, memory):
    """Whether ``cache`` holds fields computed from a memory equal to ``memory``: ``cache[key]``, the copy of the
    memory they were computed from, has its shape, dtype and values (compared: O(memory), not the O(memory · d²)
    of computing them). Any other memory, an array refilled in place included, has them computed again."""
    return cache is not None and key in cache and _same_array(cache[key], memory)


def _memoized_field(cache, key, shape):
    """The field ``cache[key]`` computed from the cached memory, which must have ``shape`` (the one computing it
    here would give: another means another head count or other parameters, refused)."""
    value = cache[key]
    if value.shape != shape:
        raise ValueError(f"cache[{key!r}] holds {value.dtype} {value.shape}, but this call's would be {shape} "
                         "(another n_heads or other parameters): start a new cache")
    return value


def _memoize(cache, key, memory, fields):
    """Store ``fields`` computed from ``memory``, and a copy of the memory as ``cache[key]`` (the caller may
    refill its array in place: the copy keeps the values they were computed from)."""
    if cache is not None:
        cache[key] = memory.copy()
        cache.update(fields)


class LateTokenRead(ValueError):
    """A cached decoding step refused: a cached token reads a new, later one through a kernel without χ (a token
    shift's), as the full pass would; the cache holds no such read (``_late_reads``)."""


def _late_reads(cache, key, pos, windows):
    """Refuse new positions p that a cached token (position q in ``cache[key]``) reads with a kernel window
    ``low < q − p < high`` carrying no χ: the full pass would have it read this later token, cached decoding cannot."""
    if cache is None or key not in cache:
        return
    cached = np.sort(cache[key], axis=1)
    for low, high in windows:
        for b in range(len(pos)):
            first = np.searchsorted(cached[b], pos[b] + low, side="right")
            inside = np.searchsorted(cached[b], pos[b] + high) > first
            if inside.any():
                token = int(np.argmax(inside))
                raise LateTokenRead(f"positions: new token {token} at {pos[b, token]} is read by a cached token at "
                                 f"{cached[b, first[token]]} (q − p in ({low}, {high}), a kernel without χ): the full pass "
                                 f"has the earlier token read the later one, cached decoding cannot; keep new positions "
                                 f"at least {-low} above the cached ones, or call without a cache")
