"""trainer.pipeline=partial (rlforge/pipeline/partial.py, docs/pipelines.md): responses decoded segment by segment
across steps are those of one decoding, groups train once all their responses have ended, the lag stays in its
bound, a resume continues the carried rows exactly, and what the pipeline cannot serve is refused."""

from __future__ import annotations

import math

import pytest
import torch
from safetensors.torch import load_file

from rlforge import Trainer, hookimpl
from rlforge import batch as B
from rlforge.data import collate, tokenize_rows
from rlforge.errors import ConfigError
from rlforge.pipeline.base import Pipeline
from rlforge.pipeline.off_policy import batch_state
from rlforge.pipeline.partial import ENDED, PartialRollouts, engine_prompts, extend, finish
from rlforge.sampling import SamplingParams
from rlforge.testing import fake_controller, fast_config, step_context
from tests.test_pipeline import Prompts
from tests.test_resume import StopAt

PARTIAL = "trainer.pipeline=partial"


def _rows():
    """Two rows: prompt [5, 6] with response [7] so far, prompt [9] with none."""
    rows = B.Batch({B.PROMPTS: torch.tensor([[5, 6], [0, 9]]), B.PROMPT_MASK: torch.tensor([[1, 1], [0, 1]]),
                    B.RESPONSES: torch.tensor([[7]]).repeat(2, 1), B.RESPONSE_MASK: torch.tensor([[1], [0]]),
                    B.ROLLOUT_LOG_PROBS: torch.tensor([[-0.5], [0.0]]), ENDED: torch.tensor([False, False])},
                   {B.UID: ["a", "b"]})
    return rows


def test_segments_append_to_the_responses_so_far():
    rows = _rows()
    prompts = engine_prompts(rows, torch.tensor([1, 0]))
    assert prompts[B.PROMPTS].tolist() == [[5, 6, 7], [0, 0, 9]] and prompts[B.PROMPT_MASK].tolist() == [[1, 1, 1],
                                                                                                       [0, 0, 1]]
    out = extend(rows, {0: (torch.tensor([8, 2]), torch.tensor([-1.0, -2.0]), True),
                        1: (torch.tensor([4]), torch.tensor([-3.0]), False)})
    assert out[B.RESPONSES].tolist() == [[7, 8, 2], [4, 0, 0]]
    assert out[B.RESPONSE_MASK].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert out[B.ROLLOUT_LOG_PROBS].tolist() == [[-0.5, -1.0, -2.0], [-3.0, 0.0, 0.0]]
    assert out[ENDED].tolist() == [True, False]
    done = finish(out.select([1]), pad=99)
    assert done[B.RESPONSES].tolist() == [[4]] and ENDED not in done  # cut to the longest row, padded with pad
    assert done[B.INPUT_IDS].tolist() == [[0, 9, 4]] and done[B.ATTENTION_MASK].tolist() == [[0, 1, 1]]


def _engine(cfg):
    from rlforge.build import Builder
    from rlforge.plugin_manager import PluginManager

    pm = PluginManager()
    module = pm.registry.algorithm.get("grpo")(cfg)
    module.configure_model()
    engine = pm.registry.rollout.get("hf")(cfg, module.actor, module.tokenizer)
    rows = pm.registry.dataset.get("arith")(cfg, "val")[:12]
    prompts = collate(tokenize_rows(rows, module.tokenizer, 64, True, "t"), module.tokenizer.pad_token_id,
                      [f"p{i}" for i in range(12)])
    return module, engine, prompts, Builder(cfg, pm)


