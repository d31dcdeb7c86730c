"""rlforge.plugin_manager: built-ins, block list, object plugins, broken plugins, pip entry points."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from rlforge import plugin_manager as pmod
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.module import RLModule
from rlforge.plugin_manager import AUTOLOAD_ENV, PluginManager
from tests.plugin_dist import installed_package

BUILTIN_COMPONENTS = {
    "algorithm": ["grpo"],
    "rollout": ["hf"],
    "reward_manager": ["rule"],
    "strategy": ["single", "fsdp"],
    "logger": ["console", "mlflow"],
    "dataset": ["arith", "files"],
    "controller": ["local", "ray"],
}


# --- built-ins --------------------------------------------------------------------------------------


def test_builtins_register_their_components(pm: PluginManager) -> None:
    for kind, names in BUILTIN_COMPONENTS.items():
        reg = getattr(pm.registry, kind)
        for name in names:
            assert name in reg, f"{kind}:{name} missing; have {reg.available()}"


def test_builtin_grpo_is_the_grpo_class(pm: PluginManager) -> None:
    from rlforge.algorithms.grpo import GRPO

    assert pm.registry.algorithm.get("grpo") is GRPO


def test_builtins_load_without_errors(pm: PluginManager) -> None:
    assert pm.errors() == []


def test_builtin_plugin_infos(pm: PluginManager) -> None:
    infos = {i.name: i for i in pm.plugins()}
    for mod in pmod.BUILTIN_PLUGINS:
        assert mod in infos
        assert infos[mod].source == "builtin"
        assert infos[mod].distribution == "rlforge"
        assert infos[mod].error == ""
    assert infos["rlforge.algorithms.grpo"].components == ["algorithm:dr_grpo", "algorithm:grpo"]
    assert infos["rlforge.plugins.logger.mlflow_logger"].components == ["logger:mlflow  (capabilities: marks_outcome)"]
    assert infos["rlforge.plugins.reward.rule"].components[0] == "reward manager:rule  (defines: check_data_sources, check_function)"


def test_registry_entries_record_their_plugin(pm: PluginManager) -> None:
    assert pm.registry.algorithm.entry("grpo").plugin == "rlforge.algorithms.grpo"
    assert pm.registry.logger.entry("console").plugin == "rlforge.plugins.logger.console"


def test_disable_blocks_a_builtin_plugin() -> None:
    pm = PluginManager(disable=["rlforge.plugins.logger.mlflow_logger"], autoload=False)
    assert "mlflow" not in pm.registry.logger
    assert "console" in pm.registry.logger
    assert "rlforge.plugins.logger.mlflow_logger" not in {i.name for i in pm.plugins()}
    assert pm.errors() == []


def test_disabling_a_name_that_no_plugin_has_is_a_warning() -> None:
    pm = PluginManager(disable=["rlforge.plugins.logger.mlflow_loger"], autoload=False)
    assert "mlflow" in pm.registry.logger  # the misspelled name blocked nothing
    assert pm.warnings() == ["plugins.disable names 'rlforge.plugins.logger.mlflow_loger', which is no plugin here. "
                             "Did you mean 'rlforge.plugins.logger.mlflow_logger'? 'rlforge plugins list' shows their "
                             "names."]


def test_disable_blocks_an_object_plugin() -> None:
    class P:
        @hookimpl
        def rlforge_register(self, registry):
            registry.algorithm.register("blocked_algo", object())

    pm = PluginManager(disable=["blocked"], autoload=False)
    pm.register(P(), name="blocked")
    assert "blocked_algo" not in pm.registry.algorithm
    assert "blocked" not in {i.name for i in pm.plugins()}


def test_separate_managers_have_separate_registries() -> None:
    a = PluginManager(autoload=False)
    b = PluginManager(autoload=False)
    a.registry.algorithm.register("only_in_a", RLModule)
    assert "only_in_a" not in b.registry.algorithm


# --- object plugins ----------------------------------------------------------------------------------


class _ObjectPlugin:
    def __init__(self) -> None:
        self.steps: list[int] = []

    @hookimpl
    def rlforge_register(self, registry):
        registry.reward_fn.register("always_one", lambda *args, **kwargs: 1.0, description="always 1")
        registry.dataset.register("tiny", lambda config, split: [])

    @hookimpl
    def rlforge_step_end(self, trainer, step, metrics):
        self.steps.append(step)


def test_register_object_plugin_adds_components() -> None:
    pm = PluginManager(autoload=False)
    plugin = _ObjectPlugin()
    pm.register(plugin, name="my-object")
    assert "always_one" in pm.registry.reward_fn
    assert pm.registry.reward_fn.get("always_one")("s", "x", "1", None) == 1.0
    assert "tiny" in pm.registry.dataset
    info = {i.name: i for i in pm.plugins()}["my-object"]
    assert info.source == "object"
    assert sorted(info.components) == ["dataset:tiny", "reward fn:always_one"]
    assert pm.registry.reward_fn.entry("always_one").plugin == "my-object"
    # the built-ins are still there
    assert "grpo" in pm.registry.algorithm


def test_object_plugin_receives_lifecycle_hooks() -> None:
    pm = PluginManager(autoload=False)
    plugin = _ObjectPlugin()
    pm.register(plugin, name="cb")
    pm.hook.rlforge_step_end(trainer=None, step=3, metrics={})
    assert plugin.steps == [3]


def test_registering_the_same_object_twice_is_a_no_op() -> None:
    pm = PluginManager(autoload=False)
    plugin = _ObjectPlugin()
    pm.register(plugin, name="cb")
    pm.register(plugin, name="cb")  # would be a duplicate-name error if it ran again
    pm.hook.rlforge_step_end(trainer=None, step=1, metrics={})
    assert plugin.steps == [1]


def test_object_plugin_overriding_builtin_needs_override() -> None:
    from rlforge.errors import RLForgeError

    class Clash:
        @hookimpl
        def rlforge_register(self, registry):
            registry.algorithm.register("grpo", RLModule)

    pm = PluginManager(autoload=False)
    with pytest.raises(RLForgeError, match="already registered"):
        pm.register(Clash(), name="clash")


# --- broken plugins -------------------------------------------------------------------------------


@pytest.fixture
def broken_builtins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, ...]:
    (tmp_path / "rlf_broken_import.py").write_text("raise ImportError('needs the frobnicate package')\n")
    (tmp_path / "rlf_broken_register.py").write_text(
        textwrap.dedent(
            """
            from rlforge.hookspecs import hookimpl

            @hookimpl
            def rlforge_register(registry):
                raise RuntimeError("boom in register")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("rlf_broken_import", "rlf_broken_register", "rlf_no_such_module_xyz")
    monkeypatch.setattr(pmod, "BUILTIN_PLUGINS", pmod.BUILTIN_PLUGINS + names)
    yield names
    for n in names:
        sys.modules.pop(n, None)


