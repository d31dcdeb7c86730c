"""``verl_agent`` loop: verl's own agent loops, unchanged, each row by its ``agent_name``
(docs/agentic.md#verls-agent-loops).

verl 0.9.1 runs every row through the agent loop its ``agent_name`` names (else ``agent.default_agent_loop``): its
built-in ``single_turn_agent`` and ``tool_agent``, or a class of the run's ``agent.agent_loop_config_path`` (a YAML
list of ``{name, _target_, ...}``). Each trajectory builds its loop as verl's ``AgentLoopWorker`` does
(``hydra.utils.instantiate`` with the trainer config, a server manager, the tokenizer, the dataset class, the data
config and verl's tools) and awaits ``run(sampling_params, **row)``. The server manager's ``generate`` is rlforge's
rollout engine (token ids in, token ids and log-probs out, as verl's vLLM server), so continuous batching (vllm) or
waves (hf) apply as for rlforge's own loops. What a loop returns (``AgentLoopOutput``) becomes a
:class:`~rlforge.agent.Trajectory`; the reward function scores it as any trajectory.

Not run, each refused by name when it arises: images, video and audio; a loop that scores its own trajectories
(``reward_score``); a repetition penalty. rlforge's own tools (``rollout.agent.tools``) are not offered to verl's
loops (verl's tools are: ``rollout.agent.tool_config_path`` / ``function_tool_path``)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from rlforge.agent import AgentLoop, Sample, Trajectory, TrajectoryEngine
from rlforge.agent.verl_tools import VerlTool
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.verl_code import INSTALL, search_working_directory

NAME = "verl_agent"


@dataclass
class VerlAgentConfig:
    """The ``verl_agent`` loop (``rollout.agent.verl_agent``): verl's agent loops (docs/agentic.md#verls-agent-
    loops)."""

    default_agent_loop: str = "single_turn_agent"  # the verl loop of rows without agent_name (verl's agent.default_agent_loop)
    agent_loop_config_path: Optional[str] = None  # verl's agent loop config YAML: a list of {name, _target_, ...}, registered beside verl's built-in loops
    config: dict[str, Any] = field(default_factory=dict)  # verl config the loops read, as verl's tree (rollout.agent.verl_agent.config.actor_rollout_ref.rollout.multi_turn.max_user_turns=2), over verl 0.9.1's defaults; the keys rlforge's settings decide come from them


def _owned(config: Any) -> dict[str, Any]:
    """The verl keys rlforge's own settings decide, with their values for this run."""
    r, a, d = config.rollout, config.rollout.agent, config.data
    rollout = "actor_rollout_ref.rollout"
    return {
        "actor_rollout_ref.model.path": config.model.path,
        "data.max_prompt_length": int(d.max_prompt_length), "data.max_response_length": int(r.max_new_tokens),
        "data.apply_chat_template_kwargs": dict(d.apply_chat_template_kwargs),
        f"{rollout}.prompt_length": int(d.max_prompt_length), f"{rollout}.response_length": int(r.max_new_tokens),
        f"{rollout}.n": int(r.n), f"{rollout}.temperature": float(r.temperature), f"{rollout}.top_p": float(r.top_p),
        f"{rollout}.top_k": int(r.top_k) or -1, f"{rollout}.calculate_log_probs": True,
        f"{rollout}.multi_turn.max_assistant_turns": int(a.max_turns),
        f"{rollout}.multi_turn.max_parallel_calls": int(a.max_tool_calls_per_turn),
        f"{rollout}.multi_turn.max_tool_response_length": int(a.max_tool_output_tokens),
        f"{rollout}.multi_turn.tool_response_truncate_side": a.tool_output_truncate_side,
        f"{rollout}.multi_turn.tool_config_path": a.tool_config_path,
        f"{rollout}.multi_turn.function_tool_path": a.function_tool_path,
        f"{rollout}.agent.default_agent_loop": a.verl_agent.default_agent_loop,
        f"{rollout}.agent.agent_loop_config_path": a.verl_agent.agent_loop_config_path,
    }


def verl_config(config: Any) -> Any:
    """The trainer config verl's loops read (``self.config``): verl 0.9.1's defaults (ppo_trainer), then
    ``rollout.agent.verl_agent.config``, then the keys rlforge's own settings decide."""
    from omegaconf import OmegaConf

    from rlforge.config.verl_hydra import load_default

    tree = OmegaConf.merge(OmegaConf.create(load_default("ppo_trainer")), _given(config))
    for key, value in _owned(config).items():
        OmegaConf.update(tree, key, value, force_add=True)
    return tree


def _given(config: Any) -> dict[str, Any]:
    from omegaconf import OmegaConf

    given = OmegaConf.to_container(config.rollout.agent.verl_agent.config, resolve=True)
    return given or {}  # type: ignore[return-value]  # a mapping (the field's type)


