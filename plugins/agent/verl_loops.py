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

Not run, each refused by name when it arises: rows with images (rlforge's own loops take them), video and audio;
sampling parameters rlforge's engines do not apply (a repetition penalty, stop strings, ...). rlforge's own tools
(``rollout.agent.tools``) are not offered to verl's loops (verl's tools are: ``rollout.agent.tool_config_path`` /
``function_tool_path``)."""

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
        f"{rollout}.val_kwargs.temperature": float(r.val_temperature),
        f"{rollout}.val_kwargs.top_p": float(r.val_top_p),
        f"{rollout}.val_kwargs.top_k": int(r.val_top_k) or -1, f"{rollout}.val_kwargs.n": int(r.val_n),
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
    from rlforge.config.verl_hydra import load_default

    given = dict(flatten(_given(config)))
    closed = load_default("ppo_trainer")
    for key in given:  # verl's structured sections (those with a _target_) take only their own keys, as in verl
        node, parts = closed, key.split(".")
        for depth, part in enumerate(parts):
            if not isinstance(node, dict):
                break
            if part not in node:
                if "_target_" in node:
                    raise ConfigError(f"rollout.agent.verl_agent.config sets '{key}', but verl's "
                                      f"{'.'.join(parts[:depth])} has no key '{part}' (verl refuses it too).")
                break
            node = node[part]
    for key, want in _owned(config).items():
        if key in given and given[key] != want:
            raise ConfigError(f"rollout.agent.verl_agent.config sets '{key}={given[key]}', but this run's own "
                              f"settings make it {want!r}: set it through rlforge's key (docs/agentic.md#verls-agent-"
                              f"loops lists them) and leave it out of verl_agent.config.")


# sampling keys a loop may send that rlforge's engines do not apply, with the value that asks for nothing
NEUTRAL = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_tokens": 0,
           "ignore_eos": False, "stop": None, "stop_token_ids": None, "n": 1, "seed": None}
TAKEN = ("temperature", "top_p", "top_k")  # passed on (the engine refuses values other than the rollout's)
READ = ("max_tokens", "max_new_tokens", "logprobs", "skip_special_tokens", "detokenize")  # read here, or moot


class Generations:
    """What one trajectory's generate calls returned, in order (the log-probs of a loop that does not return them)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.log_probs: list[float] = []

    def add(self, ids: list[int], log_probs: list[float]) -> None:
        self.ids += ids
        self.log_probs += log_probs


def check_sampling(params: dict[str, Any]) -> None:
    """A ``ValueError`` naming the first sampling key rlforge's engines would not apply."""
    for key, value in params.items():
        if key in TAKEN or key in READ:
            continue
        if key not in NEUTRAL:
            raise ValueError(f"the loop asked for the sampling parameter {key}={value!r}, which rlforge's engines do "
                             f"not take (they take {', '.join(TAKEN)} and max_tokens)")
        neutral = NEUTRAL[key]
        if value != neutral and not (neutral is None and not value):
            raise ValueError(f"the loop asked for {key}={value!r}, which rlforge's engines do not apply "
                             f"(only {key}={neutral!r}: leave it out)")


