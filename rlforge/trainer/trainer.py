"""Trainer.fit(): the dataflow loop of docs/concepts.md ("The dataflow of one step"), timed stage by stage, with hooks
around each."""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch
from omegaconf import DictConfig, OmegaConf

from rlforge import batch as B
from rlforge import checkpoint as ckpt
from rlforge import diskio
from rlforge import pipeline as pipelines
from rlforge import resume
from rlforge.agent.stage import evaluator
from rlforge.build import Builder
from rlforge.config import compose
from rlforge.config.batches import apply_total_epochs
from rlforge.data import PromptSampler
from rlforge.dataflow import DataFlow, StepContext
from rlforge.errors import SHIELDED, STOP_UNDERWAY, NonFiniteError, RLForgeError
from rlforge.metric_values import check_kept, check_numbers
from rlforge.module import RLModule
from rlforge.module_checks import callback_without_hooks, check_given_module, check_hook_signatures, unknown_hooks
from rlforge.plugin_manager import PluginManager, implementers
from rlforge.trainer.checkpoint_hooks import checkpoint_entries, restore_checkpoint_entries
from rlforge.sampling import SamplingParams
from rlforge.trainer.metrics import data_metrics, sample_records, token_count, val_generations
from rlforge.trainer.report import print_summary, reward_error_share
from rlforge.weight_sync import add_sync_metrics

if TYPE_CHECKING:
    from rlforge.protocols import GenerationsLogger

log = logging.getLogger("rlforge")
RESUME_HINT = "Free space, then continue with trainer.resume=auto (the last checkpoint is complete)."


