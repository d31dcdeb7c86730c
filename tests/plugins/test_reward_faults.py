"""Reward results that used to crash the run or slip through, checked through the real worker processes:
huge or malformed values, reward files that exit or hang at import, a bad worker count, timeouts measured
in CPU time (so the verdict does not depend on machine load) and made loud, and configuration errors
raised inside a reward function (the code sandbox's refusal) that must stop the run."""

from __future__ import annotations

import logging
import math
import re
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from rlforge import batch as B
from rlforge.errors import RLForgeError
from rlforge.plugins.reward import sandbox
from rlforge.plugins.reward.results import extra_values, split_result
from rlforge.plugins.reward.rule import RuleRewardManager
from rlforge.plugins.reward.user_file import load_user_function
from rlforge.plugins.reward.workers import RewardWorkers
from tests.plugins.test_reward import (  # noqa: F401 (fixtures)
    _response_batch,
    _reward_config,
    manager_factory,
    short_backstop,
)

FLOAT32_MAX = float(torch.finfo(torch.float32).max)

REWARD = """
import os, signal, subprocess, sys, time
from rlforge.errors import RLForgeError

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "big":
        return 1e39
    if solution_str == "bigint":
        return {"score": 10 ** 400}
    if solution_str == "accnone":
        return {"score": 1.0, "acc": None}
    if solution_str == "exit":
        sys.exit(2)
    if solution_str == "burn":
        while True:
            pass
    if solution_str == "nap":  # 1.5 s of wall clock, almost no CPU
        time.sleep(1.5)
        return 1.0
    if solution_str == "stopped":  # descheduled for 1.5 s, as on a loaded machine
        subprocess.Popen(["sh", "-c", f"sleep 1.5; kill -CONT {os.getpid()}"])
        os.kill(os.getpid(), signal.SIGSTOP)
        return 1.0
    if solution_str == "config":
        raise RLForgeError("Set reward.my_key (my reward needs it).")
    return float(solution_str == ground_truth)
"""


@pytest.fixture
def reward_file(tmp_path: Path) -> str:
    path = tmp_path / "reward.py"
    path.write_text(REWARD)
    return str(path)


def _batch(tok, texts: list[str], source: str = "mine", truth: str = "ok", width: int = 9) -> B.Batch:
    return _response_batch(tok, texts, [source] * len(texts), [truth] * len(texts), width=width)


# --- values -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("result", "message"),
    [
        (1e39, "returned score 1e+39, beyond the float32 range of the reward tensor"),
        (-1e39, "returned score -1e+39, beyond the float32 range"),
        ({"score": 10 ** 400}, "which is not a float (int too large to convert to float)"),
        (10 ** 5000, "returned score a int, which is not a float"),  # its repr would raise too
        ({"score": 1.0, "acc": None}, "returned 'acc' NoneType (None), not a number"),
        ({"score": 1.0, "acc": float("nan")}, "returned 'acc' nan"),
        ({"score": 1.0, "acc": 1e300}, "returned 'acc' 1e+300, beyond the float32 range"),
    ],
    ids=["1e39", "-1e39", "10**400", "10**5000", "acc-None", "acc-nan", "acc-1e300"],
)
def test_split_result_refuses_values_the_reward_tensor_cannot_hold(result, message) -> None:
    with pytest.raises(ValueError) as info:
        split_result(result)
    assert message in str(info.value)


def test_split_result_keeps_float64_within_the_float32_range() -> None:
    assert split_result(FLOAT32_MAX) == (FLOAT32_MAX, 1.0)
    assert split_result({"score": 0.1, "acc": True}) == (0.1, 1.0)  # the float64 value, rounded only in the tensor
    # a tensor or array of one number, of any shape, as verl takes it; one of more numbers or a complex one is not
    assert split_result(torch.tensor(1.0)) == (1.0, 1.0) and split_result({"score": np.float32(0.5)}) == (0.5, 0.0)
    assert split_result(np.array(0.25)) == (0.25, 0.0) and split_result(torch.tensor(True)) == (1.0, 1.0)
    assert split_result(torch.tensor([1.0])) == (1.0, 1.0) and split_result(np.array([[0.5]])) == (0.5, 0.0)
    # a score that still carries autograd is its number, without torch's warning about converting it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert split_result({"score": torch.tensor([0.5], requires_grad=True), "n": np.array([2])}) == (0.5, 0.0)
    assert extra_values({"score": 1.0, "n": torch.tensor([[3]]), "v": np.array([1, 2])}) == {"n": 3.0}
    for bad in (torch.tensor([]), np.array([0.5, 0.5]), torch.tensor(1 + 1j)):
        with pytest.raises(ValueError, match="not a number"):
            split_result(bad)