def test_broken_plugins_are_reported_and_the_rest_works(broken_builtins: tuple[str, ...]) -> None:
    pm = PluginManager(autoload=False)
    errors = {i.name: i.error for i in pm.errors()}
    assert set(errors) == set(broken_builtins)
    assert "ImportError" in errors["rlf_broken_import"] and "frobnicate" in errors["rlf_broken_import"]
    assert "RuntimeError" in errors["rlf_broken_register"] and "boom in register" in errors["rlf_broken_register"]
    assert "ModuleNotFoundError" in errors["rlf_no_such_module_xyz"]
    # every built-in still loads and works
    for kind, names in BUILTIN_COMPONENTS.items():
        for name in names:
            assert name in getattr(pm.registry, kind)
    from rlforge.config import compose

    cfg = compose(pm.registry, "grpo")
    assert cfg.algorithm.name == "grpo"


def test_broken_plugin_can_be_disabled(broken_builtins: tuple[str, ...]) -> None:
    pm = PluginManager(disable=list(broken_builtins), autoload=False)
    assert pm.errors() == []


def test_cli_plugins_list_shows_failures(broken_builtins: tuple[str, ...], capsys, no_autoload) -> None:
    from rlforge.cli import main

    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert "rlf_broken_import" in out
    assert "FAILED to load: ImportError: needs the frobnicate package" in out


