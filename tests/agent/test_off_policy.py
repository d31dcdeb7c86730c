"""trainer.pipeline=one_step_off and async with an agent loop (docs/pipelines.md): the agent rollout stage's
generation (loops, tools, the engine handle's waves) runs in the rollout thread with the engine's own weights, on the
schedule of the built-in rollout stage; each lagged batch is the batch the synchronous agent stage generates from the
same prompts, weights and seed; agent metrics and validation through the loop work; a resume is bit-identical."""

from __future__ import annotations

import copy
import threading
from types import SimpleNamespace

import pytest
import torch

from rlforge import Trainer, hookimpl, load_config
from rlforge import batch as B
from rlforge.agent.batching import AGENT_REWARDS
from rlforge.agent.stage import AgentRolloutStage
from rlforge.dataflow import RolloutStage, Stage
from rlforge.errors import ConfigError
from rlforge.testing import fake_controller
from tests.test_pipeline import ASYNC, OFF, SCHEDULES, Prompts, Versions, _gap, _log_probs, _weights
from tests.test_resume import StopAt

pytestmark = pytest.mark.slow

# the shipped agentic preset (tiny-agent calls the calculator), small; wave_wait_s above tool_timeout_s: waves never
# depend on timing, so sampled runs (temperature 1) are reproducible
TOOL_AGENT = ["data.train_batch_size=4", "rollout.n=2", "actor.ppo_mini_batch_size=4", "data.arith_tool.val_size=4",
              "rollout.val_n=1", "trainer.val_every=2", "trainer.save_every=0",
              "trainer.progress=false", "trainer.val_before_train=false", "logger.backends=[console]",
              "actor.lr=1e-3", "actor.entropy_coeff=0.05", "rollout.agent.wave_wait_s=30"]  # the entropy bonus: every
# update changes the weights, also when no sample is rewarded
AGENT_METRICS = ("num_turns/mean", "tool_call_counts/mean", "agent/engine_calls", "agent/wave_size/mean",
                 "agent/reward/mean", "timing_s/agent_reward")


def _config(tmp_path, *extra):
    return load_config("grpo", [f"trainer.runs_root={tmp_path}", *TOOL_AGENT, *extra], config_file="builtin:agentic")


class Calls:
    """Every call of the agent stage's generation: the thread, the prompts, the sampling parameters, the output."""

    def __init__(self, monkeypatch):
        self.calls = []
        original = AgentRolloutStage.rollout

        def record(stage, run, batch, params):
            out, metrics = original(stage, run, batch, params)
            self.calls.append((threading.current_thread().name, batch, params, out))
            return out, metrics

        monkeypatch.setattr(AgentRolloutStage, "rollout", record)

    def of(self, out):
        return next(c for c in self.calls if c[3] is out or torch.equal(c[3][B.INPUT_IDS], out[B.INPUT_IDS]))


class Outputs:
    """The generated batch (as the rollout stage returned it) of each step, and the validation metrics."""

    def __init__(self):
        self.batches, self.validations = {}, []

    @hookimpl
    def rlforge_rollout_end(self, trainer, batch):
        self.batches[trainer.step] = batch

    @hookimpl
    def rlforge_validation_end(self, metrics):
        self.validations.append(metrics)


SCHEDULE_CASES = {"one_step_off": (OFF,), "async-2": (ASYNC, "trainer.max_staleness=2")}


@pytest.mark.parametrize("case", [pytest.param("one_step_off", marks=pytest.mark.learning_matrix), "async-2"])
def test_a_tool_agent_runs_ahead_on_the_schedule(tmp_path, monkeypatch, case):
    pipeline = SCHEDULE_CASES[case]
    versions, staleness, ahead = SCHEDULES[pipeline]
    calls, rec, outs = Calls(monkeypatch), Versions(), Outputs()
    trainer = Trainer(_config(tmp_path, *pipeline, "trainer.total_steps=5"), callbacks=[rec, outs])
    summary = trainer.fit()
    assert summary["steps"] == 5
    assert trainer.flow.names()[:3] == ["rollout", "reward", "agent_reward"]
    stage = trainer.flow.stages[0]
    assert type(stage).__name__ == "LaggedRollout" and isinstance(stage.source, AgentRolloutStage)
    # each sample's policy version, and the lag, as scheduled (the table of tests/test_pipeline.py)
    assert {s: sorted(set(b[B.POLICY_VERSION].tolist())) for s, b in rec.trained.items()} == {
        s: [v] for s, v in versions.items()}
    assert [h["async/staleness/max"] for h in trainer.history] == staleness
    assert [h["async/buffer/size"] for h in trainer.history] == ahead
    for h in trainer.history:  # the agent metrics of the batch trained on, and the agent rewards added
        assert all(k in h for k in AGENT_METRICS), sorted(h)
    assert sum(h["tool_call_counts/mean"] for h in trainer.history) > 0  # the calculator was called
    # step 1 generates its batch itself; every later one was generated in the rollout thread, ahead
    threads = {s: calls.of(b)[0] for s, b in outs.batches.items()}
    assert threads[1] == "MainThread" and all(t.startswith("rlforge-rollout") for s, t in threads.items() if s > 1)
    # validation (after steps 2 and 4, and the final one) ran the agent loop, in the trainer's thread
    assert [c[0] for c in calls.calls].count("MainThread") == 1 + 3
    assert len(outs.validations) == 3 and all("val/num_turns/mean" in m for m in outs.validations)
    model = copy.deepcopy(trainer.module.actor)  # the local controller's driver trains the actor
    for step, batch in rec.trained.items():
        mask = batch[B.RESPONSE_MASK]
        # the engine's log-probs are those of the weights of the scheduled version, and of no other
        gaps = {v: _gap(batch[B.ROLLOUT_LOG_PROBS], _log_probs(trainer, model, w, batch), mask)
                for v, w in rec.weights.items()}
        assert [v for v, gap in gaps.items() if gap < 1e-4] == [versions[step]], (step, gaps)
        # the synchronous agent stage, given the same prompts, weights and seed, generates the very same batch: the
        # same tokens, masks (0 on tool replies and template glue), log-probs and agent rewards
        _, prompts, params, out = calls.of(outs.batches[step])
        assert params.seed is not None
        again, _ = AgentRolloutStage().rollout(_engine(trainer, rec.weights[versions[step]]), prompts, params)
        for key in (B.INPUT_IDS, B.RESPONSES, B.RESPONSE_MASK, B.ATTENTION_MASK, AGENT_REWARDS):
            assert torch.equal(again[key], out[key]), (step, key)
        assert _gap(again[B.ROLLOUT_LOG_PROBS], out[B.ROLLOUT_LOG_PROBS], out[B.RESPONSE_MASK]) < 1e-4  # (fp32 noise)
    assert any(bool(((b[B.RESPONSE_MASK][:, 1:] - b[B.RESPONSE_MASK][:, :-1]) == 1).any())
               for b in rec.trained.values())  # some trajectories got a tool reply (a 0-run inside the mask)


