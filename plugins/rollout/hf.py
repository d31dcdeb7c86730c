"""``hf`` rollout engine: batched sampling with the model's own forward pass (CPU or GPU).

Decoding is rlforge's loop on a static KV cache (``hf_decode.Decoder``), which samples what transformers
``generate`` would with the same parameters, in less time per token. A response ends at the first of the model's stop
tokens (``rlforge.models.stop_token_ids``: the generation config's EOS ids, the tokenizer's EOS and the chat
template's end-of-turn token; none with ``rollout.ignore_eos``). The checkpoint's other generation defaults (temperature, top-k, repetition penalty,
...) are not used: sampling follows ``SamplingParams`` only, as in the vllm engine.

With ``rollout.hf.compile=true`` the one-token decoding step runs through ``torch.compile`` (on every device). The
cache length is rounded up to a multiple of 64 so that shapes repeat: each new (batch size, cache length) compiles
once, which takes seconds on CPU, and later batches of that shape reuse it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.capabilities import RolloutCapabilities
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import, no_grad
from rlforge.models import rollout_stop_ids
from rlforge.plugins.rollout.hf_decode import Decoder
from rlforge.sampling import Generation, SamplingParams, derived_seed
from rlforge.weight_sync import WeightSync, tensor_bytes

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")


def response_mask(responses: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 on tokens up to and including the first stop token of any kind (all tokens if there is none)."""
    is_stop = torch.isin(responses, torch.tensor(stop_ids, dtype=responses.dtype)).long()
    after_stop = (is_stop.cumsum(-1) - is_stop) > 0
    return (~after_stop).long()


@dataclass
class HFRolloutConfig:
    """The ``hf`` engine (``rollout.name=hf``)."""

    compile: bool = False  # torch.compile the one-token decoding step (compiles once per batch size and cache length)


class HFRollout:
    """Generates with the given model object. When it is the actor itself (the default in the local
    controller) weights are shared and ``update_weights`` has nothing to copy."""

    supports_sleep = False
    # rows' vision inputs (B.MULTI_MODAL_INPUTS) go to the model's forward; generates with the actor model itself
    # (log-probs: max abs diff ~1e-6 on CPU fp32); generate_tokens with its own stop tokens
    capabilities = RolloutCapabilities(supports_images=True, logprobs_match_actor=True, token_io=True)

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        if not config.rollout.hf.compile:  # config-only commands load no torch (tests/test_cli_imports.py)
            return
        from rlforge import precision

        mixed = precision.for_config(config).compute
        if mixed:
            raise ConfigError(
                f"rollout.hf.compile=true decodes on a static KV cache, which transformers cannot keep under the "
                f"autocast of model.precision={config.model.precision} (a {mixed} compute dtype over fp32 weights): set "
                f"rollout.hf.compile=false, or model.precision=32-true or bf16-true.")

    def __init__(self, config: Any, model: torch.nn.Module, tokenizer: Any) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = rollout_stop_ids(config, tokenizer, model)
        self.micro_batch_size = config.rollout.micro_batch_size
        self.decoder = Decoder(model, self.stop_ids, tokenizer.pad_token_id, compile=config.rollout.hf.compile)
        self.weight_sync: WeightSync = MemorySync(config, self)  # the Builder sets the one rollout.weight_sync picks

    @no_grad
    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        out = batch.repeat_interleave(params.n) if params.n > 1 else batch
        # a seeded call: each micro-batch samples from a stream of its own (the same seed would repeat their draws)
        parts = [self._generate(mb, replace(params, seed=derived_seed(params.seed, i)))
                 for i, mb in enumerate(out.split(self.micro_batch_size))]
        width = max(p[0].shape[1] for p in parts)
        pad = self.tokenizer.pad_token_id

        def cat(i: int, fill: float) -> torch.Tensor:
            return torch.cat([torch.nn.functional.pad(p[i], (0, width - p[i].shape[1]), value=fill) for p in parts])

        responses, log_probs = cat(0, pad), cat(1, 0.0)
        mask = response_mask(responses, self.stop_ids)
        responses = responses.masked_fill(mask == 0, pad)
        out[B.RESPONSES] = responses
        out[B.RESPONSE_MASK] = mask
        out[B.ROLLOUT_LOG_PROBS] = log_probs * mask
        out[B.INPUT_IDS] = torch.cat([out[B.PROMPTS], responses], dim=1)
        out[B.ATTENTION_MASK] = torch.cat([out[B.PROMPT_MASK], mask], dim=1)
        return out

    def _generate(self, mb: B.Batch, params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        was_training = self.model.training
        self.model.eval()
        try:
            with self.autocast(device):
                responses, log_probs = self.decoder.decode(mb[B.PROMPTS].to(device), mb[B.PROMPT_MASK].to(device),
                                                           params, mb.lists.get(B.MULTI_MODAL_INPUTS))
        finally:
            self.model.train(was_training)
        return responses.cpu(), log_probs.cpu()

    def autocast(self, device: Any) -> Any:
        """Generation runs in the compute dtype of a mixed ``model.precision``, as the trainer's forward passes."""
        import contextlib

        from rlforge import precision

        compute = precision.for_config(self.config).compute
        return torch.autocast(device.type, dtype=getattr(torch, compute)) if compute else contextlib.nullcontext()

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams],
                        multi_modal: list[dict[str, Any] | None] | None = None) -> list[Generation]:
        """Token-in/token-out requests of agent loops: one batched ``generate`` per group of requests whose sampling
        parameters differ at most in ``max_new_tokens`` (``rlforge.agent.engine.tokens_via_generate``);
        ``multi_modal``: each prompt's vision inputs (None for a text prompt)."""
        from rlforge.agent.engine import tokens_via_generate

        return tokens_via_generate(self, prompts, params, self.tokenizer.pad_token_id, set(self.stop_ids), multi_modal)

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Load these weights into the model it generates with (``rollout.weight_sync``: ``memory``); the bytes
        copied."""
        return self.weight_sync.load(named_tensors)

    def shutdown(self) -> None:
        self.weight_sync.close()
        self.model = self.decoder = None  # type: ignore[assignment]


class MemorySync(WeightSync):
    """The hf engine's model is the actor itself or a replica in this process: the tensors that it does not already
    share are copied in place (none when it generates with the actor, also with LoRA: its adapter is live)."""

    engine = HFRollout
    preference = 10

    def load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        from rlforge.lora import is_lora

        model = self.rollout.model
        if is_lora(model):  # the LoRA actor itself (LoRA runs on one device): its adapter is already live
            return 0
        params = dict(model.named_parameters())
        moved = 0
        with torch.no_grad():
            for name, tensor in named_tensors:
                if params[name].data_ptr() != tensor.data_ptr():
                    params[name].copy_(tensor)
                    moved += tensor_bytes(tensor)
        return moved


@hookimpl
def rlforge_register(registry):
    registry.rollout.register("hf", HFRollout, config=HFRolloutConfig,
                              description="transformers generate (CPU/GPU), shares actor weights")
    registry.weight_sync.register("memory", MemorySync, description="hf engine: tensors copied in place in its process")
