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


def _gap(model, out, remove_padding=False) -> float:
    recomputed, _ = response_logprobs(model, out[B.INPUT_IDS], out[B.ATTENTION_MASK], out[B.RESPONSES].shape[1],
                                      multi_modal=out.lists[B.MULTI_MODAL_INPUTS], remove_padding=remove_padding)
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
    with pytest.raises(AgentLoopError, match=r"holds 0 image tokens, but its images take \d+: each image token "
                                             r"stands for a part of an image"):
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


# --- inserted turns that show images (a tool's crop of the picture) ------------------------------------------------
def _crop(sample):
    return sample.multi_modal["images"][0].crop((0, 0, 56, 56))  # 56 x 56 pixels: 4 image tokens


class _Insert(AgentLoop):
    """Answer, get ``message(sample)`` inserted, answer again."""

    @staticmethod
    def message(sample):
        raise NotImplementedError  # abstract

    async def run(self, sample, engine):
        conv = self.conversation(sample)
        await conv.generate(engine)
        if conv.add_messages([self.message(sample)]):
            await conv.generate(engine)
        return conv.finish()


class _Zoom(_Insert):
    """A tool reply showing a crop of the row's image."""

    @staticmethod
    def message(sample):
        return {"role": "tool", "content": "<image>Zoomed.", "images": [_crop(sample)]}


def _two_turn_runner(pm, tok, proc, loop, max_new_tokens, *extra):
    cfg = load_config("grpo", [*OVERRIDES[:3], f"rollout.max_new_tokens={max_new_tokens}",
                               "rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]", *extra], plugins=pm)
    runner = Builder(cfg, pm).agent(tok, proc)
    runner.loop = loop(cfg, runner.context)
    return runner


@pytest.mark.slow
def test_a_tool_reply_with_an_image_is_seen_by_later_turns_and_trained_with_them(setup, pm) -> None:
    import json

    from rlforge.agent.record import AGENT_RECORD

    _, model, tok, proc, batch, hf = setup
    runner = _two_turn_runner(pm, tok, proc, _Zoom, 48, "rollout.agent.record_trajectories=true")
    torch.manual_seed(0)
    out, metrics = runner.rollout(batch, SamplingParams(n=2, temperature=1.0, max_new_tokens=48), hf.generate_tokens)
    assert metrics["agent/model_turns/mean"] == 2
    image = proc.image_token_id
    for i, inputs in enumerate(out.lists[B.MULTI_MODAL_INPUTS]):  # the row's picture, then the crop
        assert inputs["image_grid_thw"].shape[0] == 2 and inputs["image_grid_thw"][1].tolist() == [1, 4, 4]
        in_response = out[B.RESPONSES][i] == image
        assert in_response.sum().item() == 4 and not (out[B.RESPONSE_MASK][i].bool() & in_response).any()
    assert out.lists[B.MULTI_MODAL_INPUTS][0] is not batch.lists[B.MULTI_MODAL_INPUTS][0]  # the rows' own untouched
    assert batch.lists[B.MULTI_MODAL_INPUTS][0]["image_grid_thw"].shape[0] == 1
    assert _gap(model, out) < 1e-4  # every model turn: the engine saw what the trainer sees
    assert _gap(model, out, remove_padding=True) < 1e-4  # packed (model.remove_padding) too
    record = json.loads(json.dumps(out[AGENT_RECORD][0]))  # the record stays JSON: the images are counted
    assert record["spans"][1]["messages"] == [{"role": "tool", "content": "<image>Zoomed.", "images": 1}]


@pytest.mark.parametrize("message, error", [
    (lambda sample: {"role": "tool", "content": "Zoomed.", "images": [_crop(sample)]},
     r"message 0 \(tool\) has 1 image\(s\) in 'images' and 0 <image> placeholder\(s\) in its content"),
    (lambda sample: {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "this?"}]},
     r"message 0 \(user\) has an image part but no 'images'"),
])
def test_inserted_images_must_match_their_placeholders(setup, pm, message, error) -> None:
    _, _, tok, proc, batch, hf = setup
    runner = _two_turn_runner(pm, tok, proc, type("Bad", (_Insert,), {"message": staticmethod(message)}), 24)
    with pytest.raises(AgentLoopError, match=error):
        runner.rollout(batch.select([0]), SamplingParams(n=1, temperature=0.0, max_new_tokens=4), hf.generate_tokens)


