"""The batch arithmetic of a config: mini- and micro-batches by count or by tokens, each role's forward-only passes,
``trainer.total_epochs`` as steps, and the arithmetic in words (``rlforge config show``).

The checks run when a config is composed (``compose.validate``; an algorithm with a role of its own checks that
role's section in its ``validate_config``: ``check_batch_sizes(config, "critic")``).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf, read_write

from rlforge.errors import ConfigError


def config_section(cfg: DictConfig, key: str) -> Any:
    """The config section at the dotted ``key`` (``actor``, ``algorithm.prm``): a role's batch and optimizer options."""
    section = OmegaConf.select(cfg, key)
    if section is None:
        raise ConfigError(f"The config has no section '{key}'.")
    return section


def micro_batch_size(cfg: DictConfig, section: str = "actor") -> int:
    """``<section>.ppo_micro_batch_size`` in samples; unset means the whole mini-batch (no accumulation)."""
    options = config_section(cfg, section)
    micro = options.ppo_micro_batch_size
    return int(micro) if micro is not None else options.ppo_mini_batch_size * cfg.rollout.n


def check_batch_sizes(cfg: DictConfig, section: str = "actor") -> None:
    """The mini-batch (prompts) divides the batch and the micro-batch (samples) divides the mini-batch.

    The core checks ``actor``; algorithms with a critic check ``critic`` in their ``validate_config`` (a dotted
    ``section`` for a role's options elsewhere: PRIME's ``algorithm.prm``).
    """
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    options = config_section(cfg, section)
    mini, micro = options.ppo_mini_batch_size, micro_batch_size(cfg, section)
    if mini <= 0 or micro <= 0:
        raise ConfigError(f"'{section}.ppo_mini_batch_size' and '{section}.ppo_micro_batch_size' must be positive.")
    if prompts % mini:
        raise ConfigError(
            f"'{section}.ppo_mini_batch_size' ({mini} prompts) must divide 'data.train_batch_size' ({prompts} prompts)."
        )
    budget, longest = options.max_tokens_per_micro_batch, per_rank_longest(cfg)
    if budget:
        if options.ppo_micro_batch_size is not None:
            raise ConfigError(
                f"Set one of '{section}.ppo_micro_batch_size' ({options.ppo_micro_batch_size} samples) and "
                f"'{section}.max_tokens_per_micro_batch' ({budget} tokens): micro-batches are cut by count or by tokens."
            )
        if budget < longest:
            raise ConfigError(
                f"'{section}.max_tokens_per_micro_batch' ({budget}) must hold the longest sequence: "
                f"{_longest_words(cfg)} = {longest} tokens per rank (or 0 = off)."
            )
    elif (mini * n) % micro:
        raise ConfigError(
            f"'{section}.ppo_micro_batch_size' ({micro} samples) must divide the mini-batch of "
            f"{mini} prompts x rollout.n={n} = {mini * n} samples."
        )
    for name in SCORING.get(section, ()):
        check_scoring(cfg, f"{section}.{name}", longest)


# the forward-only passes of each role, with micro-batches of their own (schema.ScoringConfig)
SCORING = {"actor": ("log_prob", "ref_log_prob"), "critic": ("values",), "algorithm.prm": ("log_prob",)}


def check_scoring(cfg: DictConfig, key: str, longest: int) -> None:
    """A forward-only pass is cut by count or by tokens, and a token budget holds the longest sequence."""
    s = OmegaConf.select(cfg, key)
    if s.max_tokens_per_micro_batch and s.micro_batch_size is not None:
        raise ConfigError(f"Set one of '{key}.micro_batch_size' ({s.micro_batch_size} sequences) and "
                          f"'{key}.max_tokens_per_micro_batch' ({s.max_tokens_per_micro_batch} tokens): micro-batches "
                          f"are cut by count or by tokens.")
    if s.max_tokens_per_micro_batch and s.max_tokens_per_micro_batch < longest:
        raise ConfigError(f"'{key}.max_tokens_per_micro_batch' ({s.max_tokens_per_micro_batch}) must hold the longest "
                          f"sequence: {_longest_words(cfg)} = {longest} tokens per rank (or 0 = by count, null = as the "
                          f"update).")


