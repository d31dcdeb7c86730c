"""What an algorithm (``RLModule`` subclass), a stage or a plugin hands the loop is checked where it arrives, and a
mistake is one line naming the method, stage or key and what to do (helper-60's adversarial pass): ``self.log`` in and
out of a step, metrics that are not numbers, methods named like hooks that are none, stage results, ``validate_config``
errors, and a flow returned by ``rlforge_before_flow_compile``."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from rlforge import Trainer, module_checks
from rlforge import batch as B
from rlforge.algorithms.grpo import GRPO
from rlforge.capabilities import LoggerCapabilities
from rlforge.dataflow import DataFlow, Stage
from rlforge.errors import ConfigError, RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.module_checks import unknown_hooks
from rlforge.testing import fast_config, step_context

TINY = ("trainer.total_steps=1", "data.train_batch_size=2", "rollout.n=2", "actor.ppo_mini_batch_size=2",
        "actor.ppo_micro_batch_size=4", "trainer.val_at_end=false")


def _fit(module_class: type, tmp_path, pm) -> Trainer:
    cfg = fast_config("grpo", tmp_path, *TINY, plugins=pm)
    trainer = Trainer(cfg, plugins=pm)
    trainer.fit(module_class(cfg))
    return trainer


class StepEndLogger(GRPO):
    """Logs from on_train_step_end, and has methods named like hooks that none are."""

    def on_train_step_end(self, metrics):
        self.log("custom/from_step_end", 7.0)

    def on_fit_start(self):
        pass

    def on_train_step_ends(self, metrics):
        pass


class OptimizerLogger(GRPO):
    def configure_optimizers(self):
        self.log("custom/in_configure_optimizers", 1.0)
        return super().configure_optimizers()


def test_self_log_in_on_train_step_end_lands_in_the_step_and_unknown_hooks_are_reported(tmp_path, pm, caplog):
    with caplog.at_level(logging.WARNING, logger="rlforge"):
        trainer = _fit(StepEndLogger, tmp_path, pm)
    assert trainer.history[-1]["custom/from_step_end"] == 7.0
    assert trainer.module._fitting is False and trainer.module._metrics is None  # nothing left after the fit
    warned = [r.getMessage() for r in caplog.records if "is never called" in r.getMessage()]
    assert len(warned) == 2
    assert warned[0].startswith("StepEndLogger.on_fit_start is never called: it is not an RLModule hook (those are "
                                "on_rollout_end, on_train_step_end). For other events implement a plugin hook (here "
                                "rlforge_fit_start)")
    assert "StepEndLogger.on_train_step_ends is never called" in warned[1]
    assert "Did you mean 'on_train_step_end'?" in warned[1]


def test_self_log_where_no_step_runs_is_an_error_naming_the_method_while_fitting(tmp_path, pm):
    with pytest.raises(RLForgeError, match=r"OptimizerLogger.log\('custom/in_configure_optimizers'\) was called in "
                                           r"OptimizerLogger.configure_optimizers, where no training step runs"):
        _fit(OptimizerLogger, tmp_path, pm)


def test_unknown_hooks_suggest_the_module_hook_and_the_plugin_hook(registry) -> None:
    class Mine(RLModule):
        on_policy = True  # an attribute, not a method: not a hook candidate

        def on_rollout_end(self, batch):
            pass

        def on_validation_end(self):
            pass

        def on_rollout_start(self, batch):
            pass

    rollout_start, validation_end = unknown_hooks(Mine, RLModule)
    assert "Mine.on_rollout_start is never called" in rollout_start
    assert "Did you mean 'on_rollout_end'?" in rollout_start and "(here rlforge_rollout_start)" in rollout_start
    assert "Did you mean" not in validation_end and "(here rlforge_validation_end)" in validation_end
    assert [name for name in registry.algorithm.available()  # the built-in algorithms define none
            if unknown_hooks(registry.algorithm.get(name), RLModule)] == []


class Logs(RLModule):
    def compute_advantages(self, batch):
        self.log("custom/value", batch)
        return batch


def test_self_log_takes_numbers_and_names_the_key_and_the_method(default_config) -> None:
    module = Logs(default_config)
    module._metrics = {}
    module.compute_advantages(torch.tensor([2.0]))  # a one-element tensor is a number
    assert module._metrics == {"custom/value": 2.0}
    for value, what in (("hello", "str"), (torch.ones(3), r"a tensor of shape \(3,\)"), (None, "NoneType")):
        with pytest.raises(RLForgeError, match=rf"metric 'custom/value' \(self.log in Logs.compute_advantages\) is "
                                               rf"{what}, not a number"):
            module.compute_advantages(value)
    module._metrics = None
    module.compute_advantages("hello")  # no Trainer fits it: ignored
    module._fitting = True
    with pytest.raises(RLForgeError, match=r"Logs.log\('custom/value'\) was called in Logs.compute_advantages, where "
                                           r"no training step runs"):
        module.compute_advantages(1.0)


class Liar(Stage):
    name = "liar"
    produces = frozenset({"my_col"})

    def __init__(self, result=lambda batch: batch):
        self.result = result

    def run(self, ctx, batch):
        return self.result(batch)


class Needs(Stage):
    name = "needs"
    requires = frozenset({"my_col"})

    def run(self, ctx, batch):
        return batch


def _batch() -> B.Batch:
    return B.Batch({B.PROMPTS: torch.zeros(2, 3)})


def test_a_stage_returns_a_batch() -> None:
    def returns_dict(batch):
        return {"x": 1}

    for stage, named in ((Liar(lambda batch: None), r"stage 'liar' \(Liar\) returned None"),
                         (DataFlow("f", [returns_dict]).stages[0],
                          r"stage 'returns_dict' \(.*returns_dict\) returned dict")):
        flow = DataFlow("f", [stage], inputs={B.PROMPTS}).compile()
        with pytest.raises(RLForgeError, match=rf"^Dataflow 'f': {named}: a stage's run returns the batch"):
            step_context(flow=flow).run(stage, _batch())


def test_a_stage_sets_the_columns_it_promises_to_a_later_stage() -> None:
    liar = Liar()
    flow = DataFlow("f", [liar, Needs()], inputs={B.PROMPTS}).compile()
    with pytest.raises(RLForgeError, match=r"^Dataflow 'f': stage 'liar' \(Liar\) did not set 'my_col' \(stage "
                                           r"'needs' requires it\), which its produces declares: set it in its run"):
        step_context(flow=flow).run(liar, _batch())
    alone = Liar()  # what no later stage requires may be left out (an optional output)
    flow = DataFlow("f", [alone], inputs={B.PROMPTS}).compile()
    assert step_context(flow=flow).run(alone, _batch()).columns() == [B.PROMPTS]


def test_ctx_log_takes_numbers_and_names_the_key_and_the_stage() -> None:
    class Logging(Stage):
        name = "logging"

        def __init__(self, metrics):
            self.metrics = metrics

        def run(self, ctx, batch):
            ctx.log(self.metrics)
            return batch

    ctx = step_context()
    ctx.run(Logging({"custom/t": torch.tensor(3.0), "custom/n": 2}), _batch())
    assert ctx.metrics["custom/t"] == 3.0 and ctx.metrics["custom/n"] == 2
    with pytest.raises(RLForgeError, match=r"metric 'custom/s' \(ctx.log in stage 'logging' \(.*Logging\)\) is str"):
        ctx.run(Logging({"custom/s": "abc"}), _batch())
    with pytest.raises(RLForgeError, match=r"ctx.log outside a stage: ctx.log takes a dict of name -> number, got "
                                           r"list"):
        ctx.log([1.0])


ASSERTING_ALGO = """
from rlforge.module import RLModule


