"""The ``hf`` engine's decoding loop: batched sampling on a KV cache written in place, one model call per new token.

It replaces transformers' ``generate`` (docs/performance.md: 10-15% less time per batch in the CPU benchmarks, the
same tokens): no logits processors, stopping criteria or per-step output lists, the KV cache written in place (no
re-allocation per token: it doubles when full) with the attention reading only the positions written so far
(``_filled_layer``; 9% less time per 20.6M batch than reading the whole allocation), the attention mask allocated
once for the whole call, and one set
of batched tensor operations per token for the sampling, the log-probs and the finished rows, whatever the batch
size. On CPU in fp32 the linear layers multiply by an input-major copy of their weights made for the call
(``TransposedLinears``: 2-13% less time per step at 16-128 rows). Repeated prompts (the samples of a GRPO group) are
prefilled once each, and where ``hf_cascade`` applies the cache holds them once and the attention reads them once per
step (cascade attention). Optionally the one-token step runs through ``torch.compile`` (``rollout.hf.compile``, on transformers'
``StaticCache``, whose shapes do not change from step to step). Under autocast (a mixed
``model.precision``) the filled-length cache holds keys and values in the compute dtype, the dtype the attention's
autocast casts them to before reading them (the same results as transformers' growing cache, which holds both in
fp32 there); layer types that have no static layer, and the sliding-window and other layers under autocast, grow
their cache by concatenation instead, as transformers' default cache does.

Semantics (those of the ``generate`` call it replaces):

- the log-prob of each sampled token is ``log_softmax(logits / temperature)`` of the model's raw logits (greedy:
  of the raw logits), before top-k, top-p or the ``min_new_tokens`` stop-token ban, as the actor computes it;
- the token is drawn from ``softmax`` of the logits after the stop-token ban (for the first ``min_new_tokens``
  tokens), temperature, top-k and top-p (transformers' warpers), with ``torch.multinomial``: from the private
  generator of a seeded call (``SamplingParams.seed``), else from the global torch RNG; greedy takes the argmax;
- a vision-language model never samples its image or video placeholder tokens (``multimodal.placeholder_token_ids``:
  the forward pass would look for their pixels); their log-probs stay those of the raw logits;
- a row that emitted a stop token gets the pad token from then on; the loop ends when every row has stopped or
  after ``max_new_tokens`` tokens. Finished rows are dropped from the batch that is computed (not with a compiled
  step, whose shapes must repeat, nor on a cache whose layers do not all reorder fully: ``_reorders_fully``), so later tokens of the remaining rows are drawn from a smaller batch: a seeded
  call stays reproducible, with other draws than a loop that keeps every row;
- the input-major products (CPU, fp32), the one prefill per distinct prompt and the cascade attention give the
  plain loop's results up to float rounding (~1e-6 to 1e-5 in the log-probs): a token can differ from the plain
  loop's only where two logits tie to that precision.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rlforge import multimodal
from rlforge.errors import RLForgeError
from rlforge.lazy import lazy_import
from rlforge.lengths import length_groups
from rlforge.plugins.rollout import hf_cascade
from rlforge.sampling import SamplingParams

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

CACHE_LENGTH_STEP = 64  # compiled steps: the cache length is rounded up to a multiple of this, so shapes repeat
CACHE_GROWS_FROM = 256  # the filled-length cache's first allocation: the prompt + this many positions, then doubling
# finished rows leave the decoding batch (their KV-cache rows dropped) once at most this share of its rows still runs:
# a heavy-tailed batch then costs the tokens it generates, not its longest row times its size (docs/performance.md)
COMPACT_BELOW = 0.75
# CPU, fp32: the linear layers of a decoding call multiply by a copy of their weights stored input-major, held for the
# call, when all of them together take at most this many bytes, in the products of at least TRANSPOSE_MIN_ROWS rows
# (fewer rows: the plain product, as fast or faster there; see TransposedLinears)
TRANSPOSE_MAX_BYTES = 2**30
TRANSPOSE_MIN_ROWS = 16


class Sampler:
    """Draws the next token of every row from the last logits (see the module docstring)."""

    def __init__(self, params: SamplingParams, stop_ids: list[int], device: Any, banned: Sequence[int] = ()) -> None:
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        self.greedy = params.temperature == 0
        self.temperature = 1.0 if self.greedy else float(params.temperature)
        warpers: list[Any] = [] if self.greedy else [TemperatureLogitsWarper(params.temperature)]
        if params.top_k and not self.greedy:
            warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0 and not self.greedy:
            warpers.append(TopPLogitsWarper(params.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.min_new_tokens = int(params.min_new_tokens or 0)
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=device)
        self.banned = torch.tensor(list(banned), dtype=torch.long, device=device) if banned else None
        self.generator = None
        if params.seed is not None and not self.greedy:
            self.generator = torch.Generator(device).manual_seed(int(params.seed))

    def __call__(self, logits: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [B], their log-probs [B]) for new token number ``t`` (0-based) from ``logits`` [B, V]."""
        logits = logits.float()
        log_probs = torch.log_softmax(logits / self.temperature, dim=-1)
        scores = logits
        if t < self.min_new_tokens and len(self.stop_ids):
            scores = scores.index_fill(-1, self.stop_ids, float("-inf"))
        if self.banned is not None:
            scores = scores.index_fill(-1, self.banned, float("-inf"))
        if self.greedy:
            tokens = scores.argmax(-1)
        else:
            probs = torch.softmax(self.warpers(None, scores), dim=-1)
            tokens = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


