"""What a component can do, declared once on its class and read from its registry entry.

A rollout engine, strategy, dataset or logger declares ``capabilities = RolloutCapabilities(...)`` /
``StrategyCapabilities(...)`` / ``DatasetCapabilities(...)`` / ``LoggerCapabilities(...)`` (every field defaults to
False, or ""), or passes it at registration (``register(name, factory, capabilities=...)``, for a factory function). The
registry reads the declaration when the component is registered (``Registry.register``: the wrong type, or a
capability written as a bare attribute of the class, function or object, is refused there), keeps it on the entry
(``registry.rollout.entry(name).capabilities``, ``Builder.capabilities(kind)``) and ``rlforge plugins list`` shows it.
Likewise the optional functions a component's class may define (``validate_config``, a strategy's
``export_checkpoint``: ``Kind.functions``) are read at registration into ``entry.functions``. The core reads
capabilities only from there: it never probes a component for optional attributes.

A worker class declares its remote methods the same way, once, on the method: ``@remote(dispatch, collect)`` names
how a call through a worker group is split over the ranks and how their results are joined (the modes are registry
kinds, ``rlforge/controller/dispatch.py``); ``rlforge.worker`` offers the same ``remote`` to worker classes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from rlforge.errors import RLForgeError


@dataclass(frozen=True)
class RolloutCapabilities:
    """A rollout engine's (``registry.rollout``)."""

    owns_weights: bool = False  # keeps its own copy of the weights (vllm): a sharded actor keeps no replica for it
    logprobs_match_actor: bool = False  # its sampling log-probs are the actor's (hf): the old_logprob pass reuses them
    supports_images: bool = False  # generates from rows with images (docs/multimodal.md)
    # has generate_tokens (token-in/token-out requests); else rlforge builds them on generate
    token_io: bool = field(default=False, metadata={"method": "generate_tokens"})
    continuous_batching: bool = False  # generate_tokens takes overlapping calls (agent turns start at once)
    lora_adapters: bool = False  # given a LoRA actor, generates with its adapter: a sync moves only the adapter


@dataclass(frozen=True)
class StrategyCapabilities:
    """A training strategy's (``registry.strategy``)."""

    sharded: bool = False  # several processes hold the model (fsdp, tp, megatron, fabric): a launcher places them
    shares_prompts: bool = False  # verified with model.shared_prefix (a prompt's KV cache shared by its responses)
    async_checkpoint: bool = False  # save_sharded_async writes what load_sharded reads (strategy.checkpoint=async)
    # the config key of how many consecutive ranks see the same rows (tp: "strategy.tp.size", sequence-parallel
    # groups): the controllers split batches over num_processes / that many data-parallel groups; "": each rank alone
    same_rows_key: str = ""

    def data_parallel_size(self, config: Any) -> int:
        """The data-parallel groups that ``strategy.num_processes`` ranks form (``same_rows_key``)."""
        from omegaconf import OmegaConf

        ranks = int(config.strategy.num_processes)
        if not self.same_rows_key:
            return ranks
        size = OmegaConf.select(config, self.same_rows_key)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1 or ranks % size:
            raise RLForgeError(f"{self.same_rows_key}={size!r} must be a whole number >= 1 that divides "
                               f"strategy.num_processes={ranks} (strategy.name={config.strategy.name} declares "
                               f"same_rows_key='{self.same_rows_key}').")
        return ranks // size


@dataclass(frozen=True)
class DatasetCapabilities:
    """A dataset's (``registry.dataset``)."""

    reads_data_files: bool = False  # reads data.train_files / data.val_files (else setting them is refused)
    checks_own_files: bool = False  # hands data.train_files / val_files to its own reader as they are (folders, Hub ids): not checked as local files first


@dataclass(frozen=True)
class LoggerCapabilities:
    """A logger's (``registry.logger``)."""

    # has log_generations(rows, step): shows trainer.log_val_generations' rows
    shows_generations: bool = field(default=False, metadata={"method": "log_generations"})
    # has close_as(outcome), called instead of close(): marks how the run ended, "finished", "failed" (an exception)
    # or "killed" (Ctrl-C, SIGTERM), as its tracker shows it
    marks_outcome: bool = field(default=False, metadata={"method": "close_as"})