class Even(RLModule):
    @classmethod
    def validate_config(cls, config):
        if config.rollout.n % 2:
            raise ValueError("rollout.n must be even\\nsecond line")


class Asserts(Even):
    @classmethod
    def validate_config(cls, config):
        super().validate_config(config)
        assert config.rollout.n > 100


class Says(RLModule):
    @staticmethod
    def validate_config(config):
        raise ConfigError("'rollout.n' is wrong.")
"""


def test_validate_config_value_and_assertion_errors_are_config_errors(tmp_path) -> None:
    import importlib.util

    path = tmp_path / "asserting_algo.py"  # not a test file: its assert is not rewritten by pytest, as in a plugin
    path.write_text("from rlforge.errors import ConfigError\n" + ASSERTING_ALGO)
    spec = importlib.util.spec_from_file_location("asserting_algo", path)
    algo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(algo)

    def config(n):
        return SimpleNamespace(algorithm=SimpleNamespace(name="mine"), rollout=SimpleNamespace(n=n))

    for cls, n, reason in (
            (algo.Even, 3, r"Even.validate_config refused the config: rollout.n must be even\. Change the value"),
            (algo.Asserts, 3, r"Asserts.validate_config refused the config: rollout.n must be even\. Change"),
            (algo.Asserts, 4, r"Asserts.validate_config refused the config: assertion failed at "
                              r"asserting_algo.py:17: assert config.rollout.n > 100\. Change")):
        with pytest.raises(ConfigError, match=rf"^--algo mine: {reason}"):
            module_checks.validate_config(cls, config(n))
    assert module_checks.validate_config(algo.Asserts, config(102)) is None
    with pytest.raises(ConfigError, match=r"^'rollout.n' is wrong.$"):  # a ConfigError goes through as it is
        module_checks.validate_config(algo.Says, config(2))


class _ReturnsFlow:
    def __init__(self, same: bool):
        self.same = same

    @hookimpl
    def rlforge_before_flow_compile(self, flow):
        return flow if self.same else DataFlow("new", flow.stages)


def test_a_flow_returned_by_rlforge_before_flow_compile_is_refused(tmp_path) -> None:
    cfg = fast_config("grpo", tmp_path)
    assert Trainer(cfg, callbacks=[_ReturnsFlow(same=True)]).build_flow(GRPO(cfg)).name == "grpo"
    with pytest.raises(RLForgeError, match=r"^rlforge_before_flow_compile \(implemented by .*_ReturnsFlow.*\) returned "
                                           r"DataFlow: the hook edits the flow it is given in place"):
        Trainer(cfg, callbacks=[_ReturnsFlow(same=False)]).build_flow(GRPO(cfg))


class BrokenLogger:
    """A logger plugin whose log_metrics raises."""

    def __init__(self, config, run_dir):
        pass

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step):
        raise KeyError("no such project")

    def log_artifact(self, path):
        pass

    def close(self):
        pass


class RegistersBrokenLogger:
    @hookimpl
    def rlforge_register(self, registry):
        registry.logger.register("broken", BrokenLogger)


def test_a_logger_plugin_that_raises_is_named(tmp_path) -> None:
    from rlforge.plugin_manager import PluginManager

    pm = PluginManager(autoload=False)
    pm.register(RegistersBrokenLogger(), name="broken_logger_plugin")
    cfg = fast_config("grpo", tmp_path, *TINY, "logger.backends=[broken]", plugins=pm)
    with pytest.raises(RLForgeError, match=r"^The logger 'broken' \(logger.backends; plugin broken_logger_plugin\) "
                                           r"failed in log_metrics at step 1: KeyError: 'no such project'\. Fix the "
                                           r"plugin, or leave 'broken' out of logger.backends"):
        Trainer(cfg, plugins=pm).fit()
    def disk_boom(self, metrics, step):
        raise OSError("disk boom")  # no errno: not a failed write that diskio words, the plugin's own error

    BrokenLogger.log_metrics = disk_boom  # type: ignore[method-assign]
    with pytest.raises(RLForgeError, match=r"^The logger 'broken' .* failed in log_metrics at step 1: OSError: disk "):
        Trainer(cfg, plugins=pm).fit()
    BrokenLogger.log_metrics = lambda self, metrics, step: None  # type: ignore[method-assign]
    BrokenLogger.close = lambda self: 1 / 0  # type: ignore[method-assign]
    with pytest.raises(RLForgeError, match=r"^The logger 'broken' .* failed in close at step 1: ZeroDivisionError"):
        Trainer(cfg, plugins=pm).fit()
    BrokenLogger.close = lambda self: None  # type: ignore[method-assign]
    BrokenLogger.__init__ = lambda self, config, run_dir: int("not a number")  # type: ignore[method-assign]
    with pytest.raises(RLForgeError, match=r"^The logger 'broken' \(logger.backends; plugin broken_logger_plugin\) "
                                           r"failed to start: ValueError: invalid literal"):
        Trainer(cfg, plugins=pm).fit()

    def exits(self, config, run_dir):  # as a client library may on a failed login: named, not a silent exit
        raise SystemExit(3)

    BrokenLogger.__init__ = exits  # type: ignore[method-assign]
    with pytest.raises(RLForgeError, match=r"^The logger 'broken' \(logger.backends; plugin broken_logger_plugin\) "
                                           r"failed to start: called sys.exit\(3\)\. Fix its settings or the plugin"):
        Trainer(cfg, plugins=pm).fit()


def test_a_one_number_numpy_metric_is_taken_as_reward_functions_return_them() -> None:
    import numpy as np

    from rlforge.metric_values import as_number

    assert [as_number("k", v, "x") for v in (np.array(2.0), np.float32(1.5), np.array([3]))] == [2.0, 1.5, 3.0]
    with pytest.raises(RLForgeError, match=r"metric 'k' \(ctx.log in stage 's'\) is ndarray, not a number"):
        as_number("k", np.array([1.0, 2.0]), "ctx.log in stage 's'")


class DictDataset:
    @hookimpl
    def rlforge_register(self, registry):
        registry.dataset.register("as_dict", lambda config, split: {"rows": []})


def test_a_plugin_dataset_that_returns_no_list_of_rows_is_named(tmp_path) -> None:
    from rlforge.plugin_manager import PluginManager

    pm = PluginManager(autoload=False)
    pm.register(DictDataset(), name="dict_dataset_plugin")
    cfg = fast_config("grpo", tmp_path, *TINY, "data.name=as_dict", plugins=pm)
    with pytest.raises(RLForgeError, match=r"^The dataset 'as_dict' \(data.name; plugin dict_dataset_plugin\) returned "
                                           r"dict for the train split: it returns a list \(a sequence\) of rows"):
        Trainer(cfg, plugins=pm).fit()


ENDINGS: list[tuple[str, str]] = []


class MarksOutcome:
    """A logger that declares marks_outcome: closed with how the run ended."""

    capabilities = LoggerCapabilities(marks_outcome=True)

    def __init__(self, config, run_dir):
        pass

    def log_params(self, params):
        pass

    def log_metrics(self, metrics, step):
        pass

    def log_artifact(self, path):
        pass

    def close(self):
        ENDINGS.append(("marks", "close"))

    def close_as(self, outcome):
        ENDINGS.append(("marks", outcome))


class Plain(MarksOutcome):
    capabilities = LoggerCapabilities()

    def close(self):
        ENDINGS.append(("plain", "close"))


class RegistersOutcomeLoggers:
    @hookimpl
    def rlforge_register(self, registry):
        registry.logger.register("marks", MarksOutcome)
        registry.logger.register("plain", Plain)


class StopsAtStep:
    def __init__(self, error: BaseException) -> None:
        self.error = error

    @hookimpl
    def rlforge_step_start(self, step):
        raise self.error


def test_a_logger_that_marks_the_outcome_is_closed_with_how_the_run_ended(tmp_path) -> None:
    """finished; killed by Ctrl-C or SIGTERM (a KeyboardInterrupt); failed by any other exception. A logger that does
    not declare marks_outcome gets close() (mlflow ends its run FINISHED/FAILED/KILLED, wandb with exit code 0/1)."""
    from rlforge.plugin_manager import PluginManager

    pm = PluginManager(autoload=False)
    pm.register(RegistersOutcomeLoggers(), name="outcome_loggers")
    cfg = fast_config("grpo", tmp_path, *TINY, "logger.backends=[marks,plain]", plugins=pm)
    ENDINGS.clear()
    Trainer(cfg, plugins=pm).fit()
    assert ENDINGS == [("marks", "finished"), ("plain", "close")]
    for error, outcome in ((KeyboardInterrupt(), "killed"), (RuntimeError("boom"), "failed")):
        ENDINGS.clear()
        with pytest.raises(type(error)):
            Trainer(cfg, plugins=pm, callbacks=[StopsAtStep(error)]).fit()
        assert ENDINGS == [("marks", outcome), ("plain", "close")]


class LogsUpdateMetric(GRPO):
    def policy_loss(self, *args, **kwargs):
        self.log("actor/pg_loss", 1.0)
        return super().policy_loss(*args, **kwargs)


class LogsDataMetric(GRPO):
    def compute_advantages(self, batch):
        self.log("response_length/mean", 1.0)
        return super().compute_advantages(batch)


class LogsTimingAtStepEnd(GRPO):
    def on_train_step_end(self, metrics):
        self.log("timing_s/step", 1.0)


class LogsOwnTwice(GRPO):
    def compute_advantages(self, batch):
        self.log("custom/twice", 1.0)
        return super().compute_advantages(batch)

    def on_train_step_end(self, metrics):
        self.log("custom/twice", 2.0)


@pytest.mark.parametrize(("module_class", "name", "where"), [
    (LogsUpdateMetric, "actor/pg_loss", "the update"),
    (LogsDataMetric, "response_length/mean", "this step"),
    (LogsTimingAtStepEnd, "timing_s/step", "LogsTimingAtStepEnd.on_train_step_end"),
])
def test_self_log_of_a_metric_rlforge_writes_is_an_error_naming_it(tmp_path, pm, module_class, name, where) -> None:
    """One value would silently replace the other (the user's, or rlforge's): named, whichever is written first."""
    with pytest.raises(RLForgeError, match=rf"^{module_class.__name__}.log\('{name}'\) in {where}: rlforge writes the "
                                           rf"metric '{name}' itself in this step.*'custom/{name.split('/')[-1]}'"):
        _fit(module_class, tmp_path, pm)


def test_self_log_of_its_own_name_twice_in_a_step_keeps_the_last(tmp_path, pm) -> None:
    assert _fit(LogsOwnTwice, tmp_path, pm).history[-1]["custom/twice"] == 2.0
