"""Cascade attention for the hf engine's decoding loop: the samples of a prompt read its keys and values once per step.

A GRPO batch repeats every prompt ``n`` times. On a per-row KV cache each decoding step reads each prompt's keys and
values ``n`` times, and on CPU that attention is bound by the memory's read rate (docs/performance.md). Here the cache
holds each distinct prompt once (``SharedPromptCache``: prompt part ``[prompts, kv_heads, P, d]``, response part per
row) and the attention of a one-token step is computed in two parts over one softmax: the rows of a prompt, gathered
as a block of queries, against their prompt's keys (one product per distinct prompt), and each row against its own
response keys; ``a @ [Vp; Vr]`` is ``a_p @ Vp + a_r @ Vr``. The result is the per-row attention's up to float
rounding; the cache also takes ``1/n`` of the prompts' memory.

It runs where it can be checked: fp32, every layer plain attention through transformers' ``sdpa`` interface, and a
one-token probe of the model in which every layer's attention call arrives with the cache, with the keys and values
the cache returned (not keys expanded from a cached latent), no keyword this code does not honour (a sliding window,
a soft cap, attention sinks) and no attention mask of the model's own making (a learned bias); elsewhere the decoder keeps its per-row cache. While a decoding call runs, the model's
attention implementation is ``rlforge_cascade`` (reference-counted across threads); a call
without the cache (another thread's forward pass) gets ``sdpa`` with ``sdpa``'s mask, as before.
"""

from __future__ import annotations

import functools
import threading
from typing import TYPE_CHECKING, Any

from rlforge.lazy import lazy_import

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

NAME = "rlforge_cascade"  # the attention implementation's name while a decoding call runs
KEYWORD = "rlforge_shared_prompts"  # the forward keyword that carries the cache to the attention calls
# Cascade only where the prompt keys and values it saves reading per layer and step (rows beyond the distinct prompts x
# prompt width x key and value bytes) reach this: below it, the extra operations of the two-part attention cost about
# what the reads do (small caches also stay in the processor's cache)
MIN_SAVED_BYTES = 2 * 2**20
HONOURED = frozenset({"dropout", "scaling", "position_ids", "cache_position", "use_cache", "output_attentions",
                      "is_causal", KEYWORD})
_lock = threading.Lock()
_users: dict[int, int] = {}  # id(text config) -> decoding calls running with the cascade implementation
_probing = threading.local()  # .masks: the masks the mask function returned during this thread's probe (else None)


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
              **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: ``query`` [B, heads, 1, d], ``key``/``value`` the rows' response part
    [B, kv_heads, t, d] (``SharedPromptCache``'s layer) -> [B, 1, heads, d]. Without the cache: ``sdpa``."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    cache = kwargs.pop(KEYWORD, None)
    # mypy knows the caches below only as the objects an isinstance of a runtime-made class narrows them to
    shared: Any = cache
    if not isinstance(cache, _types()[1]):
        if isinstance(cache, _types()[2]):  # the probe: did the keys and values the cache returned arrive as they are?
            returned = shared.returned.get(module.layer_idx)
            if returned is not None and key is returned[0] and value is returned[1]:
                shared.direct.add(module.layer_idx)
            shared.unhonoured |= {k for k, v in kwargs.items() if v is not None and v is not False and k not in HONOURED}
            if attention_mask is not None and not any(attention_mask is m for m in getattr(_probing, "masks", ())):
                shared.unhonoured.add("attention_mask")  # a mask of the model's own making (Doge adds a learned bias)
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                      **kwargs)
    rows, heads, _, dim = query.shape
    kv_heads = key.shape[1]
    layer = shared.layers[module.layer_idx]
    scale = dim ** -0.5 if scaling is None else scaling
    q = query.reshape(rows, kv_heads, heads // kv_heads, dim)  # the query heads of one kv head as a block of queries
    prompt = torch.matmul(shared.grouped(q), layer.prompt_keys.transpose(-1, -2)).mul_(scale).add_(shared.bias)
    own = torch.matmul(q, key.transpose(-1, -2)).mul_(scale)
    weights = torch.cat([shared.by_row(prompt), own], -1).softmax(-1)
    width = prompt.shape[-1]
    out = torch.matmul(weights[..., width:], value)
    out += shared.by_row(torch.matmul(shared.grouped(weights[..., :width]), layer.prompt_values))
    return out.reshape(rows, heads, 1, value.shape[-1]).transpose(1, 2), None  # value heads may be narrower (MLA)


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, attention)
    AttentionMaskInterface.register(NAME, _mask)  # other callers' forward passes get sdpa's masks


