"""What a plugin or a new algorithm hands back to rlforge is checked where it arrives, and a wrong one is an error that
names who returned it and what it takes (helper-51's adversarial pass): policy losses, training steps, metrics, the
batch-returning hooks, and the entries a plugin adds to a checkpoint."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlforge import batch as B
from rlforge import checkpoint as ckpt
from rlforge.algorithms.base import checked_output
from rlforge.dataflow import DataFlow, StepContext
from rlforge.errors import RLForgeError
from rlforge.hookspecs import hookimpl
from rlforge.metric_values import check_numbers
from rlforge.module import checked_loss
from rlforge.plugin_manager import PluginManager
from rlforge.protocols import PolicyLossOutput
from rlforge.sampling import SamplingParams

MASK = torch.ones(2, 3)


def test_a_policy_loss_returns_the_per_token_loss() -> None:
    good = PolicyLossOutput(torch.zeros(2, 3), {"actor/clipfrac": torch.zeros(2, 3), "actor/x": torch.tensor(0.0)})
    assert checked_output(good, MASK, "actor.policy_loss=mine") is good
    for out, message in ((PolicyLossOutput(torch.tensor(1.0), {}), r"a loss of shape \(\): it takes the per-token"),
                         ((torch.zeros(2, 3), {}), "returned tuple: return a PolicyLossOutput"),
                         (PolicyLossOutput(torch.zeros(2, 3), {"s": 0.5}), "the stat 's' as float"),
                         (PolicyLossOutput(torch.zeros(2, 3), {"s": torch.zeros(3, 2)}), r"'s' as shape \(3, 2\)")):
        with pytest.raises(RLForgeError, match=rf"actor.policy_loss=mine .*{message}"):
            checked_output(out, MASK, "actor.policy_loss=mine")
    # helper-80: a detached loss was blamed on the algorithm ("GRPO's actor loss does not depend on ...")
    with pytest.raises(RLForgeError, match=r"actor.policy_loss=mine returned a loss without a gradient"):
        checked_output(good, MASK, "actor.policy_loss=mine", trains=True)
    grad = PolicyLossOutput(torch.zeros(2, 3, requires_grad=True) * 2, {})
    assert checked_output(grad, MASK, "actor.policy_loss=mine", trains=True) is grad


def test_a_training_step_returns_a_loss_with_a_gradient_and_numeric_metrics() -> None:
    w = torch.ones(3, requires_grad=True)
    loss, metrics = checked_loss(((w * 2).sum(), {"a": 1, "b": torch.tensor(2.0)}), "Mine's actor loss")
    assert loss.requires_grad and metrics == {"a": 1, "b": 2.0}
    for result, message in (((w * 2).sum(), r"returned Tensor: return \(loss, metrics\)"),
                            (((w * 2).sum(),), "returned tuple of 1"),
                            ((w * 2, {}), r"is a torch.float32 tensor of shape \(3,\): it takes one float"),
                            ((1.0, {}), "is float"),
                            (((w * 2).sum().detach(), {}), "does not depend on the model's parameters"),
                            (((w * 2).sum(), [1.0]), "its metrics are list"),
                            (((w * 2).sum(), {"m": "x"}), "metric 'm' .* is str, not a number")):
        with pytest.raises(RLForgeError, match=f"Mine's actor loss.*{message}|{message}"):
            checked_loss(result, "Mine's actor loss")


def test_metrics_are_numbers() -> None:
    metrics = {"a": 1.5, "n": np.float32(2.0), "t": torch.tensor([3.0]), "flag": True}
    check_numbers(metrics, "set by me")
    assert metrics["t"] == 3.0 and isinstance(metrics["t"], float)
    for value, what in (("hello", "str"), (None, "NoneType"), (torch.zeros(2), r"a tensor of shape \(2,\)")):
        with pytest.raises(RLForgeError, match=rf"metric 'my/x' \(set by me\) is {what}, not a number"):
            check_numbers({"my/x": value}, "set by me")


class _Filter:
    def __init__(self, result):
        self.result = result

    @hookimpl
    def rlforge_filter_groups(self, trainer, batch):
        return self.result(batch)


@pytest.mark.parametrize(("result", "message"), [
    (lambda b: b.select([]), r"rlforge_filter_groups \(implemented by _Filter\) returned a batch of 0 rows"),
    (lambda b: [1, 2], r"rlforge_filter_groups \(implemented by _Filter\) returned list: return the batch"),
])
def test_a_hook_that_returns_a_batch_returns_one_with_rows(result, message) -> None:
    def context(plugin):
        pm = PluginManager(autoload=False)
        pm.register(plugin)
        return StepContext(config=None, controller=None, module=None, hook=pm.hook, step=1, sampling=SamplingParams(),
                           flow=DataFlow("f", []), draw=lambda: B.Batch({}), hook_trainer=None)

    batch = B.Batch({B.RESPONSE_MASK: MASK}, {B.UID: ["a", "b"]})
    with pytest.raises(RLForgeError, match=message):
        context(_Filter(result)).hook_batch("filter_groups", batch)
    assert context(_Filter(lambda b: None)).hook_batch("filter_groups", batch) is None  # None: the batch is kept
    assert len(context(_Filter(lambda b: b.select([1]))).hook_batch("filter_groups", batch)) == 1


def test_a_checkpoint_entry_that_would_not_resume_is_refused_when_saved(tmp_path) -> None:
    ckpt.check_loadable({"count": 3, "rng": torch.zeros(2), "names": ["a"], "nested": {"x": math.pi}}, "mine")
    # (not a numpy array: libraries imported by other tests of the worker may allowlist numpy for the safe loader)
    for value, shown in ((_Opaque(), "_Opaque"), (object(), "object")):
        with pytest.raises(RLForgeError, match=rf"checkpoint entry 'bad' \(added by a plugin\) does not load with "
                                               rf"torch.load\(weights_only=True\) \(.*{shown}.*\), which resuming uses"):
            ckpt.check_loadable({"ok": 1, "bad": value}, "added by a plugin")
    with pytest.raises(RLForgeError, match=r"^Mine.state_dict\(\) returned NoneType: return a dict"):
        ckpt.check_loadable(None, "Mine.state_dict()")  # type: ignore[arg-type]  # what a mistaken override returns
    # a state file saved before the check: said to hold such a value, not to be corrupted, without colour codes
    import pickle

    state = tmp_path / "trainer_state.pt"
    torch.save({"extra": {"bad": _Opaque()}}, state)
    with pytest.raises(pickle.UnpicklingError) as exc:
        torch.load(state, weights_only=True)
    detail = ckpt.unsafe_detail(exc.value)
    assert "\x1b[" not in detail and "_Opaque" in detail
    # torch's other wording (a global it has no advice for): the refused thing follows blank lines
    other = Exception("Weights only load failed. In PyTorch 2.6, ...\nPlease file an issue with the following so that "
                      "we can make `weights_only=True` compatible with your use case: WeightsUnpickler error: \n\n"
                      "Can only build Tensor, ... but got <class 'numpy.ndarray'>\n\nCheck the documentation")
    assert ckpt.unsafe_detail(other) == "Can only build Tensor, ... but got <class 'numpy.ndarray'>"


class _Opaque:
    """A class no library allowlists for torch's safe loader."""
