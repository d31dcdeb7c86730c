"""A resumed run loads the plugin modules of the run it continues (docs/plugins.md, docs/reliability.md): `rlforge fit
--algo my_algo trainer.resume=auto` after a run started with `-p my_algo.py` continues it without `-p`, as
`rlforge eval RUN_DIR` does; a recorded module that is gone is one error naming it and the run."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from rlforge.cli import main
from rlforge.config import compose_with_plugins
from rlforge.errors import RLForgeError
from rlforge.resume import write_run_config
from tests.test_bad_inputs import QUICK, _error

ALGORITHM = '''from rlforge import hookimpl
from rlforge.algorithms.grpo import GRPO


class {cls}(GRPO):
    """GRPO under a plugin's name."""


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("{name}", {cls})
'''


def _plugin(folder, name):
    """A plugin file ``<name>.py`` registering the algorithm ``name`` (a name of its own: a file is imported once per
    process)."""
    path = folder / f"{name}.py"
    path.write_text(ALGORITHM.format(cls=name.title().replace("_", ""), name=name), encoding="utf-8")
    return path


def _run_with(folder, modules):
    """A run folder whose config.yaml records ``modules`` (what a run started with -p writes)."""
    run = folder / "runs" / "e" / "20260101-000000"
    run.mkdir(parents=True)
    write_run_config(run, OmegaConf.create({"plugins": {"modules": [str(m) for m in modules]}}))
    return run


def test_a_resume_without_p_loads_the_modules_the_run_recorded(tmp_path):
    plugin = _plugin(tmp_path, "resumed_algo_a")
    run = _run_with(tmp_path, [plugin])
    pm, cfg = compose_with_plugins("resumed_algo_a", overrides=[f"trainer.resume={run}"])
    assert "resumed_algo_a" in pm.registry.algorithm
    assert list(cfg.plugins.modules) == [str(plugin)]  # recorded again: the continuation's config matches the run's


def test_a_command_that_gives_p_loads_what_it_gives(tmp_path):
    recorded, given = _plugin(tmp_path, "resumed_algo_b"), _plugin(tmp_path, "resumed_algo_c")
    run = _run_with(tmp_path, [recorded])
    pm, cfg = compose_with_plugins("resumed_algo_c", overrides=[f"trainer.resume={run}"], modules=[str(given)])
    assert "resumed_algo_b" not in pm.registry.algorithm and list(cfg.plugins.modules) == [str(given)]


def test_a_recorded_module_that_is_gone_names_it_and_the_run(tmp_path):
    run = _run_with(tmp_path, [tmp_path / "moved_away.py"])
    with pytest.raises(RLForgeError) as err:
        compose_with_plugins("grpo", overrides=["trainer.resume=auto", f"trainer.runs_root={tmp_path / 'runs'}",
                                                "trainer.experiment=e"])
    assert str(err.value).startswith(f"Plugin file not found: {tmp_path / 'moved_away.py'} (plugins.modules / -p). It "
                                     f"is one of the plugin modules of the run that trainer.resume continues ({run}")
    assert "restore it, or give the plugin modules yourself with -p" in str(err.value)


def test_a_new_run_loads_no_recorded_module(tmp_path):
    _run_with(tmp_path, [tmp_path / "moved_away.py"])  # an earlier run of the experiment: not continued
    pm, _ = compose_with_plugins("grpo", overrides=[f"trainer.runs_root={tmp_path / 'runs'}", "trainer.experiment=e"])
    assert pm.modules == []


@pytest.mark.slow
def test_fit_with_algo_resumes_a_run_started_with_p(capsys, tmp_path):
    plugin = _plugin(tmp_path, "resumed_algo_d")
    run = [*QUICK, "trainer.save_every=1", f"trainer.runs_root={tmp_path / 'runs'}", "trainer.experiment=e",
           "--algo", "resumed_algo_d"]
    assert main(["fit", "-p", str(plugin), *run]) == 0
    assert main(["fit", *run, "trainer.resume=auto", "trainer.total_steps=2"]) == 0  # no -p
    (folder,) = (tmp_path / "runs" / "e").iterdir()
    resumed = [json.loads(line) for line in (folder / "resumes.jsonl").read_text().splitlines()]
    assert [r["step"] for r in resumed] == [1]
    capsys.readouterr()
    # without --algo the algorithm differs from the run's (grpo is the default), and the message says so
    err = _error(capsys, ["fit", *run[:-2], "trainer.resume=auto", "trainer.total_steps=3"])
    assert "algorithm.name: 'resumed_algo_d' -> 'grpo'" in err