def test_bad_values_are_one_counted_error_each_and_one_log_line(
    char_tokenizer, registry, manager_factory, reward_file, caplog, capfd  # noqa: F811
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=reward_file, fallback_score=-1.0)
    with caplog.at_level(logging.WARNING, logger="rlforge.reward"):
        out = mgr.score(_batch(char_tokenizer, ["big", "bigint", "accnone", "ok", "exit"]))
        again = mgr.score(_batch(char_tokenizer, ["big", "accnone", "ok"]))
    torch.testing.assert_close(out[B.SCORES], torch.tensor([-1.0, -1.0, -1.0, 1.0, -1.0]))
    assert out[B.SCORES].dtype == torch.float32 and out[B.ACC].tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]
    assert out.meta["metrics"] == {"reward/errors": 4.0, "reward/timeouts": 0.0, "reward/error_share": 0.8}
    assert again.meta["metrics"] == {"reward/errors": 2.0, "reward/timeouts": 0.0, "reward/error_share": 2 / 3}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2  # the first 'bad value' and the first 'raised'; later ones only counted
    assert "sample 0 (bad value): returned score 1e+39, beyond the float32 range" in lines[0]
    assert "sample 4 (raised): raised SystemExit: 2" in lines[1]  # sys.exit in a reward call: an error
    assert "Traceback" not in capfd.readouterr().err


# --- reward files that fail at import ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("import sys\nsys.exit(3)", r"Reward file .*bad.py failed to import: SystemExit: 3"),
        ("import os\nos._exit(4)", (r"Reward file .*bad.py ended its process while being imported: reward worker "
                                    r"exited with code 4")),
        ("while True:\n    pass", (r"Reward file .*bad.py did not finish importing: it used more than "
                                    r"reward.timeout_s=0.5 s of CPU time")),
        ("import time\ntime.sleep(60)", (r"Reward file .*bad.py did not finish importing: it gave no result within "
                                         r"the wall-clock backstop of 2 s")),
    ],
    ids=["sys.exit", "os._exit", "loop", "sleep"],
)
def test_reward_file_that_exits_or_hangs_at_import_is_a_clear_error(tmp_path, body, message, short_backstop) -> None:  # noqa: F811
    path = tmp_path / "bad.py"
    path.write_text(body + "\ndef compute_score(*args):\n    return 1.0\n")
    start = time.monotonic()
    with pytest.raises(RLForgeError, match=message):
        load_user_function(str(path), timeout_s=0.5)
    assert time.monotonic() - start < 10.0


def test_reward_manager_checks_the_file_with_reward_timeout_s(char_tokenizer, registry, tmp_path) -> None:
    path = tmp_path / "loops.py"
    path.write_text("while True:\n    pass\n")
    with pytest.raises(RLForgeError, match=r"loops.py did not finish importing.*reward.timeout_s=0.25"):
        RuleRewardManager(_reward_config(file=str(path), timeout_s=0.25), char_tokenizer, registry)


# --- the worker pool --------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_workers", [0, -1])
def test_num_workers_below_one_is_a_clear_error(num_workers) -> None:
    with pytest.raises(RLForgeError, match=rf"reward.num_workers must be an integer >= 1 .*got {num_workers}"):
        RewardWorkers({}, num_workers, 1.0)


def test_wall_clock_time_without_cpu_use_is_not_a_timeout(
    char_tokenizer, registry, manager_factory, reward_file  # noqa: F811
) -> None:
    """1.5 s asleep or descheduled (SIGSTOP, as on a loaded machine) is far over timeout_s=0.5 in wall-clock
    time but uses almost no CPU: the calls are scored, as they would be on an idle machine."""
    mgr = manager_factory(char_tokenizer, registry, file=reward_file, timeout_s=0.5)
    out = mgr.score(_batch(char_tokenizer, ["nap", "stopped", "ok"]))
    assert out[B.SCORES].tolist() == [1.0, 1.0, 1.0]
    assert out.meta["metrics"] == {"reward/errors": 0.0, "reward/timeouts": 0.0, "reward/error_share": 0.0}


