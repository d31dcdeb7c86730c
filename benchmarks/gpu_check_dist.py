"""The distributed sections of ``gpu_check.py`` (docs/distributed.md lists what they verify):

- ``megatron``: HF -> Megatron -> HF bit-identical on the device; the converted GPTModel (TP 1, PP 1) against the
  HF model's logits in fp32 and bf16 at the check's model shape, and its forward time next to HF's. On CPU
  (``--smoke``) only the conversion runs: megatron-core's forward needs CUDA;
- ``tp``: the ``tp`` strategy on 2 processes (on one GPU: both ranks on it, gloo between them) against one process:
  log-probs, the clipped update, and the gathered weights;
- ``vllm_ray``: GRPO with ``trainer.controller=ray rollout.name=vllm strategy.name=fsdp``: one vLLM engine inside
  the Ray worker (no HF replica), sleep/wake between phases where the platform has it, the engine's weights read
  back after the first sync and compared with the gathered actor weights, stage timings.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

TOY = ["data.train_batch_size=4", "rollout.n=4", "actor.ppo_mini_batch_size=2", "actor.lr=1e-2",
       "actor.grad_clip=0.05", "actor.entropy_coeff=0.01"]


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(rank: int, world: int, port: int) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


def check_megatron(folder: Path, device: str, seqs: int, seq_len: int, timed: Any) -> dict[str, Any]:
    """Conversion on the device; on CUDA also logits and forward time against HF, fp32 and bf16."""
    from megatron.core import parallel_state

    from rlforge import load_config
    from rlforge.models import load_model
    from rlforge.plugin_manager import PluginManager
    from rlforge.plugins.strategy.megatron_convert import Layout, hf_to_megatron, megatron_to_hf

    hf = load_model(str(folder)).to(device)
    layout = Layout.of(hf.config)
    state = hf.state_dict()
    back = megatron_to_hf(hf_to_megatron(state, layout), layout)
    out: dict[str, Any] = {"round_trip_bit_identical": back.keys() == state.keys()
                           and all(torch.equal(back[k], v) for k, v in state.items())}
    if device != "cuda":
        out["forward"] = "skipped: megatron-core's forward needs CUDA"
        return out
    _launch(0, 1, _port())
    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [f"model.path={folder}", "strategy.name=megatron", "strategy.checkpoint=sharded",
                               "trainer.controller=ray", "strategy.device=cuda"], plugins=pm)
    strategy = pm.registry.strategy.get("megatron")(cfg)
    ids = torch.randint(3, hf.config.vocab_size, (seqs, seq_len), device="cuda")
    try:
        for dtype in (torch.float32, torch.bfloat16):
            ref = load_model(str(folder)).to(dtype).cuda().eval()
            mg = strategy.setup_model(load_model(str(folder)).to(dtype)).eval()
            with torch.no_grad():
                a, b = ref(input_ids=ids).logits.float(), mg(input_ids=ids).logits.float()
                name = str(dtype).removeprefix("torch.")
                out[f"{name}_max_abs_logit_diff"] = float((a - b).abs().max())
                out[f"{name}_logprob_max_diff"] = float((a.log_softmax(-1) - b.log_softmax(-1)).abs().max())
                out[f"{name}_hf_forward_s"] = timed(lambda: ref(input_ids=ids), torch.device("cuda"))
                out[f"{name}_megatron_forward_s"] = timed(lambda: mg(input_ids=ids), torch.device("cuda"))
    finally:
        parallel_state.destroy_model_parallel()
        torch.distributed.destroy_process_group()
    return out


def _sgd_grpo(config: Any) -> Any:
    """GRPO with plain SGD: Adam's first step is sign-like and would amplify float noise into the comparison."""
    from rlforge.algorithms.grpo import GRPO

    class SGDGRPO(GRPO):
        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.actor.parameters(), lr=self.config.actor.lr), None

    module = SGDGRPO(config)
    module.configure_model()
    return module


def _tp_rank(rank: int, port: int, device: str, batch: Any, out_dir: str) -> None:
    from rlforge import load_config
    from rlforge.controller.dispatch import shard_for_update
    from rlforge.plugin_manager import PluginManager
    from rlforge.worker import ActorWorker

    _launch(rank, 2, port)
    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [*TOY, "strategy.name=tp", "strategy.tp.size=2", "strategy.num_processes=2",
                               f"strategy.device={device}", "strategy.fsdp.backend=gloo", "trainer.controller=ray"],
                      plugins=pm)
    module = _sgd_grpo(cfg)
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("tp")(cfg))
    out = {"log_probs": worker.compute_log_probs(batch), "metrics": worker.update(shard_for_update(batch, 1, 8)[0])}
    out["weights"] = worker.model_state_dict()
    torch.save(out, os.path.join(out_dir, f"tp{rank}.pt"))
    torch.distributed.destroy_process_group()


