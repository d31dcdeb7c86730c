"""rlforge.registry: one generic Registry per component kind, collected in Registries."""

from __future__ import annotations

import pytest

from rlforge.errors import RLForgeError
from rlforge.registry import Registries, Registry, UnknownComponentError


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
    regs.algorithm.register("x", object())
    assert "x" not in regs.rollout


def test_registries_error_message_uses_config_key() -> None:
    regs = Registries()
    regs.rollout.register("hf", object())
    with pytest.raises(UnknownComponentError, match=r"Unknown rollout 'vlm' \(rollout.name\)"):
        regs.rollout.get("vlm")


def test_registries_components_of_plugin() -> None:
    regs = Registries()
    regs.set_current_plugin("p1")
    regs.algorithm.register("a1", object())
    regs.reward_fn.register("r1", object())
    regs.set_current_plugin("p2")
    regs.algorithm.register("a2", object())
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
    assert "rollout:vllm  (capabilities: owns_weights, supports_images, continuous_batching, lora_adapters)" in out
    assert ("strategy:fsdp  (capabilities: sharded, shares_prompts, async_checkpoint, "
            "same_rows_key=strategy.fsdp.sequence_parallel_size)") in out