def test_each_step_with_timeouts_logs_their_count(
    char_tokenizer, registry, manager_factory, reward_file, caplog  # noqa: F811
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=reward_file, timeout_s=0.3)
    with caplog.at_level(logging.WARNING, logger="rlforge.reward"):
        first = mgr.score(_batch(char_tokenizer, ["burn", "ok", "burn"]))
        second = mgr.score(_batch(char_tokenizer, ["ok", "burn"]))
    assert first.meta["metrics"]["reward/timeouts"] == 2.0 and second.meta["metrics"]["reward/timeouts"] == 1.0
    counts = [r.getMessage() for r in caplog.records if "reward calls timed out" in r.getMessage()]
    assert counts[0].startswith("2 of 3 reward calls timed out (over reward.timeout_s=0.3 s of CPU time")
    assert counts[1].startswith("1 of 2 reward calls timed out") and len(counts) == 2
    assert "reward/timeouts" in counts[0]


def test_rlforge_error_in_a_reward_function_stops_the_run(
    char_tokenizer, registry, manager_factory, reward_file  # noqa: F811
) -> None:
    mgr = manager_factory(char_tokenizer, registry, file=reward_file)
    with pytest.raises(RLForgeError, match=r"Set reward.my_key \(my reward needs it\)."):
        mgr.score(_batch(char_tokenizer, ["ok", "config"]))


# --- the code reward without real isolation ---------------------------------------------------------------


@pytest.fixture
def no_isolation(monkeypatch: pytest.MonkeyPatch) -> None:
    """This machine as one without root and user namespaces (the workers fork with the patch in place)."""
    real_probe = sandbox._probe
    monkeypatch.setattr(sandbox, "_probe", lambda mode, euid: sandbox._Probe(None, "unshare failed: Operation not "
                        "permitted") if mode in sandbox.STRONG_MODES else real_probe(mode, euid))


CODE_TRUTH = '{"inputs": ["2\\n"], "outputs": ["4\\n"]}'


def test_code_reward_without_isolation_stops_the_run_unless_weak_is_allowed(
    char_tokenizer, registry, manager_factory, no_isolation  # noqa: F811
) -> None:
    batch = _batch(char_tokenizer, ["print(2*2)"], source="code", truth=CODE_TRUTH, width=12)
    refusing = manager_factory(char_tokenizer, registry)
    with pytest.raises(RLForgeError, match=r"No real isolation works here.*reward.code.sandbox_allow_weak=true"):
        refusing.score(batch)
    weak = manager_factory(char_tokenizer, registry, sandbox_allow_weak=True)  # (its warning: test_sandbox.py)
    assert weak.score(batch)[B.SCORES].tolist() == [1.0]


def test_code_reward_budget_is_cpu_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole call's budget (80% of reward.timeout_s) is counted in CPU time, sandboxed programs included:
    a program that burns 0.7 s of CPU on the first test leaves none of a 0.6 s budget for the second."""
    from rlforge.plugins.reward.code import code_exec_score

    calls = []
    real = sandbox.run_sandboxed

    def counting(*args, **kwargs):
        calls.append(kwargs["timeout_s"])
        return real(*args, **kwargs)

    monkeypatch.setattr("rlforge.plugins.reward.code.run_sandboxed", counting)
    truth = {"inputs": ["1\n", "2\n"], "outputs": ["1\n", "2\n"]}
    slow = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.7:\n    pass\nprint(input())\n"
    result = code_exec_score("code", slow, truth, timeout_s=0.75, sandbox_timeout_s=5.0)
    assert len(calls) == 1 and math.isclose(calls[0], 0.6, abs_tol=0.05)  # min(5, 0.8 * 0.75 - CPU used so far)
    assert result == {"score": 0.5, "acc": 0.0}


# --- a reward that fails on every sample, and files that are no reward file ----------------------------------
ALWAYS_FAILS = """
def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "ok":
        return 1.0
    raise KeyError("answer")