# A distribution on sys.path, as pip would leave it (a .dist-info folder with entry_points.txt), whose entry
# points fail in every way plugin code can at import: a raise, sys.exit, a KeyboardInterrupt it raises itself.
FAULTY_PLUGINS = {
    "ep_raises": "raise RuntimeError('cannot find libfoo.so')",
    "ep_exits": "import sys; sys.exit(3)",
    "ep_interrupts": "raise KeyboardInterrupt",
    "ep_fine": (
        "from rlforge.hookspecs import hookimpl\n"
        "from rlforge.algorithms.grpo import GRPO\n"
        "class Fine(GRPO):\n    preset = {'algorithm': {'name': 'fine_algo'}}\n"
        "@hookimpl\ndef rlforge_register(registry):\n    registry.algorithm.register('fine_algo', Fine)\n"
    ),
}


def _fake_distribution(root: Path, dist: str, modules: dict[str, str]) -> None:
    info = root / f"{dist}-0.7.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.7\n")
    (info / "entry_points.txt").write_text("[rlforge]\n" + "".join(f"{m} = rlftest_{m}\n" for m in modules))
    for mod, code in modules.items():
        (root / f"rlftest_{mod}.py").write_text(code + "\n")


@pytest.fixture
def faulty_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    _fake_distribution(tmp_path, "rlforge-faulty", FAULTY_PLUGINS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    yield tmp_path
    for mod in FAULTY_PLUGINS:
        sys.modules.pop(f"rlftest_{mod}", None)


def test_entry_points_that_exit_or_raise_at_import_are_named_and_the_rest_loads(faulty_entry_points) -> None:
    pm = PluginManager()
    errors = {i.name: i.error for i in pm.errors()}
    assert errors == {"ep_raises": "RuntimeError: cannot find libfoo.so",
                      "ep_exits": "called sys.exit(3) while loading",
                      "ep_interrupts": "raised KeyboardInterrupt while loading"}
    assert "fine_algo" in pm.registry.algorithm and "grpo" in pm.registry.algorithm
    lines = pm.warnings()
    assert "plugin 'ep_exits' (from rlforge-faulty 0.7) failed to load: called sys.exit(3) while loading" in lines


@pytest.mark.parametrize("argv", [["plugins", "list"], ["config", "show", "--algo", "fine_algo"]])
def test_cli_answers_despite_plugins_that_exit_at_import(faulty_entry_points, capsys, argv: list[str]) -> None:
    from rlforge.cli import main

    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert out.strip()
    if argv[0] == "plugins":
        assert "ep_exits  (entry point, rlforge-faulty 0.7)\n    FAILED to load: called sys.exit(3)" in out
    else:
        assert "name: fine_algo" in out
        assert "rlforge: warning: plugin 'ep_exits' (from rlforge-faulty 0.7) failed to load" in err
        assert sum("rlforge-faulty" in line for line in err.splitlines()) == 3  # one line per failing plugin


def test_a_real_ctrl_c_while_plugins_load_still_stops(tmp_path: Path) -> None:
    """In a process of its own, as a Ctrl-C meets it (the suite's own process may ignore SIGINT)."""
    # the folder name as pip writes it (rlforge_sigint-0.7.dist-info): a new process's metadata search needs it
    _fake_distribution(tmp_path, "rlforge_sigint", {"ep_sigint": "import os, signal; os.kill(os.getpid(), signal.SIGINT)"})
    env = {k: v for k, v in os.environ.items() if k != AUTOLOAD_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), *filter(None, [env.get("PYTHONPATH")])])
    # as started from a terminal: the suite's process may ignore SIGINT (an earlier test leaves it so) and a child
    # keeps an inherited SIG_IGN
    code = ("import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "from rlforge.plugin_manager import PluginManager\nPluginManager()\nprint('loaded')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode != 0 and "loaded" not in out.stdout, out.stdout
    assert out.stderr.rstrip().endswith("KeyboardInterrupt") and "failed to load" not in out.stderr, out.stderr[-2000:]


# --- third-party plugin installed with pip (entry point group "rlforge") ---------------------------

DIST_NAME = "rlforge-testplug-myalgo"
DIST_VERSION = "0.3.1"
EP_NAME = "myplug"

PLUGIN_SOURCE = '''
"""A third-party rlforge plugin used by the test suite."""
from rlforge.algorithms.grpo import GRPO
from rlforge.hookspecs import hookimpl


class MyAlgo(GRPO):
    """GRPO with a different preset (test plugin)."""

    preset = {"algorithm": {"name": "my_algo"}, "rollout": {"n": 4}}


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("my_algo", MyAlgo)
'''


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory: pytest.TempPathFactory):
    with installed_package(tmp_path_factory.mktemp("myplug_dist"), DIST_NAME, "myplug_pkg",
                           {EP_NAME: ("plugin", PLUGIN_SOURCE)}, DIST_VERSION):
        yield DIST_NAME


