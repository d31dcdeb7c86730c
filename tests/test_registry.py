"""rlforge.registry: one generic Registry per component kind, collected in Registries."""

from __future__ import annotations

import pytest

from rlforge.errors import RLForgeError
from rlforge.module import RLModule
from rlforge.registry import Registries, Registry, UnknownComponentError


def _algo() -> type:
    """A new algorithm class (``Registries.algorithm`` takes RLModule subclasses only)."""
    return type("Algo", (RLModule,), {})


@pytest.fixture
def reg() -> Registry:
    return Registry("algorithm", "algorithm.name")


def test_register_as_call_returns_object(reg: Registry) -> None:
    obj = object()
    assert reg.register("grpo", obj) is obj
    assert reg.get("grpo") is obj


def test_register_as_decorator_returns_object_unchanged(reg: Registry) -> None:
    @reg.register("ppo", description="proximal policy optimization")
    class PPO:
        """Docstring line."""

    assert reg.get("ppo") is PPO
    assert PPO.__name__ == "PPO"
    assert reg.entry("ppo").description == "proximal policy optimization"


def test_description_defaults_to_first_docstring_line(reg: Registry) -> None:
    class Algo:
        """First line.

        More text.
        """

    reg.register("a", Algo)
    assert reg.entry("a").description == "First line."


def test_duplicate_name_without_override_is_an_error(reg: Registry) -> None:
    first, second = object(), object()
    reg.register("grpo", first)
    with pytest.raises(RLForgeError, match="already registered") as info:
        reg.register("grpo", second)
    assert "override=True" in str(info.value)
    assert "'grpo'" in str(info.value)
    assert reg.get("grpo") is first


def test_duplicate_decorator_without_override_is_an_error(reg: Registry) -> None:
    reg.register("grpo", object())
    with pytest.raises(RLForgeError, match="already registered"):

        @reg.register("grpo")
        def f() -> None:  # pragma: no cover - never registered
            pass


def test_duplicate_with_override_replaces(reg: Registry) -> None:
    first, second = object(), object()
    reg.register("grpo", first)
    assert reg.register("grpo", second, override=True) is second
    assert reg.get("grpo") is second
    assert reg.available() == ["grpo"]


def test_duplicate_error_names_the_previous_plugin(reg: Registry) -> None:
    reg.current_plugin = "first_plugin"
    reg.register("grpo", object())
    reg.current_plugin = "second_plugin"
    with pytest.raises(RLForgeError, match="first_plugin"):
        reg.register("grpo", object())


def test_entry_records_the_registering_plugin(reg: Registry) -> None:
    reg.current_plugin = "my.plugin"
    reg.register("x", object())
    assert reg.entry("x").plugin == "my.plugin"


def test_get_unknown_lists_available_and_suggests_closest(reg: Registry) -> None:
    for name in ("grpo", "ppo", "rloo"):
        reg.register(name, object())
    with pytest.raises(UnknownComponentError) as info:
        reg.get("grpoo")
    msg = str(info.value)
    assert "Unknown algorithm 'grpoo'" in msg
    assert "(algorithm.name)" in msg
    assert "Did you mean 'grpo'?" in msg
    assert "Available: grpo, ppo, rloo" in msg
    assert "rlforge plugins list" in msg


def test_get_unknown_without_close_match_has_no_suggestion(reg: Registry) -> None:
    reg.register("grpo", object())
    with pytest.raises(UnknownComponentError) as info:
        reg.get("zzzzzzzz")
    assert "Did you mean" not in str(info.value)
    assert "Available: grpo" in str(info.value)


def test_get_on_empty_registry_says_none(reg: Registry) -> None:
    with pytest.raises(UnknownComponentError, match=r"Available: \(none\)"):
        reg.get("grpo")


def test_unknown_component_error_is_an_rlforge_error() -> None:
    assert issubclass(UnknownComponentError, RLForgeError)


