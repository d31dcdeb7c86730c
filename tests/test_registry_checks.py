"""rlforge.registry: what registration refuses or records beyond the plain registry (tests/test_registry.py) —
two plugins claiming one name, reward functions that cannot be called, algorithms that are no RLModule."""

from __future__ import annotations

from typing import Optional

import pytest

from rlforge.errors import RLForgeError
from rlforge.module import RLModule
from rlforge.registry import Registries


def _algo() -> type:
    """A new algorithm class (``Registries.algorithm`` takes RLModule subclasses only)."""
    return type("Algo", (RLModule,), {})


# --- two plugins, one name ------------------------------------------------------------------------------------------


def _two_plugins(regs: Registries, first_override: bool, second_override: bool) -> tuple[object, object]:
    """A built-in ``grpo``, then plugins ``plug_a`` and ``plug_b`` (not built in) that both register ``grpo``."""
    first, second = _algo(), _algo()
    regs.set_current_plugin("rlforge.algorithms.grpo")
    regs.algorithm.register("grpo", _algo())
    regs.set_current_plugin("plug_a", "'plug_a' (from rlforge-plug-a 0.1.0)")
    regs.algorithm.register("grpo", first, override=first_override)
    regs.set_current_plugin("plug_b", "'plug_b' (from rlforge-plug-b 0.2.0)")
    regs.algorithm.register("grpo", second, override=second_override)
    return first, second


def test_two_plugins_replacing_one_built_in_contest_it() -> None:
    """Which of two installed plugins won used to depend on their install order, silently: now the name is contested
    and using it names both and the choice."""
    from rlforge.registry import ComponentConflictError

    regs = Registries()
    _two_plugins(regs, True, True)
    assert "grpo" in regs.algorithm
    with pytest.raises(ComponentConflictError) as info:
        regs.algorithm.get("grpo")
    assert str(info.value) == (
        "algorithm 'grpo' (built in, from plugin 'rlforge.algorithms.grpo') is replaced by 2 plugins: 'plug_a' (from "
        "rlforge-plug-a 0.1.0) and 'plug_b' (from rlforge-plug-b 0.2.0). Which one a run got would depend on the "
        "order they load in (for installed packages, the order they were installed in), so none is used: choose one "
        "by disabling the others for the run, e.g. 'plugins.disable=[plug_b]' keeps 'plug_a' (or uninstall one).")
    assert regs.conflicts() == [str(info.value)]
    assert regs.components_of("plug_a") == ["algorithm:grpo  (CONTESTED: also registered by plug_b; not usable "
                                            "until one is disabled)"]
    assert regs.components_of("plug_b") == ["algorithm:grpo  (CONTESTED: also registered by plug_a; not usable "
                                            "until one is disabled)"]


def test_a_built_in_s_name_needs_override_whichever_plugin_holds_it() -> None:
    """Without override=True a plugin cannot take a built-in's name, also when another plugin replaced the built-in
    first: the outcome does not depend on which of the two loads first."""
    with pytest.raises(RLForgeError, match=r"^algorithm 'grpo' is already registered \(by plugin "
                                           r"'rlforge.algorithms.grpo'\); pass override=True to replace it.$"):
        _two_plugins(Registries(), True, False)


def test_two_plugins_registering_a_new_name_contest_it() -> None:
    from rlforge.registry import ComponentConflictError

    regs = Registries()
    regs.set_current_plugin("plug_a", "'plug_a' (from rlforge-plug-a 0.1.0)")
    regs.algorithm.register("twin", _algo())
    regs.algorithm.register("own_a", _algo())
    regs.set_current_plugin("plug_b", "'plug_b' (from rlforge-plug-b 0.2.0)")
    regs.algorithm.register("twin", _algo(), override=True)
    regs.algorithm.register("own_b", _algo())  # the rest of both plugins still loads
    with pytest.raises(ComponentConflictError, match=r"^algorithm 'twin' is registered by 2 plugins: 'plug_a' "
                                                     r"\(from rlforge-plug-a 0.1.0\) and 'plug_b'"):
        regs.algorithm.entry("twin")
    assert regs.algorithm.entry("own_a").plugin == "plug_a" and regs.algorithm.entry("own_b").plugin == "plug_b"


def test_one_plugin_replacing_a_built_in_is_recorded() -> None:
    regs = Registries()
    regs.set_current_plugin("rlforge.algorithms.grpo")
    regs.algorithm.register("grpo", _algo())
    regs.set_current_plugin("plug_a", "'plug_a' (from rlforge-plug-a 0.1.0)")
    mine = _algo()
    regs.algorithm.register("grpo", mine, override=True)
    regs.algorithm.register("grpo", mine, override=True)  # again, by the same plugin: still its own
    entry = regs.algorithm.entry("grpo")
    assert (entry.obj, entry.plugin, entry.replaced) == (mine, "plug_a", "rlforge.algorithms.grpo")
    assert regs.components_of("plug_a") == ["algorithm:grpo  (replaces the one of rlforge.algorithms.grpo)"]
    assert regs.conflicts() == []


def test_code_outside_plugins_may_still_replace_a_plugin_s_component() -> None:
    """A registration that is not a plugin's (a script, a benchmark) is one explicit choice: override=True wins,
    without it the name is taken."""
    regs = Registries()
    regs.set_current_plugin("plug_a", "'plug_a' (from rlforge-plug-a 0.1.0)")
    regs.algorithm.register("twin", _algo())
    regs.set_current_plugin("<direct>")
    with pytest.raises(RLForgeError, match=r"already registered \(by plugin 'plug_a'\); pass override=True"):
        regs.algorithm.register("twin", _algo())
    mine = _algo()
    regs.algorithm.register("twin", mine, override=True)
    assert regs.algorithm.get("twin") is mine and regs.algorithm.entry("twin").replaced == "plug_a"