@functools.lru_cache(maxsize=None)
def server_class() -> type:
    """verl's ``LLMServerClient`` with ``generate`` on one trajectory's rlforge engine: token ids in, verl's
    ``TokenOutput`` out (a subclass, so loops that check the type take it). ``max_tokens`` defaults as verl's vLLM
    server computes it, within rlforge's engine window."""
    from verl.workers.rollout.llm_server import LLMServerClient
    from verl.workers.rollout.replica import TokenOutput

    class EngineServer(LLMServerClient):  # type: ignore[misc]
        def __init__(self, engine: TrajectoryEngine, config: Any) -> None:
            super().__init__(config, None)
            rollout = config.actor_rollout_ref.rollout
            self.engine, self.prompt_length, self.response_length = engine, int(rollout.prompt_length), int(
                rollout.response_length)
            self.generations = Generations()

        async def generate(self, request_id: Any = None, *, prompt_ids: list[int], sampling_params: dict[str, Any],
                           image_data: Any = None, video_data: Any = None, audio_data: Any = None,
                           **kwargs: Any) -> Any:
            if image_data or video_data or audio_data:
                raise ValueError("the loop sent images, video or audio: rlforge's verl_agent loop runs text models")
            check_sampling(sampling_params)
            asked = sampling_params.get("max_tokens", sampling_params.get("max_new_tokens"))
            room = self.engine.handle.max_len - len(prompt_ids)
            if room < 1:
                raise ValueError(f"a prompt of {len(prompt_ids)} tokens leaves no room to generate within "
                                 f"{self.engine.handle.max_len} tokens (data.max_prompt_length + "
                                 f"rollout.max_new_tokens)")
            if asked is None:
                asked = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
            overrides: dict[str, Any] = {k: sampling_params[k] for k in TAKEN if k in sampling_params}
            if overrides.get("top_k") == -1:  # verl's "no top-k"
                overrides["top_k"] = 0
            gen = await self.engine.generate(list(prompt_ids), max_new_tokens=max(1, min(int(asked), room)),
                                             **overrides)
            self.generations.add(list(gen.ids), list(gen.log_probs))
            return TokenOutput(token_ids=list(gen.ids), log_probs=list(gen.log_probs), stop_reason="completed")

    return EngineServer


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

    refuses_images = ("rlforge runs verl's agent loops on text rows only (verl's loops take a row's images through "
                      "RLHFDataset.process_vision_info, which imports qwen_vl_utils and so torchvision, which the CPU "
                      "install cannot have: not built). rlforge's own loops take rows with images: "
                      "rollout.agent.loop=tool_agent, interaction or your own (docs/agentic.md)")

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
            for name, entry in self.registry.items():  # import each class now: its import error, not Hydra's
                try:
                    hydra.utils.get_class(entry["_target_"])
                except Exception as exc:
                    cause = exc.__cause__ or exc.__context__ or exc  # Hydra's own message wraps the import error
                    raise RLForgeError(f"{options.agent_loop_config_path}: the agent loop '{name}' names "
                                       f"_target_={entry['_target_']}, which does not import: "
                                       f"{type(cause).__name__}: {cause}") from None
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
        if sample.multi_modal is not None:  # rows streamed past the loader's check
            raise ValueError(f"the row has images: {self.refuses_images}")
        server = server_class()(engine, self.verl)
        p = engine.defaults
        params = {"temperature": p.temperature, "top_p": p.top_p, "top_k": p.top_k or -1, "repetition_penalty": 1.0,
                  "logprobs": True}
        try:
            loop = self._instantiate(config=self.registry[name], server_manager=server, **self._shared)
            output = await loop.run(params, **self.row_fields(sample))
            budget = int(self.config.rollout.max_new_tokens)
            return trajectory(output, server.generations, self.context.tokenizer, budget)
        except Exception as exc:
            cause = exc.__cause__ if type(exc).__name__ == "InstantiationException" and exc.__cause__ else None
            why = f" (caused by {type(cause).__name__}: {cause})" if cause is not None else ""
            raise RuntimeError(f"verl's agent loop '{name}': {type(exc).__name__}: {exc}{why}") from exc


def trajectory(output: Any, generations: Generations, tokenizer: Any, budget: int) -> Trajectory:
    """verl's ``AgentLoopOutput`` as a trajectory: the response cut to ``budget`` tokens (verl cuts it to
    ``response_length``), verl's turn count kept (the prompt, model and inserted turns), the reward function's input
    as verl's naive reward manager makes it (the whole response decoded without special tokens; the loop's
    ``extra_fields`` in ``extra_info``), or the loop's own ``reward_score`` in place of the reward function's. A loop
    that returns no log-probs gets those of its generate calls, when its model tokens are what they generated."""
    if output.multi_modal_data and any(output.multi_modal_data.values()):
        raise ValueError("the loop returned images, video or audio; rlforge's verl_agent loop runs text models")
    n = min(len(output.response_ids), budget)
    ids, mask = [int(t) for t in output.response_ids[:n]], [int(m) for m in output.response_mask[:n]]
    log_probs = output.response_logprobs
    if log_probs is None:
        model = [t for t, m in zip(ids, mask) if m]
        if model != generations.ids[:len(model)]:
            raise ValueError("the loop returned no response_logprobs, and its model tokens (response_mask 1) are not "
                             "the tokens its generate calls returned: rlforge trains on the engine's log-probs (pass "
                             "them on from each TokenOutput.log_probs)")
        found = iter(generations.log_probs)
        log_probs = [next(found) if m else 0.0 for m in mask]
    extra = output.extra_fields or {}
    traj = Trajectory(prompt_ids=[int(t) for t in output.prompt_ids], response_ids=ids, response_mask=mask,
                      log_probs=[float(x) for x in log_probs[:n]],
                      answer=tokenizer.decode(ids, skip_special_tokens=True),
                      extra_info=dict(extra) if isinstance(extra, dict) else None,
                      score=None if output.reward_score is None else float(output.reward_score))
    traj.inserted_turns = max(0, int(output.num_turns) - 1 - len(traj.turn_spans()))
    return traj


@hookimpl
def rlforge_register(registry: Any) -> None:
    registry.agent_loop.register(NAME, VerlAgentLoop, config=VerlAgentConfig)
