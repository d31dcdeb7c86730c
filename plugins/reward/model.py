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
(no ``acc`` then). The manager runs where the rule manager does: in the Trainer's process, also under the Ray
controller (the driver).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from rlforge.plugins.reward.rule import RuleRewardManager

from rlforge import batch as B
from rlforge.errors import ConfigError
from rlforge.hookspecs import hookimpl
from rlforge.lazy import lazy_import, no_grad
from rlforge.models import BUILTIN_PREFIX, HUB_ID, architectures, resolve_model_path

if TYPE_CHECKING:
    import torch

    from rlforge import ops
else:
    torch = lazy_import("torch")
    ops = lazy_import("rlforge.ops")

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
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?", m.device):
            raise ConfigError(f"'reward.model.device' is '{m.device}'. Allowed: auto, cpu, cuda or cuda:N.")
        if m.batch_size <= 0:
            raise ConfigError(f"'reward.model.batch_size' must be a positive integer, got {m.batch_size}.")
        if m.rule_weight and not m.rule:
            raise ConfigError(f"'reward.model.rule_weight' is {m.rule_weight} but 'reward.model.rule' is false: turn "
                              f"the rule reward on or set its weight to 0.")

    def __init__(self, config: Any, tokenizer: Any, registry: Any) -> None:
        from rlforge.models import load_reward_model, load_tokenizer
        from rlforge.tools.export import model_folder

        m = self.options = config.reward.model
        folder = model_folder(m.path)
        check_reward_model_folder(folder, m.path)
        self.tokenizer = tokenizer
        self.rm_tokenizer = load_tokenizer(folder, trust_remote_code=m.trust_remote_code)
        self.device = torch.device("cuda" if m.device == "auto" and torch.cuda.is_available() else
                                   "cpu" if m.device == "auto" else m.device)
        model = load_reward_model(folder, self.rm_tokenizer.pad_token_id, m.dtype, m.trust_remote_code,
                                  key="reward.model.path")
        self.model = model.requires_grad_(False).eval().to(self.device)
        self.same_tokens = (self.rm_tokenizer.get_vocab() == tokenizer.get_vocab()
                            and self.rm_tokenizer.chat_template == tokenizer.chat_template)
        self.rule = RuleRewardManager(config, tokenizer, registry) if m.rule else None

    def score(self, batch: B.Batch) -> B.Batch:
        m = self.options
        if self.rule is not None:
            batch = self.rule.score(batch)
            rule_scores = batch[B.SCORES].clone()
        else:
            batch[B.RESPONSE_TEXT] = self.tokenizer.batch_decode(batch[B.RESPONSES], skip_special_tokens=True)
        model_scores = self.model_scores(batch)
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

    @no_grad
    def model_scores(self, batch: B.Batch) -> torch.Tensor:
        """The reward model's score of every sample [B], in batches of ``reward.model.batch_size``."""
        ids, mask = ((batch[B.INPUT_IDS], batch[B.ATTENTION_MASK]) if self.same_tokens else self._render(batch))
        size, pad = self.options.batch_size, self.rm_tokenizer.pad_token_id
        parts = [ops.sequence_scores(self.model, ids[i:i + size].to(self.device), mask[i:i + size].to(self.device),
                                     pad).cpu() for i in range(0, len(ids), size)]
        return torch.cat(parts)

    def _render(self, batch: B.Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt messages + response text through the reward model's chat template, right-padded."""
        seqs = []
        for messages, text in zip(batch[B.RAW_PROMPT], batch[B.RESPONSE_TEXT]):
            enc = self.rm_tokenizer.apply_chat_template([*messages, {"role": "assistant", "content": text}],
                                                        tokenize=True)
            seqs.append(list(enc["input_ids"] if hasattr(enc, "keys") else enc))
        width = max(len(s) for s in seqs)
        ids = torch.full((len(seqs), width), self.rm_tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)], mask[i, : len(s)] = torch.tensor(s), 1
        return ids, mask

    def close(self) -> None:
        """Stop the rule reward's worker processes."""
        if self.rule is not None:
            self.rule.close()


@hookimpl
def rlforge_register(registry):
    registry.reward_manager.register(
        "model", ModelRewardManager, config=ModelRewardConfig,
        description="a reward model (HF sequence classifier), plus the weighted rule reward")