@pytest.mark.parametrize("least", [0, 5])
def test_greedy_segments_give_the_responses_of_one_decoding(tmp_path, least):
    """Frozen weights, greedy: every response decoded 3 tokens per step, across steps, is the one decoding of the
    prompt gives, with the same log-probs; each group trains once, when all its rows have ended. A minimum length
    (rollout.min_new_tokens) counts over the whole response, not per segment."""
    cfg = fast_config("grpo", tmp_path, PARTIAL, "trainer.partial_tokens=3", "rollout.max_new_tokens=7",
                      f"rollout.min_new_tokens={least}")
    module, engine, prompts, builder = _engine(cfg)
    greedy = SamplingParams(n=2, temperature=0.0, max_new_tokens=7, min_new_tokens=least)
    whole = engine.generate(prompts, greedy)
    pipeline = PartialRollouts(cfg)
    controller = fake_controller(generate=engine.generate)
    trained, carried = {}, []
    for step in range(1, 7):  # two new prompts a step
        ctx = step_context(cfg, controller=controller, module=module, step=step, sampling=greedy, builder=builder)
        out, metrics = pipeline.rollout(ctx, prompts.select([2 * step - 2, 2 * step - 1]))
        carried.append(metrics["partial/carried_out"])
        for i, uid in enumerate(out[B.UID]):
            trained.setdefault(uid, []).append((step, out.select([i])))
        assert metrics["partial/lag/max"] <= math.ceil(7 / 3) - 1
    assert len(trained) >= 4 and (least or max(carried) > 0)  # most groups ended; without a minimum, some spanned steps
    for i, uid in enumerate(whole[B.UID]):
        if uid not in trained:
            continue
        rows = trained[uid]
        assert len(rows) == 2 and len({s for s, _ in rows}) == 1  # the group's two rows, in one step
        step, row = rows[0]
        n = int(whole[B.RESPONSE_MASK][i].sum())
        assert row[B.RESPONSES][0, :n].tolist() == whole[B.RESPONSES][i, :n].tolist()
        assert int(row[B.RESPONSE_MASK][0].sum()) == n
        torch.testing.assert_close(row[B.ROLLOUT_LOG_PROBS][0, :n], whole[B.ROLLOUT_LOG_PROBS][i, :n],
                                   atol=1e-4, rtol=0)


class Versions:
    """Each trained batch's policy versions and the rows' response lengths."""

    def __init__(self):
        self.versions, self.groups = {}, {}

    @hookimpl
    def rlforge_advantage_end(self, trainer, batch):
        self.versions[trainer.step] = batch[B.POLICY_VERSION].tolist()
        self.groups[trainer.step] = list(batch[B.UID])


@pytest.mark.slow
def test_a_run_trains_whole_groups_within_the_lag_bound(tmp_path):
    rec = Versions()
    trainer = Trainer(fast_config("grpo", tmp_path, PARTIAL, "trainer.partial_tokens=2", "trainer.total_steps=4",
                                  "actor.lr=1e-3"), callbacks=[rec])
    trainer.fit()
    bound = math.ceil(trainer.config.rollout.max_new_tokens / 2) - 1
    for step, versions in rec.versions.items():
        assert all(step - 1 - bound <= v <= step - 1 for v in versions), (step, versions)
        counts = {u: rec.groups[step].count(u) for u in rec.groups[step]}
        assert set(counts.values()) == {trainer.config.rollout.n}  # whole groups only
    assert any(v < s - 1 for s, vs in rec.versions.items() for v in vs)  # some rows did span an update
    assert [type(s).__name__ for s in trainer.flow.stages[:4:3]] == ["PartialRolloutStage", "RecomputedOldLogProb"]
    assert all(h["partial/trained_rows"] > 0 for h in trainer.history)