def test_a_reward_function_that_cannot_be_called_is_refused_at_registration() -> None:
    """A number registered as reward function failed only at the first batch's scores, after the model loaded and
    generated (helper-59); a callable object, a partial and an async function pass (their signatures are checked
    where a run uses them; an async one is awaited there, as reward.file's: helper-81 found the two doors differ)."""
    import functools

    from rlforge.registry import Registries

    async def scored(data_source, solution_str, ground_truth, extra_info):
        return 1.0

    class Scorer:
        def __call__(self, data_source, solution_str, ground_truth, extra_info):
            return 1.0

    registries = Registries()
    with pytest.raises(RLForgeError, match=r"reward fn 'x' \(plugin '<unknown>'\): 42 is not callable"):
        registries.reward_fn.register("x", 42)
    registries.reward_fn.register("y", scored)
    registries.reward_fn.register("v", functools.partial(scored))
    registries.reward_fn.register("z", Scorer())
    registries.reward_fn.register("w", functools.partial(lambda data_source, solution_str, ground_truth, extra_info,
                                                         k=1: k))
    assert set(registries.reward_fn.available()) == {"y", "v", "z", "w"}


def test_an_algorithm_is_an_rlmodule_subclass_with_a_class_level_validate_config() -> None:
    """Refused at registration, naming the class and the plugin: not later as an AttributeError on config_class, or a
    TypeError when the config is composed."""

    class NotModule:
        """Not an RLModule."""

    class PlainValidate(RLModule):
        def validate_config(self, config):
            pass

    regs = Registries()
    regs.set_current_plugin("my_plugin")
    with pytest.raises(RLForgeError, match=r"^algorithm 'nm' \(plugin 'my_plugin'\): class .*NotModule is not an "
                                           r"RLModule subclass: register a class that extends rlforge.RLModule"):
        regs.algorithm.register("nm", NotModule)
    with pytest.raises(RLForgeError, match=r"^algorithm 'fn' \(plugin 'my_plugin'\): function .* is not an RLModule "
                                           r"subclass"):
        regs.algorithm.register("fn", lambda config: None)
    with pytest.raises(RLForgeError, match=r"PlainValidate.validate_config is a plain method, .* make it a "
                                           r"@classmethod validate_config\(cls, config\)"):
        regs.algorithm.register("plain", PlainValidate)
    assert "nm" not in regs.algorithm and "plain" not in regs.algorithm


def test_an_algorithms_config_class_is_a_dataclass_that_keeps_the_types_it_inherits() -> None:
    """helper-80: a config_class that is not a dataclass, or that declares GRPO's float epsilon as str, ended in a
    TypeError traceback (dataclasses.fields; 'str' >= 'float' in GRPO's check) at `rlforge fit`."""
    import dataclasses

    from rlforge.algorithms.grpo import GRPO, GRPOConfig
    from rlforge.plugin_manager import PluginManager

    class Loose:
        foo = 1

    @dataclasses.dataclass
    class Retyped(GRPOConfig):
        epsilon: str = "oops"  # type: ignore[assignment]

    @dataclasses.dataclass
    class Added(GRPOConfig):
        bonus: float = 0.5
        epsilon: float = 0.3  # the same type, another default: fine

    class Undecorated(GRPOConfig):  # its own fields would not be keys (helper-82)
        bonus: float = 0.5

    @dataclasses.dataclass
    class Unrelated:
        bonus: float = 0.5

    @dataclasses.dataclass
    class Widened(GRPOConfig):
        epsilon: Optional[float] = 0.2  # noqa: UP045 - a null would reach GRPO's checks

    regs = Registries()
    for config, match in ((Loose, r"config_class = .*Loose is not a dataclass that extends the algorithm section's"),
                          (Undecorated, "Undecorated is not a dataclass that extends"),
                          (Unrelated, "Unrelated is not a dataclass that extends"),
                          (Widened, r"declares 'epsilon' as Optional\[float\], and GRPOConfig"),
                          (Retyped, r"declares 'epsilon' as str, and GRPOConfig \(which it extends\) as float")):
        with pytest.raises(RLForgeError, match=match):
            regs.algorithm.register("x", type("Mine", (GRPO,), {"config_class": config}))
    regs.algorithm.register("ok", type("Mine", (GRPO,), {"config_class": Added}))
    assert len(PluginManager(autoload=False).registry.algorithm.available()) >= 20  # every built-in passes


def test_a_tool_without_execute_is_refused_at_registration() -> None:
    """helper-80: a Tool subclass that kept the base's execute (which raises) registered and built, and every call
    the model made failed while the run trained on."""
    from rlforge.agent.base import Tool
    from rlforge.plugin_manager import PluginManager

    class NoExec(Tool):
        name = "noexec"

    class NoneExec(Tool):
        name = "noneexec"
        execute = None

    class Calc(Tool):
        name = "calc"

        async def execute(self, arguments, state):
            return "4"

    regs = Registries()
    with pytest.raises(RLForgeError, match=r"NoExec extends rlforge.agent.Tool without an execute method: implement "
                                           r"execute\(self, arguments, state\)"):
        regs.tool.register("noexec", NoExec)
    with pytest.raises(RLForgeError, match="NoneExec extends rlforge.agent.Tool without an execute method"):
        regs.tool.register("noneexec", NoneExec)
    regs.tool.register("calc", Calc)
    assert "calc" in regs.tool and "noexec" not in regs.tool
    assert PluginManager(autoload=False).registry.tool.available()  # the built-in tools pass
