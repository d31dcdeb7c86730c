"""``hf`` rollout engine: batched sampling with transformers ``generate`` (CPU or GPU).

A response ends at the first of the model's stop tokens (``rlforge.models.stop_token_ids``: the
generation config's EOS ids, the tokenizer's EOS and the chat template's end-of-turn token). The checkpoint's
other generation defaults (temperature, top-k, repetition penalty, ...) are not used: sampling follows
``SamplingParams`` only, as in the vllm engine.

With ``rollout.hf.compile=true`` the decoding step runs on a static KV cache through ``torch.compile`` (on
every device: transformers does that by itself only on GPUs). Prompts are then left-padded to
``data.max_prompt_length`` so that shapes repeat: each new (batch size, length) compiles once, which takes
tens of seconds on CPU, and later batches of that shape reuse it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import, no_grad
from rlforge.models import stop_token_ids
from rlforge.protocols import Generation, SamplingParams

if TYPE_CHECKING:
    import torch

    from rlforge import ops
else:
    torch = lazy_import("torch")
    ops = lazy_import("rlforge.ops")


def response_mask(responses: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """1 on tokens up to and including the first stop token of any kind (all tokens if there is none)."""
    is_stop = torch.isin(responses, torch.tensor(stop_ids, dtype=responses.dtype)).long()
    after_stop = (is_stop.cumsum(-1) - is_stop) > 0
    return (~after_stop).long()


class SeededSampling:
    """A logits processor that draws each next token from a private ``torch.Generator`` seeded with
    ``SamplingParams.seed`` (after temperature, top-k and top-p, transformers' own warpers) and leaves only that token
    possible, so greedy decoding emits it: sampling that no other thread's use of the global torch RNG can shift."""

    def __init__(self, params: SamplingParams, device: Any) -> None:
        from transformers import LogitsProcessorList, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

        warpers: list[Any] = [TemperatureLogitsWarper(params.temperature)]
        if params.top_k:
            warpers.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            warpers.append(TopPLogitsWarper(params.top_p))
        self.warpers = LogitsProcessorList(warpers)
        self.generator = torch.Generator(device).manual_seed(int(params.seed or 0))

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.warpers(input_ids, scores).float(), dim=-1)
        token = torch.multinomial(probs, 1, generator=self.generator)
        return torch.full_like(scores, float("-inf")).scatter_(-1, token, 0.0)


@dataclass
class HFRolloutConfig:
    """The ``hf`` engine (``rollout.name=hf``)."""

    compile: bool = False  # static KV cache + torch.compile'd decoding (compiles once per batch shape)


class HFRollout:
    """Generates with the given model object. When it is the actor itself (the default in the local
    controller) weights are shared and ``update_weights`` has nothing to copy."""

    supports_sleep = False
    logprobs_match_actor = True  # generates with the actor model itself (max abs diff ~1e-6 on CPU fp32)

    def __init__(self, config: Any, model: torch.nn.Module, tokenizer: Any) -> None:
        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer, model)
        self.micro_batch_size = config.rollout.micro_batch_size
        self.compiled: dict[str, Any] = {}
        if config.rollout.hf.compile:
            from transformers.generation.configuration_utils import CompileConfig

            compile_config = CompileConfig(fullgraph=False, dynamic=False)
            compile_config._compile_all_devices = True  # transformers' switch for compiling off GPU
            self.compiled = {"cache_implementation": "static", "compile_config": compile_config}

    @no_grad
    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        out = batch.repeat_interleave(params.n) if params.n > 1 else batch
        seeded = None
        if params.seed is not None and params.temperature > 0:
            seeded = SeededSampling(params, next(self.model.parameters()).device)
        parts = [self._generate(mb, params, seeded) for mb in out.split(self.micro_batch_size)]
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

    def _generate(self, mb: B.Batch, params: SamplingParams, seeded: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        device = next(self.model.parameters()).device
        prompts, prompt_mask = mb[B.PROMPTS].to(device), mb[B.PROMPT_MASK].to(device)
        if self.compiled:  # one prompt width for every batch: one compiled shape per batch size
            extra = max(0, self.config.data.max_prompt_length - prompts.shape[1])  # agent turns may be longer
            prompts = torch.nn.functional.pad(prompts, (extra, 0), value=self.tokenizer.pad_token_id)
            prompt_mask = torch.nn.functional.pad(prompt_mask, (extra, 0), value=0)
        greedy = params.temperature == 0
        sampling: dict[str, Any] = {"do_sample": False}
        if seeded is not None:  # greedy decoding of the token SeededSampling drew
            sampling = {"do_sample": False, "logits_processor": [seeded]}
        elif not greedy:
            sampling = {"do_sample": True, "temperature": params.temperature, "top_p": params.top_p,
                        "top_k": params.top_k or None}
        was_training, defaults = self.model.training, self.model.generation_config
        self.model.eval()
        # rlforge's sampling parameters only: transformers fills every unset one from the checkpoint's
        # generation_config.json (Qwen2.5-Instruct: repetition_penalty=1.05, top_k=20), which would sample from
        # another distribution than the one the log-probs describe, and than the vllm engine samples from
        from transformers import GenerationConfig

        self.model.generation_config = GenerationConfig()
        try:
            with self.autocast(prompts.device):
                gen = self.model.generate(
                    input_ids=prompts,
                    attention_mask=prompt_mask,
                    max_new_tokens=params.max_new_tokens,
                    min_new_tokens=params.min_new_tokens or None,
                    pad_token_id=self.tokenizer.pad_token_id,
                    eos_token_id=self.stop_ids,
                    output_logits=True,
                    return_dict_in_generate=True,
                    **sampling,
                    **self.compiled,
                )
        finally:
            self.model.generation_config = defaults
            self.model.train(was_training)
        responses = gen.sequences[:, prompts.shape[1]:].cpu()
        logits = torch.stack(gen.logits, dim=1)
        if not greedy:
            logits = logits / params.temperature
        return responses, ops.token_logprobs(logits, responses.to(logits.device))[0].cpu()

    def autocast(self, device: Any) -> Any:
        """Generation runs in the compute dtype of a mixed ``model.precision``, as the trainer's forward passes."""
        import contextlib

        from rlforge import precision

        compute = precision.for_config(self.config).compute
        return torch.autocast(device.type, dtype=getattr(torch, compute)) if compute else contextlib.nullcontext()

    def generate_tokens(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        """Token-in/token-out requests of agent loops: one batched ``generate`` per group of requests whose sampling
        parameters differ at most in ``max_new_tokens`` (``rlforge.agent.engine.tokens_via_generate``)."""
        from rlforge.agent.engine import tokens_via_generate

        return tokens_via_generate(self, prompts, params, self.tokenizer.pad_token_id, set(self.stop_ids))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        from rlforge.lora import is_lora

        if is_lora(self.model):  # the LoRA actor itself (LoRA runs on one device): its adapter is already live
            return
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in named_tensors:
                if params[name].data_ptr() != tensor.data_ptr():
                    params[name].copy_(tensor)

    def shutdown(self) -> None:
        self.model = None  # type: ignore[assignment]


@hookimpl
def rlforge_register(registry):
    registry.rollout.register("hf", HFRollout, config=HFRolloutConfig,
                              description="transformers generate (CPU/GPU), shares actor weights")
