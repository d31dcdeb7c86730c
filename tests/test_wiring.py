"""The wiring: components own their config sections, one Builder makes the objects, plugin hygiene (issue #13).

The last tests install a third-party package with pip that brings its own rollout engine with its own config
keys, a hook-only plugin with ``plugins.<name>.*`` options, and a stage inserted into every algorithm's flow.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlforge.config import compose
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.plugin_manager import AUTOLOAD_ENV, PluginError, PluginManager
from tests.plugin_dist import installed_package

# --- config sections owned by components -----------------------------------------------------------


def test_builtin_components_own_their_sections(default_config) -> None:
    assert default_config.rollout.hf.compile is False
    assert default_config.rollout.vllm.weight_bucket_mb == 64
    assert default_config.strategy.fsdp.backend == "auto"
    assert default_config.data.arith.train_size == 20000
    assert default_config.ray.placement_strategy == "PACK"
    assert "compile" not in default_config.rollout and "train_size" not in default_config.data


def test_plugin_keys_get_did_you_mean(registry) -> None:
    with pytest.raises(ConfigError, match=r"Unknown config key 'rollout.hf.compil'.*Did you mean 'rollout.hf.compile'"):
        compose(registry, None, None, ["rollout.hf.compil=true"])
    with pytest.raises(ConfigError, match=r"Did you mean 'data.arith.max_operand'"):
        compose(registry, None, None, ["data.arith.max_opernd=9"])


def test_selected_components_validate_their_own_section(registry) -> None:
    ray = ["trainer.controller=ray", "strategy.name=fsdp"]
    with pytest.raises(ConfigError, match=r"strategy.fsdp.backend='mpi'. Allowed: auto, nccl, gloo"):
        compose(registry, None, None, [*ray, "strategy.fsdp.backend=mpi"])
    # an unselected component's section is not its business
    assert compose(registry, None, None, ["strategy.fsdp.backend=mpi"]).strategy.fsdp.backend == "mpi"
    with pytest.raises(ConfigError, match=r"'rollout.vllm.gpu_memory_utilization' must be in \(0, 1\], got 1.5"):
        compose(registry, None, None, ["rollout.name=vllm", "rollout.vllm.gpu_memory_utilization=1.5"])
    with pytest.raises(ConfigError, match=r"'rollout.vllm.idle_spin_s' must be >= 0, got -1(\.0)?: seconds, or null"):
        compose(registry, None, None, ["rollout.name=vllm", "rollout.vllm.idle_spin_s=-1"])
    with pytest.raises(ConfigError, match="needs one process per rank"):
        compose(registry, None, None, ["strategy.name=fsdp"])
    with pytest.raises(ConfigError, match=r"rollout.hf.compile=true .* model.precision=bf16-mixed .* "
                                          r"model.precision=32-true or bf16-true"):
        compose(registry, None, None, ["rollout.hf.compile=true", "model.precision=bf16-mixed"])
    assert compose(registry, None, None, ["rollout.hf.compile=true", "model.precision=bf16-true"]).rollout.hf.compile


@dataclass
class _Opts:
    level: int = 3  # how much


def test_two_components_cannot_claim_one_section() -> None:
    pm = PluginManager(autoload=False)

    class Clash:
        @hookimpl
        def rlforge_register(self, registry):
            registry.reward_fn.register("rule", lambda *a: 1.0, config=_Opts)  # reward.rule: also a manager's?

    pm.register(Clash(), name="clash")  # the rule manager has no options, so no clash yet
    assert compose(pm.registry, None, None, ["reward.rule.level=5"]).reward.rule.level == 5

    class CoreKey:
        @hookimpl
        def rlforge_register(self, registry):
            registry.rollout.register("n", object, config=_Opts)  # rollout.n is a core key

    pm.register(CoreKey(), name="corekey")
    with pytest.raises(ConfigError, match=r"declares config section 'rollout.n', which is a core key"):
        compose(pm.registry, None, None, [])


def test_config_must_be_a_dataclass() -> None:
    pm = PluginManager(autoload=False)
    with pytest.raises(RLForgeError, match="config= must be a dataclass"):
        pm.registry.rollout.register("x", object, config=dict)


def test_config_show_names_the_owners(capsys, no_autoload) -> None:
    from rlforge.cli import main

    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "rollout.hf (rlforge.plugins.rollout.hf)" in out
    assert "strategy.fsdp (rlforge.plugins.strategy.fsdp)" in out
    assert "ray (rlforge.controller.ray_controller)" in out


def test_builder_checks_the_protocol() -> None:
    from rlforge.build import Builder

    pm = PluginManager(autoload=False)

    class NoGenerate:
        supports_sleep = False

        def __init__(self, config, model, tokenizer):
            pass

    pm.registry.rollout.register("broken", NoGenerate)
    cfg = compose(pm.registry, None, None, ["rollout.name=broken"])
    with pytest.raises(RLForgeError, match=r"rollout.name=broken.*does not implement rlforge.protocols.RolloutEngine "
                                           r"\(missing: generate, shutdown, update_weights\)"):
        Builder(cfg, pm).rollout(None, None)


# --- plugin hygiene -----------------------------------------------------------------------------------


def test_unknown_hook_is_refused_with_the_plugin_name_and_a_suggestion() -> None:
    class Typo:
        @hookimpl
        def rlforge_step_ends(self, trainer, step, metrics):
            pass

    pm = PluginManager(autoload=False)
    with pytest.raises(PluginError, match=r"Plugin 'typo' implements 'rlforge_step_ends', which is not an rlforge "
                                          r"hook. Did you mean 'rlforge_step_end'"):
        pm.register(Typo(), name="typo")
    assert not pm.pm.is_registered(Typo)


def test_unmarked_rlforge_functions_are_hooks_as_in_pytest() -> None:
    seen = []

    class Unmarked:
        def rlforge_step_end(self, trainer, step, metrics):
            seen.append(step)

    pm = PluginManager(autoload=False)
    pm.register(Unmarked(), name="unmarked")
    pm.hook.rlforge_step_end(trainer=None, step=7, metrics={})
    assert seen == [7]


def test_registration_is_all_or_nothing() -> None:
    class HalfWay:
        @hookimpl
        def rlforge_register(self, registry):
            registry.algorithm.register("half_algo", RLModule)
            registry.reward_fn.register("half_reward", lambda *a: 0.0)
            raise RuntimeError("boom after two registrations")

    pm = PluginManager(autoload=False)
    with pytest.raises(RuntimeError, match="boom"):
        pm.register(HalfWay(), name="halfway")
    assert "half_algo" not in pm.registry.algorithm and "half_reward" not in pm.registry.reward_fn
    assert "grpo" in pm.registry.algorithm  # what others registered stays


@pytest.fixture
def broken_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from rlforge import plugin_manager as pmod

    (tmp_path / "rlf_half_plugin.py").write_text(textwrap.dedent("""
        from rlforge import RLModule
        from rlforge.hookspecs import hookimpl

        @hookimpl
        def rlforge_register(registry):
            registry.algorithm.register("half_way_algo", RLModule)
            raise ImportError("needs the frobnicate package")
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(pmod, "BUILTIN_PLUGINS", pmod.BUILTIN_PLUGINS + ("rlf_half_plugin",))
    yield "rlf_half_plugin"
    sys.modules.pop("rlf_half_plugin", None)