def _tool_replies(pm, tok, proc, tool, sample, name=None):
    import asyncio

    from rlforge.agent.chat import ChatFormat
    from rlforge.agent.toolbox import Toolbox
    from rlforge.agent.types import ParsedTurn, ToolCall, ToolStats

    cfg = load_config("grpo", ["rollout.agent.loop=tool_agent", "rollout.agent.tools=[calculator]"], plugins=pm)
    name = name or tool.name
    box = Toolbox({name: tool}, cfg.rollout.agent)

    async def go():
        async with box.session(sample, ChatFormat(tok, processor=proc), ToolStats()) as session:
            return (await session.run(ParsedTurn("", [ToolCall(name, {}, "")])))[0]

    try:
        return asyncio.run(go())
    finally:
        box.close()


def test_tools_reply_with_images_for_a_vision_model_and_errors_otherwise(setup, pm) -> None:
    from rlforge.agent import Tool
    from rlforge.agent.runner import samples
    from rlforge.agent.types import ToolResult

    _, _, tok, proc, batch, _ = setup
    sample = samples(batch.select([0]))[0]

    class Zoom(Tool):
        name = "zoom"

        def __init__(self, text, image=None):
            super().__init__(None)
            self.text, self.image = text, image

        def execute(self, arguments, state):
            return ToolResult(self.text, images=[_crop(sample) if self.image is None else self.image])

    (reply,) = _tool_replies(pm, tok, proc, Zoom("the corner"), sample)
    assert reply["content"] == "<image>the corner" and reply["images"][0].size == (56, 56)
    # images the processor refuses, or that are no image, are the tool's errors: a reply, never a stopped run
    from PIL import Image

    for image, error in [(Image.new("RGB", (3, 4000)), "an image the model's image processor cannot take (images[0], "
                                                        "3 x 4000 pixels: ValueError: absolute aspect ratio"),
                         (Image.new("RGB", (0, 0)), "cannot take (images[0], 0 x 0 pixels"),
                         ({"bytes": b"no image"}, "images[0] is not a readable image (UnidentifiedImageError: cannot "
                                                  "identify image file <_io.BytesIO object>)")]:
        (bad,) = _tool_replies(pm, tok, proc, Zoom("x", image), sample)
        assert bad["content"].startswith("Error: ") and error in bad["content"] and "images" not in bad
    (text_model,) = _tool_replies(pm, tok, None, Zoom("the corner"), sample)
    assert text_model["content"].startswith("Error: the tool 'zoom' replied with images, which a text model cannot "
                                            "see") and "images" not in text_model
    (marked,) = _tool_replies(pm, tok, proc, Zoom("here: <image>"), sample)
    assert "are shown before the text, which must not mark places for them" in marked["content"]


def test_a_verl_tool_response_with_images_becomes_a_reply_with_images(setup, pm) -> None:
    pytest.importorskip("verl", reason="verl is not installed (scripts/setup.sh test installs it)")
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

    from rlforge.agent.runner import samples
    from rlforge.agent.verl_tools import VerlTool

    _, _, tok, proc, batch, _ = setup
    sample = samples(batch.select([0]))[0]

    class ZoomIn(BaseTool):  # as verl's image zoom-in tool answers: ToolResponse(image=[...], text=...)
        async def execute(self, instance_id, parameters, **kwargs):
            return ToolResponse(image=[_crop(sample)], text="zoomed"), 0.0, {}

    schema = OpenAIFunctionToolSchema.model_validate({"type": "function", "function": {
        "name": "zoom_in", "description": "zoom", "parameters": {"type": "object", "properties": {}}}})
    (reply,) = _tool_replies(pm, tok, proc, VerlTool(None, ZoomIn({}, schema)), sample, "zoom_in")
    assert reply["content"] == "<image>zoomed" and len(reply["images"]) == 1


class _Spell(_Insert):
    """A user turn whose text spells the image-pad token and writes <image>, on image and text rows alike."""

    @staticmethod
    def message(sample):
        return {"role": "user", "content": "Docs: <|image_pad|> marks <image> spots."}


@pytest.mark.slow
def test_inserted_text_never_takes_an_images_place(setup, pm) -> None:
    from tests.multimodal.test_mm_data import mixed_batch

    _, model, tok, proc, _, hf = setup
    runner = _two_turn_runner(pm, tok, proc, _Spell, 64)
    _, batch = mixed_batch(tok, proc)  # a row with an image and a text row, in one wave
    out, metrics = runner.rollout(batch, SamplingParams(n=1, temperature=0.0, max_new_tokens=64), hf.generate_tokens)
    assert metrics["agent/model_turns/mean"] == 2
    assert not (out[B.RESPONSES] == proc.image_token_id).any()  # escaped: "< |image_pad|>"; <image> is text here
    assert "< |image_pad|> marks <image> spots." in tok.decode(out[B.RESPONSES][1])
    assert _gap(model, out) < 1e-4