def _engine(trainer, weights):
    """What the synchronous agent stage needs of a run, with a new ``hf`` engine holding ``weights``."""
    model = copy.deepcopy(trainer.module.actor)
    model.load_state_dict(weights)
    engine = trainer.plugins.registry.rollout.get("hf")(trainer.config, model, trainer.module.tokenizer)
    return SimpleNamespace(config=trainer.config, builder=trainer.builder, module=trainer.module,
                           controller=fake_controller(generate_tokens=engine.generate_tokens))


def test_a_simulated_user_runs_ahead(tmp_path):
    """The interaction loop (arith_tutor, on the default task and model) with one_step_off."""
    rec = Versions()
    cfg = load_config("grpo", [f"trainer.runs_root={tmp_path}", OFF, "data.train_batch_size=4", "rollout.n=2",
                               "actor.ppo_mini_batch_size=4", "data.arith.train_size=512", "data.arith.val_size=4", "trainer.val_every=0",
                               "trainer.progress=false", "trainer.val_before_train=false", "logger.backends=[console]",
                               "trainer.total_steps=3", "rollout.max_new_tokens=40", "rollout.agent.loop=interaction",
                               "rollout.agent.interaction=arith_tutor", "rollout.agent.max_turns=3", "actor.lr=1e-3"])
    trainer = Trainer(cfg, callbacks=[rec])
    trainer.fit()
    assert {s: b[B.POLICY_VERSION].unique().tolist() for s, b in rec.trained.items()} == {1: [0], 2: [0], 3: [1]}
    assert all("agent/model_turns/max" in h and "agent/reward/mean" in h for h in trainer.history)


def test_resume_with_a_tool_agent_is_bit_identical(tmp_path):
    """async with max_staleness 2: the checkpoint of step 2 holds the agent batches of steps 3 and 4 (and their agent
    metrics); the resumed run trains on them and continues bit for bit."""
    common = [ASYNC, "trainer.max_staleness=2", "trainer.total_steps=4", "trainer.save_every=2",
              "trainer.keep_last_n=0", "trainer.val_every=0"]
    seen_full, seen_resumed = Prompts(), Prompts()
    full = Trainer(_config(tmp_path / "a", *common), callbacks=[seen_full])
    full.fit()
    with pytest.raises(KeyboardInterrupt):
        Trainer(_config(tmp_path / "b", *common), callbacks=[StopAt(3)]).fit()
    resumed = Trainer(_config(tmp_path / "b", *common, "trainer.resume=auto"), callbacks=[seen_resumed])
    resumed.fit()
    assert seen_resumed.uids == {s: u for s, u in seen_full.uids.items() if s > 2}
    a, b = _weights(full.run_dir, 4), _weights(resumed.run_dir, 4)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("critic/score/mean", "actor/pg_loss", "async/policy_version", "num_turns/mean", "tool_call_counts/mean",
            "agent/engine_calls", "agent/reward/mean")
    assert [[h[k] for k in keys] for h in full.history[2:]] == [[h[k] for k in keys] for h in resumed.history]


class RunOverride(RolloutStage):
    def run(self, ctx, batch):
        return super().run(ctx, batch)


class NotARolloutStage(Stage):
    name = "rollout"
    requires, produces = RolloutStage.requires, RolloutStage.produces


@pytest.mark.parametrize(("stage", "says"), [
    (RunOverride, "has RunOverride instead, which overrides run\\(\\) .*override rollout\\(\\), or use "
                  "trainer.pipeline=sync"),
    (NotARolloutStage, "has NotARolloutStage instead, which is no RolloutStage"),
])
def test_a_rollout_stage_it_cannot_run_ahead_is_refused_before_any_model_loads(tmp_path, stage, says):
    class Replace:
        @hookimpl
        def rlforge_before_flow_compile(self, flow):
            flow.replace(Stage.ROLLOUT, stage())

    trainer = Trainer(load_config("grpo", [f"trainer.runs_root={tmp_path}", OFF]), callbacks=[Replace()])
    with pytest.raises(ConfigError, match=f"^{OFF} runs the generation of the rollout stage .*{says}"):
        trainer.fit()
    assert trainer.module.actor is None