def test_failed_and_disabled_plugins_are_named_in_every_command_and_in_unknown_names(
    broken_module: str, capsys, no_autoload
) -> None:
    from rlforge.cli import main

    pm = PluginManager(autoload=False)
    assert "half_way_algo" not in pm.registry.algorithm
    with pytest.raises(RLForgeError, match=r"Unknown algorithm 'half_way_algo'.*Plugins not loaded: rlf_half_plugin "
                                           r"\(failed to load: ImportError: needs the frobnicate package\)"):
        pm.registry.algorithm.get("half_way_algo")
    for argv in (["algos"], ["config", "show"], ["fit", "--algo", "nope"]):
        main(argv)
        err = capsys.readouterr().err
        assert "rlforge: warning: plugin 'rlf_half_plugin' failed to load: ImportError: needs the frobnicate" in err
    main(["config", "show", "plugins.disable=[rlforge.plugins.logger.wandb_logger]"])
    err = capsys.readouterr().err
    assert "plugin 'rlforge.plugins.logger.wandb_logger' is disabled (plugins.disable)" in err
    main(["fit", "logger.backends=[wandb]", "plugins.disable=[rlforge.plugins.logger.wandb_logger]"])
    err = capsys.readouterr().err
    assert "Unknown logger 'wandb' (logger.backends)" in err and "wandb_logger (disabled by plugins.disable)" in err