def check_config(config: Any) -> None:
    """Keys of ``rollout.agent.verl_agent.config`` that rlforge's own settings decide must agree with them."""
    from rlforge.config.verl_fates import flatten

    given = dict(flatten(_given(config)))
    for key, want in _owned(config).items():
        if key in given and given[key] != want:
            raise ConfigError(f"rollout.agent.verl_agent.config sets '{key}={given[key]}', but this run's own "
                              f"settings make it {want!r}: set it through rlforge's key (docs/agentic.md#verls-agent-"
                              f"loops lists them) and leave it out of verl_agent.config.")


class EngineServer:
    """verl's server manager (``LLMServerClient.generate``) on one trajectory's rlforge engine: token ids in, verl's
    ``TokenOutput`` out. ``max_tokens`` defaults as verl's vLLM server computes it."""

    def __init__(self, engine: TrajectoryEngine, prompt_length: int, response_length: int) -> None:
        self.engine, self.prompt_length, self.response_length = engine, prompt_length, response_length

    async def generate(self, request_id: Any = None, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                       image_data: Any = None, video_data: Any = None, audio_data: Any = None, **kwargs: Any) -> Any:
        from verl.workers.rollout.replica import TokenOutput

        if image_data or video_data or audio_data:
            raise ValueError("the loop sent images, video or audio: rlforge's verl_agent loop runs text models")
        params = dict(sampling_params)
        if float(params.pop("repetition_penalty", 1.0) or 1.0) != 1.0:
            raise ValueError("the loop asked for a repetition penalty, which rlforge's engines do not apply")
        asked = params.pop("max_tokens", params.pop("max_new_tokens", None))
        room = self.engine.handle.max_len - len(prompt_ids)
        if room < 1:
            raise ValueError(f"a prompt of {len(prompt_ids)} tokens leaves no room to generate within "
                             f"{self.engine.handle.max_len} tokens (data.max_prompt_length + rollout.max_new_tokens)")
        if asked is None:
            asked = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        overrides: dict[str, Any] = {"max_new_tokens": max(1, min(int(asked), room))}
        for key in ("temperature", "top_p", "top_k"):
            if key in params:
                overrides[key] = params[key]
        if overrides.get("top_k", 0) == -1:  # verl's "no top-k"
            overrides["top_k"] = 0
        gen = await self.engine.generate(list(prompt_ids), **overrides)
        return TokenOutput(token_ids=list(gen.ids), log_probs=list(gen.log_probs), stop_reason="completed")


@functools.lru_cache(maxsize=None)
def _hf_model_type(path: str, trust_remote_code: bool) -> str | None:
    """The model's ``model_type`` (verl picks its token builder by it); None when its config cannot be read."""
    from transformers import AutoConfig

    try:
        return str(AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code).model_type)
    except Exception:  # a model verl would treat as of no known family
        return None