def _mask(*args: Any, **kwargs: Any) -> Any:
    """``sdpa``'s mask; during a probe in this thread, also kept, so the probe can tell it from a mask the model made."""
    from transformers.masking_utils import sdpa_mask

    mask = sdpa_mask(*args, **kwargs)
    masks = getattr(_probing, "masks", None)
    if masks is not None:
        masks.append(mask)
    return mask


class switched:
    """Context manager: ``config``'s attention implementation is the cascade while any decoding call holds it."""

    def __init__(self, config: Any) -> None:
        self.config = config

    def __enter__(self) -> switched:
        with _lock:
            if not _users.get(id(self.config)):
                _register()
                self.config._attn_implementation_internal = NAME
            _users[id(self.config)] = _users.get(id(self.config), 0) + 1
        return self

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            _users[id(self.config)] -= 1
            if not _users[id(self.config)]:
                del _users[id(self.config)]
                self.config._attn_implementation_internal = "sdpa"


def supported(model: torch.nn.Module, config: Any) -> bool:
    """Whether ``model`` (its text ``config``) can decode with the cascade: fp32 weights, ``sdpa`` attention, and a
    one-token probe in which every layer's attention call receives the cache, with the very keys and values the cache
    returned (not e.g. keys expanded from a cached latent, as multi-head latent attention computes them), only keywords
    the cascade honours (None or False: off), and no attention mask but the one transformers' mask function made (the
    cascade computes its own; Doge adds a learned bias to the mask, which it would drop)."""
    # NAME: another thread's decoding call runs with the cascade now (switched from sdpa, its only origin)
    if config._attn_implementation not in ("sdpa", NAME) or next(model.parameters()).dtype != torch.float32:
        return False
    probe = _types()[2](config=config)
    device = next(model.parameters()).device
    _probing.masks = []
    with switched(config), torch.no_grad():
        try:
            model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=device), past_key_values=probe, use_cache=True,
                  **{KEYWORD: probe})
        except TypeError:  # a forward that takes no such keyword
            return False
        finally:
            _probing.masks = None
    return probe.direct == probe.seen == set(range(config.num_hidden_layers)) and not probe.unhonoured


