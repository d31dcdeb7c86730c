"""``rlforge new``: the plugin template becomes a package that installs, lists, trains and passes its own tests;
the experiment template becomes a folder whose config composes with its reward file."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.tools.scaffold import render, render_text, template_variables
from tests.plugin_dist import install, visible

# a name of its own per test process, so concurrent test runs in one environment do not collide
NAME = f"tmpl_{os.getpid()}"
DIST = f"rlforge-tmpl-{os.getpid()}"
FIT = ["data.train_batch_size=4", "actor.ppo_mini_batch_size=4", "rollout.n=4", "data.arith.train_size=512", "data.arith.val_size=8",
       "trainer.val_before_train=false", "trainer.progress=false", "trainer.total_steps=2"]


def _run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("RLFORGE_DISABLE_PLUGIN_AUTOLOAD", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=600)


def test_template_variables():
    v = template_variables("plugin", "My-Algo")
    assert (v["name"], v["package"], v["dist"], v["class_name"]) == ("my_algo", "rlforge_my_algo", "rlforge-my-algo",
                                                                     "MyAlgo")
    with pytest.raises(RLForgeError, match="Invalid plugin name '2fast'"):
        template_variables("plugin", "2fast")
    for name in ("my_algo_", "my-algo-"):  # pip refuses the distribution name rlforge-my-algo-
        with pytest.raises(RLForgeError, match=f"Invalid plugin name '{name}'.*ending with a letter or digit"):
            template_variables("plugin", name)
    with pytest.raises(RLForgeError, match="unknown placeholder '{{nope}}'"):
        render_text("a {{ nope }} b", v, "x.tmpl")


@pytest.mark.parametrize(("name", "taken"), [("grpo", "algorithm 'grpo'"), ("gsm8k", "reward_fn 'gsm8k'")])
def test_a_plugin_named_as_a_built_in_is_refused(tmp_path, capsys, name, taken):
    assert main(["new", "plugin", name, "--dir", str(tmp_path)]) == 2  # its tests would fail, it would never load
    err = capsys.readouterr().err
    assert f"Plugin name '{name}' is taken" in err and taken in err and not list(tmp_path.iterdir())


def test_new_plugin_renders_every_file(tmp_path, capsys):
    assert main(["new", "plugin", "my-algo", "--dir", str(tmp_path)]) == 0
    root = tmp_path / "rlforge-my-algo"
    assert f"created {root}" in capsys.readouterr().out
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    assert files == ["README.md", "pyproject.toml", "rlforge_my_algo/__init__.py", "rlforge_my_algo/algorithm.py",
                     "rlforge_my_algo/plugin.py", "rlforge_my_algo/reward.py", "tests/test_plugin.py"]
    text = "".join(p.read_text() for p in root.rglob("*") if p.is_file())
    assert "{{" not in text and ".tmpl" not in text
    assert '[project.entry-points.rlforge]\nmy_algo = "rlforge_my_algo.plugin"' in (root / "pyproject.toml").read_text()
    assert main(["new", "plugin", "my-algo", "--dir", str(tmp_path)]) == 2
    assert f"{root} already exists (the folder of plugin 'my-algo'):" in capsys.readouterr().err  # named after it


def test_plugin_installs_trains_lists_and_passes_its_tests(tmp_path):
    root = render("plugin", NAME, tmp_path)
    own_tests = _run("-m", "pytest", "-q", "-p", "no:cacheprovider", cwd=root)
    assert own_tests.returncode == 0, own_tests.stdout[-3000:] + own_tests.stderr[-3000:]
    assert "5 passed" in own_tests.stdout

    site = tmp_path / "site"
    installed = install(root, site)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    with visible(site):
        listed = _run("-m", "rlforge.cli", "plugins", "list")
        assert listed.returncode == 0, listed.stderr
        assert f"{NAME}  (entry point, {DIST} 0.1.0)\n    algorithm:{NAME}\n    reward fn:{NAME}\n" in listed.stdout
        run_dir = tmp_path / "run"
        fit = _run("-m", "rlforge.cli", "fit", "--algo", NAME, f"reward.fn={NAME}", *FIT, f"trainer.run_dir={run_dir}",
                   "algorithm.adv_clip=1.0", cwd=tmp_path)
        assert fit.returncode == 0, fit.stdout[-3000:] + fit.stderr[-3000:]
        assert "step    2/2" in fit.stdout
        config = (run_dir / "config.yaml").read_text()
        assert f"name: {NAME}" in config and "adv_clip: 1.0" in config
        assert (run_dir / "checkpoints" / "step_000002" / "actor" / "config.json").is_file()
        from mlflow.tracking import MlflowClient

        client = MlflowClient(tracking_uri=f"sqlite:///{run_dir / 'mlflow.db'}")
        run_id = (run_dir / "mlflow_run_id").read_text().strip()
        assert len(client.get_metric_history(run_id, f"{NAME}/score_spread")) == 2  # the plugin's hook ran
    assert NAME not in _run("-m", "rlforge.cli", "plugins", "list").stdout


def test_new_experiment_composes_and_loads_its_reward(tmp_path, monkeypatch, capsys):
    assert main(["new", "experiment", "sweep1", "--dir", str(tmp_path)]) == 0
    folder = tmp_path / "sweep1"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.yaml", "reward.py"]
    monkeypatch.chdir(folder)
    assert main(["config", "show", "--config", "config.yaml"]) == 0
    out = capsys.readouterr().out
    assert "experiment: sweep1" in out and "file: reward.py" in out
    from rlforge.plugins.reward.rule import load_user_function

    score = load_user_function("reward.py")
    assert score("arith", " 7 ", "7") == {"score": 1.0, "acc": 1.0}
    assert score("arith", "8", "7") == {"score": 0.1, "acc": 0.0}


def test_a_name_that_is_changed_is_said_with_why(tmp_path, capsys):
    """`rlforge new experiment ok-name` wrote ok_name/ without a word (adversarial review): both templates now say the
    name they used and why; a name used as given gets no note."""
    assert main(["new", "experiment", "ok-name", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "ok_name").is_dir()
    assert ("note: the experiment 'ok-name' is named 'ok_name' (lower case, '_' for '-'), because the names rlforge "
            "new derives from it must be valid Python identifiers: its folder is ok_name/ and its trainer.experiment "
            "ok_name.\n") in out
    assert main(["new", "plugin", "Ok-Plug", "--dir", str(tmp_path)]) == 0
    assert ("note: the plugin 'Ok-Plug' is named 'ok_plug' (lower case, '_' for '-'), because the names rlforge new "
            "derives from it must be valid Python identifiers: its entry point, algorithm and reward function are "
            "'ok_plug', its package rlforge_ok_plug, its distribution rlforge-ok-plug.\n") in capsys.readouterr().out
    assert main(["new", "experiment", "as_given", "--dir", str(tmp_path)]) == 0
    assert "note:" not in capsys.readouterr().out