def test_entry_of_unknown_name_raises(reg: Registry) -> None:
    with pytest.raises(UnknownComponentError):
        reg.entry("nope")


def test_available_is_sorted_and_in_and_len(reg: Registry) -> None:
    for name in ("zeta", "alpha", "mid"):
        reg.register(name, object())
    assert reg.available() == ["alpha", "mid", "zeta"]
    assert [e.name for e in reg.entries()] == ["alpha", "mid", "zeta"]
    assert "mid" in reg
    assert "nope" not in reg
    assert len(reg) == 3


def test_registries_has_one_registry_per_kind() -> None:
    regs = Registries()
    kinds = regs.all()
    assert set(kinds) == set(Registries.KINDS)
    for kind in ("algorithm", "rollout", "reward_manager", "reward_fn", "strategy", "logger", "dataset", "controller"):
        assert isinstance(getattr(regs, kind), Registry)
        assert getattr(regs, kind).key == Registries.KINDS[kind]
    # registries are independent
    regs.algorithm.register("x", _algo())
    assert "x" not in regs.rollout


def test_registries_error_message_uses_config_key() -> None:
    regs = Registries()
    regs.rollout.register("hf", object())
    with pytest.raises(UnknownComponentError, match=r"Unknown rollout 'vlm' \(rollout.name\)"):
        regs.rollout.get("vlm")


def test_registries_components_of_plugin() -> None:
    regs = Registries()
    regs.set_current_plugin("p1")
    regs.algorithm.register("a1", _algo())
    regs.reward_fn.register("r1", len)
    regs.set_current_plugin("p2")
    regs.algorithm.register("a2", _algo())
    assert sorted(regs.components_of("p1")) == ["algorithm:a1", "reward fn:r1"]
    assert regs.components_of("p2") == ["algorithm:a2"]
    assert regs.components_of("nobody") == []


def test_capabilities_are_read_at_registration_and_a_bare_attribute_is_refused() -> None:
    from rlforge.capabilities import RolloutCapabilities, StrategyCapabilities

    regs = Registries()

    class Declared:
        capabilities = RolloutCapabilities(owns_weights=True)

    class Plain:
        pass

    regs.rollout.register("declared", Declared)
    regs.rollout.register("plain", Plain)
    assert regs.rollout.entry("declared").capabilities.owns_weights
    assert regs.rollout.entry("plain").capabilities == RolloutCapabilities()

    class Old:  # the convention before capabilities were declared
        owns_weights = True

    with pytest.raises(RLForgeError, match=r"rollout 'old' sets owns_weights as a class attribute; declare its "
                                           r"capabilities instead: capabilities = rlforge.capabilities."
                                           r"RolloutCapabilities\(owns_weights=True\)"):
        regs.rollout.register("old", Old)

    class Callable:  # registered as an object (a dataset), its capability a bare attribute of its class
        reads_data_files = True

        def __call__(self, config, split):
            return []

    def factory(config, split):
        return []

    factory.reads_data_files = True  # type: ignore[attr-defined]
    for obj in (Callable(), factory):
        with pytest.raises(RLForgeError, match=r"dataset 'bare' sets reads_data_files as an attribute; declare its "
                                               r"capabilities instead: capabilities = rlforge.capabilities."
                                               r"DatasetCapabilities\(reads_data_files=True\)"):
            regs.dataset.register("bare", obj)

    class ToolWithCapabilities:
        capabilities = RolloutCapabilities(token_io=True)

    with pytest.raises(RLForgeError, match=r"tool 'capable' sets capabilities = RolloutCapabilities\(.*\), but "
                                           r"components of this kind declare no capabilities"):
        regs.tool.register("capable", ToolWithCapabilities)

    class Half:  # declared, plus one bare: the suggested line keeps both
        capabilities = RolloutCapabilities(owns_weights=True)
        continuous_batching = True

    with pytest.raises(RLForgeError, match=r"RolloutCapabilities\(owns_weights=True, continuous_batching=True\)"):
        regs.rollout.register("half", Half)

    class Wrong:
        capabilities = StrategyCapabilities()

    with pytest.raises(RLForgeError, match=r"rollout 'wrong': capabilities must be a rlforge.capabilities."
                                           r"RolloutCapabilities, got StrategyCapabilities"):
        regs.rollout.register("wrong", Wrong)

    class NotBool:
        capabilities = StrategyCapabilities(sharded="yes")  # type: ignore[arg-type]

    with pytest.raises(RLForgeError, match=r"strategy 'odd': capability sharded must be True or False, got 'yes'"):
        regs.strategy.register("odd", NotBool)