@pytest.mark.slow
def test_an_openai_agent_on_image_rows_keeps_the_image_and_image_url_parts_are_400s(setup, pm, tmp_path) -> None:
    """The agent sends the row's messages back (their <image> placeholders: the row's images); the endpoint cannot
    take images of its own (an image_url part is a 400 the agent sees)."""
    import textwrap

    pytest.importorskip("openai")
    _, model, tok, proc, batch, hf = setup
    agent_file = tmp_path / "vision_agent.py"
    agent_file.write_text(textwrap.dedent("""
        import openai

        def agent(sample, endpoint):
            api = openai.OpenAI(base_url=endpoint.base_url, api_key=endpoint.api_key, max_retries=0)
            try:
                api.chat.completions.create(model=endpoint.model, messages=[{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}])
            except openai.BadRequestError as exc:
                assert exc.status_code == 400
            else:
                raise AssertionError("an image_url part was accepted")
            first = api.chat.completions.create(model=endpoint.model, messages=sample.messages)
            again = [*sample.messages, {"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "Sure?"}]
            return api.chat.completions.create(model=endpoint.model, messages=again).choices[0].message.content
    """))
    cfg = load_config("grpo", [*OVERRIDES[:4], "rollout.agent.loop=openai_agent",
                               f"rollout.agent.openai_agent.entry={agent_file}:agent"], plugins=pm)
    runner = Builder(cfg, pm).agent(tok, proc)
    try:
        out, metrics = runner.rollout(batch.select([0, 1]), SamplingParams(n=1, temperature=0.0, max_new_tokens=24),
                                      hf.generate_tokens)
    finally:
        runner.close()
    assert metrics["agent/model_turns/mean"] == 2 and torch.equal(out[B.PROMPTS], batch.select([0, 1])[B.PROMPTS])
    assert _gap(model, out) < 1e-4


def test_verls_loops_on_image_rows_are_refused_when_the_data_loads(tmp_path, capsys) -> None:
    pytest.importorskip("verl", reason="verl is not installed (scripts/setup.sh test installs it)")
    from rlforge.cli import main

    assert main(["fit", "--algo", "grpo", "--config", "builtin:vision", f"trainer.runs_root={tmp_path}",
                 "rollout.agent.loop=verl_agent", "data.vision.train_size=8", "data.vision.val_size=4"]) == 2
    assert ("vision (train), row 1: the row has images, but rollout.agent.loop=verl_agent does not take them: rlforge "
            "runs verl's agent loops on text rows only") in capsys.readouterr().err


@pytest.mark.slow
def test_an_interaction_shows_images_in_its_opening_and_its_replies(setup, pm) -> None:
    """An environment that renders its observations: reset() and step() return message dicts with images."""
    from rlforge.agent import Interaction

    class Frames(Interaction):
        name = "frames"

        def reset(self, sample):  # the text spells the image-pad token: escaped, as in inserted turns
            self.sample, self.turn = sample, 0
            return {"content": "<image><|image_pad|>", "images": [_crop(sample)]}

        def step(self, message):  # a frame of another size, and text that is no valid UTF-8
            self.turn += 1
            return {"content": "<image> \ud800", "images": [_crop(self.sample).resize((112, 56))]}, 0.0, self.turn == 2

    _, model, tok, proc, batch, hf = setup
    cfg = load_config("grpo", [*OVERRIDES[:3], "data.max_prompt_length=64", "rollout.max_new_tokens=48",
                               "rollout.agent.loop=interaction", "rollout.agent.interaction=arith_tutor"], plugins=pm)
    runner = Builder(cfg, pm).agent(tok, proc)
    runner.context.new_interaction = lambda: Frames(cfg)
    out, metrics = runner.rollout(batch.select([0, 1]), SamplingParams(n=1, temperature=0.0, max_new_tokens=48),
                                  hf.generate_tokens)
    assert metrics["agent/model_turns/mean"] == 2
    for i, inputs in enumerate(out.lists[B.MULTI_MODAL_INPUTS]):  # in order: the row's, the opening's, the reply's
        assert inputs["image_grid_thw"].tolist() == [[1, 6, 6], [1, 4, 4], [1, 4, 8]]
        assert [image.size for image in inputs["images"]] == [(84, 84), (56, 56), (112, 56)]
        assert (out[B.PROMPTS][i] == proc.image_token_id).sum() == 9 + 4
        assert (out[B.RESPONSES][i] == proc.image_token_id).sum() == 8
    assert _gap(model, out) < 1e-4