@pytest.mark.slow
def test_resume_continues_the_carried_rows_bit_identically(tmp_path):
    """A run stopped at step 3 and resumed from its checkpoint of step 2 (which holds the rows carried into step 3)
    trains on the same groups as an uninterrupted run and ends with the same weights bit for bit."""
    def config(path, *extra):
        return fast_config("grpo", path, PARTIAL, "trainer.partial_tokens=2", *extra)

    common = ["trainer.total_steps=4", "trainer.save_every=2", "trainer.keep_last_n=0", "actor.lr=1e-4"]
    seen_full, seen_resumed = Prompts(), Prompts()
    full = Trainer(config(tmp_path / "a", *common), callbacks=[seen_full])
    full.fit()
    with pytest.raises(KeyboardInterrupt):
        Trainer(config(tmp_path / "b", *common), callbacks=[StopAt(3)]).fit()
    state = torch.load(next((tmp_path / "b").rglob("step_000002")) / "trainer_state.pt", weights_only=True)
    assert state["pipeline"]["carried"] is not None  # rows were carried over the checkpoint
    resumed = Trainer(config(tmp_path / "b", *common, "trainer.resume=auto"), callbacks=[seen_resumed])
    resumed.fit()
    assert seen_resumed.uids == {s: u for s, u in seen_full.uids.items() if s > 2}

    def weights(run):
        return load_file(str(run.run_dir / "checkpoints" / "step_000004" / "actor" / "model.safetensors"))

    a, b = weights(full), weights(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    keys = ("critic/score/mean", "actor/pg_loss", "partial/carried_in")
    assert [[h[k] for k in keys] for h in full.history[2:]] == [[h[k] for k in keys] for h in resumed.history]


@pytest.mark.parametrize(("extra", "says"), [
    (["trainer.partial_tokens=4"], "trainer.partial_tokens=4 is an option of trainer.pipeline=partial; "
                                   "trainer.pipeline=sync has none"),
    (["trainer.pipeline=async", "trainer.partial_tokens=4"], "is an option of trainer.pipeline=partial; "
                                                              "trainer.pipeline=async has none"),
    ([PARTIAL, "trainer.max_staleness=2"], "is an option of trainer.pipeline=async; trainer.pipeline=partial"),
    ([PARTIAL, "trainer.partial_tokens=16", "rollout.max_new_tokens=16"], "is not below rollout.max_new_tokens=16"),
    ([PARTIAL, "actor.reuse_rollout_log_probs=true"], "old log-probs must be recomputed"),
    ([PARTIAL, "rollout.agent.loop=tool_agent"], r"an agent loop \(rollout.agent.loop=tool_agent\) runs whole turns"),
])
def test_what_partial_cannot_serve_is_refused_at_compose(tmp_path, extra, says):
    with pytest.raises(ConfigError, match=says):
        fast_config("grpo", tmp_path, *extra)


@pytest.mark.parametrize(("algo", "says"), [("dapo", "stage 'dynamic_sampling'"), ("remax", "stage 'greedy_baseline'")])
def test_stages_that_generate_during_the_step_are_refused(tmp_path, algo, says):
    trainer = Trainer(fast_config(algo, tmp_path, PARTIAL))
    with pytest.raises(ConfigError, match=f"trainer.pipeline=partial: {says}"):
        trainer.build_flow(trainer.builder.module(None))


def test_the_default_segment_is_a_quarter_of_the_responses(tmp_path):
    cfg = fast_config("grpo", tmp_path, PARTIAL, "rollout.max_new_tokens=64")
    assert PartialRollouts(cfg).segment == 16


def test_the_trained_rows_split_evenly_over_the_data_parallel_ranks():
    """Three ended groups of 3 rows over 2 ranks: the newest waits (9 rows would not split); one rank takes all."""
    rows = B.Batch({ENDED: torch.tensor([True] * 9 + [False])}, {B.UID: [*"aaabbbccc", "d"]})
    assert PartialRollouts._trainable(rows, 2).tolist() == [True] * 6 + [False] * 4
    assert PartialRollouts._trainable(rows, 1).tolist() == [True] * 9 + [False]


def test_a_resume_that_cannot_hold_the_carried_responses_is_refused(tmp_path):
    rows = _rows()
    rows = extend(rows, {0: (torch.tensor([8, 9]), torch.tensor([-1.0, -1.0]), False)})  # 3 tokens so far
    pipeline = PartialRollouts(fast_config("grpo", tmp_path, PARTIAL, "trainer.partial_tokens=1",
                                           "rollout.max_new_tokens=2"))
    with pytest.raises(ConfigError, match=r"responses of up to 3 tokens .* resume with rollout.max_new_tokens >= 3"):
        pipeline.load_state_dict({"carried": batch_state(rows)}, 2)


def test_a_pipeline_that_does_not_continue_the_carried_rows_says_they_are_dropped(tmp_path, capsys):
    Pipeline(fast_config("grpo", tmp_path)).load_state_dict({"carried": batch_state(_rows())}, 2)
    assert "rlforge: warning: the checkpoint holds samples of another trainer.pipeline (carried)" in \
        capsys.readouterr().err
    Pipeline(fast_config("grpo", tmp_path)).load_state_dict({}, 2)
    assert capsys.readouterr().err == ""


def test_the_default_segment_is_named_when_it_is_too_long(tmp_path):
    with pytest.raises(ConfigError, match=r"trainer.partial_tokens \(unset: 1, a quarter .*\) is not below "
                                          r"rollout.max_new_tokens=1, .* Use trainer.pipeline=sync"):
        fast_config("grpo", tmp_path, PARTIAL, "rollout.max_new_tokens=1")


def test_eval_of_a_partial_run_takes_any_max_new_tokens(tmp_path, capsys):
    """Evaluation does not train: a partial run's folder evaluates with a rollout.max_new_tokens below its
    partial_tokens (the pipeline's own check would refuse that in training)."""
    import json

    from rlforge.cli import main

    trainer = Trainer(fast_config("grpo", tmp_path, PARTIAL, "trainer.partial_tokens=3", "rollout.max_new_tokens=7",
                                  "trainer.total_steps=1", "trainer.save_every=1"))
    trainer.fit()
    out = tmp_path / "eval.json"
    assert main(["eval", str(trainer.run_dir), "--out", str(out), "--limit", "2", "rollout.max_new_tokens=2"]) == 0
    assert json.loads(out.read_text())["max_new_tokens"] == 2