def _norm(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def test_entry_point_plugin_is_listed(installed_plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    pm = PluginManager()
    infos = {i.name: i for i in pm.plugins()}
    assert EP_NAME in infos, sorted(infos)
    info = infos[EP_NAME]
    assert info.source == "entry point"
    assert _norm(info.distribution) == DIST_NAME
    assert info.version == DIST_VERSION
    assert info.error == ""
    assert info.components == ["algorithm:my_algo"]
    assert EP_NAME not in {i.name for i in pm.errors()}


def test_entry_point_algorithm_is_usable(installed_plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    from rlforge.algorithms.grpo import GRPO
    from rlforge.config import compose

    pm = PluginManager()
    cls = pm.registry.algorithm.get("my_algo")
    assert issubclass(cls, GRPO) and cls is not GRPO
    assert pm.registry.algorithm.entry("my_algo").plugin == EP_NAME
    cfg = compose(pm.registry, "my_algo")
    assert cfg.algorithm.name == "my_algo"
    assert cfg.rollout.n == 4  # the plugin's preset applies


def test_entry_point_plugin_in_cli(installed_plugin: str, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    from rlforge.cli import main

    assert main(["plugins", "list"]) == 0
    out = capsys.readouterr().out
    assert f"{EP_NAME}  (entry point, " in out
    assert DIST_VERSION in out
    assert "algorithm:my_algo" in out
    assert main(["algos"]) == 0
    assert "my_algo" in capsys.readouterr().out


def test_autoload_env_var_skips_entry_points(installed_plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    pm = PluginManager()
    assert EP_NAME not in {i.name for i in pm.plugins()}
    assert "my_algo" not in pm.registry.algorithm
    assert "grpo" in pm.registry.algorithm


def test_autoload_false_skips_entry_points(installed_plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    pm = PluginManager(autoload=False)
    assert "my_algo" not in pm.registry.algorithm


def test_disable_blocks_an_entry_point(installed_plugin: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    pm = PluginManager(disable=[EP_NAME])
    assert "my_algo" not in pm.registry.algorithm
    assert EP_NAME not in {i.name for i in pm.plugins()}
    assert "grpo" in pm.registry.algorithm


# --- two installed plugins that register one name ---------------------------------------------------------------

TWIN_SOURCE = '''
"""Installed test plugin {tag}: replaces the built-in grpo and registers twin_algo."""
from rlforge.algorithms.grpo import GRPO
from rlforge.hookspecs import hookimpl


class Twin{tag}(GRPO):
    """twin_algo of plugin {tag}."""

    preset = {{"algorithm": {{"name": "twin_algo"}}}}


@hookimpl
def rlforge_register(registry):
    registry.algorithm.register("grpo", Twin{tag}, override=True)
    registry.algorithm.register("twin_algo", Twin{tag})
    registry.algorithm.register("only_{tag}", Twin{tag})
'''


@pytest.fixture(scope="module")
def twin_plugins(tmp_path_factory: pytest.TempPathFactory):
    """Distributions rlforge-twin-a (entry point twin_a) and rlforge-twin-b (twin_b): both replace the built-in grpo
    (override=True) and both register twin_algo."""
    with installed_package(tmp_path_factory.mktemp("twin_a"), "rlforge-twin-a", "twin_a_pkg",
                           {"twin_a": ("plugin", TWIN_SOURCE.format(tag="A"))}), \
         installed_package(tmp_path_factory.mktemp("twin_b"), "rlforge-twin-b", "twin_b_pkg",
                           {"twin_b": ("plugin", TWIN_SOURCE.format(tag="B"))}):
        yield


def test_two_installed_plugins_claiming_a_name_stop_a_run_that_uses_it(twin_plugins, monkeypatch) -> None:
    """The winner used to depend on the install order (silently with override=True; 'failed to load' for the other
    one without it): now both load, and a run that names the contested algorithm stops, naming both plugins, their
    distributions and how to choose one."""
    from rlforge.config import compose
    from rlforge.registry import ComponentConflictError

    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    pm = PluginManager()
    assert {"twin_a", "twin_b"} <= {i.name for i in pm.plugins()} and pm.errors() == []
    assert {"only_A", "only_B"} <= set(pm.registry.algorithm.available())  # their other components work
    for algo in ("twin_algo", "grpo"):
        with pytest.raises(ComponentConflictError) as info:
            compose(pm.registry, algo)
        message = str(info.value)
        first, second = sorted(("twin_a", "twin_b"), key=[i.name for i in pm.plugins()].index)
        assert f"'{first}' (from rlforge-twin-" in message and f"'{second}' (from rlforge-twin-" in message
        assert f"e.g. 'plugins.disable=[{second}]' keeps '{first}'" in message
        assert message in pm.warnings()
    assert "built in, from plugin 'rlforge.algorithms.grpo'" in " ".join(pm.warnings())
    infos = {i.name: i for i in pm.plugins()}
    assert any(c.startswith("algorithm:twin_algo  (CONTESTED: also registered by twin_") for c in
               infos["twin_a"].components)


def test_disabling_one_of_two_installed_plugins_chooses_the_other(twin_plugins, monkeypatch) -> None:
    """The way out the error names: plugins.disable keeps one; its replacement of the built-in works as documented
    and the run's provenance names it."""
    from rlforge.config import compose

    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    pm = PluginManager(disable=["twin_b"])
    assert pm.registry.algorithm.get("twin_algo").__name__ == "TwinA"
    assert pm.registry.algorithm.entry("grpo").replaced == "rlforge.algorithms.grpo"
    cfg = compose(pm.registry, "grpo")
    assert pm.provenance(cfg)["algorithm:grpo"] == ("twin_a (rlforge-twin-a 0.1.0), replacing the one of "
                                                    "rlforge.algorithms.grpo")
    assert pm.provenance(cfg)["logger:console"].startswith("rlforge.plugins.logger.")
    assert not [w for w in pm.warnings() if "registered by" in w or "replaced by" in w]
    assert PluginManager(disable=["twin_a"]).registry.algorithm.get("twin_algo").__name__ == "TwinB"


def test_the_commands_checks_do_not_stumble_on_a_contest_the_run_avoids(twin_plugins, monkeypatch) -> None:
    """rlforge fit's and rlforge sft's key checks composed a default config with every installed plugin (grpo):
    with two plugins replacing grpo, plugins.disable=[twin_b] did not help and even --algo dpo stopped (helper-59)."""
    from rlforge.config import compose_with_plugins
    from rlforge.config.checks import check_fit_keys, check_sft_layers

    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    for algo, overrides in (("grpo", ["plugins.disable=[twin_b]"]), ("dpo", [])):
        pm, cfg = compose_with_plugins(algo, None, overrides)
        check_fit_keys(cfg)
    check_sft_layers([(OmegaConf.create({"sft": {"steps": 2}, "plugins": {"disable": ["twin_b"]}}), "overrides")])
    with pytest.raises(ConfigError, match="rlforge sft does not read 'actor.lr'"):
        check_sft_layers([(OmegaConf.create({"actor": {"lr": 1e-3}, "plugins": {"disable": ["twin_a"]}}), "file")])
