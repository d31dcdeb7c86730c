"""``partial``: partial rollouts (Kimi k1.5, arXiv:2501.12599, section 2.6.2): a step decodes at most
``trainer.partial_tokens`` tokens of each response; a response that has not ended by then is continued in the next
step's decoding batch, by the next step's weights, beside the next step's new prompts.

In a synchronous step a heavy-tailed batch waits for its longest response, decoded nearly alone at the end; here the
long responses share their decoding steps with the next batches' short ones, at the price of prefilling each
continued response again and recomputing the old log-probs (on the CPUs measured so far that price was higher than
the gain: docs/performance.md, "Partial rollouts and a prefill by length").

The schedule of step ``k`` (fixed, never timing-dependent):

1. the step's ``data.train_batch_size`` new prompts, ``rollout.n`` rows each, join the rows carried from earlier
   steps that have not ended;
2. every row that has not ended gets one segment: at most ``trainer.partial_tokens`` new tokens (and no more than
   ``rollout.max_new_tokens`` in all), sampled by the current weights (version ``k - 1``) with a seed drawn from the
   trainer's RNG (``rollout.min_new_tokens`` counts over the whole response). The engine sees the prompt followed
   by the response so far (its rollout log-probs are kept per token, so ``rollout_log_probs`` are the behaviour
   policy's, segment by segment);
3. the groups (the rows of one prompt) whose rows have all ended are trained on this step, oldest first, as many as
   make a number of rows that splits evenly over the data-parallel ranks; the others are carried on. Should none be
   trainable, step 2 runs again (with the next prompts too once every row has ended): a step never trains on
   nothing.

A trained row's ``policy_version`` is the version of its first segment: it lags by at most
``ceil(rollout.max_new_tokens / partial_tokens) - 1`` updates, plus any step its ended group waited for an even
split. The old log-probs are recomputed by the trainer's
weights (PPO's ratio and ``algorithm.rollout_is`` then see the lag). A checkpoint holds the carried rows, so a
resumed run continues them exactly; the rows still carried when the run ends are not trained.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from rlforge import batch as B
from rlforge.agent.config import SINGLE_TURN
from rlforge.dataflow import DataFlow, RolloutStage, StepContext
from rlforge.errors import ConfigError
from rlforge.lazy import lazy_import
from rlforge.microbatch import groups_splitting_evenly
from rlforge.pipeline.base import Pipeline
from rlforge.pipeline.off_policy import batch_from_state, batch_state
from rlforge.sampling import SEED_RANGE

if TYPE_CHECKING:
    import torch

    from rlforge.sampling import SamplingParams
else:
    torch = lazy_import("torch")

ENDED = "_partial_ended"  # [rows] bool: the row's response has ended (a stop token, or rollout.max_new_tokens)
DEFAULT_SHARE = 4  # trainer.partial_tokens when unset: rollout.max_new_tokens / this


class PartialRollouts(Pipeline):
    """``partial``: each step decodes at most ``trainer.partial_tokens`` tokens per response and trains on the groups
    whose responses have all ended; the others continue in the next step (see the module's docstring)."""

    name = "partial"
    reads = ("partial_tokens",)

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.segment = self.segment_tokens(config)
        self.carried: B.Batch | None = None  # rows of the groups not trained yet, ended or not
        self._stop_ids: set[int] | None = None

    @staticmethod
    def segment_tokens(config: Any) -> int:
        value = config.trainer.partial_tokens
        return max(1, config.rollout.max_new_tokens // DEFAULT_SHARE) if value is None else int(value)

    @classmethod
    def validate_config(cls, config: Any) -> None:
        super().validate_config(config)
        key, most = f"trainer.pipeline={cls.name}", config.rollout.max_new_tokens
        segment = cls.segment_tokens(config)
        if segment >= most:
            what = (f"trainer.partial_tokens={segment}" if config.trainer.partial_tokens is not None else
                    f"trainer.partial_tokens (unset: {segment}, a quarter of rollout.max_new_tokens and at least 1)")
            hint = f"Set trainer.partial_tokens below {most}, or use" if most > 1 else "Use"
            raise ConfigError(f"{key}: {what} is not below rollout.max_new_tokens={most}, so every response would end "
                              f"within its step. {hint} trainer.pipeline=sync.")
        if config.actor.reuse_rollout_log_probs:
            raise ConfigError(f"{key} continues responses by newer weights, so the old log-probs must be "
                              f"recomputed: set actor.reuse_rollout_log_probs=null (or false), not true.")
        if config.rollout.agent.loop != SINGLE_TURN:
            raise ConfigError(f"{key} continues a response token by token; an agent loop "
                              f"(rollout.agent.loop={config.rollout.agent.loop}) runs whole turns. Use "
                              f"trainer.pipeline=sync, or async to generate ahead.")

    def prepare(self, flow: DataFlow) -> DataFlow:
        key, hint = f"trainer.pipeline={self.name}", "Use trainer.pipeline=sync."
        rollout = next((s for s in flow.stages if s.name == RolloutStage.name), None)
        if not isinstance(rollout, RolloutStage) or type(rollout).rollout is not RolloutStage.rollout:
            what = "none" if rollout is None else f"{type(rollout).__name__}, which generates in its own way"
            raise ConfigError(f"{key} continues the built-in rollout stage's responses; dataflow '{flow.name}' "
                              f"has {what}. {hint}")
        self.off_policy_stages(flow, rollout, "from prompts that would not be continued")
        flow.replace(rollout, PartialRolloutStage(self))
        return flow

    # --- one step ------------------------------------------------------------------------------------
    def rollout(self, ctx: StepContext, prompts: B.Batch) -> tuple[B.Batch, dict[str, float]]:
        """The rows this step trains on (the groups that have ended), and the pipeline's metrics."""
        if prompts.lists.get(B.MULTI_MODAL_INPUTS) and any(prompts.lists[B.MULTI_MODAL_INPUTS]):
            raise ConfigError(f"trainer.pipeline={self.name} does not continue responses to images yet. "
                              f"Use trainer.pipeline=sync.")
        fresh = self._fresh(ctx, prompts)
        rows = fresh if self.carried is None else B.Batch.concat([self.carried, fresh])
        carried_in, segments, unit = 0 if self.carried is None else len(self.carried), 0, ctx.data_parallel_size
        while True:  # ends: each segment brings every open row closer to rollout.max_new_tokens
            if bool(rows[ENDED].all()):  # nothing left to decode, and the ended groups do not split evenly
                rows = B.Batch.concat([rows, self._fresh(ctx, ctx.draw())])
            rows = self._segment(ctx, rows)
            segments += 1
            done = self._trainable(rows, unit)
            if done.any():
                break
        train, self.carried = rows.select(done), (rows.select(~done) if not done.all() else None)
        train = finish(train, ctx.module.tokenizer.pad_token_id)
        lag = float((ctx.step - 1 - train[B.POLICY_VERSION]).double().max())
        return train, {"partial/segments": float(segments), "partial/carried_in": float(carried_in),
                       "partial/carried_out": float(0 if self.carried is None else len(self.carried)),
                       "partial/trained_rows": float(len(train)), "partial/lag/max": lag}

    @staticmethod
    def _fresh(ctx: StepContext, prompts: B.Batch) -> B.Batch:
        """``rollout.n`` rows per prompt, with no response yet (width 0), of version ``step - 1``."""
        fresh = prompts.repeat_interleave(ctx.sampling.n)
        fresh[B.RESPONSES] = torch.zeros((len(fresh), 0), dtype=torch.long)
        fresh[B.RESPONSE_MASK] = torch.zeros((len(fresh), 0), dtype=torch.long)
        fresh[B.ROLLOUT_LOG_PROBS] = torch.zeros((len(fresh), 0))
        fresh[B.POLICY_VERSION] = torch.full((len(fresh),), ctx.step - 1, dtype=torch.long)
        fresh[ENDED] = torch.zeros(len(fresh), dtype=torch.bool)
        return fresh

    def _segment(self, ctx: StepContext, rows: B.Batch) -> B.Batch:
        """Decode one segment of every row that has not ended: one engine call per distinct (token budget, minimum
        left of ``rollout.min_new_tokens``): the minimum counts over the whole response, not per segment."""
        most, least = int(ctx.config.rollout.max_new_tokens), int(ctx.config.rollout.min_new_tokens)
        lengths = rows[B.RESPONSE_MASK].sum(-1, dtype=torch.long)  # the responses so far
        budget = (most - lengths).clamp(max=self.segment)
        floor = torch.minimum((least - lengths).clamp(min=0), budget)
        open_rows = (~rows[ENDED]).nonzero(as_tuple=True)[0].tolist()
        new: dict[int, tuple[torch.Tensor, torch.Tensor, bool]] = {}
        for tokens, minimum in sorted({(int(budget[i]), int(floor[i])) for i in open_rows}, reverse=True):
            idx = [i for i in open_rows if int(budget[i]) == tokens and int(floor[i]) == minimum]
            params = dataclasses.replace(ctx.sampling, n=1, max_new_tokens=tokens, min_new_tokens=minimum,
                                         seed=int(torch.randint(0, SEED_RANGE, ())))
            out = ctx.controller.workers.rollout.generate(engine_prompts(rows.select(idx), lengths[idx]), params)
            for j, i in enumerate(idx):
                n = int(out[B.RESPONSE_MASK][j].sum())
                got = out[B.RESPONSES][j, :n]
                ended = n < tokens or int(lengths[i]) + n >= most or (n > 0 and int(got[-1]) in self.stop_ids(ctx))
                new[i] = got, out[B.ROLLOUT_LOG_PROBS][j, :n], ended
        return extend(rows, new)

    @staticmethod
    def _trainable(rows: B.Batch, unit: int) -> torch.Tensor:
        """[rows] bool: the rows of the groups (``uid``) that have ended in all their rows, the oldest first, as many
        groups as make a number of rows that splits evenly over ``unit`` data-parallel ranks (the others wait)."""
        open_groups = {u for u, ended in zip(rows[B.UID], rows[ENDED].tolist()) if not ended}
        ended = list(dict.fromkeys(u for u in rows[B.UID] if u not in open_groups))
        keep = set(groups_splitting_evenly(rows[B.UID], ended, unit))
        return torch.tensor([u in keep for u in rows[B.UID]], dtype=torch.bool)

    def stop_ids(self, ctx: StepContext) -> set[int]:
        """The tokens that end a response (the engines' own: ``rlforge.models.stop_token_ids``)."""
        if self._stop_ids is None:
            from rlforge.models import model_stop_ids

            self._stop_ids = model_stop_ids(ctx.config, ctx.module.tokenizer)
        return self._stop_ids

    # --- checkpoints --------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The carried rows, so that a resumed run continues them."""
        return {"carried": None if self.carried is None else batch_state(self.carried)}

    def load_state_dict(self, state: dict[str, Any], step: int) -> None:
        self.drop_unread(state, ("carried",))
        saved = state.get("carried")
        self.carried = None if saved is None else batch_from_state(saved)
        most = int(self.config.rollout.max_new_tokens)
        longest = 0 if self.carried is None else int(self.carried[B.RESPONSE_MASK].sum(-1).max())
        if longest > most:
            raise ConfigError(f"The checkpoint carries responses of up to {longest} tokens into the next step "
                              f"(trainer.pipeline=partial), more than rollout.max_new_tokens={most} allows now: resume "
                              f"with rollout.max_new_tokens >= {longest}.")


def engine_prompts(rows: B.Batch, lengths: torch.Tensor) -> B.Batch:
    """What the engine continues: each row's prompt followed by its response so far, left-padded."""
    seqs = [torch.cat([p[m.bool()], r[:n]]) for p, m, r, n in
            zip(rows[B.PROMPTS], rows[B.PROMPT_MASK], rows[B.RESPONSES], lengths.tolist())]
    width = max(len(s) for s in seqs)
    ids = torch.zeros((len(seqs), width), dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):], mask[i, width - len(s):] = s, 1
    return B.Batch({B.PROMPTS: ids, B.PROMPT_MASK: mask}, {}, rows.meta)


def extend(rows: B.Batch, new: dict[int, tuple[torch.Tensor, torch.Tensor, bool]]) -> B.Batch:
    """``rows`` with each new segment appended to its row's response (``new``: row -> tokens, log-probs, ended)."""
    lengths = rows[B.RESPONSE_MASK].sum(-1, dtype=torch.long).tolist()
    width = max([rows[B.RESPONSES].shape[1]] + [lengths[i] + len(t) for i, (t, _, _) in new.items()])
    pad = width - rows[B.RESPONSES].shape[1]
    responses = torch.nn.functional.pad(rows[B.RESPONSES], (0, pad))
    mask = torch.nn.functional.pad(rows[B.RESPONSE_MASK], (0, pad))
    log_probs = torch.nn.functional.pad(rows[B.ROLLOUT_LOG_PROBS], (0, pad))
    ended = rows[ENDED].clone()
    for i, (tokens, lp, end) in new.items():
        a, b = lengths[i], lengths[i] + len(tokens)
        responses[i, a:b], mask[i, a:b], log_probs[i, a:b], ended[i] = tokens, 1, lp, end
    out = rows.copy()
    out[B.RESPONSES], out[B.RESPONSE_MASK], out[B.ROLLOUT_LOG_PROBS], out[ENDED] = responses, mask, log_probs, ended
    return out


def finish(rows: B.Batch, pad: int) -> B.Batch:
    """The trained rows as the rollout stage gives them: responses cut to the longest and padded with ``pad``,
    ``input_ids`` and ``attention_mask`` built, the pipeline's own column dropped."""
    width = int(rows[B.RESPONSE_MASK].sum(-1).max()) if len(rows) else 0
    tensors = {k: v for k, v in rows.tensors.items() if k != ENDED}
    for k in (B.RESPONSES, B.RESPONSE_MASK, B.ROLLOUT_LOG_PROBS):
        tensors[k] = tensors[k][:, :width]
    tensors[B.RESPONSES] = tensors[B.RESPONSES].masked_fill(tensors[B.RESPONSE_MASK] == 0, pad)
    tensors[B.INPUT_IDS] = torch.cat([tensors[B.PROMPTS], tensors[B.RESPONSES]], dim=1)
    tensors[B.ATTENTION_MASK] = torch.cat([tensors[B.PROMPT_MASK], tensors[B.RESPONSE_MASK]], dim=1)
    return B.Batch(tensors, dict(rows.lists), rows.meta)


class PartialRolloutStage(RolloutStage):
    """The rollout stage of ``trainer.pipeline=partial``: one segment per open row, the ended groups trained."""

    def __init__(self, pipeline: PartialRollouts) -> None:
        self.pipeline = pipeline
        self.requires, self.produces = RolloutStage.requires, RolloutStage.produces | {B.POLICY_VERSION}

    def generate(self, ctx: StepContext, batch: B.Batch) -> tuple[B.Batch, dict[str, float]]:
        return self.pipeline.rollout(ctx, batch)
