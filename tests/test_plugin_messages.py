"""What the plugin manager says about plugins given by hand (docs/plugins.md): a hook implementation taking an argument
the hook does not pass (a callback named by its class, not its id), a folder or a hook-less module given to -p, an
unknown name while entry points are off or while the name asked for is contested; and that the pages' own examples
(the hook spec version `rlforge plugins list` prints, the logger plugin) are what the code does."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlforge.cli import main
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.plugin_manager import AUTOLOAD_ENV, PluginError, PluginManager

DOCS = Path(__file__).resolve().parents[1] / "docs"


class WrongArgument:
    @hookimpl
    def rlforge_step_end(self, step, metricz):
        pass


def test_a_callback_with_an_argument_the_hook_lacks_is_named_by_its_class():
    with pytest.raises(PluginError) as err:
        PluginManager(autoload=False).register(WrongArgument())
    assert str(err.value) == (
        "The callback tests.test_plugin_messages.WrongArgument implements rlforge_step_end(step, metricz), but the "
        "hook has no argument 'metricz'. Did you mean 'metrics'? It passes trainer, step, metrics: take any of them, "
        "by these names (docs/hooks.md).")


class TakesAnything:
    @hookimpl
    def rlforge_step_end(self, step, extra=1, **kw):
        pass


def test_a_callback_with_parameters_pluggy_never_fills_is_named():
    with pytest.raises(PluginError, match=r"The callback tests.test_plugin_messages.TakesAnything implements "
                                          r"rlforge_step_end with extra=\.\.\., \*\*kw, which pluggy never fills"):
        PluginManager(autoload=False).register(TakesAnything())


def test_a_module_with_an_argument_the_hook_lacks_is_one_line(capsys, tmp_path):
    plugin = tmp_path / "wrong_arg_mod.py"
    plugin.write_text("def rlforge_validation_end(stepp):\n    pass\n", encoding="utf-8")
    assert main(["plugins", "list", "-p", str(plugin)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"rlforge: error: Plugin 'wrong_arg_mod' (from {plugin}) implements rlforge_validation_end(stepp), "
                   f"but the hook has no argument 'stepp'. Did you mean 'step'? It passes trainer, step, metrics: take "
                   f"any of them, by these names (docs/hooks.md).")


def test_a_folder_given_to_p_is_named_as_a_folder(tmp_path):
    with pytest.raises(PluginError, match=rf"Plugin path {tmp_path} \(plugins.modules / -p\) is a folder: give a \.py "
                                          rf"file in it"):
        PluginManager(autoload=False, modules=[str(tmp_path)])


def test_a_module_without_hooks_is_a_warning_that_it_registers_nothing(tmp_path, monkeypatch):
    pm = PluginManager(autoload=False, modules=["json"])
    (line,) = [w for w in pm.warnings() if "json" in w]
    assert line.startswith("plugin module 'json' (") and "implements no rlforge hook" in line
    assert "it registers nothing" in line and "rename" not in line
    monkeypatch.chdir(tmp_path)  # the user's json.py here: -p json imported the installed module instead
    (tmp_path / "json.py").write_text("")
    (line,) = [w for w in PluginManager(autoload=False, modules=["json"]).warnings() if "json" in w]
    assert "./json.py in this folder has the name of that installed module, which -p json imports: rename" in line


def test_an_unknown_name_says_entry_points_are_off(monkeypatch):
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    with pytest.raises(RLForgeError, match=rf"Unknown algorithm 'my_algo' .* Entry-point plugins are off "
                                           rf"\({AUTOLOAD_ENV}\): no installed plugin package was loaded"):
        PluginManager().registry.algorithm.get("my_algo")


def test_a_contested_name_is_marked_where_the_unknown_name_error_lists_it(tmp_path):
    files = []
    for stem in ("twin_one", "twin_two"):
        files.append(tmp_path / f"{stem}.py")
        files[-1].write_text("from rlforge import hookimpl\nfrom rlforge.algorithms.grpo import GRPO\n\n\n@hookimpl\n"
                             "def rlforge_register(registry):\n    registry.algorithm.register('twin_algo', GRPO)\n",
                             encoding="utf-8")
    pm = PluginManager(autoload=False, modules=[str(f) for f in files])
    with pytest.raises(RLForgeError) as err:
        pm.registry.algorithm.get("twin_algx")
    assert "Did you mean" not in str(err.value)  # a contested name is no name to use
    assert "Contested, so not usable: 'twin_algo' (two plugins register it; disable one of them" in str(err.value)


def test_cli_md_shows_the_first_line_plugins_list_prints(capsys, monkeypatch):
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    assert main(["plugins", "list"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert f"$ rlforge plugins list\n{first}\n" in (DOCS / "cli.md").read_text(encoding="utf-8")


def test_the_logger_example_of_plugins_md_registers_and_logs(tmp_path):
    text = (DOCS / "plugins.md").read_text(encoding="utf-8")
    start = text.index("### `registry.logger`: a logger")
    block = text.index("```python\n", start) + len("```python\n")
    plugin = tmp_path / "docs_steps_logger.py"
    plugin.write_text(text[block:text.index("\n```\n", block)], encoding="utf-8")
    pm = PluginManager(autoload=False, modules=[str(plugin)])  # its name is no built-in's: it registers
    (name,) = [c.split(":")[1] for c in pm.infos["docs_steps_logger"].components]
    assert f"'logger.backends=[console,mlflow,{name}]'" in text[start:]
    logger = pm.registry.logger.get(name)(None, str(tmp_path))
    logger.log_metrics({"x": 1.0}, 1)
    logger.close()
    assert '"x": 1.0' in next(tmp_path.glob("*.jsonl")).read_text()