def sequence_parallel_size(cfg: DictConfig) -> int:
    """The ranks that share each sequence: the selected strategy's ``sequence_parallel_size`` where its config section
    has one (``strategy.fsdp.sequence_parallel_size``), else 1."""
    return int(OmegaConf.select(cfg, f"strategy.{cfg.strategy.name}.sequence_parallel_size", default=1) or 1)


def per_rank_longest(cfg: DictConfig) -> int:
    """The tokens of the longest sequence one rank holds: a token budget per rank must hold them."""
    return -(-(cfg.data.max_prompt_length + cfg.rollout.max_new_tokens) // sequence_parallel_size(cfg))


def _longest_words(cfg: DictConfig) -> str:
    sp = sequence_parallel_size(cfg)
    words = "data.max_prompt_length + rollout.max_new_tokens"
    return words if sp == 1 else f"({words}) / strategy.{cfg.strategy.name}.sequence_parallel_size={sp}"


def apply_total_epochs(cfg: DictConfig, examples: int) -> None:
    """With ``trainer.total_epochs`` set, ``trainer.total_steps`` becomes epochs x (examples // data.train_batch_size):
    whole batches per epoch, verl's count; with ``trainer.epoch_limit`` a smaller such count becomes ``total_steps``, the
    schedules keep the old length (``trainer.schedule_steps``) and the run validates after its last step only where
    ``trainer.val_every`` names that step (verl's loop ends at the epoch limit without its last-step validation). The trainer calls it once the training examples
    are loaded and filtered."""
    epochs, limit, per_epoch = cfg.trainer.total_epochs, cfg.trainer.epoch_limit, examples // cfg.data.train_batch_size
    with read_write(cfg):
        if epochs is not None:
            cfg.trainer.total_steps = max(1, int(epochs) * per_epoch)
        if limit is not None and max(1, int(limit) * per_epoch) < cfg.trainer.total_steps:  # trainer.epoch_limit
            cfg.trainer.schedule_steps = cfg.trainer.schedule_steps or cfg.trainer.total_steps
            cfg.trainer.total_steps = max(1, int(limit) * per_epoch)
            # verl's loop ends there without its last step's validation: a step that test_freq names still validates
            every = cfg.trainer.val_every
            cfg.trainer.val_at_end = bool(cfg.trainer.val_at_end and every and cfg.trainer.total_steps % every == 0)


def explain_batch_sizes(cfg: DictConfig, words: tuple[str, str, str], ranks: int = 1) -> str:
    """The batch-size arithmetic in words (printed by ``rlforge config show``); ``words``: the algorithm's
    ``RLModule.batch_words()`` (an offline algorithm reads pairs of rows instead of sampling responses); ``ranks``: the
    data-parallel groups the strategy forms (``StrategyCapabilities.data_parallel_size``), each of which gets its share
    of a mini-batch split into micro-batches of ``actor.ppo_micro_batch_size``."""
    prompts, n = cfg.data.train_batch_size, cfg.rollout.n
    mini, micro = cfg.actor.ppo_mini_batch_size, micro_batch_size(cfg, "actor")
    verb, unit, rows = words
    return (
        f"Each step {verb} {prompts} {unit} x {n} {rows} = {prompts * n} sequences.\n"
        f"The actor update runs {cfg.actor.ppo_epochs} epoch(s) of {prompts // mini} mini-batch(es) of "
        f"{mini} {unit} ({mini * n} sequences) = {cfg.actor.ppo_epochs * prompts // mini} optimizer step(s) per "
        f"training step;\n" + (
            f"each mini-batch is split into micro-batches of at most {cfg.actor.max_tokens_per_micro_batch} tokens "
            f"(actor.max_tokens_per_micro_batch; their number varies with the sequence lengths)."
            if cfg.actor.max_tokens_per_micro_batch else
            _micro_words(mini * n, micro, ranks)
        )
    )


def _micro_words(sequences: int, micro: int, ranks: int) -> str:
    """How each mini-batch of ``sequences`` splits into micro-batches of ``micro`` sequences per rank."""
    if ranks <= 1:
        return f"each mini-batch is split into {sequences // micro} micro-batch(es) of {micro} sequences (gradient " \
               f"accumulation steps)."
    share = sequences // ranks
    return (f"each mini-batch is dealt to {ranks} ranks ({share} sequences each), and each rank's share is split into "
            f"{max(1, share // micro)} micro-batch(es) of {min(micro, share)} sequences (gradient accumulation steps).")
