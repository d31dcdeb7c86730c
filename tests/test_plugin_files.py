"""Plugin modules: ``plugins.modules`` / ``-p`` (a module name or a .py file, no package), loaded in the driver,
in Ray workers and again when a run is evaluated elsewhere."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlforge import plugin_manager as pmod
from rlforge.plugin_manager import PluginManager

FILE_PLUGIN = '''
from pathlib import Path

from rlforge import hookimpl
from rlforge.algorithms.grpo import GRPO


class FileGRPO(GRPO):
    """GRPO from a plain .py file."""


def always_one(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("file_grpo", FileGRPO)
    registry.reward_fn.register("always_one", always_one)


@hookimpl
def rlforge_step_end(trainer, step):
    (Path(trainer.run_dir) / "file_plugin_steps.txt").open("a").write(f"{step}\\n")
'''

ONE_STEP = ["--algo", "file_grpo", "reward.fn=always_one", "trainer.total_steps=1", "data.train_batch_size=4",
            "actor.ppo_mini_batch_size=4", "rollout.n=2", "data.arith.train_size=16", "data.arith.val_size=4",
            "trainer.val_before_train=false", "trainer.progress=false", "logger.backends=[console]"]


@pytest.fixture
def plugin_file(tmp_path: Path):
    """A plugin as one file in its own folder (not a package, not installed); forgotten again after the test."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    path = folder / "my_file_plugin.py"
    path.write_text(FILE_PLUGIN)
    yield path
    sys.modules.pop("my_file_plugin", None)


def _fit(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    cli = Path(sys.executable).with_name("rlforge")
    return subprocess.run([str(cli), "fit", *args, *ONE_STEP], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_a_plugin_file_from_the_command_line_trains_and_its_run_evaluates_elsewhere(
    plugin_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    # `-p NAME` finds NAME.py in the current folder, as `python -m` would; the run records its absolute path
    done = _fit(plugin_file.parent, "-p", "my_file_plugin", f"trainer.runs_root={tmp_path / 'runs'}")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "default").iterdir()
    assert (run / "file_plugin_steps.txt").read_text() == "1\n"  # the file's hook ran
    summary = json.loads((run / "summary.json").read_text())
    assert summary["accuracy_after"] == 1.0  # its reward scored validation
    assert summary["mlflow_uri"] is None and not (run / "mlflow.db").exists()  # console only: no store named
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["plugins"]["modules"] == [str(plugin_file)] and saved["algorithm"]["name"] == "file_grpo"
    # a process started elsewhere rebuilds the run from its config: the plugin loads again from there
    monkeypatch.chdir(tmp_path)
    from rlforge.cli import main

    assert main(["eval", str(run), "--limit", "2", "--out", str(tmp_path / "report.json")]) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["metrics"]["reward/mean"] == 1.0
    capsys.readouterr()


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="the Ray controller needs ray")
def test_ray_workers_load_a_plugin_file_given_by_path(plugin_file: Path, tmp_path: Path) -> None:
    """The algorithm class of a file outside the current folder reaches the Ray workers (pickled by value) and
    the workers load the file from the run's plugins.modules."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _fit(elsewhere, "-p", str(plugin_file), "trainer.controller=ray", "strategy.device=cpu", "ray.num_cpus=2",
                f"trainer.runs_root={tmp_path / 'runs'}")
    assert done.returncode == 0, done.stderr[-3000:]
    (run,) = (tmp_path / "runs" / "default").iterdir()
    assert (run / "file_plugin_steps.txt").read_text() == "1\n"


def test_plugins_modules_in_a_config_file_load_before_validation(
    plugin_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rlforge import load_config

    monkeypatch.syspath_prepend(str(plugin_file.parent))  # an importable module, named as such
    config = tmp_path / "run.yaml"
    config.write_text("plugins:\n  modules: [my_file_plugin]\nreward:\n  fn: always_one\n")
    cfg = load_config("file_grpo", config_file=str(config))  # the algorithm and the reward exist only in the module
    assert list(cfg.plugins.modules) == ["my_file_plugin"]
    again = PluginManager.for_config(cfg)  # what a worker rebuilds from the config
    info = {i.name: i for i in again.plugins()}["my_file_plugin"]
    assert (info.source, info.distribution, info.components) == (
        "module", str(plugin_file), ["algorithm:file_grpo", "reward fn:always_one"])
    assert again.registry.algorithm.get("file_grpo") is sys.modules["my_file_plugin"].FileGRPO


def test_a_plugin_module_can_be_disabled(plugin_file: Path) -> None:
    pm = PluginManager(autoload=False, modules=[str(plugin_file)], disable=["my_file_plugin"])
    assert "file_grpo" not in pm.registry.algorithm
    assert "plugin 'my_file_plugin' is disabled (plugins.disable)" in pm.warnings()


@pytest.mark.parametrize(("source", "spec", "needle"), [
    (None, "no_such_plugin_mod", "Cannot import plugin module 'no_such_plugin_mod' (plugins.modules / -p): "
                                 "ModuleNotFoundError: No module named 'no_such_plugin_mod'. Give an importable"),
    (None, "missing/plugin.py", "Plugin file not found: missing/plugin.py (plugins.modules / -p)."),
    ("x = 1\nimport no_such_dependency_mod\n", "broken_plug.py",
     "Cannot import plugin module '{path}' (plugins.modules / -p): ModuleNotFoundError: No module named "
     "'no_such_dependency_mod' (at {path}:2)."),
    ("from rlforge.algorithms.grpo import GRPO\n"
     "def rlforge_register(registry):\n    registry.algorithm.register('grpo', GRPO)\n", "dup_plug.py",
     "Plugin module 'dup_plug' (from {path}) failed to register: "),
    ("def rlforge_step_ends(step):\n    pass\n", "typo_plug.py", "implements 'rlforge_step_ends', which is not"),
    (None, "not-a-module", "'not-a-module' (plugins.modules / -p) is neither a module name nor a .py file."),
])
def test_a_plugin_module_that_cannot_load_is_an_error_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, source: str | None, spec: str, needle: str
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / spec
    if source is not None:
        path.write_text(source)
        spec = str(path)
    needle = needle.format(path=path)
    with pytest.raises(pmod.PluginError) as info:
        PluginManager(autoload=False, modules=[spec])
    assert needle in str(info.value)
    assert path.stem not in sys.modules  # a failed import leaves nothing behind
    from rlforge.cli import main

    assert main(["config", "show", "-p", spec]) == 2  # the command line says the same in one line
    assert needle in capsys.readouterr().err
