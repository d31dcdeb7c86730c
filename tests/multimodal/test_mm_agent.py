"""Agent loops on rows with images (builtin:tiny-vlm on the counting task): every request of a trajectory carries its
row's images, prompts rendered again (with tool schemas) go through the processor, and the engine's log-probs of
every model turn equal the trainer's recomputation over the assembled multi-turn batch with the images."""

from __future__ import annotations

import pytest
import torch

from rlforge import batch as B
from rlforge import load_config
from rlforge.agent import AgentLoop, Conversation
from rlforge.agent.types import AgentLoopError
from rlforge.build import Builder
from rlforge.data import collate, tokenize_rows
from rlforge.ops import response_logprobs
from rlforge.plugins.data.vision import vision_rows
from rlforge.sampling import SamplingParams

OVERRIDES = ["model.path=builtin:tiny-vlm", "data.name=vision", "data.max_prompt_length=48",
             "rollout.max_new_tokens=24", "rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor",
             "rollout.agent.max_turns=3", "rollout.agent.arith_tutor.retry_message=No."]


@pytest.fixture(scope="module")
def setup(pm, vlm):
    model, tok, proc = vlm
    cfg = load_config("grpo", OVERRIDES, plugins=pm)
    rows = vision_rows(6, 4, seed=0)
    batch = collate(tokenize_rows(rows, tok, 48, True, "val", processor=proc), tok.pad_token_id,
                    list(range(len(rows))))
    hf = pm.registry.rollout.get("hf")(cfg, model, tok)
    return cfg, model, tok, proc, batch, hf


def _gap(model, out) -> float:
    recomputed, _ = response_logprobs(model, out[B.INPUT_IDS], out[B.ATTENTION_MASK], out[B.RESPONSES].shape[1],
                                      multi_modal=out.lists[B.MULTI_MODAL_INPUTS])
    return ((recomputed - out[B.ROLLOUT_LOG_PROBS]).abs() * out[B.RESPONSE_MASK]).max().item()


@pytest.mark.slow
def test_multi_turn_trajectories_on_image_rows_match_the_trainer(setup, pm) -> None:
    cfg, model, tok, proc, batch, hf = setup
    runner = Builder(cfg, pm).agent(tok, proc)
    torch.manual_seed(0)
    out, metrics = runner.rollout(batch, SamplingParams(n=4, temperature=1.0, max_new_tokens=24), hf.generate_tokens)
    assert metrics["agent/model_turns/max"] > 1  # the tutor's "No." was answered: later turns saw the image
    image = proc.image_token_id
    for i, inputs in enumerate(out.lists[B.MULTI_MODAL_INPUTS]):  # each row keeps its own image and image tokens
        tokens = int(inputs["image_grid_thw"].prod(-1).sum()) // proc.image_processor.merge_size ** 2
        assert (out[B.PROMPTS][i] == image).sum().item() == tokens and not (out[B.RESPONSES][i] == image).any()
    assert _gap(model, out) < 1e-4


@pytest.mark.slow
def test_a_prompt_rendered_again_with_tool_schemas_keeps_the_images(setup, pm) -> None:
    cfg, model, tok, proc, batch, hf = setup
    cfg = load_config("grpo", [*OVERRIDES, "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]"],
                      plugins=pm)
    runner = Builder(cfg, pm).agent(tok, proc)
    out, _ = runner.rollout(batch, SamplingParams(n=1, temperature=0.0, max_new_tokens=24), hf.generate_tokens)
    # the tiny template writes no tool schemas: the prompt rendered again with them is the loader's, images included
    assert torch.equal(out[B.PROMPTS], batch[B.PROMPTS]) and _gap(model, out) < 1e-4


class _TextOnly(AgentLoop):
    """A loop that renders its own prompt from the text alone: the image tokens are missing."""

    async def run(self, sample, engine):
        conv = Conversation(self.context, sample)
        conv.prompt_ids = self.context.chat.encode("How many squares?")
        await conv.generate(engine)
        return conv.finish()


def test_a_request_without_the_rows_image_tokens_is_refused(setup, pm) -> None:
    cfg, model, tok, proc, batch, hf = setup
    runner = Builder(cfg, pm).agent(tok, proc)
    runner.loop = _TextOnly(cfg, runner.context)
    with pytest.raises(AgentLoopError, match=r"holds 0 image tokens, but the row's images take \d+: a prompt for a "
                                             r"row with images is rendered by the model's processor"):
        runner.rollout(batch.select([0]), SamplingParams(n=1, temperature=0.0, max_new_tokens=4), hf.generate_tokens)


def test_an_opening_without_the_placeholders_names_the_image_column(setup, pm) -> None:
    cfg, model, tok, proc, batch, hf = setup
    runner = Builder(cfg, pm).agent(tok, proc)

    class Opening(AgentLoop):
        async def run(self, sample, engine):
            return Conversation(self.context, sample, opening=[{"role": "user", "content": "Count."}]).finish()

    runner.loop = Opening(cfg, runner.context)
    with pytest.raises(AgentLoopError, match=r"has 0 <image> placeholder\(s\) but column 'images' \(data.image_key\) "
                                             r"holds 1 image"):
        runner.rollout(batch.select([0]), SamplingParams(n=1, temperature=0.0, max_new_tokens=4), hf.generate_tokens)


@pytest.mark.slow
def test_a_fit_with_a_multi_turn_loop_on_the_vision_task(tmp_path) -> None:
    """The whole step (the agentic rollout stage, the reference and update passes) on the image rows."""
    import json

    from rlforge.cli import main

    assert main(["fit", "--algo", "grpo", "--config", "builtin:vision", f"trainer.runs_root={tmp_path}",
                 "trainer.total_steps=2", "trainer.val_every=2", "data.train_batch_size=4", "rollout.n=4",
                 "actor.ppo_mini_batch_size=4", "actor.use_kl_loss=true", "rollout.max_new_tokens=16",
                 "data.vision.train_size=8", "data.vision.val_size=4", "logger.backends=[console]",
                 "rollout.agent.record_trajectories=true", *OVERRIDES[4:]]) == 0
    run = next(tmp_path.glob("vision/*"))
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    records = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    turns = [sum(s["role"] == "assistant" for s in r["spans"]) for r in records]
    assert max(turns) > 1 and all(r["prompt_ids"].count(104) > 0 for r in records)  # 104: the tiny model's image pad


def test_verls_own_loops_refuse_rows_with_images(setup, pm) -> None:
    pytest.importorskip("verl", reason="verl is not installed (scripts/setup.sh test installs it)")
    cfg, model, tok, proc, batch, hf = setup
    cfg = load_config("grpo", [*OVERRIDES[:4], "rollout.agent.loop=verl_agent"], plugins=pm)
    runner = Builder(cfg, pm).agent(tok, proc)
    with pytest.raises(AgentLoopError, match=r"the row has images: rlforge runs verl's agent loops on text rows only "
                                             r".*rollout.agent.loop=tool_agent, interaction or your own"):
        runner.rollout(batch.select([0]), SamplingParams(n=1, temperature=0.0, max_new_tokens=4), hf.generate_tokens)