def test_plugins_list_shows_the_capabilities_that_are_on(capsys) -> None:
    from rlforge.cli import main

    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "rollout:vllm  (capabilities: owns_weights, supports_images, token_io, continuous_batching, lora_adapters)" in out
    assert ("strategy:fsdp  (capabilities: sharded, shares_prompts, async_checkpoint, "
            "same_rows_key=strategy.fsdp.sequence_parallel_size)") in out
    assert "controller:torchrun  (defines: follow)" in out
    assert "dataset:files  (capabilities: reads_data_files)" in out
    assert "logger:tensorboard  (capabilities: shows_generations)" in out


# --- declarations for datasets, loggers and factories; optional class functions -------------------------------------


def test_a_factory_declares_capabilities_at_registration() -> None:
    from rlforge.capabilities import DatasetCapabilities, StrategyCapabilities

    regs = Registries()
    regs.dataset.register("files_like", lambda config, split: [], capabilities=DatasetCapabilities(reads_data_files=True))
    regs.dataset.register("plain", lambda config, split: [])
    assert regs.dataset.entry("files_like").capabilities.reads_data_files
    assert regs.dataset.entry("plain").capabilities == DatasetCapabilities()
    assert regs.components_of("<unknown>") == ["dataset:files_like  (capabilities: reads_data_files)", "dataset:plain"]
    with pytest.raises(RLForgeError, match=r"dataset 'wrong': capabilities must be a rlforge.capabilities."
                                           r"DatasetCapabilities, got StrategyCapabilities"):
        regs.dataset.register("wrong", lambda config, split: [], capabilities=StrategyCapabilities())
    with pytest.raises(RLForgeError, match="reward fn 'f': components of this kind declare no capabilities="):
        regs.reward_fn.register("f", lambda *a: 0.0, capabilities=DatasetCapabilities())

    class Old:  # the convention before the declaration
        reads_data_files = True

    with pytest.raises(RLForgeError, match=r"capabilities = rlforge.capabilities.DatasetCapabilities\(reads_data_files"
                                           r"=True\)"):
        regs.dataset.register("old", Old)


def test_a_dataset_reads_the_data_files_only_when_it_declares_it(tmp_path) -> None:
    from omegaconf import OmegaConf

    from rlforge.capabilities import DatasetCapabilities
    from rlforge.config.compose import check_data_files
    from rlforge.errors import ConfigError

    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"data_source": "x", "prompt": [{"role": "user", "content": "hi"}]}\n')
    regs = Registries()
    regs.dataset.register("reads", lambda config, split: [], capabilities=DatasetCapabilities(reads_data_files=True))
    regs.dataset.register("ignores", lambda config, split: [])

    def cfg(name: str) -> object:
        return OmegaConf.create({"data": {"name": name, "train_files": [str(rows)], "val_files": []}})

    check_data_files(cfg("reads"), regs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"'data.train_files' is set .* but data.name=ignores does not read it"):
        check_data_files(cfg("ignores"), regs)  # type: ignore[arg-type]


