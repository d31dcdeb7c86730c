"""The one place where a composed config becomes objects (Lightning's connector).

``Builder(config, plugins)`` looks every component up in the registries by the name the config gives and
constructs it with the factory signature of its kind (``rlforge.protocols``). The Trainer, each Ray rank
(for its own role), ``rlforge eval``/``generate``/``sft`` and the tests all build through it, so a component
is configured the same way wherever it runs. A built object that does not satisfy its kind's Protocol is an
error naming the component and its plugin.
"""

from __future__ import annotations

import contextlib
from collections.abc import Collection, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rlforge import diskio
from rlforge.data import first_rows
from rlforge.errors import ConfigError, RLForgeError, first_line
from rlforge.module_checks import check_initialized

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from rlforge.agent.runner import AgentRunner
    from rlforge.evaluation import Evaluator
    from rlforge.module import RLModule
    from rlforge.plugin_manager import PluginManager
    from rlforge.protocols import (
        Controller,
        Logger,
        RewardManager,
        RolloutEngine,
        Strategy,
    )


class Builder:
    """Builds the components a config selects. ``plugins``: the PluginManager the config was composed with."""

    def __init__(self, config: DictConfig, plugins: PluginManager) -> None:
        self.config = config
        self.plugins = plugins
        self.registry = plugins.registry
        self.hook = plugins.hook

    def _build(self, kind: str, name: str, *args: Any) -> Any:
        from rlforge import protocols

        entry = getattr(self.registry, kind).entry(name)
        obj = entry.obj(*args)
        proto = getattr(protocols, self.registry.SPECS[kind].protocol, None)
        if proto is not None and getattr(proto, "_is_runtime_protocol", False) and not isinstance(obj, proto):
            missing = [m for m in _members(proto) if not hasattr(obj, m)]
            raise RLForgeError(
                f"{self.registry.SPECS[kind].key}={name}: the {kind.replace('_', ' ')} registered by plugin "
                f"'{entry.plugin}' does not implement rlforge.protocols.{proto.__name__} (missing: "
                f"{', '.join(missing)}). See docs/plugins.md."
            )
        return obj

    def capabilities(self, kind: str) -> Any:
        """What the component the config selects for ``kind`` (``rollout``, ``strategy``) declares
        (``rlforge.capabilities``, read when it was registered)."""
        from omegaconf import OmegaConf

        registry = getattr(self.registry, kind)
        return registry.entry(OmegaConf.select(self.config, registry.spec.key)).capabilities

    def module(self, module: RLModule | None = None, roles: Collection[str] | None = None) -> RLModule:
        """The algorithm (``algorithm.name``) or the given module, with its tokenizer loaded; ``roles`` limits
        the models ``configure_model`` will load (default: all the algorithm needs)."""
        if module is None:
            module = self.registry.algorithm.get(self.config.algorithm.name)(self.config)
        check_initialized(module)
        module.registry = self.registry
        if roles is not None:
            module.roles = frozenset(roles)
        if module.tokenizer is None:
            module.configure_tokenizer()
        return module

    def strategy(self) -> Strategy:
        """The strategy of this process (every process that trains builds one); on a CPU device, with
        ``strategy.keep_freed_memory``, the process's allocator keeps freed memory for reuse."""
        strategy = self._build("strategy", self.config.strategy.name, self.config)
        if self.config.strategy.keep_freed_memory and strategy.device.type == "cpu":
            from rlforge.strategy import keep_freed_memory

            keep_freed_memory()
        return strategy

    def rollout(self, model: Any, tokenizer: Any) -> RolloutEngine:
        """The rollout engine (``rollout.name``) with the weight-sync backend ``rollout.weight_sync`` picks for it in
        this process (``rlforge.weight_sync``; an engine that no backend serves keeps its own ``update_weights``)."""
        from rlforge.weight_sync import backend_class

        engine = self._build("rollout", self.config.rollout.name, self.config, model, tokenizer)
        backend = backend_class(self.config, self.registry)
        if backend is not None:
            engine.weight_sync = backend(self.config, engine)
        return engine

    def reward(self, tokenizer: Any, workers: Any = None) -> RewardManager:
        """The reward manager (``reward.manager``). One that scores on worker groups of its own (its class names
        them in ``worker_roles``) gets the run's ``workers`` (``controller.workers``; None: it makes in-process ones)."""
        name = self.config.reward.manager
        extra = (workers,) if self.manager_roles() else ()
        return self._build("reward_manager", name, self.config, tokenizer, self.registry, *extra)

    def manager_roles(self) -> tuple[str, ...]:
        """The roles the reward manager scores on (its class's ``worker_roles``; none for most)."""
        name = self.config.reward.manager
        roles = getattr(self.registry.reward_manager.get(name), "worker_roles", ())
        return _role_names(roles, f"The reward manager '{name}' (reward.manager): its worker_roles")

    def roles(self, module: RLModule) -> list[str]:
        """The roles a controller places for ``module``: the algorithm's ``worker_roles()`` and the reward manager's,
        each once, each registered (``registry.role``)."""
        own = _role_names(module.worker_roles(), f"The algorithm {type(module).__qualname__}: its worker_roles()")
        from omegaconf import OmegaConf

        roles = list(dict.fromkeys([*own, *self.manager_roles()]))
        for role in roles:
            entry = self.registry.role.entry(role)  # an unknown role fails here, naming the registered ones
            section = getattr(entry.obj, "section", "")
            if section and OmegaConf.select(self.config, section) is None:
                raise ConfigError(f"The role '{role}' (plugin {entry.plugin}) reads its batch options from the config "
                                  f"section '{section}' (its Role's section), which this config does not have: give "
                                  f"the algorithm's config class that section, or name the section it has (docs/"
                                  f"plugins.md, 'A trainable role').")
        return roles

    def loggers(self, run_dir: str) -> list[Logger]:
        """The loggers of ``logger.backends``; a plugin's that fails to start is named with its plugin."""
        out = []
        for name in self.config.logger.backends:
            with self.logger_failures(name, "to start", "Fix its settings or the plugin"):
                out.append(self._build("logger", name, self.config, run_dir))
        return out

    @contextlib.contextmanager
    def logger_failures(self, name: str, when: str, fix: str = "Fix the plugin") -> Iterator[None]:
        """A logger plugin's exception (not rlforge's own errors, nor a failed write, which ``diskio`` words) as one
        line naming the logger, its plugin and ``when`` it failed ("in log_metrics at step 3")."""
        try:
            yield
        except RLForgeError:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001 (whatever a logger plugin raises, named; a client
            if diskio.failed_write(exc) is not None:  # library's sys.exit would end the run without a word)
                raise
            plugin = self.registry.logger.entry(name).plugin
            resume = "" if when == "to start" else "; trainer.resume=auto continues the run"
            what = (f"called sys.exit({exc.code!r})" if isinstance(exc, SystemExit)
                    else f"{type(exc).__name__}: {first_line(exc)}")
            raise RLForgeError(f"The logger '{name}' (logger.backends; plugin {plugin}) failed {when}: {what}. {fix}, "
                               f"or leave '{name}' out of logger.backends{resume}.") from exc

    def dataset(self, split: str) -> list[dict[str, Any]]:
        """The rows of ``split`` (``train`` or ``val``) of ``data.name``. A reward manager that defines
        ``check_data_sources(config, registry, data_sources)`` checks their ``data_source`` values here (each with
        where its first row is), so a row no reward function can score fails before any model loads, naming it."""
        rows = self.registry.dataset.get(self.config.data.name)(self.config, split)
        sequence = isinstance(rows, Sequence) and not isinstance(rows, (str, bytes))
        if not sequence or (len(rows) and not isinstance(rows[0], Mapping)):
            entry = self.registry.dataset.entry(self.config.data.name)
            got = f"a sequence of {type(rows[0]).__name__}" if sequence else type(rows).__name__
            raise RLForgeError(f"The dataset '{self.config.data.name}' (data.name; plugin {entry.plugin}) returned "
                               f"{got} for the {split} split: it returns a list (a sequence) of rows, each a dict "
                               f"(prompt, data_source, reward_model, ...; docs/plugins.md).")
        check = self.registry.reward_manager.entry(self.config.reward.manager).functions.get("check_data_sources")
        if check is not None and rows:
            check(self.config, self.registry, first_rows(rows, "data_source", f"{self.config.data.name} ({split})"))
        return rows

    def agent(self, tokenizer: Any, processor: Any = None) -> AgentRunner:
        """The agent loop (``rollout.agent.loop``) with its tools, tool parser and interaction (docs/agentic.md);
        ``processor``: a vision-language model's (rows with images)."""
        from rlforge.agent.context import AgentContext
        from rlforge.agent.runner import AgentRunner
        from rlforge.agent.toolbox import Toolbox
        from rlforge.agent.verl_tools import load_verl_tools

        cfg, a = self.config, self.config.rollout.agent
        named = {name: self._build("tool", name, cfg) for name in a.tools}
        for name, tool in load_verl_tools(cfg).items():
            if name in named:
                raise RLForgeError(f"The tool '{name}' of rollout.agent.tool_config_path/function_tool_path has the "
                                   f"name of a tool in 'rollout.agent.tools'; each tool name must be unique.")
            named[name] = tool
        tools = Toolbox(named, a)
        parser = self._build("tool_parser", a.tool_parser, cfg)
        new_interaction = (lambda: self._build("interaction", a.interaction, cfg)) if a.interaction else None
        context = AgentContext(cfg, tokenizer, tools, parser, new_interaction, processor)
        return AgentRunner(self._build("agent_loop", a.loop, cfg, context), a.loop, context)

    def evaluator(self, engine: RolloutEngine, tokenizer: Any, reward: RewardManager, rollout: str | None = None,
                  processor: Any = None) -> Evaluator:
        """The evaluator (``rlforge.evaluation``) of a rollout engine outside a run (``rlforge eval``, the SFT check):
        ``engine`` (registered as ``rollout``, default ``rollout.name``) generates, through the agent loop
        ``rollout.agent.loop`` unless it is ``single_turn`` (``processor``: a vision-language model's), and
        ``reward`` scores. Its ``close`` stops the loop."""
        from rlforge.agent.config import SINGLE_TURN
        from rlforge.agent.engine import engines_held
        from rlforge.evaluation import EngineBackend, Evaluator

        declared = self.registry.rollout.entry(rollout or self.config.rollout.name).capabilities
        backend = EngineBackend(engine, tokenizer, declared)
        if self.config.rollout.agent.loop == SINGLE_TURN:
            return Evaluator(backend, reward.score)
        runner = self.agent(tokenizer, processor)

        def agent(prompts: Any, params: Any) -> Any:
            with engines_held(backend):  # the engine awake for the whole rollout, as a run's agent stage holds it
                return runner.rollout(prompts, params, backend.generate_tokens, backend.continuous_batching,
                                      backend.submit_tokens)

        return Evaluator(backend, reward.score, agent, runner.close)

    def follow(self, module: RLModule) -> dict[str, Any] | None:
        """On a process that a launcher started but that does not drive the run (``trainer.controller=torchrun``,
        ranks > 0): serve the driving process until the run ends and return this rank's summary. None where this
        process drives (every other controller)."""
        follow = self.registry.controller.entry(self.config.trainer.controller).functions.get("follow")
        if follow is None:
            _not_launched(self.config.trainer.controller)
        return None if follow is None else follow(self, module)

    def controller(self, module: RLModule) -> Controller:
        """The controller (``trainer.controller``); it builds its workers through this builder."""
        return self._build("controller", self.config.trainer.controller, self, module)


def _not_launched(controller: str) -> None:
    """Refuse to drive a run from one of several processes a launcher started (torchrun sets ``WORLD_SIZE``): each
    would run the whole run on its own, in a folder of its own."""
    import os

    world = os.environ.get("WORLD_SIZE", "1")
    if world.isdigit() and int(world) > 1 and "TORCHELASTIC_RUN_ID" in os.environ:
        raise ConfigError(f"This process is one of {world} that torchrun started, but trainer.controller={controller} "
                          f"drives a run from one process: each of the {world} would run all of it. Set "
                          f"trainer.controller=torchrun, or start it without torchrun (rlforge fit ...).")


def _members(proto: type) -> list[str]:
    """The attributes and methods a Protocol asks for."""
    names: set[str] = set()
    for base in proto.__mro__:
        if base.__name__ not in ("Protocol", "Generic", "object"):
            names |= set(vars(base)) | set(getattr(base, "__annotations__", {}))
    return sorted(n for n in names if not n.startswith("_"))


def _role_names(roles: Any, owner: str) -> tuple[str, ...]:
    """``roles`` (``worker_roles``), refused unless a list or tuple of role names (a bare string would be read as
    one role per letter)."""
    if not isinstance(roles, (list, tuple)) or not all(isinstance(r, str) for r in roles):
        raise RLForgeError(f"{owner} must be a list or tuple of role names, got {roles!r}.")
    return tuple(roles)