def _loop_entries(path: str) -> dict[str, Any]:
    """verl's agent loop config: a YAML list of ``{name, _target_, ...}`` (the other keys go to the class)."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    try:
        entries = OmegaConf.load(path)
    except Exception as exc:
        raise ConfigError(f"rollout.agent.verl_agent.agent_loop_config_path={path}: not readable as YAML "
                          f"({type(exc).__name__}: {exc}).") from None
    if not isinstance(entries, ListConfig):
        raise ConfigError(f"{path}: verl's agent loop config is a list of {{name, _target_, ...}} entries, got a "
                          f"{type(entries).__name__}.")
    out: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, DictConfig) or not isinstance(entry.get("name"), str) or "_target_" not in entry:
            got = OmegaConf.to_container(entry) if isinstance(entry, DictConfig) else entry
            raise ConfigError(f"{path}, entry {i}: each agent loop entry needs 'name' and '_target_' (verl's "
                              f"format), got {got!r}.")
        out[entry["name"]] = entry
    return out


class VerlAgentLoop(AgentLoop):
    """Each row through verl's agent loop named by its ``agent_name`` (else ``default_agent_loop``)."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        AgentLoop.validate_config(config, registry)
        a = config.rollout.agent
        if a.tools:
            raise ConfigError(f"rollout.agent.tools={list(a.tools)} with rollout.agent.loop={NAME}: verl's agent "
                              f"loops call verl's tools (rollout.agent.tool_config_path / function_tool_path), not "
                              f"rlforge's.")
        path = a.verl_agent.agent_loop_config_path
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"'rollout.agent.verl_agent.agent_loop_config_path' names {path!r}, which is not a "
                              f"file (relative paths are read from the working directory).")
        check_config(config)

    def __init__(self, config: Any, context: Any) -> None:
        super().__init__(config, context)
        try:
            import hydra.utils
            from verl.experimental.agent_loop.agent_loop import DictConfigWrap, ToolListWrap, _agent_loop_registry
            from verl.utils.dataset.rl_dataset import get_dataset_class
        except ImportError as exc:
            raise RLForgeError(f"rollout.agent.loop={NAME} runs verl's agent loops, and verl cannot be imported "
                               f"({exc}): {INSTALL} (docs/agentic.md#verls-agent-loops).") from None
        search_working_directory()
        options = config.rollout.agent.verl_agent
        # verl's built-in loops (registered when its module loads), then the config file's, as verl's worker does
        self.registry: dict[str, Any] = dict(_agent_loop_registry)
        if options.agent_loop_config_path:
            self.registry.update(_loop_entries(options.agent_loop_config_path))
        if options.default_agent_loop not in self.registry:
            raise ConfigError(f"rollout.agent.verl_agent.default_agent_loop={options.default_agent_loop} is not a verl "
                              f"agent loop here: {', '.join(sorted(self.registry))}.")
        self.verl = verl_config(config)
        self._instantiate = hydra.utils.instantiate
        tools = [t.tool for t in context.tools.tools.values() if isinstance(t, VerlTool)]
        self._shared = {
            "trainer_config": DictConfigWrap(config=self.verl), "tokenizer": context.tokenizer, "processor": None,
            "hf_model_type": _hf_model_type(str(config.model.path), bool(config.model.trust_remote_code)),
            "dataset_cls": get_dataset_class(self.verl.data), "data_config": DictConfigWrap(self.verl.data),
            "tools": ToolListWrap(tools)}

    def row_fields(self, sample: Sample) -> dict[str, Any]:
        """The row as verl's dataset hands it to ``run`` (``RLHFDataset.__getitem__`` plus the trainer's ``uid``)."""
        extra = sample.extra_info if isinstance(sample.extra_info, dict) else {}
        return {"raw_prompt": list(sample.messages), "data_source": sample.data_source,
                "reward_model": {"ground_truth": sample.ground_truth, "style": "rule"}, "extra_info": extra,
                "index": extra.get("index", 0), "tools_kwargs": extra.get("tools_kwargs") or {},
                "interaction_kwargs": extra.get("interaction_kwargs") or {}, "uid": sample.uid}

    async def run(self, sample: Sample, engine: TrajectoryEngine) -> Trajectory:
        name = sample.agent_name or self.config.rollout.agent.verl_agent.default_agent_loop
        if name not in self.registry:
            raise ValueError(f"the row's agent_name '{name}' is not a verl agent loop here (verl's built-in loops and "
                             f"rollout.agent.verl_agent.agent_loop_config_path's: {', '.join(sorted(self.registry))})")
        rollout = self.verl.actor_rollout_ref.rollout
        server = EngineServer(engine, int(rollout.prompt_length), int(rollout.response_length))
        loop = self._instantiate(config=self.registry[name], server_manager=server, **self._shared)
        p = engine.defaults
        params = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k or -1, "repetition_penalty": 1.0,
                  "logprobs": True}
        output = await loop.run(params, **self.row_fields(sample))
        return trajectory(output, name, int(self.config.rollout.max_new_tokens))


def trajectory(output: Any, name: str, budget: int) -> Trajectory:
    """verl's ``AgentLoopOutput`` as a trajectory: the response cut to ``budget`` tokens (verl cuts it to
    ``response_length``), verl's turn count kept (the prompt, model and inserted turns)."""
    if output.reward_score is not None:
        raise ValueError(f"verl's agent loop '{name}' scored the trajectory (reward_score={output.reward_score}); "
                         f"rlforge scores trajectories with the run's reward function and does not take a loop's score")
    if output.multi_modal_data and any(output.multi_modal_data.values()):
        raise ValueError(f"verl's agent loop '{name}' returned images, video or audio; rlforge's verl_agent loop runs "
                         f"text models")
    if output.response_logprobs is None and any(output.response_mask):
        raise ValueError(f"verl's agent loop '{name}' returned no response_logprobs: rlforge trains on the engine's "
                         f"log-probs, which the server gives every generate call (pass them on as verl's loops do)")
    n = min(len(output.response_ids), budget)
    mask = [int(m) for m in output.response_mask[:n]]
    log_probs = [float(x) for x in (output.response_logprobs or [0.0] * n)[:n]]
    traj = Trajectory(prompt_ids=[int(t) for t in output.prompt_ids],
                      response_ids=[int(t) for t in output.response_ids[:n]], response_mask=mask, log_probs=log_probs)
    traj.inserted_turns = max(0, int(output.num_turns) - 1 - len(traj.turn_spans()))
    return traj


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.agent_loop.register(NAME, VerlAgentLoop, config=VerlAgentConfig)
