"""``model`` reward manager: scores rollouts with a reward model, optionally combined with the rule reward.

The reward model is any Hugging Face ``...ForSequenceClassification`` with one label: one trained by
``rlforge fit --algo rm`` (its run or checkpoint folder, or the exported folder), a local folder or a Hub id
(``reward.model.path``). It runs on its own device (``reward.model.device``) in batches of
``reward.model.batch_size`` sequences, without gradients: the RL step never trains it. When its tokenizer and
chat template are the policy's, it reads the rollout's tokens as they are; otherwise each sample is decoded and
rendered with the reward model's own chat template (prompt messages + the response as an assistant message).

With ``reward.model.rule=true`` (the default) the rule reward (``reward.fn``, ``reward.file`` or each row's
``data_source`` function, as the ``rule`` manager) runs as well:

    score = model_weight * reward_model_score + rule_weight * rule_score

and ``acc`` stays the rule's verdict (exact match on the built-in task), so ``val/accuracy`` measures the task
while training follows the learned reward. Set ``reward.model.rule=false`` for rows without a reward function
(no ``acc`` then). The manager runs where the rule manager does, in the Trainer's process (the driver); the reward
model runs on the ranks of the ``reward_model`` role (``model_worker.py``): under the Ray controller a resource pool
of ``reward.model.num_workers`` ranks, under torchrun one rank per process, else one in this process.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rlforge.plugins.reward.rule import RuleRewardManager

from rlforge import batch as B
from rlforge.config.checks import check_device
from rlforge.config.schema import option
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import
from rlforge.models import BUILTIN_PREFIX, HUB_ID, architectures, resolve_model_path

if TYPE_CHECKING:
    import torch
else:
    torch = lazy_import("torch")

DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class ModelRewardConfig:
    """The reward model of ``reward.manager=model``."""

    path: Optional[str] = None  # HF ...ForSequenceClassification folder, Hub id, or a run/checkpoint of `--algo rm`
    device: str = "auto"  # auto (cuda if available, else cpu) | cpu | cuda | cuda:N: where the reward model runs
    dtype: str = "float32"  # float32 | bfloat16 | float16
    batch_size: int = 64  # sequences per forward pass of the reward model
    model_weight: float = 1.0  # weight of the reward model's score
    rule_weight: float = 0.0  # weight of the rule reward (reward.fn, reward.file or the data_source's function)
    rule: bool = True  # also run the rule reward: for rule_weight and `acc` (exact match, val/accuracy); false = model only
    trust_remote_code: bool = False  # for the reward model's code
    num_workers: int = option(1, ge=1)  # trainer.controller=ray: ranks of the reward_model role (a resource pool of their own, ray.cpus_per_worker / gpus_per_worker each); torchrun: one per process


def check_reward_model_folder(folder: Any, path: str) -> None:
    """Refuse a model that is not a trained reward model (its score head would be random): the architectures in
    its ``config.json`` must include a ``...ForSequenceClassification``."""
    found = architectures(resolve_model_path(folder, "reward.model.path"))
    if found and not any(a.endswith("ForSequenceClassification") for a in found):
        raise ConfigError(
            f"'reward.model.path' ({path}) is a {', '.join(found)}, not a reward model "
            f"(...ForSequenceClassification): its score head would be random. Train one with 'rlforge fit --algo rm' "
            f"and give its run folder, or give a sequence-classification model."
        )


class ModelRewardManager:
    """Scores with a sequence-classification reward model (plus the weighted rule reward)."""

    @staticmethod
    def validate_config(config: Any, registry: Any) -> None:
        m = config.reward.model
        if not m.path:
            raise ConfigError("reward.manager=model needs 'reward.model.path': a reward model folder (e.g. a run of "
                              "'rlforge fit --algo rm'), a checkpoint of one, or a Hub id.")
        local = not (m.path.startswith(BUILTIN_PREFIX) or HUB_ID.fullmatch(m.path))
        if local and not Path(m.path).expanduser().exists():
            raise ConfigError(f"'reward.model.path' does not exist: {m.path}.")
        if m.dtype not in DTYPES:
            raise ConfigError(f"'reward.model.dtype' is '{m.dtype}'. Allowed: {', '.join(DTYPES)}.")
        check_device(m.device, "reward.model.device")
        if m.batch_size <= 0:
            raise ConfigError(f"'reward.model.batch_size' must be a positive integer, got {m.batch_size}.")
        if m.rule_weight and not m.rule:
            raise ConfigError(f"'reward.model.rule_weight' is {m.rule_weight} but 'reward.model.rule' is false: turn "
                              f"the rule reward on or set its weight to 0.")

    worker_roles = ("reward_model",)  # it scores on the reward_model role's ranks (plugins/reward/model_worker.py)

    def __init__(self, config: Any, tokenizer: Any, registry: Any, workers: Any = None) -> None:
        """``workers``: the run's worker groups (``controller.workers``), whose ``reward_model`` group scores; None
        (``rlforge eval``, a manager built alone): one rank of the role in this process."""
        from rlforge.controller.remote import InProcess, WorkerGroup
        from rlforge.plugins.reward.model_worker import RewardModelWorker

        self.options = config.reward.model
        self.tokenizer = tokenizer
        if workers is None:
            worker = RewardModelWorker("reward_model", 0, 1)
            worker.load(config, tokenizer)
            self.model = WorkerGroup("reward_model", RewardModelWorker, InProcess([worker]), config, registry)
        else:
            self.model = workers.reward_model
        self.rule = RuleRewardManager(config, tokenizer, registry) if self.options.rule else None

    def score(self, batch: B.Batch) -> B.Batch:
        m = self.options
        if self.rule is not None:
            batch = self.rule.score(batch)
            rule_scores = batch[B.SCORES].clone()
        else:
            batch[B.RESPONSE_TEXT] = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        model_scores = self.model.compute_scores(batch)
        scores = m.model_weight * model_scores
        metrics = {"reward/model/mean": float(model_scores.mean())}
        if self.rule is not None:
            scores = scores + m.rule_weight * rule_scores
            metrics["reward/rule/mean"] = float(rule_scores.mean())
        mask = batch[B.RESPONSE_MASK]
        token_scores = torch.zeros(mask.shape, dtype=torch.float32)
        token_scores[torch.arange(len(batch)), (mask.sum(-1) - 1).clamp(min=0)] = scores
        batch[B.SCORES], batch[B.TOKEN_LEVEL_SCORES] = scores, token_scores
        batch.meta["metrics"] = {**batch.meta.get("metrics", {}), **metrics}
        return batch

    def close(self) -> None:
        """Stop the rule reward's worker processes."""
        if self.rule is not None:
            self.rule.close()


@hookimpl
def rlforge_register(registry):
    from rlforge.controller.remote import Role

    registry.reward_manager.register(
        "model", ModelRewardManager, config=ModelRewardConfig,
        description="a reward model (HF sequence classifier), plus the weighted rule reward")
    registry.role.register("reward_model", Role("rlforge.plugins.reward.model_worker:RewardModelWorker",
                                                pool="reward_model", ranks="reward.model.num_workers"),
                           description="the model reward manager's reward model on ranks of its own")