class TransposedLinears:
    """A decoding call's ``nn.Linear`` layers multiplying by a copy of their weights stored input-major.

    ``nn.Linear`` keeps its weight as ``[out, in]`` and computes ``x @ weight.T``; on CPU in fp32 MKL's sgemm is slower
    with that transposed right-hand side at the row counts of decoding steps than on an ``[in, out]`` copy. The copy is
    made once per call (the weights' size again, held until ``restore()``) and used by the products of at least
    ``TRANSPOSE_MIN_ROWS`` rows, whatever the batch size (finished rows leave the batch without a repacking). The
    20.6M model's decoding step, paired against the plain product in one process: 0.87-0.89x at 16-32 rows and
    0.98x at 64-128 with 2 threads, 0.87-0.93x at 32-128 with one; below 16 rows no faster, so left plain there
    (docs/performance.md, "Long tails")."""

    def __init__(self, layers: list[torch.nn.Linear]) -> None:
        self.layers: list[torch.nn.Linear] = []
        try:
            for layer in layers:
                layer.forward = functools.partial(_input_major_product, layer, layer.weight.t().contiguous())  # type: ignore[method-assign]
                self.layers.append(layer)
        except BaseException:  # e.g. out of memory at a copy: no layer stays switched
            self.restore()
            raise

    @classmethod
    def for_model(cls, model: torch.nn.Module, device: Any) -> TransposedLinears | None:
        """The model's plain fp32 CPU linear layers, switched; None where this does not apply (not CPU, gradients on,
        no such layers, or more than ``TRANSPOSE_MAX_BYTES`` of them). A layer whose forward is already replaced on
        the instance (a hook library's or the user's) is left as it is."""
        if device.type != "cpu" or torch.is_grad_enabled():
            return None
        layers = [m for m in model.modules() if type(m) is torch.nn.Linear and type(m.weight) is torch.nn.Parameter
                  and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu" and "forward" not in vars(m)]
        if not layers or sum(m.weight.numel() * 4 for m in layers) > TRANSPOSE_MAX_BYTES:
            return None
        return cls(layers)

    def restore(self) -> None:
        for layer in self.layers:
            layer.__dict__.pop("forward", None)


def _input_major_product(layer: torch.nn.Linear, weight_t: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if x.numel() < TRANSPOSE_MIN_ROWS * x.shape[-1] or torch.is_grad_enabled():  # few rows, or a forward pass with
        return torch.nn.functional.linear(x, layer.weight, layer.bias)  # gradients (another thread's: the parameter's)
    out = torch.matmul(x, weight_t)
    return out if layer.bias is None else out + layer.bias


# transformers' cache layers whose reorder_cache reorders all they hold (finished rows may leave the batch); not e.g.
# the indexed-attention layers, whose indexer state stays at the old batch (Qwen4-Exp crashed: helper-49)
REORDERED_LAYERS = ("StaticLayer", "StaticSlidingWindowLayer", "DynamicLayer", "DynamicSlidingWindowLayer",
                    "LinearAttentionLayer", "LinearAttentionAndFullAttentionLayer",
                    "LinearAttentionAndSlidingWindowAttentionLayer", "LinearAttentionAndStaticFullAttentionLayer",
                    "LinearAttentionAndStaticSlidingWindowAttentionLayer")


def _reorders_fully(cache: Any) -> bool:
    """Whether finished rows can leave ``cache``: each of its layers is one of :data:`REORDERED_LAYERS` or this
    engine's own (the filled-length and shared-prompt layers); elsewhere every row stays in the batch, masked."""
    from transformers import cache_utils

    known = {getattr(cache_utils, name, None) for name in REORDERED_LAYERS}
    return all(type(layer) in known or isinstance(layer, _filled_layer()) for layer in getattr(cache, "layers", [None]))


def _written(cache: Any) -> bool:
    """Whether a forward pass wrote to ``cache`` (a model that ignores ``past_key_values`` leaves it empty)."""
    return any(getattr(layer, "is_initialized", True) for layer in getattr(cache, "layers", [None]))


@functools.cache
def _filled_layer() -> type:
    from transformers.cache_utils import StaticLayer

    class FilledLayer(StaticLayer):
        """A static cache layer (written in place) whose attention reads only the positions written so far, as a
        growing cache's does, instead of the whole allocation: the decoding step's attention and key/value copies
        scale with the tokens so far, not with prompt + max_new_tokens. Its storage starts at the first keys'
        length + ``CACHE_GROWS_FROM`` positions (at most ``max_cache_len``) and doubles when full: the memory follows
        the longest response so far, not ``max_new_tokens``, with at most twice the positions copied. ``dtype``: the
        keys' and values' storage dtype (default: the first keys'); under autocast the compute dtype (the rotary
        embedding hands the keys over in fp32, the values in the compute dtype)."""

        is_compileable = False  # its shapes change every step
        max_cache_len: int
        keys: torch.Tensor
        values: torch.Tensor

        def __init__(self, max_cache_len: int, dtype: torch.dtype | None = None) -> None:
            super().__init__(max_cache_len)
            self.filled = 0
            self.storage_dtype = dtype

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            dtype = self.storage_dtype or key_states.dtype  # (the static layer allocates both in the keys' dtype)
            limit, self.max_cache_len = self.max_cache_len, min(self.max_cache_len,
                                                                key_states.shape[-2] + CACHE_GROWS_FROM)
            try:  # the static layer allocates max_cache_len positions
                super().lazy_initialization(key_states.new_empty(key_states.shape, dtype=dtype), value_states)
            finally:
                self.max_cache_len = limit

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
                   ) -> tuple[torch.Tensor, torch.Tensor]:
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, self.filled = self.filled, self.filled + key_states.shape[-2]
            room = self.keys.shape[-2]
            if self.filled > room:
                grown = min(self.max_cache_len, max(self.filled, 2 * room))
                self.keys, self.values = (torch.cat([t, t.new_zeros(*t.shape[:2], grown - room, t.shape[-1])], -2)
                                          for t in (self.keys, self.values))
            # a slice copy: the static layer's index_copy_ costs ~8x as much per decoding step
            self.keys[:, :, start: self.filled].copy_(key_states)
            self.values[:, :, start: self.filled].copy_(value_states)
            return self.keys[:, :, : self.filled], self.values[:, :, : self.filled]

        def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
            return self.filled + query_length, 0

        def get_seq_length(self) -> int:
            return self.filled

    return FilledLayer


class Decoder:
    """Batched decoding for one model: ``decode(prompts, prompt_mask, params)`` -> (responses, log-probs)."""

    def __init__(self, model: torch.nn.Module, stop_ids: list[int], pad_id: int, compile: bool = False) -> None:
        self.model, self.stop_ids, self.pad_id = model, stop_ids, pad_id
        self.step = torch.compile(model, dynamic=False) if compile else model
        self.compiled = compile
        self.banned = multimodal.placeholder_token_ids(model)
        self._cascade: dict[tuple[str, Any], bool] = {}  # hf_cascade.supported, per attention implementation and dtype

    def _cascade_supported(self, config: Any) -> bool:
        """``hf_cascade.supported`` for the model, probed once per attention implementation and weight dtype."""
        implementation = config._attn_implementation  # sdpa while another thread decodes with the cascade
        key = ("sdpa" if implementation == hf_cascade.NAME else implementation, next(self.model.parameters()).dtype)
        if key not in self._cascade:
            self._cascade[key] = hf_cascade.supported(self.model, config)
        return self._cascade[key]

    def decode(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams,
               multi_modal: list | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Left-padded ``prompts`` [B, P] -> (response tokens [B, L], their log-probs [B, L]), L <= max_new_tokens
        (fewer when every row stopped earlier). ``multi_modal``: the rows' vision inputs (``B.MULTI_MODAL_INPUTS``)
        for a vision-language model: the prompt's forward gets the pixel values and M-RoPE positions, and each new
        token the position after its row's last (a text token's three M-RoPE positions are equal)."""
        plain = self.compiled or torch.is_autocast_enabled(prompts.device.type)
        with contextlib.ExitStack() as switches:  # what a call switches in the model, switched back after it
            transposed = None if plain else TransposedLinears.for_model(self.model, prompts.device)
            if transposed is not None:
                switches.callback(transposed.restore)
            return self._decode(prompts, prompt_mask, params, multi_modal, switches)

    def _decode(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, params: SamplingParams,
                multi_modal: list | None, switches: contextlib.ExitStack) -> tuple[torch.Tensor, torch.Tensor]:
        from transformers import Cache, DynamicCache, StaticCache
        from transformers.cache_utils import StaticLayer

        supports_cache = getattr(self.model, "_supports_default_dynamic_cache", None)
        if supports_cache is None or not supports_cache():
            raise self._no_cache("no transformers generation cache")
        rows, width = prompts.shape
        new = int(params.max_new_tokens)
        length = width + new
        if self.compiled:
            length = -(-length // CACHE_LENGTH_STEP) * CACHE_LENGTH_STEP
        # Under autocast the rotary embedding leaves the keys in fp32 and the values in the compute dtype, which
        # transformers' static layers (one dtype, the keys') cannot hold: the filled-length layer stores both in the
        # compute dtype, other layer types grow by concatenation, as transformers' own cache does
        autocast = torch.is_autocast_enabled(prompts.device.type)
        compute = torch.get_autocast_dtype(prompts.device.type) if autocast else None
        if self.compiled and autocast:
            raise RLForgeError("rollout.hf.compile=true decodes on a static KV cache, which transformers cannot keep "
                               "under autocast (a mixed model.precision): set rollout.hf.compile=false, or "
                               "model.precision=32-true or bf16-true.")
        config = self.model.config.get_text_config(decoder=True)
        vision = multimodal.forward_inputs(self.model, prompts, prompt_mask, multi_modal) if multi_modal else None
        # each distinct prompt (tokens and padding) and, per row, which one it is
        distinct, inverse = torch.unique(torch.cat([prompts, prompt_mask.to(prompts.dtype)], 1), dim=0,
                                         return_inverse=True)
        # plain attention in every layer (no sliding-window or linear-attention layers): the prompts may be prefilled
        # in parts, the attention reads the filled part of the cache, and with repeated prompts each prompt's keys and
        # values once (hf_cascade) where that applies
        try:
            cache = StaticCache(config=config, max_cache_len=length)  # storage is allocated at the first forward
        except KeyError as exc:  # a layer type with no static layer (DeepSeek-V4's compressed attention): its own cache
            if self.compiled:
                raise RLForgeError(f"rollout.hf.compile=true decodes on transformers' static KV cache, which has no "
                                   f"layer of {type(self.model).__name__}'s type {exc}: set rollout.hf.compile=false."
                                   ) from None
            cache = DynamicCache(config=config)
        layers = len(cache.layers)
        plain = all(type(layer) is StaticLayer for layer in cache.layers)
        cascade = (plain and not autocast and not self.compiled and not vision and len(distinct) < rows
                   and hf_cascade.worth_it(rows, len(distinct), width, config) and self._cascade_supported(config))
        if cascade:
            cache = hf_cascade.shared_prompt_cache(layers, new)
        elif plain and not self.compiled:
            cache = Cache(layers=[_filled_layer()(length, compute) for _ in range(layers)])
        elif autocast and not isinstance(cache, DynamicCache):  # sliding-window layers & co.: a growing cache
            cache = DynamicCache(config=config)
        if cascade:
            switches.enter_context(hf_cascade.switched(config))
        compacts = not self.compiled and _reorders_fully(cache)
        mask = prompt_mask.new_ones(rows, length)  # later columns: causality hides the ones not written yet
        mask[:, :width] = prompt_mask
        position = (prompt_mask.long().cumsum(-1) - 1).clamp(min=0)
        if vision:
            out = self.model(input_ids=prompts, attention_mask=mask if self.compiled else prompt_mask,
                             past_key_values=cache, cache_position=torch.arange(width, device=prompts.device),
                             use_cache=True, logits_to_keep=1, **vision)
            if vision["position_ids"].dim() == 3:  # M-RoPE (3, B, P): go on from the temporal row
                position = vision["position_ids"][0]
        else:
            out = self._prefill(prompts, prompt_mask, position, mask, cache, config, distinct, inverse, cascade, plain)
        if not cascade and not _written(cache):
            raise self._no_cache("its forward pass left the cache empty")
        shared = {hf_cascade.KEYWORD: cache} if cascade else {}
        sample = Sampler(params, self.stop_ids, prompts.device, self.banned)
        tokens = prompts.new_full((rows, new), self.pad_id)
        log_probs = torch.zeros(rows, new, device=prompts.device)
        done = torch.zeros(rows, dtype=torch.bool, device=prompts.device)
        running = torch.arange(rows, device=prompts.device)  # the rows of the batch still computed, in order
        stop = sample.stop_ids
        position = position[:, -1:]
        steps = new
        for t in range(new):
            token, log_prob = sample(out.logits[:, -1], t)
            token = token.masked_fill(done, self.pad_id)
            tokens[running, t], log_probs[running, t] = token, log_prob.masked_fill(done, 0.0)
            done |= torch.isin(token, stop)
            left = int((~done).sum())
            if t + 1 == new or left == 0:
                steps = t + 1
                break
            if compacts and left <= COMPACT_BELOW * len(done):
                keep = (~done).nonzero().squeeze(-1)
                cache.reorder_cache(keep)
                token, position, mask, running, done = token[keep], position[keep], mask[keep], running[keep], done[keep]
            position = position + 1
            step_mask = None if cascade else mask if self.compiled else mask[:, : width + t + 1]
            out = self.step(input_ids=token[:, None], attention_mask=step_mask, position_ids=position,
                            past_key_values=cache, cache_position=torch.tensor([width + t], device=prompts.device),
                            use_cache=True, **shared)
        return tokens[:, :steps], log_probs[:, :steps]

    def _no_cache(self, why: str) -> RLForgeError:
        return RLForgeError(f"The hf engine decodes with a KV cache, which {type(self.model).__name__} does not "
                            f"support ({why}). Use rollout.name=vllm for this model.")

    def _prefill(self, prompts: torch.Tensor, prompt_mask: torch.Tensor, position: torch.Tensor, mask: torch.Tensor,
                 cache: Any, config: Any, distinct: torch.Tensor, inverse: torch.Tensor, cascade: bool,
                 plain: bool) -> Any:
        """The prompts' forward pass, writing their keys and values into ``cache`` (empty) in the left-padded layout of
        one pass over ``prompts``. Returns an object whose ``logits[:, -1]`` are each row's next-token logits.

        Each distinct prompt runs once (the ``n`` samples of a GRPO group repeat their prompt: 1/n of the work), in
        one pass per group of similar length (``lengths.length_groups``: where the left padding of the short prompts
        would be most of a single pass's work, e.g. the long and short prompts of partial rollouts), each trimmed to
        its longest prompt; the rows then get their prompt's keys, values and logits."""
        from types import SimpleNamespace

        from transformers import DynamicCache

        rows, width = prompts.shape
        lengths = distinct[:, width:].sum(-1)
        groups = length_groups(lengths.tolist())
        if not plain or len(distinct) == rows and len(groups) == 1:  # one pass over the rows as given
            return self.model(input_ids=prompts, attention_mask=mask if self.compiled else prompt_mask,
                              position_ids=position, past_key_values=cache,
                              cache_position=torch.arange(width, device=prompts.device), use_cache=True,
                              logits_to_keep=1)
        ids, ids_mask = distinct[:, :width], distinct[:, width:]
        ids_position = (ids_mask.cumsum(-1) - 1).clamp(min=0)
        keys: list[tuple[torch.Tensor, torch.Tensor]] = []
        logits: torch.Tensor | None = None
        for group in groups:
            idx = torch.tensor(group, device=prompts.device)
            start = width - int(lengths[idx].max())
            part = DynamicCache(config=config)
            out = self.model(input_ids=ids[idx, start:], attention_mask=ids_mask[idx, start:],
                             position_ids=ids_position[idx, start:], past_key_values=part, use_cache=True,
                             cache_position=torch.arange(width - start, device=prompts.device), logits_to_keep=1)
            if not _written(part):
                raise self._no_cache("its forward pass left the cache empty")
            if logits is None:
                logits = out.logits.new_zeros(len(distinct), 1, out.logits.shape[-1])
            logits[idx] = out.logits[:, -1:]
            for i, layer in enumerate(part.layers):
                if len(keys) <= i:
                    keys.append((layer.keys.new_zeros(len(distinct), *layer.keys.shape[1:2], width, layer.keys.shape[-1]),
                                 layer.values.new_zeros(len(distinct), *layer.values.shape[1:2], width,
                                                        layer.values.shape[-1])))
                keys[i][0][idx, :, start:], keys[i][1][idx, :, start:] = layer.keys, layer.values
        if cascade:
            cache.share(keys, ids_mask, inverse)
        else:
            for i, (k, v) in enumerate(keys):
                cache.update(k[inverse], v[inverse], i)  # positions 0 .. width - 1, as the single pass writes them
        assert logits is not None
        return SimpleNamespace(logits=logits[inverse])