class Trainer:
    """Lightning-style entry point: ``Trainer(config).fit(module)``.

    :param config: a composed config (``rlforge.load_config``); None composes the defaults with ``algo``
        and ``overrides``.
    :param callbacks: objects with ``@hookimpl`` methods, registered as plugins for this run.
    """

    def __init__(
        self,
        config: DictConfig | None = None,
        *,
        algo: str | None = None,
        overrides: Iterable[str] = (),
        callbacks: Iterable[object] = (),
        plugins: PluginManager | None = None,
    ) -> None:
        if plugins is None and config is None:
            from rlforge.config import compose_with_plugins

            plugins, config = compose_with_plugins(algo, None, list(overrides))
        self.plugins = plugins or (PluginManager.for_config(config) if config is not None else PluginManager())
        self.config = config if config is not None else compose(self.plugins.registry, algo, None, list(overrides))
        one = not hasattr(callbacks, "__iter__") or any(n.startswith("rlforge_") for n in dir(callbacks))
        for cb in reversed([callbacks] if one else list(callbacks)):  # one callback, as Lightning takes; pluggy calls
            # the last registered first: the list's order
            self.plugins.register(cb)
            if not any(name.startswith("rlforge_") for name in dir(cb)):
                log.warning(callback_without_hooks(cb))
        self.hook = self.plugins.hook
        self.builder = Builder(self.config, self.plugins)
        self.pipeline = pipelines.for_config(self.config)  # trainer.pipeline: when each step's batch is generated
        self.step = 0
        self.history: list[dict[str, float]] = []
        self.should_stop = False  # set by a hook: the run ends after this step, as at trainer.total_steps
        self.run_dir: Path | None = None
        # a checkpoint being written in the background: its step, trainer state and meta
        self._writing: tuple[int, dict[str, Any], dict[str, Any]] | None = None
        self._entries: tuple[int, dict[str, Any]] | None = None  # (step, what the save hooks added at it)
        self._resynced: dict[str, float] = {}  # weight_sync/* of the sync a resume made, for the first step's metrics

    # --- setup ------------------------------------------------------------------------------------
    def _resolve_run(self) -> resume.Binding:
        """Lock the run folder to write and read the checkpoint to continue from (rlforge.resume)."""
        binding = resume.bind(self.config, self.fingerprint,
                              lambda: compose(self.plugins.registry, self.config.algorithm.name))
        self.run_dir = binding.run_dir
        return binding

    def _load_data(self, module: RLModule) -> None:
        """The module's training and validation examples (``RLModule.prepare_data``) and the sampler over them."""
        d = self.config.data
        self.train_examples = module.prepare_data(self.builder.dataset("train"), "train")
        apply_total_epochs(self.config, len(self.train_examples))  # total_epochs / epoch_limit: steps from the rows
        self.val_examples = module.prepare_data(self.builder.dataset("val"), "val")
        self.sampler = PromptSampler(len(self.train_examples), d.train_batch_size, d.shuffle, self.config.trainer.seed)
        self.fingerprint = {**resume.fingerprint(self.train_examples, self.config),
                            "module": f"{type(module).__module__}.{type(module).__qualname__}",
                            # which plugin (and distribution) gave each component the config names: a record only
                            "plugins": self.plugins.provenance(self.config)}

    def _seed(self) -> None:
        seed = self.config.trainer.seed
        random.seed(seed)
        torch.manual_seed(seed)

    # --- the loop ---------------------------------------------------------------------------------
    def fit(self, module: RLModule | None = None) -> dict[str, Any]:
        """Train ``module`` (default: the algorithm ``algorithm.name``) and return the run's summary."""
        self.should_stop = False  # a hook may set it from here on (rlforge_fit_start included)
        if module is not None:
            check_given_module(module, self.config, self.plugins.registry.algorithm)
        module = self.module = self.builder.module(module)
        check_hook_signatures(type(module), RLModule)
        for warning in unknown_hooks(type(module), RLModule):
            log.warning(warning)
        module._fitting = True  # from here its log() outside a step raises (RLModule.log)
        try:
            return self._start(module)
        finally:
            module._fitting = False

    def _start(self, module: RLModule) -> dict[str, Any]:
        """Build the flow, prepare the data, take the run folder and the controller, then train (:meth:`_fit`)."""
        self.flow = self.build_flow(module)
        self._load_data(module)  # data mistakes surface before any model loads or folder is made
        served = self.builder.follow(module)  # a torchrun rank > 0 serves rank 0, which runs the loop below
        if served is not None:
            return served
        binding = self._resolve_run()
        try:
            self._seed()
            with resume.starting(binding):  # a start that fails frees the folder: nothing was trained
                self.controller = self.builder.controller(module)  # loads the models this process needs
            self.loggers = []
            outcome = "finished"
            try:
                with resume.starting(binding):
                    self.loggers = self.builder.loggers(str(self.run_dir))
                return self._fit(module, self.flow, binding)
            except BaseException as exc:
                outcome = "killed" if isinstance(exc, KeyboardInterrupt) else "failed"
                STOP_UNDERWAY.set()  # a repeated SIGTERM lets this clean-up finish (rlforge.cli)
                self.pipeline.close()  # the rollout thread stops before the plugins release what it may use
                self._settle_checkpoint()
                self.hook.rlforge_exception(trainer=self, exception=exc)
                raise
            finally:
                self.pipeline.close()
                self._close_loggers(outcome)
                self.controller.shutdown()
        finally:
            binding.lock.release()

    def build_flow(self, module: RLModule) -> DataFlow:
        """The module's dataflow, edited by the plugins (``rlforge_before_flow_compile``) and the pipeline
        (``trainer.pipeline``), then compiled."""
        flow = module.flow()
        if not isinstance(flow, DataFlow):
            raise RLForgeError(f"{type(module).__qualname__}.flow() returned {type(flow).__name__}: return the step's "
                               f"DataFlow (super().flow(), edited, or a DataFlow of your own: docs/concepts.md).")
        returned = self.hook.rlforge_before_flow_compile(flow=flow, module=module, config=self.config)
        stray = [r for r in returned if r is not flow]  # pluggy returns the results that are not None
        if stray:
            raise RLForgeError(
                f"rlforge_before_flow_compile (implemented by {implementers(self.hook, 'before_flow_compile')}) "
                f"returned {type(stray[0]).__name__}: the hook edits the flow it is given in place (flow.insert_after, "
                f"replace, remove; flow.stages[:] = ... to replace every stage) and returns None; a returned flow "
                f"would be ignored.")
        return self.pipeline.prepare(flow).compile()

    def _fit(self, module: RLModule, flow: DataFlow, binding: resume.Binding) -> dict[str, Any]:
        cfg, t = self.config, self.config.trainer
        params = OmegaConf.to_container(cfg, resolve=True)
        for lg, name in zip(self.loggers, cfg.logger.backends):
            with self.builder.logger_failures(name, "in log_params"):
                lg.log_params(params)  # type: ignore[arg-type]  # a dict at the root
        if binding.checkpoint is not None:
            self._restore(binding.checkpoint, binding.state)
            changed = "".join(f"; {k}: {a!r} -> {b!r}" for k, (a, b) in binding.changed.items()
                              if not k.startswith("trainer.resume"))
            print(f"rlforge: resumed from {binding.checkpoint} (step {self.step}){changed}")
        elif not binding.new:
            print(f"rlforge: restarting {self.run_dir} from step 0 (it was stopped before its first checkpoint)")
        self.hook.rlforge_fit_start(trainer=self, module=module)
        # what every checkpoint saves of the module, checked before the first step rather than at the first save
        ckpt.check_loadable(module.state_dict(), f"{type(module).__name__}.state_dict()")
        start = time.perf_counter()
        val_before = self.validate() if t.val_before_train and self.step == 0 else None
        tokens = 0
        validated: dict[str, float] | None = None  # the validation of the last step, where the loop made one
        while self.step < t.total_steps:
            self.step += 1
            try:
                tokens += self._train_step(flow)
            except NonFiniteError as exc:
                raise NonFiniteError(f"{exc} The last good state is saved in {self.save()}.") from None
            last = self.step >= t.total_steps or self.should_stop  # the end's validation and checkpoint follow
            validated = self.validate() if t.val_every and self.step % t.val_every == 0 and not last else None
            if self.should_stop:  # set by a hook during the step or this validation: the end follows (once)
                break
            if t.save_every and self.step % t.save_every == 0 and not last:
                self.save(background=cfg.strategy.checkpoint == "async")
                if self.should_stop:  # set by a save hook: the end follows at this step
                    break
        if self.should_stop and self.step < t.total_steps:
            print(f"rlforge: stopped after step {self.step} of {t.total_steps}: a hook set trainer.should_stop")
        self.finish_checkpoint()
        last_ckpt = ckpt.list_checkpoints(self.run_dir)
        if not last_ckpt or last_ckpt[-1].name != f"step_{self.step:06d}" or not ckpt.has_actor(last_ckpt[-1]):
            self.save()  # the last checkpoint, with actor/ (a plain Hugging Face folder) in every mode
        val_after = (validated if validated is not None else self.validate()) if t.val_at_end else {}
        elapsed = time.perf_counter() - start
        summary = {
            "accuracy_before": val_before.get("val/accuracy") if val_before else None,
            "accuracy_after": val_after.get("val/accuracy"),
            "steps": self.step,
            "reward_error_share": reward_error_share(self.history),
            "tokens_per_s": tokens / elapsed if elapsed else 0.0,
            "seconds": elapsed,
            "run_dir": str(self.run_dir),
            "mlflow_uri": None,  # the store the mlflow logger logged into: it fills this in (no mlflow logger: none)
        }
        with diskio.disk_errors(f"write {self.run_dir / 'summary.json'}", "The last checkpoint is complete.",
                                where=self.run_dir):
            diskio.write_atomic(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        self.hook.rlforge_fit_end(trainer=self, module=module, summary=summary)
        print_summary(summary, "mlflow" in cfg.logger.backends)
        return summary

    def _train_step(self, flow: DataFlow) -> int:
        self.hook.rlforge_step_start(trainer=self, step=self.step)
        step_start = time.perf_counter()
        ctx = StepContext(config=self.config, controller=self.controller, module=self.module, hook=self.hook,
                          step=self.step, sampling=SamplingParams.from_config(self.config.rollout), flow=flow,
                          draw=self.next_prompts, hook_trainer=self, builder=self.builder)
        self.module.step, self.module._metrics, self.module._logged = self.step, ctx.metrics, {}
        add_sync_metrics(ctx.metrics, self._resynced)  # the engine's weights of a resume (popped: once)
        try:
            batch = self.pipeline.prompts(self.next_prompts)
            for stage in flow.stages:
                batch = ctx.run(stage, batch)
        finally:
            self.module._metrics = None
        check_numbers(ctx.metrics, f"set in ctx.metrics by a stage of dataflow '{flow.name}'")  # ctx.log checks its own
        n_tokens = token_count(batch)
        builtin = data_metrics(batch, self.config.rollout.max_new_tokens)
        self.module._check_logged(ctx.metrics, builtin)
        check_kept(builtin, {**builtin, **ctx.metrics}, f"this step's ctx.log (a stage of dataflow '{flow.name}' or "
                                                        f"the reward manager's metrics)")
        metrics = {**builtin, **ctx.metrics}
        self._write_samples("samples.jsonl", batch, self.config.trainer.samples_to_save)
        elapsed = time.perf_counter() - step_start
        staged = sum(v for k, v in ctx.metrics.items() if k.startswith("timing_s/"))
        metrics.update({"timing_s/step": elapsed, "timing_s/other": elapsed - staged,
                        "perf/throughput": n_tokens / elapsed, "perf/total_num_tokens": float(n_tokens),
                        "training/epoch": float(self.sampler.epoch)})
        written = {k: v for k, v in metrics.items() if k not in self.module._logged}  # the module's own may change
        self.hook.rlforge_step_end(trainer=self, step=self.step, metrics=metrics)
        self.module._metrics = metrics  # its self.log in on_train_step_end adds to this step's metrics
        try:
            self.module.on_train_step_end(metrics)
        finally:
            self.module._metrics = None
        who = (f"rlforge_step_end ({implementers(self.hook, 'step_end')}) or "
               f"{type(self.module).__name__}.on_train_step_end")
        check_numbers(metrics, f"set in {who}")
        check_kept(written, metrics, who)
        self.module._check_logged(metrics)
        self.history.append({"step": self.step, **metrics})
        self._log(metrics)
        return n_tokens

    def next_prompts(self) -> B.Batch:
        """The next ``data.train_batch_size`` training examples as a batch (``RLModule.collate``; the data cursor
        advances)."""
        idx = self.sampler.next_indices()
        draw = f"{self.sampler.epoch}.{self.sampler.position}"  # unique per draw: samples of a prompt share it
        return self.module.collate([self.train_examples[i] for i in idx], [f"{draw}-{i}" for i in idx])

    def validate(self) -> dict[str, float]:
        """The module's validation on the held-out examples (``RLModule.validate``; default: generate and score),
        through the run's agent loop when it has one (its metrics added as ``val/num_turns/mean``, ...)."""
        if not self.val_examples:
            return {}
        self.pipeline.settle(self.controller, self.step)  # the engine idle, with the trainer's weights
        rng = torch.get_rng_state()  # validation must not shift the training RNG stream
        self.module.evaluator = evaluator(self)
        metrics, batch = self.module.validate(self.controller, self.val_examples)
        metrics = {**metrics, **{f"val/{k}": v for k, v in self.module.evaluator.metrics().items()}}
        torch.set_rng_state(rng)
        if batch is not None:
            self._write_samples("val_samples.jsonl", batch, len(batch))
            self._log_val_generations(batch)
        written = dict(metrics)
        self.hook.rlforge_validation_end(trainer=self, step=self.step, metrics=metrics)
        check_kept(written, metrics, f"rlforge_validation_end ({implementers(self.hook, 'validation_end')})")
        self._log(metrics)
        return metrics

    def _log(self, metrics: dict[str, float], step: int | None = None) -> None:
        step = self.step if step is None else step
        with diskio.disk_errors(f"log the metrics of step {step} into {self.run_dir}", RESUME_HINT,
                                where=self.run_dir):
            for lg, name in zip(self.loggers, self.config.logger.backends):
                with self.builder.logger_failures(name, f"in log_metrics at step {step}"):
                    lg.log_metrics(metrics, step)

    def _close_loggers(self, outcome: str) -> None:
        """Close every logger (``close_as(outcome)`` where it declares ``marks_outcome``: "finished", "failed",
        "killed"); one that fails to is an error, or a warning where the run failed already (its own error is the one
        to show)."""
        declared = self.builder.registry.logger
        for lg, name in zip(self.loggers, self.config.logger.backends):
            marks = declared.entry(name).capabilities.marks_outcome
            try:
                with self.builder.logger_failures(name, f"in {'close_as' if marks else 'close'} at step {self.step}"):
                    lg.close_as(outcome) if marks else lg.close()  # type: ignore[attr-defined]
            except RLForgeError as exc:
                if outcome == "finished":
                    raise
                log.warning("%s", exc)

    def _log_val_generations(self, batch: B.Batch) -> None:
        """``trainer.log_val_generations``: verl's pick of this validation's generations in verl's file,
        ``val_generations/val_step<N>.json``, handed to every logger (``log_artifact``), and shown by a logger that
        declares ``LoggerCapabilities(shows_generations=True)`` through its ``log_generations(rows, step)`` (wandb: a
        table, tensorboard: text, as verl shows them)."""
        rows = val_generations(batch, self.module.tokenizer, self.config.trainer.log_val_generations)
        if not rows:
            return
        path = self.run_dir / "val_generations" / f"val_step{self.step}.json"
        with diskio.disk_errors(f"write {path}", RESUME_HINT, where=self.run_dir):
            path.parent.mkdir(exist_ok=True)
            diskio.write_atomic(path, json.dumps(rows, indent=1))
        declared = self.builder.registry.logger
        for lg, name in zip(self.loggers, self.config.logger.backends):
            with self.builder.logger_failures(name, f"in log_artifact at step {self.step}"):
                lg.log_artifact(str(path))
            if declared.entry(name).capabilities.shows_generations:
                cast("GenerationsLogger", lg).log_generations(rows, self.step)

    def _write_samples(self, name: str, batch: B.Batch, limit: int) -> None:
        records = sample_records(batch, limit)  # none for batches without generated text (offline algorithms)
        if not records:
            return
        with diskio.disk_errors(f"write {self.run_dir / name}", RESUME_HINT, where=self.run_dir), \
                diskio.open_text(self.run_dir / name, append=True) as fh:
            for record in records:
                fh.write(json.dumps({"step": self.step, **record}) + "\n")

    # --- checkpoints ------------------------------------------------------------------------------
    def save(self, background: bool = False) -> Path:
        """Write the checkpoint of this step (``rlforge.checkpoint``) and return its folder. ``background``
        (``strategy.checkpoint=async``): the ranks write their shards while training goes on, and the folder appears
        once they are done (:meth:`finish_checkpoint`, at the latest when the next checkpoint starts); no ``actor/``.
        Logs ``timing_s/save_checkpoint``, the seconds the loop waited (a previous write included)."""
        start = time.perf_counter()
        self.finish_checkpoint()
        state: dict[str, Any] = {
            "step": self.step,
            "sampler": self.sampler.state_dict(),
            "module": self.module.state_dict(),
            "rng": ckpt.rng_state(),
            "pipeline": self.pipeline.state_dict(),
            "extra": self._checkpoint_entries(),
        }
        ckpt.check_loadable(state["extra"], f"added by rlforge_save_checkpoint, implemented by "
                                            f"{implementers(self.hook, 'save_checkpoint')}")
        ckpt.check_loadable(state["module"], f"{type(self.module).__name__}.state_dict()")
        meta = {"config": OmegaConf.to_container(self.config, resolve=True), **self.fingerprint}
        if background:
            state = copy.deepcopy(state)  # as it is now: training goes on
        # last, so that once the ranks' background write starts nothing else can fail before it is tracked
        state["controller"] = self.controller.state_dict(ckpt.staging_dir(self.run_dir, self.step), background)
        if background:
            self._writing = (self.step, state, meta)
            state["controller"] = copy.deepcopy(state["controller"])  # the ranks' small state, as it is now
            path = ckpt.step_dir(self.run_dir, self.step)
        else:
            path = ckpt.save(self.run_dir, self.step, self.module.actor, self.module.tokenizer, state,
                             self.config.trainer.keep_last_n, meta, processor=self.module.processor)
        self._log({"timing_s/save_checkpoint": time.perf_counter() - start})
        return path

    def _checkpoint_entries(self) -> dict[str, Any]:
        """What ``rlforge_save_checkpoint`` adds at this step, asked once per step: the last checkpoint of a run that
        a save hook stopped rewrites the step of that (background) save with actor/ and reuses them."""
        if self._entries is None or self._entries[0] != self.step:
            self._entries = (self.step, checkpoint_entries(self.plugins, self))
        return self._entries[1]

    def finish_checkpoint(self) -> None:
        """Wait for the checkpoint that is being written in the background (if any), then make it a checkpoint
        (``checkpoint.save``: renamed into place once complete). Logs ``timing_s/checkpoint_write``, the seconds the
        ranks took to write it, at its step."""
        if self._writing is None:
            return
        step, state, meta = self._writing  # tracked until waited for: an interrupt in the wait leaves it to settle
        folder = ckpt.step_dir(self.run_dir, step).parent
        try:
            with diskio.disk_errors(f"write checkpoint step {step} into {folder}", RESUME_HINT, where=folder):
                seconds = self.controller.finish_checkpoint()
        except Exception:  # a failed write: nothing left to settle (an interrupt is not one: it stays tracked)
            self._writing = None
            raise
        self._writing = None
        SHIELDED.set()  # a SIGTERM waits until the written shards are a checkpoint (a few small files and a rename)
        try:
            ckpt.save(self.run_dir, step, None, self.module.tokenizer, state, self.config.trainer.keep_last_n, meta)
        finally:
            SHIELDED.clear()
        self._log({"timing_s/checkpoint_write": seconds}, step)

    def _settle_checkpoint(self) -> None:
        """On the way out of a failed run: the checkpoint written in the background is completed if its write
        succeeds (it holds the state of its step, before the failure), else left unnamed. A write the failure
        interrupted before it was tracked (inside ``controller.state_dict``) is waited for and left unnamed: the next
        resume removes its staged folder. Without background writes (``strategy.checkpoint`` other than ``async``)
        no write can be in flight."""
        if self._writing is None and self.config.strategy.checkpoint != "async":
            return
        try:
            if self._writing is None:
                self.controller.finish_checkpoint()
            self.finish_checkpoint()
        except Exception as exc:
            log.warning("The checkpoint being written when the run failed is incomplete and was dropped: %s", exc)

    def _restore(self, path: Path, state: dict[str, Any]) -> None:
        self.controller.load_state_dict(state["controller"], path)  # the actor's weights too (actor/ or shards)
        self._resynced = self.controller.sync_weights().metrics()  # logged with the first step's own syncs
        self.sampler.load_state_dict(state["sampler"])
        self.module.load_state_dict(state.get("module", {}))
        ckpt.set_rng_state(state["rng"])
        self.step = int(state["step"])
        self.pipeline.load_state_dict(state.get("pipeline", {}), self.step)
        restore_checkpoint_entries(self.plugins, self, state.get("extra", {}))
