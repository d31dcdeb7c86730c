"""What a Lightning user hands ``Trainer.fit`` is checked where it arrives (helper-70's and helper-71's passes): a
module built with another config, an unregistered subclass's preset and config section, checkpoint entries two callbacks
share, a module state that would not load, early stopping (``trainer.should_stop``), callback order, and named errors
for subclasses that break ``RLModule``'s contract."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

import numpy as np
import pytest

from rlforge import Trainer
from rlforge.algorithms.grpo import GRPO, GRPOConfig
from rlforge.algorithms.ppo import PPO
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import PluginManager
from rlforge.testing import fast_config
from tests.test_module_contracts import TINY, _fit


@dataclass
class ClippedConfig(GRPOConfig):
    adv_clip: float = 2.0


class OwnSection(GRPO):
    config_class = ClippedConfig


class OwnPreset(GRPO):
    preset = {"rollout": {"n": 4}}


class OwnCheck(GRPO):
    @classmethod
    def validate_config(cls, config):
        raise ValueError("no config suits OwnCheck")


def test_a_module_built_with_another_config_is_refused(tmp_path, pm) -> None:
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    other = fast_config("grpo", tmp_path, *TINY, "actor.lr=0.5", plugins=pm)
    with pytest.raises(ConfigError, match=r"GRPO was built with another config than the Trainer's: actor.lr is 0.5 in "
                                          r"the module's, 5e-05 in the Trainer's"):
        Trainer(cfg, plugins=pm).fit(GRPO(other))
    assert _fit(GRPO, tmp_path, pm).step == 1  # an equal config, composed twice, is the same config


@pytest.mark.parametrize(("module_class", "named"), [
    (OwnSection, "OwnSection sets its config_class's algorithm.adv_clip, which the config never got"),
    (OwnPreset, "OwnPreset sets rollout.n=4 in its preset, which the config never got"),
    (OwnCheck, "OwnCheck.validate_config refused the config: no config suits OwnCheck"),
    (PPO, "PPO sets its config_class's algorithm.gamma, which the config never got: it was composed for --algo "
          "grpo (GRPO), and only the preset and config section of the algorithm it is composed for are in it. Compose "
          "the config for it: load_config('ppo', ...) (--algo ppo)"),
])
def test_an_unregistered_module_s_own_config_is_not_ignored(tmp_path, pm, module_class, named) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        _fit(module_class, tmp_path, pm)


def test_a_registered_module_gets_its_preset_and_section(tmp_path) -> None:
    pm = PluginManager(autoload=False)  # not the session's shared one: this test registers
    pm.registry.algorithm.register("clipped", OwnSection)
    pm.registry.algorithm.register("preset_n", OwnPreset)
    cfg = fast_config("clipped", tmp_path, *TINY, plugins=pm)
    assert cfg.algorithm.adv_clip == 2.0
    Trainer(cfg, plugins=pm).fit(OwnSection(cfg))
    assert fast_config("preset_n", tmp_path, plugins=pm).rollout.n == 4


class Counter:
    def __init__(self, start: int, key: str = "count") -> None:
        self.count, self.key = start, key

    @hookimpl
    def rlforge_step_end(self, trainer):
        self.count += 1

    @hookimpl
    def rlforge_save_checkpoint(self, checkpoint):
        checkpoint[self.key] = self.count

    @hookimpl
    def rlforge_load_checkpoint(self, checkpoint):
        self.count = checkpoint[self.key]


def test_two_callbacks_saving_one_checkpoint_entry_are_refused(tmp_path, pm) -> None:
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    with pytest.raises(RLForgeError, match="Counter and Counter both save the checkpoint entry 'count'"):
        Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[Counter(0), Counter(100)]).fit()
    first, second = Counter(0, "first"), Counter(100, "second")
    run = fast_config("grpo", tmp_path, *TINY, "trainer.total_steps=1", f"trainer.run_dir={tmp_path / 'run'}",
                      plugins=pm)
    Trainer(run, plugins=PluginManager(autoload=False), callbacks=[first, second]).fit()
    first, second = Counter(0, "first"), Counter(0, "second")
    resumed = fast_config("grpo", tmp_path, *TINY, "trainer.total_steps=2", f"trainer.run_dir={tmp_path / 'run'}",
                          "trainer.resume=auto", plugins=pm)
    Trainer(resumed, plugins=PluginManager(autoload=False), callbacks=[first, second]).fit()
    assert (first.count, second.count) == (2, 102)  # each restored its own entry, then counted step 2


class StateOfNumpy(GRPO):
    def state_dict(self):
        return {"seen": np.zeros(2)}

    def on_rollout_end(self, batch):
        raise AssertionError("the state is checked before the first step")


def test_a_module_state_that_would_not_load_is_refused_before_training(tmp_path, pm) -> None:
    with pytest.raises(RLForgeError, match=r"checkpoint entry 'seen' \(StateOfNumpy.state_dict\(\)\) does not load"):
        _fit(StateOfNumpy, tmp_path, pm)


class StopAt:
    def __init__(self, step: int) -> None:
        self.at, self.validated = step, []

    @hookimpl
    def rlforge_step_end(self, trainer, step):
        trainer.should_stop = step == self.at

    @hookimpl
    def rlforge_validation_end(self, step):
        self.validated.append(step)


def test_a_hook_stops_the_run_early_and_it_ends_as_at_total_steps(tmp_path, pm, capsys) -> None:
    stop = StopAt(2)
    cfg = fast_config("grpo", tmp_path, *TINY, "trainer.total_steps=4", "trainer.val_every=2",
                      "trainer.val_at_end=true", f"trainer.run_dir={tmp_path / 'run'}", plugins=pm)
    trainer = Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[stop])
    assert trainer.fit()["steps"] == 2
    assert "stopped after step 2 of 4: a hook set trainer.should_stop" in capsys.readouterr().out
    assert stop.validated == [2]  # the end's validation, once
    assert [p.name for p in (tmp_path / "run" / "checkpoints").iterdir()] == ["step_000002"]


class FlowOfNone(GRPO):
    def flow(self):
        return None


class NoActor(GRPO):
    def configure_model(self):
        pass


class NoSuperInit(GRPO):
    def __init__(self, config):
        self.config = config


class NarrowHook(GRPO):
    def on_train_step_end(self):
        pass


class WiderHook(GRPO):
    def on_train_step_end(self, metrics, scale=1.0):
        self.log("custom/scaled", scale)


@pytest.mark.parametrize(("module_class", "named"), [
    (FlowOfNone, "FlowOfNone.flow() returned NoneType: return the step's DataFlow"),
    (NoActor, "NoActor.configure_model() left self.actor None: call super().configure_model()"),
    (NoSuperInit, "NoSuperInit.__init__ did not call super().__init__(config)"),
    (NarrowHook, "NarrowHook.on_train_step_end(self) does not take the arguments the loop passes it: "
                 "RLModule.on_train_step_end(self, metrics"),
])
def test_a_subclass_that_breaks_rlmodule_s_contract_is_named(tmp_path, pm, module_class, named) -> None:
    with pytest.raises(RLForgeError, match=re.escape(named)):
        _fit(module_class, tmp_path, pm)


def test_an_override_with_more_optional_arguments_runs(tmp_path, pm) -> None:
    assert _fit(WiderHook, tmp_path, pm).history[-1]["custom/scaled"] == 1.0


class OddNames(GRPO):
    name: object = 42

    def on_train_step_end(self, metrics):
        self.log(self.name, 1.0)


@pytest.mark.parametrize("name", [42, "", ("tuple",)])
def test_a_metric_name_that_is_not_a_string_is_named(tmp_path, pm, name) -> None:
    module_class = type("OddName", (OddNames,), {"name": name})
    with pytest.raises(RLForgeError, match=re.escape(f"metric name {name!r} (self.log in OddNames.on_train_step_end) "
                                                     f"is not a name")):
        _fit(module_class, tmp_path, pm)


class Order:
    def __init__(self, name: str, calls: list[str]) -> None:
        self.name, self.calls = name, calls

    @hookimpl
    def rlforge_step_end(self):
        self.calls.append(self.name)


def test_callbacks_run_in_the_list_s_order(tmp_path, pm) -> None:
    calls: list[str] = []
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[Order(n, calls) for n in "ABC"]).fit()
    assert calls == ["A", "B", "C"]


def test_a_callback_class_instead_of_an_instance_is_named(tmp_path, pm) -> None:
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    with pytest.raises(RLForgeError, match=re.escape("is a class whose rlforge_step_end is a method: register an "
                                                     "instance (Trainer(callbacks=[Order()]))")):
        Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[Order])


class StopEarly:
    @hookimpl
    def rlforge_fit_start(self, trainer):
        trainer.should_stop = True


class StopAtValidation:
    def __init__(self) -> None:
        self.validated: list[int] = []

    @hookimpl
    def rlforge_validation_end(self, trainer, step):
        self.validated.append(step)
        trainer.should_stop = True


def test_a_stop_set_before_step_1_or_by_a_validation_ends_the_run_after_that_step(tmp_path, pm) -> None:
    cfg = fast_config("grpo", tmp_path, *TINY, "trainer.total_steps=3", plugins=pm)
    assert Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=StopEarly()).fit()["steps"] == 1
    stop = StopAtValidation()
    cfg = fast_config("grpo", tmp_path, *TINY, "trainer.total_steps=3", "trainer.val_every=1", "trainer.save_every=1",
                      "trainer.val_at_end=true", plugins=pm)
    summary = Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[stop]).fit()
    assert summary["steps"] == 1 and stop.validated == [1]  # step 1 validated once, the end reuses it
    assert summary["accuracy_after"] is not None


class Takes:
    def __init__(self, key: str, pops: str | None = None) -> None:
        self.key, self.pops, self.got = key, pops, None

    @hookimpl
    def rlforge_save_checkpoint(self, checkpoint):
        checkpoint[self.key] = {"seen": [1, 2]}

    @hookimpl
    def rlforge_load_checkpoint(self, checkpoint):
        self.got = checkpoint.get(self.key)
        if self.pops:
            checkpoint.pop(self.pops)
        checkpoint.clear()


def test_each_checkpoint_loader_gets_every_entry(tmp_path, pm) -> None:
    run = tmp_path / "run"
    cfg = fast_config("grpo", tmp_path, *TINY, f"trainer.run_dir={run}", plugins=pm)
    Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[Takes("a"), Takes("b")]).fit()
    first, second = Takes("a", pops="b"), Takes("b", pops="a")
    resumed = fast_config("grpo", tmp_path, *TINY, "trainer.total_steps=2", f"trainer.run_dir={run}",
                          "trainer.resume=auto", plugins=pm)
    Trainer(resumed, plugins=PluginManager(autoload=False), callbacks=[first, second]).fit()
    assert first.got == second.got == {"seen": [1, 2]}  # the first's pop and clear left the second its entry


class LightningStyle:
    def on_fit_start(self, trainer, module):
        pass


def test_a_callback_with_no_rlforge_hook_is_warned_about(tmp_path, pm, caplog) -> None:
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[LightningStyle()])
    assert ("The callback LightningStyle implements no rlforge_* hook, so nothing of it is called. Its on_fit_start "
            "are not rlforge hooks (close: rlforge_fit_start)") in caplog.text


def test_a_module_config_differing_only_in_keys_a_resume_may_change_is_taken(tmp_path, pm) -> None:
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    quiet = fast_config("grpo", tmp_path, *TINY, "trainer.progress=true", "trainer.val_at_end=true", plugins=pm)
    assert Trainer(cfg, plugins=pm).fit(GRPO(quiet))["steps"] == 1


def test_a_module_made_from_a_plain_dict_is_refused_with_how_to_compose_a_config():
    with pytest.raises(ConfigError, match=r"GRPO\(config\) takes a composed config, not a dict: rlforge.load_config"):
        GRPO({"algorithm": {"name": "grpo"}})
    with pytest.raises(ConfigError, match=r"PPO\(config\) takes a composed config"):
        PPO(config={})


class Replaces:
    def __init__(self, key: str, value=1.0) -> None:
        self.key, self.value = key, value

    @hookimpl
    def rlforge_step_end(self, metrics):
        metrics[self.key] = self.value


def test_a_hook_that_replaces_a_metric_rlforge_wrote_is_refused_and_one_that_drops_or_adds_is_not(tmp_path, pm):
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    with pytest.raises(RLForgeError, match=r"metric 'critic/score/mean' was replaced in rlforge_step_end "
                                           r"\(.*Replaces.*\) or GRPO.on_train_step_end \(.* -> 7.0\): rlforge writes "
                                           r"it itself .*'custom/mean'"):
        Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[Replaces("critic/score/mean", 7.0)]).fit()

    class Drops:
        @hookimpl
        def rlforge_step_end(self, metrics):
            del metrics["critic/score/mean"]

    trainer = Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[Drops(), Replaces("custom/mine")])
    trainer.fit()
    assert "critic/score/mean" not in trainer.history[-1] and trainer.history[-1]["custom/mine"] == 1.0


class LogsScoreMean(GRPO):
    def flow(self):
        from rlforge.dataflow import Stage

        class Logs(Stage):
            name = "logs"

            def run(self, ctx, batch):
                ctx.log({"critic/score/mean": 7.0})
                return batch

        return super().flow().insert_after(Stage.REWARD, Logs())


class ReplacesAccuracy:
    @hookimpl
    def rlforge_validation_end(self, metrics):
        metrics["val/accuracy"] = 0.99


def test_a_stage_or_a_validation_hook_that_replaces_a_metric_rlforge_writes_is_refused(tmp_path, pm):
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    with pytest.raises(RLForgeError, match=r"metric 'critic/score/mean' was replaced in this step's ctx.log \(a stage "
                                           r"of dataflow .* -> 7.0\)"):
        Trainer(cfg, plugins=PluginManager(autoload=False)).fit(LogsScoreMean(cfg))
    cfg = fast_config("grpo", tmp_path, *TINY, "trainer.val_at_end=true", plugins=pm)
    with pytest.raises(RLForgeError, match=r"metric 'val/accuracy' was replaced in rlforge_validation_end "
                                           r"\(.*ReplacesAccuracy.*\) \(.* -> 0.99\)"):
        Trainer(cfg, plugins=PluginManager(autoload=False), callbacks=[ReplacesAccuracy()]).fit()