def test_a_logger_shows_generations_only_when_it_declares_it(tmp_path, monkeypatch) -> None:
    from contextlib import nullcontext
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from rlforge.capabilities import LoggerCapabilities
    from rlforge.trainer import trainer as T

    rows = [{"input": "1+1?", "output": "2", "score": 1.0}]
    monkeypatch.setattr(T, "val_generations", lambda batch, tokenizer, n: rows)

    class Shows:
        capabilities = LoggerCapabilities(shows_generations=True)

        def __init__(self) -> None:
            self.artifacts: list[str] = []
            self.shown: list[tuple[object, int]] = []

        def log_artifact(self, path: str) -> None:
            self.artifacts.append(path)

        def log_generations(self, rows: object, step: int) -> None:
            self.shown.append((rows, step))

    class Quiet(Shows):  # has the method, declares nothing: the file only
        capabilities = LoggerCapabilities()

    regs = Registries()
    regs.logger.register("shows", Shows)
    regs.logger.register("quiet", Quiet)
    shows, quiet = Shows(), Quiet()
    run = SimpleNamespace(module=SimpleNamespace(tokenizer=None), run_dir=tmp_path, step=3, loggers=[shows, quiet],
                          config=OmegaConf.create({"trainer": {"log_val_generations": 1},
                                                   "logger": {"backends": ["shows", "quiet"]}}),
                          builder=SimpleNamespace(registry=regs, logger_failures=lambda name, when: nullcontext()))
    T.Trainer._log_val_generations(run, None)  # type: ignore[arg-type]
    assert shows.shown == [(rows, 3)] and quiet.shown == []
    assert shows.artifacts == quiet.artifacts == [str(tmp_path / "val_generations" / "val_step3.json")]


def test_optional_class_functions_are_read_at_registration() -> None:
    regs = Registries()

    class Exports:
        @staticmethod
        def export_checkpoint(checkpoint: object, out: object) -> None: ...

        @staticmethod
        def validate_config(config: object, registry: object) -> None: ...

    class Plain:
        pass

    class NotAFunction:
        export_checkpoint = "gather.py"

    regs.strategy.register("exports", Exports)
    regs.strategy.register("plain", Plain)
    assert set(regs.strategy.entry("exports").functions) == {"export_checkpoint", "validate_config"}
    assert regs.strategy.entry("plain").functions == {}
    assert "strategy:exports  (defines: export_checkpoint)" in regs.components_of("<unknown>")
    with pytest.raises(RLForgeError, match=r"strategy 'bad': export_checkpoint must be a function \(a static or class "
                                           r"method\), got 'gather.py'"):
        regs.strategy.register("bad", NotAFunction)
    regs.rollout.register("engine", Exports)  # not an engine's optional function: not read
    assert set(regs.rollout.entry("engine").functions) == {"validate_config"}


def test_a_reward_manager_without_close_is_refused_when_built() -> None:
    from types import SimpleNamespace

    from rlforge.build import Builder

    class NoClose:
        def __init__(self, config: object, tokenizer: object, registry: object) -> None: ...

        def score(self, batch: object) -> object:
            return batch

    regs = Registries()
    regs.reward_manager.register("no_close", NoClose)
    builder = Builder(SimpleNamespace(reward=SimpleNamespace(manager="no_close")),  # type: ignore[arg-type]
                      SimpleNamespace(registry=regs, hook=None))  # type: ignore[arg-type]
    with pytest.raises(RLForgeError, match=r"reward.manager=no_close: .* does not implement rlforge.protocols."
                                           r"RewardManager \(missing: close\)"):
        builder.reward(None)


def test_a_capability_that_names_a_method_needs_it() -> None:
    from rlforge.capabilities import LoggerCapabilities, RolloutCapabilities

    class NoTable:
        capabilities = LoggerCapabilities(shows_generations=True)

    class NoTokens:
        capabilities = RolloutCapabilities(token_io=True)

    regs = Registries()
    with pytest.raises(RLForgeError, match=r"logger 'no_table' declares shows_generations=True but its class defines "
                                           r"no log_generations\(\) method"):
        regs.logger.register("no_table", NoTable)
    with pytest.raises(RLForgeError, match=r"rollout 'no_tokens' declares token_io=True .* no generate_tokens\(\)"):
        regs.rollout.register("no_tokens", NoTokens)