def check_tp(device: str) -> dict[str, Any]:
    """The tp strategy (tp 2, both ranks on this device) against one process on the same batch, plain SGD."""
    from rlforge import batch as B
    from rlforge import load_config
    from rlforge.plugin_manager import PluginManager
    from rlforge.worker import ActorWorker

    pm = PluginManager(autoload=False)
    cfg = load_config("grpo", [*TOY, f"strategy.device={device}"], plugins=pm)
    module = _sgd_grpo(cfg)
    worker = ActorWorker(cfg, module, pm.registry.strategy.get("single")(cfg))
    g = torch.Generator().manual_seed(0)
    prompts, responses = torch.randint(7, 100, (16, 6), generator=g), torch.randint(7, 100, (16, 5), generator=g)
    ones_p, ones_r = torch.ones_like(prompts), torch.ones_like(responses)
    batch = B.Batch({B.PROMPTS: prompts, B.PROMPT_MASK: ones_p, B.RESPONSES: responses, B.RESPONSE_MASK: ones_r,
                     B.INPUT_IDS: torch.cat([prompts, responses], 1), B.ATTENTION_MASK: torch.cat([ones_p, ones_r], 1),
                     B.ADVANTAGES: torch.randn(16, 5, generator=g)})
    batch[B.OLD_LOG_PROBS] = worker.compute_log_probs(batch)
    single = {"log_probs": worker.compute_log_probs(batch), "metrics": worker.update(batch)}
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_tp_rank, args=(_port(), device, batch, tmp), nprocs=2, join=True)
        ranks = [torch.load(Path(tmp) / f"tp{r}.pt", weights_only=False) for r in range(2)]
    weights = {k: v.detach().cpu() for k, v in module.actor.state_dict().items()}
    return {
        "log_prob_max_diff": float((ranks[0]["log_probs"] - single["log_probs"]).abs().max()),
        "grad_norm": [single["metrics"]["actor/grad_norm"], ranks[0]["metrics"]["actor/grad_norm"]],
        "weight_max_diff": max(float((ranks[0]["weights"][k] - w).abs().max()) for k, w in weights.items()),
    }


def check_vllm_ray(steps: int, device: str) -> dict[str, Any]:
    """A short GRPO run with one vLLM engine inside one Ray worker; the engine's weights after the first sync."""
    import ray
    from transformers import AutoConfig

    from rlforge import Trainer, hookimpl, load_config
    from rlforge.models import resolve_model_path
    from rlforge.plugins.strategy.tp_layout import vllm_shard

    class Probe:
        def __init__(self) -> None:
            self.seen: dict[str, Any] = {}

        @hookimpl
        def rlforge_weight_sync_end(self, trainer, seconds):
            if not self.seen:
                group = trainer.controller.actor
                engine = group.engine_weights()[0][0]
                config = AutoConfig.from_pretrained(resolve_model_path(trainer.config.model.path))  # the driver: no model
                expected = vllm_shard(group.model_state_dict(), config, 0, 1)
                self.seen.update(replica=group.holds_replica()[0], engine_equals_actor=all(
                    torch.equal(engine[k].cpu(), v.to(engine[k].dtype)) for k, v in expected.items()))

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, num_gpus=1 if device == "cuda" else 0, include_dashboard=False,
             _node_ip_address="127.0.0.1")
    probe = Probe()
    try:
        with tempfile.TemporaryDirectory() as runs:
            cfg = load_config("grpo", [
                "rollout.name=vllm", "trainer.controller=ray", "strategy.name=fsdp", "strategy.num_processes=1",
                f"strategy.device={device}", f"trainer.total_steps={steps}", "trainer.val_before_train=false",
                "trainer.val_every=0", "trainer.save_every=0", "data.arith.val_size=8", "trainer.progress=false",
                "logger.backends=[]", f"trainer.runs_root={runs}", "data.train_batch_size=16",
                "rollout.vllm.enforce_eager=true",  # a short run: no CUDA-graph capture at engine start
            ])
            trainer = Trainer(cfg, callbacks=[probe])
            trainer.fit()
    finally:
        ray.shutdown()
    last = trainer.history[-1]
    return {**probe.seen, "steps": len(trainer.history),
            **{k.removeprefix("timing_s/"): v for k, v in last.items() if k.startswith("timing_s/")}}