def test_plugins_disable_is_read_before_composing(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlforge.config import compose_with_plugins

    made = []
    real = PluginManager.__init__

    def counting(self, *a, **k):
        made.append(k.get("disable"))
        real(self, *a, **k)

    monkeypatch.setattr(PluginManager, "__init__", counting)
    pm, cfg = compose_with_plugins(None, None, ["plugins.disable=[rlforge.plugins.logger.wandb_logger]"])
    assert made == [["rlforge.plugins.logger.wandb_logger"]]  # one manager, one composition
    assert "wandb" not in pm.registry.logger


# --- a third-party package: its own engine with config keys, a hook-only plugin with options, a stage ----

DIST = "rlforge-testplug-wiring"
PLUGIN = '''
"""Test plugins: an engine with its own options, and a hook-only plugin that edits every flow."""
from dataclasses import dataclass

from rlforge import batch as B
from rlforge.dataflow import Stage
from rlforge.hookspecs import hookimpl
from rlforge.plugins.rollout.hf import HFRollout


@dataclass
class ShortConfig:
    max_tokens: int = 2  # the most tokens this engine ever generates


class ShortRollout(HFRollout):
    """The hf engine, capped at rollout.short.max_tokens new tokens."""

    def generate(self, batch, params):
        from dataclasses import replace
        cap = self.config.rollout.short.max_tokens
        return super().generate(batch, replace(params, max_new_tokens=min(cap, params.max_new_tokens)))


@hookimpl
def rlforge_register(registry):
    registry.rollout.register("short", ShortRollout, config=ShortConfig)
'''
HOOKS = '''
"""A plugin without components: options at plugins.tagger.*, a stage in every flow."""
from dataclasses import dataclass

from rlforge import batch as B
from rlforge.dataflow import Stage
from rlforge.hookspecs import hookimpl


@dataclass
class TaggerOptions:
    metric: str = "tagger/longest"  # the metric name to log


class LongestResponse(Stage):
    name = "longest_response"
    requires = frozenset({B.RESPONSE_MASK})

    def __init__(self, metric):
        self.metric = metric

    def run(self, ctx, batch):
        ctx.log({self.metric: float(batch[B.RESPONSE_MASK].sum(-1).max())})
        return batch


@hookimpl
def rlforge_register(registry):
    registry.plugin_options(TaggerOptions)


@hookimpl
def rlforge_before_flow_compile(flow, module, config):
    if Stage.REWARD in flow:  # offline algorithms (dpo, rm, ...) have no rollout and no reward stage
        flow.insert_after(Stage.REWARD, LongestResponse(config.plugins.tagger.metric))
'''


@pytest.fixture(scope="module")
def wiring_package(tmp_path_factory: pytest.TempPathFactory):
    with installed_package(tmp_path_factory.mktemp("wiring_dist"), DIST, "wiring_pkg",
                           {"shortengine": ("engine", PLUGIN), "tagger": ("tagger", HOOKS)}, "0.0.1"):
        yield DIST


def test_third_party_engine_and_hook_only_plugin_own_config_keys(wiring_package, monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    from rlforge.config import compose_with_plugins
    from rlforge.trainer import Trainer

    pm, cfg = compose_with_plugins("grpo", None, [
        "rollout.name=short", "rollout.short.max_tokens=3", "plugins.tagger.metric=custom/longest",
        "trainer.total_steps=2", "data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=2",
        "data.arith.train_size=512", "data.arith.val_size=4", "trainer.val_before_train=false", "trainer.save_every=0",
        "logger.backends=[console]", "trainer.progress=false", f"trainer.runs_root={tmp_path}",
    ])
    assert pm.registry.rollout.entry("short").plugin == "shortengine"
    with pytest.raises(ConfigError, match="Did you mean 'plugins.tagger.metric'"):
        compose_with_plugins("grpo", None, ["plugins.tagger.metrc=x"])
    trainer = Trainer(cfg, plugins=pm)
    trainer.fit()
    assert "longest_response" in trainer.flow.names()
    for row in trainer.history:
        assert row["custom/longest"] <= 3  # the engine's own option capped the responses
        assert "timing_s/longest_response" in row


def test_a_plugin_stage_goes_into_every_algorithms_flow(wiring_package, monkeypatch) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    from rlforge.build import Builder
    from rlforge.trainer import Trainer

    pm = PluginManager()
    for algo in pm.registry.algorithm.available():
        cfg = compose(pm.registry, algo, None, [])
        module = pm.registry.algorithm.get(algo)(cfg)
        trainer = Trainer(cfg, plugins=pm)
        flow = trainer.build_flow(module)
        if "reward" not in flow:
            assert "longest_response" not in flow, algo
            continue
        assert flow.names().index("longest_response") == flow.names().index("reward") + 1, algo
        assert Builder(cfg, pm).registry is pm.registry


def test_rows_no_reward_function_can_score_fail_before_any_model_or_folder(tmp_path, capsys, no_autoload) -> None:
    import json

    from rlforge.cli import main

    data = tmp_path / "rows.jsonl"
    rows = [{"data_source": src, "prompt": "What is 1+1?", "reward_model": {"ground_truth": "2"}}
            for src in ("arith", "my_task", "other_task")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows * 12))
    code = main(["fit", "data.name=files", f"data.train_files=[{data}]", "data.train_batch_size=4",
                 "actor.ppo_mini_batch_size=4", f"trainer.runs_root={tmp_path / 'runs'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert "No reward function for data_source" in err and "'my_task'" in err and "'other_task'" in err
    assert not (tmp_path / "runs").exists()  # no run folder was made
