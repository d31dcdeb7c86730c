"""Helpers for tests of rlforge and of plugins built on it (the way Lightning ships ``BoringModel``).

- ``fast_config(algo, tmp_path, *overrides)``: the config of a short run on the shipped tiny model and the built-in
  task: small batches, no validation, no checkpoints, no progress bar, console logging only. A test adds the few keys
  it is about::

      from rlforge import Trainer
      from rlforge.testing import fast_config

      def test_my_algorithm_trains(tmp_path):
          trainer = Trainer(fast_config("my_algo", tmp_path, "trainer.total_steps=2"))
          trainer.fit()

- ``step_context(config, batches, controller=...)``: the ``StepContext`` a stage runs in, without a trainer: ``draw``
  serves ``batches`` in order, ``regenerate`` draws the next one, hooks are recorded (``RecordingHook.calls``).
- ``fake_controller(workers, **methods)``: a controller with just the worker-group methods (``workers={"actor":
  {"compute_log_probs": ...}}``; ``generate=``/``generate_tokens=`` are the rollout workers', ``ctx.workers.rollout``)
  and controller methods (``score``, ...) a stage under test calls, waves and no log-prob reuse.
- ``FixedAnswerEngine``: a rollout engine (register it under ``registry.rollout``) that answers every prompt with the
  same text (``answer``), for tests of what surrounds generation (rewards, eval, export) without sampling.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FAST_OVERRIDES = (
    "data.train_batch_size=8", "actor.ppo_mini_batch_size=4", "actor.ppo_micro_batch_size=16", "rollout.n=4",
    "data.arith.train_size=512", "data.arith.val_size=16", "trainer.val_every=0", "trainer.val_before_train=false", "trainer.save_every=0",
    "trainer.progress=false", "logger.backends=[console]",
)


def fast_config(algo: str, tmp_path: str | Path, *overrides: str, plugins: Any = None) -> Any:
    """The composed config of algorithm ``algo`` for a short test run writing under ``tmp_path``: ``FAST_OVERRIDES``,
    then ``overrides`` (later keys win)."""
    from rlforge import load_config

    return load_config(algo, [*FAST_OVERRIDES, f"trainer.runs_root={tmp_path}", *overrides], plugins=plugins)


class RecordingHook:
    """The hook relay of a :func:`step_context`: every ``rlforge_<name>(**kwargs)`` call is kept in ``calls`` as
    ``(name, kwargs)`` and returns None."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("rlforge_"):
            raise AttributeError(name)
        return lambda **kwargs: self.calls.append((name[len("rlforge_"):], kwargs))


def step_context(config: Any = None, batches: Iterable[Any] = (), *, controller: Any = None, module: Any = None,
                 step: int = 1, sampling: Any = None, flow: Any = None, hook: Any = None, builder: Any = None) -> Any:
    """A ``rlforge.dataflow.StepContext`` for running one stage in a test: ``ctx.draw()`` (and ``ctx.regenerate``,
    which a stage such as dynamic sampling calls for more prompts) serve ``batches`` in order (a list given is popped
    in place: the test sees what is left); ``hook``: a :class:`RecordingHook` unless given (``ctx._hook.calls``)."""
    from rlforge.dataflow import DataFlow, StepContext
    from rlforge.errors import RLForgeError
    from rlforge.sampling import SamplingParams

    queue = batches if isinstance(batches, list) else list(batches)

    def draw() -> Any:
        if not queue:
            raise RLForgeError("step_context: the stage drew more batches than the test gave")
        return queue.pop(0)

    ctx = StepContext(config=config, controller=controller, module=module, hook=hook or RecordingHook(), step=step,
                      sampling=sampling or SamplingParams(), flow=flow or DataFlow("test", []), draw=draw,
                      builder=builder)
    ctx.regenerate = lambda before: ctx.draw()  # type: ignore[method-assign]  # no flow before the stage here
    return ctx


def fake_controller(workers: dict[str, dict[str, Any]] | None = None, **methods: Any) -> Any:
    """A controller offering ``methods`` (``score=...``) and worker groups with just the methods a stage under test
    calls (``workers={"actor": {"compute_log_probs": lambda batch, role: ...}}``, reached as ``ctx.workers.actor``;
    ``generate=``/``generate_tokens=`` go to ``ctx.workers.rollout``), in waves, without reusing the engine's
    log-probs (``logprobs_match_actor=False``). A role not given is the real controller's error
    (``rlforge.dataflow.Workers``)."""
    from rlforge.dataflow import Workers

    groups = {role: dict(fns) for role, fns in (workers or {}).items()}
    for name in ("generate", "generate_tokens"):  # the engines' methods: ctx.workers.rollout's
        if name in methods:
            groups.setdefault("rollout", {})[name] = methods.pop(name)
    return SimpleNamespace(logprobs_match_actor=False, continuous_batching=False,
                           workers=Workers({role: SimpleNamespace(**fns) for role, fns in groups.items()}),
                           **methods)


class FixedAnswerEngine:
    """A rollout engine answering ``answer`` (then the end-of-sequence token) to every prompt, ``n`` times each.
    Subclass it to change ``answer``; ``instances`` lists the engines built (a test can check they were closed)."""

    answer = "42"
    supports_sleep = False
    instances: list[FixedAnswerEngine] = []

    def __init__(self, config: Any, model: Any, tokenizer: Any) -> None:
        self.tokenizer, self.closed = tokenizer, False
        type(self).instances.append(self)

    def generate(self, batch: Any, params: Any) -> Any:
        import torch

        from rlforge import batch as B

        out = batch.repeat_interleave(params.n) if params.n > 1 else batch
        ids = self.tokenizer(self.answer, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
        out[B.RESPONSES] = torch.tensor([ids] * len(out))
        out[B.RESPONSE_MASK] = torch.ones_like(out[B.RESPONSES])
        return out

    def update_weights(self, named_tensors: Any) -> None:
        pass

    def shutdown(self) -> None:
        self.closed = True
