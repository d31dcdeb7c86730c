"""Shared fixtures: the plugin manager with the built-ins, a composed default config, the char tokenizer, the tiny
chat model, a counter of shared-prefix forward passes."""

from __future__ import annotations

import os
import signal
from collections import Counter

import pytest

from rlforge.plugin_manager import AUTOLOAD_ENV, PluginManager

STRICT_SKIPS_ENV = "RLFORGE_STRICT_SKIPS"  # set by scripts/test.sh: there, only tests marked gpu may skip


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (scripts/test.sh runs one worker per core) each worker, and every process it starts,
    computes on one thread: a worker per core with a thread per core each would oversubscribe the cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        os.environ["OMP_NUM_THREADS"] = "1"
        import torch

        torch.set_num_threads(1)


# Test files whose checks would see another file's processes, so they run one after another on one pytest-xdist
# worker: test_sandbox.py checks, machine-wide, that no sandboxed process outlives a test, and these files start
# sandboxes (code rewards, the python tool).
SHARED_WORKER = {path: "sandbox" for path in (
    "tests/plugins/test_sandbox.py", "tests/plugins/test_reward.py", "tests/plugins/test_reward_file.py",
    "tests/plugins/test_reward_faults.py",
    "tests/plugins/test_code_reward.py", "tests/agent/test_tools.py",
)}

try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # a plain pytest without the test extra: no workers
    LoadFileScheduling = None
else:
    class FileScheduling(LoadFileScheduling):
        """pytest-xdist's ``loadfile``: each test file whole on one worker (its module-scoped engine or cluster
        starts once), the files of :data:`SHARED_WORKER` together."""

        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return SHARED_WORKER.get(path, path)

    @pytest.hookimpl(optionalhook=True)  # with ``-p no:xdist`` the hook is not declared
    def pytest_xdist_make_scheduler(config: pytest.Config, log):
        # the files in collection order (pytest_collection_modifyitems below), not xdist's default of the files with
        # the most tests first, which left the long one- and two-test files (a Ray cluster with vLLM engines, a
        # learning run) for the end of the run
        config.option.loadscopereorder = False
        return FileScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The files with the most ``slow`` tests first (each file's own order kept), so pytest-xdist's workers start on
    the long files and end on short ones. Tests marked ``gpu`` skip, with the reason, where torch sees no CUDA device."""
    import torch

    slow = Counter(item.path for item in items if item.get_closest_marker("slow"))
    items[:] = sorted(items, key=lambda item: -slow[item.path])  # stable: files stay whole and in order within
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; torch.cuda.is_available() is False on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _unexpected_skip(report: pytest.TestReport | pytest.CollectReport, gpu: bool) -> None:
    if report.skipped and not gpu and not hasattr(report, "wasxfail") and os.environ.get(STRICT_SKIPS_ENV):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        report.outcome = "failed"
        report.longrepr = (f"skipped under scripts/test.sh, where only tests marked gpu may skip ({STRICT_SKIPS_ENV}=1): "
                           f"{reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Under scripts/test.sh a skip other than a GPU test's fails: a missing extra must not pass silently."""
    outcome = yield
    _unexpected_skip(outcome.get_result(), "gpu" in item.keywords)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """The same for a module that skips itself at import (``pytest.importorskip``)."""
    outcome = yield
    _unexpected_skip(outcome.get_result(), False)


@pytest.fixture(scope="session")
def pm() -> PluginManager:
    """Built-in plugins only (no third-party entry points), shared read-only by many tests."""
    return PluginManager(autoload=False)


@pytest.fixture(scope="session")
def registry(pm: PluginManager):
    return pm.registry


@pytest.fixture(scope="session")
def default_config(pm: PluginManager):
    import rlforge

    return rlforge.load_config(plugins=pm)


@pytest.fixture(scope="session")
def char_tokenizer():
    from rlforge.models import build_char_tokenizer

    return build_char_tokenizer()


@pytest.fixture(scope="session")
def tiny_chat_model(tmp_path_factory: pytest.TempPathFactory):
    """Folder of the tiny Qwen2 chat model (rlforge.tools.tiny_chat): ChatML, tools, eos != end-of-turn."""
    from rlforge.tools.tiny_chat import build_tiny_chat_model

    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-chat"))


@pytest.fixture
def no_autoload(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTOLOAD_ENV, "1")


LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def no_launch_variables_leak():
    """A test that joins a process group in this process (Lightning's ddp sets ``MASTER_PORT`` here) must not hand its
    launch variables to the next test's subprocesses: they would try to listen on a port that is still taken."""
    import os

    saved = {key: os.environ.get(key) for key in LAUNCH_VARIABLES}
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


SIGTERM_AT_START = signal.getsignal(signal.SIGTERM)


@pytest.fixture(autouse=True)
def no_sigterm_handler_leaks():
    """``ray.init`` gives this process a Python SIGTERM handler (``sys.exit``) that outlives ``ray.shutdown``; a
    process forked later (datasets' ``map(num_proc=...)`` pool) inherits it, and a child stuck on a lock copied at the
    fork then ignores the pool's terminate, so the test hangs (seen under pytest-xdist). After each test SIGTERM is
    what it was when the session started."""
    yield
    if signal.getsignal(signal.SIGTERM) is not SIGTERM_AT_START:
        signal.signal(signal.SIGTERM, SIGTERM_AT_START)


@pytest.fixture
def shared_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per forward pass that took the shared-prefix path (``model.shared_prefix``) in this test."""
    from rlforge import ops

    calls: list[int] = []
    forward = ops._shared_prefix_forward
    monkeypatch.setattr(ops, "_shared_prefix_forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    return calls