def declared(kind: str, name: str, obj: Any, declaration: type, given: Any = None) -> Any:
    """The capabilities ``obj`` (registered as ``kind`` ``name``) declares: ``given`` (``register(...,
    capabilities=)``), else its ``capabilities`` attribute, else the defaults. A value of another type, or a capability
    set as a bare attribute (of the class, or of a registered function or object), is an error naming both."""
    value = given if given is not None else getattr(obj, "capabilities", None)  # read once, at registration
    if value is None:
        value = declaration()
    if not isinstance(value, declaration):
        raise RLForgeError(f"{kind} '{name}': capabilities must be a rlforge.capabilities.{declaration.__name__}, "
                           f"got {value!r}.")
    attrs = _attributes(obj)
    loose = [f.name for f in fields(declaration) if f.name in attrs]
    if loose:
        merged = {**{f.name: getattr(value, f.name) for f in fields(declaration)}, **{n: attrs[n] for n in loose}}
        given = ", ".join(f"{f.name}={merged[f.name]!r}" for f in fields(declaration) if merged[f.name] != f.default)
        what = ("a class attribute" if len(loose) == 1 else "class attributes") if isinstance(obj, type) else (
            "an attribute" if len(loose) == 1 else "attributes")
        raise RLForgeError(f"{kind} '{name}' sets {', '.join(loose)} as {what}; declare its capabilities instead: "
                           f"capabilities = rlforge.capabilities.{declaration.__name__}({given}).")
    for f in fields(declaration):
        if not isinstance(getattr(value, f.name), type(f.default)):
            must = "True or False" if isinstance(f.default, bool) else f"a {type(f.default).__name__}"
            raise RLForgeError(f"{kind} '{name}': capability {f.name} must be {must}, got {getattr(value, f.name)!r}.")
        method = f.metadata.get("method")
        if method and getattr(value, f.name) and isinstance(obj, type) and not callable(attrs.get(method)):
            raise RLForgeError(f"{kind} '{name}' declares {f.name}=True but its class defines no {method}() method.")
    return value


def functions(kind: str, name: str, obj: Any, names: tuple[str, ...]) -> dict[str, Callable[..., Any]]:
    """The optional functions among ``names`` that ``obj`` (registered as ``kind`` ``name``) defines, e.g.
    ``validate_config``, read once at registration; one that is not callable is an error naming it."""
    out: dict[str, Callable[..., Any]] = {}
    for fn in names:
        value = getattr(obj, fn, None)  # read once, at registration
        if value is None:
            continue
        if not callable(value):
            raise RLForgeError(f"{kind} '{name}': {fn} must be a function (a static or class method), got {value!r}.")
        out[fn] = value
    return out


def _attributes(obj: Any) -> dict[str, Any]:
    """The attributes set in the class bodies of ``obj`` and its bases; for a registered function or object, those of
    its class and its own."""
    klass = obj if isinstance(obj, type) else type(obj)
    out: dict[str, Any] = {}
    for base in reversed(klass.__mro__):
        out.update(vars(base))
    if not isinstance(obj, type):
        out.update(getattr(obj, "__dict__", {}))
    return out


def shown(capabilities: Any) -> str:
    """The capabilities that are on, for ``rlforge plugins list`` (``""`` when none)."""
    if capabilities is None:
        return ""
    on = [(f.name, getattr(capabilities, f.name)) for f in fields(capabilities) if getattr(capabilities, f.name)]
    return ", ".join(name if value is True else f"{name}={value}" for name, value in on)


# --- worker methods: @remote declares how a call through a worker group is split and joined ------------------------

REMOTE = "__rlforge_remote__"


@dataclass(frozen=True)
class Remote:
    """How a worker method is called through a group: the names of its dispatch and collect modes."""

    dispatch: str = "all"
    collect: str = "all"


def remote(dispatch: str = "all", collect: str = "all") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a worker method as callable through a worker group (``rlforge.controller.remote.WorkerGroup``).

    ``dispatch``: ``all`` (every rank, the same arguments; a ``PerRank`` argument gives each rank its own value),
    ``dp_score`` / ``dp_update`` (the first argument, a Batch, split over data-parallel groups for a forward pass or
    an update), ``rows`` (the first argument's rows in near-equal parts, for models without collectives),
    ``engine_rows`` / ``engine_requests`` (prompts split over the ranks' rollout engines, each seeded).
    ``collect``: ``all`` (the list, in rank order), ``first``, ``max``, ``concat`` (Batches or per-row tensors, back
    in row order), ``flatten``. Call arguments are positional or keyword, as the method's signature allows."""

    def mark(fn: Callable[..., Any]) -> Callable[..., Any]:
        setattr(fn, REMOTE, Remote(dispatch, collect))
        return fn

    return mark


def declared_methods(cls: type) -> dict[str, Remote]:
    """The methods of ``cls`` marked with :func:`remote`, in it or a base class (an override keeps the mark)."""
    out: dict[str, Remote] = {}
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            spec = getattr(value, REMOTE, None)
            if isinstance(spec, Remote):
                out[name] = spec
    return out