def worth_it(rows: int, distinct: int, width: int, config: Any) -> bool:
    """Whether the prompt reads saved per layer and step reach ``MIN_SAVED_BYTES`` (fp32 keys and values)."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (rows - distinct) * width * kv_heads * dim * 2 * 4 >= MIN_SAVED_BYTES


def shared_prompt_cache(layers: int, new: int) -> Any:
    """An empty ``SharedPromptCache`` of ``layers`` layers with room for ``new`` response positions per row."""
    layer_type, cache_type, _ = _types()
    return cache_type(layers=[layer_type(new) for _ in range(layers)])


@functools.cache
def _types() -> tuple[type, type, type]:
    from transformers import Cache, DynamicCache

    from rlforge.plugins.rollout.hf_decode import _filled_layer

    class SharedPromptLayer(_filled_layer()):  # type: ignore[misc]
        """A filled-part layer for the responses beside its distinct prompts' keys and values."""

        prompt_keys: torch.Tensor
        prompt_values: torch.Tensor

    class SharedPromptCache(Cache):
        """The cascade's KV cache: each layer's distinct prompts once, the responses per row; ``inverse`` maps each
        row of the decoding batch to its prompt (kept in step as ``reorder_cache`` drops finished rows)."""

        def share(self, keys: list[tuple[torch.Tensor, torch.Tensor]], mask: torch.Tensor, inverse: torch.Tensor
                  ) -> None:
            """The prompts' keys and values per layer ([prompts, kv_heads, P, d]), their padding ``mask``
            [prompts, P] and each row's prompt."""
            for layer, (k, v) in zip(self.layers, keys):
                layer.prompt_keys, layer.prompt_values = k, v
            self.width = mask.shape[1]
            self.bias = torch.zeros(mask.shape, dtype=keys[0][0].dtype, device=mask.device).masked_fill_(
                mask == 0, float("-inf"))[:, None, None, :]
            self._rows(inverse)

        def _rows(self, inverse: torch.Tensor) -> None:
            """``slots`` [prompts, most rows of one prompt]: the rows of each prompt (``len(inverse)``, a zero row,
            where it has fewer); ``where`` [rows]: each row's place in that layout, flattened."""
            counts = torch.bincount(inverse, minlength=self.bias.shape[0])
            most = int(counts.max())
            order = torch.argsort(inverse, stable=True)
            rank = torch.arange(len(inverse), device=inverse.device) - (counts.cumsum(0) - counts)[inverse[order]]
            self.slots = inverse.new_full((len(counts), most), len(inverse))
            self.slots[inverse[order], rank] = order
            self.where = torch.empty_like(inverse)
            self.where[order] = inverse[order] * most + rank
            self.inverse = inverse

        def grouped(self, x: torch.Tensor) -> torch.Tensor:
            """[rows, kv_heads, g, k] -> [prompts, kv_heads, most * g, k]: each prompt's rows as one block of
            queries."""
            _, kv_heads, g, k = x.shape
            padded = torch.cat([x, x.new_zeros(1, kv_heads, g, k)])[self.slots]  # [prompts, most, kv_heads, g, k]
            return padded.permute(0, 2, 1, 3, 4).reshape(self.slots.shape[0], kv_heads, -1, k)

        def by_row(self, y: torch.Tensor) -> torch.Tensor:
            """The inverse of ``grouped``: [prompts, kv_heads, most * g, k] -> [rows, kv_heads, g, k]."""
            prompts, kv_heads, _, k = y.shape
            most = self.slots.shape[1]
            flat = y.reshape(prompts, kv_heads, most, -1, k).permute(0, 2, 1, 3, 4)
            return flat.reshape(prompts * most, kv_heads, -1, k).index_select(0, self.where)

        def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
            """Keeps the rows ``beam_idx`` (finished rows leave the decoding batch), and only the prompts they have."""
            super().reorder_cache(beam_idx)
            live, inverse = torch.unique(self.inverse[beam_idx], return_inverse=True)
            if len(live) < self.bias.shape[0]:
                for layer in self.layers:
                    layer.prompt_keys, layer.prompt_values = layer.prompt_keys[live], layer.prompt_values[live]
                self.bias = self.bias[live]
            self._rows(inverse)

        def get_seq_length(self, layer_idx: int = 0) -> int:
            return self.width + self.layers[layer_idx].get_seq_length()

    class Probe(DynamicCache):
        """The cache of ``supported``'s one-token forward: the keys and values each layer's ``update`` returned, the
        layers whose attention call received exactly those, and the keywords with a value the cascade would not
        honour."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.returned: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
            self.seen: set[int] = set()  # the layers whose update ran
            self.direct: set[int] = set()  # the layers whose attention call received what their update returned
            self.unhonoured: set[str] = set()

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            self.seen.add(layer_idx)
            self.returned[layer_idx] = super().update(key_states, value_states, layer_idx, *args, **kwargs)
            return self.returned[layer_idx]

    return SharedPromptLayer, SharedPromptCache, Probe