"""


def test_a_batch_on_which_every_call_failed_stops_the_run_with_the_first_error(
    char_tokenizer, registry, manager_factory, tmp_path  # noqa: F811
) -> None:
    from rlforge.plugins.reward.rule import RewardFailure

    path = tmp_path / "fails.py"
    path.write_text(ALWAYS_FAILS)
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    with pytest.raises(RewardFailure) as err:
        mgr.score(_batch(char_tokenizer, ["a", "b", "c"]))
    assert str(err.value).startswith(
        "3 of 3 reward calls failed on this batch (3 raised), which reaches reward.max_error_share=1: the training "
        "step would train on reward.fallback_score alone. The first: data_source 'mine', sample 0: raised KeyError: "
        "'answer'.")
    assert "raise reward.max_error_share" not in str(err.value)  # 1 is its most: nothing to raise it to
    out = mgr.score(_batch(char_tokenizer, ["a", "ok", "c"]))  # some signal left: scored, the share reported
    assert out.meta["metrics"]["reward/error_share"] == 2 / 3
    assert out[B.REWARD_FAILED].tolist() == [1.0, 0.0, 1.0]  # which rows got the fallback (GDPO's components)


def test_max_error_share_is_the_tolerance(char_tokenizer, registry, manager_factory, tmp_path) -> None:  # noqa: F811
    from rlforge.plugins.reward.rule import RewardFailure

    path = tmp_path / "fails.py"
    path.write_text(ALWAYS_FAILS)
    mgr = manager_factory(char_tokenizer, registry, file=str(path), max_error_share=0.5)
    assert mgr.score(_batch(char_tokenizer, ["ok", "ok", "c"]))[B.SCORES].tolist() == [1.0, 1.0, 0.0]
    with pytest.raises(RewardFailure, match=r"^2 of 4 reward calls failed on this batch \(2 raised\), which reaches "
                                            r"reward.max_error_share=0.5"):
        mgr.score(_batch(char_tokenizer, ["ok", "a", "ok", "b"]))
    first = manager_factory(char_tokenizer, registry, file=str(path), max_error_share=0.0)  # as verl (rlforge verl)
    assert first.score(_batch(char_tokenizer, ["ok", "ok"]))[B.SCORES].tolist() == [1.0, 1.0]
    with pytest.raises(RewardFailure, match=r"^1 of 3 reward calls failed on this batch \(1 raised\), which reaches "
                                            r"reward.max_error_share=0: the first failed call stops the run \(verl's "
                                            r"reward managers stop on a call that raises.*\)\. The first: "
                                            r"data_source 'mine', sample 2"):
        first.score(_batch(char_tokenizer, ["ok", "ok", "c"]))


# the signature of verl's verl/utils/reward_score/gsm8k.py::compute_score (a scorer for verl's dispatcher, not a
# custom reward function); the body is this test's own
VERL_STYLE_SCORER = """
def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    assert method in ("strict", "flexible")
    return score if solution_str.strip().endswith(str(ground_truth)) else format_score
"""


def test_a_verl_scorer_used_as_reward_file_is_refused_at_load_with_the_wrapper_to_write(tmp_path) -> None:
    path = tmp_path / "gsm8k.py"
    path.write_text(VERL_STYLE_SCORER)
    with pytest.raises(RLForgeError) as err:
        load_user_function(str(path))
    msg = str(err.value)
    assert msg.startswith(f"Reward file {path}: compute_score(solution_str, ground_truth, method='strict', "
                          f"format_score=0.0, score=1.0) does not follow the reward-function contract compute_score("
                          f"data_source, solution_str, ground_truth, extra_info): its parameter 'solution_str' is "
                          f"argument 1, where rlforge passes 'data_source'")
    assert "def compute_score(data_source, solution_str, ground_truth, extra_info): return scorer(" in msg
    path.write_text("def compute_score(data_source, solution_str):\n    return 1.0\n")
    with pytest.raises(RLForgeError, match="it cannot take these four arguments"):
        load_user_function(str(path))


@pytest.mark.parametrize("target, says", [
    ("/etc/passwd", "is not a Python file (its name does not end in .py)"),
    ("DIR", "is a directory"),
])
def test_files_that_are_no_reward_file_are_named_so(tmp_path, target, says) -> None:
    path = str(tmp_path) if target == "DIR" else target
    with pytest.raises(RLForgeError, match=rf"^Reward file {path} \(reward.file\) {re.escape(says)}"):
        load_user_function(path)


def test_numpy_bools_are_scores_as_verl_reads_them(char_tokenizer, registry, manager_factory, tmp_path) -> None:  # noqa: F811
    np = pytest.importorskip("numpy")
    assert split_result(np.True_) == (1.0, 1.0) and split_result(np.False_) == (0.0, 0.0)
    assert split_result({"score": np.float32(0.5), "acc": np.True_}) == (0.5, 1.0)
    path = tmp_path / "np_reward.py"
    path.write_text("import numpy as np\n\ndef compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                    "    return np.array(solution_str) == np.array(ground_truth)\n")
    mgr = manager_factory(char_tokenizer, registry, file=str(path))
    out = mgr.score(_batch(char_tokenizer, ["ok", "no"]))
    assert out[B.SCORES].tolist() == [1.0, 0.0] and out.meta["metrics"]["reward/errors"] == 0.0
