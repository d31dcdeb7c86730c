"""The key tables against verl and against rlforge: every key of every shipped verl default tree has a rule (no key
falls to "unknown"), every rlforge key the tables or the derived rules write exists in rlforge's schema (for the
algorithm that reads it), and no message claims "no counterpart" for a key rlforge maps."""

from __future__ import annotations

import pytest
import yaml
from omegaconf import OmegaConf

from rlforge.config import compose, verl, verl_hydra, verl_tree
from rlforge.config.verl_keys import TABLE
from rlforge.config.verl_rules import Map
from rlforge.config.verl_sft import TABLE as SFT_TABLE

TREES = verl_hydra.shipped()


def _tree(name: str) -> dict:
    return yaml.safe_load((verl_tree.DEFAULTS / f"{name}.yaml").read_text())


def test_the_shipped_trees_carry_their_provenance() -> None:
    for name in TREES:
        head = (verl_tree.DEFAULTS / f"{name}.yaml").read_text().splitlines()[:3]
        assert head[0].startswith(f"# verl's default config '{name}', composed by Hydra")
        assert head[1].startswith("# Source: ") and ("verl 0.9.1" in head[1] or "v0.7.0" in head[1])


@pytest.mark.parametrize("name", TREES)
def test_every_default_key_has_a_rule(name: str) -> None:
    table = SFT_TABLE if name.startswith("sft_") else TABLE
    missing = [k for k, _ in verl.flatten(_tree(name)) if table.rule(k) is None]
    assert not missing, f"{len(missing)} keys of {name} without a rule: {missing[:10]}"


def _schema_keys(registry, algo: str) -> set[str]:
    cfg = compose(registry, algo)
    return {k for k, _ in verl.flatten(OmegaConf.to_container(cfg))}


@pytest.mark.parametrize("name,extra", [
    ("ppo_trainer", ["algorithm.adv_estimator=gae", "actor_rollout_ref.rollout.name=vllm"]),
    ("ppo_trainer", ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=hf",
                     "actor_rollout_ref.actor.use_dynamic_bsz=True"]),
    ("dapo_trainer", ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.name=vllm",
                      "algorithm.filter_groups.enable=True", "reward.reward_kwargs.overlong_buffer_cfg.enable=True",
                      "actor_rollout_ref.rollout.val_kwargs.do_sample=True", "trainer.logger=[console]"]),
    ("ppo_megatron_trainer", ["algorithm.adv_estimator=reinforce_plus_plus", "actor_rollout_ref.rollout.name=vllm"]),
])
def test_every_mapped_target_is_an_rlforge_key(registry, name: str, extra: list[str]) -> None:
    from rlforge.config.verl_launch import prepare

    t = prepare([f"--config-name={name}", "trainer.total_training_steps=5", *extra], refuse=False).translation
    known = _schema_keys(registry, t.algorithm)
    written = set(t.overrides) - {"data.name"}
    assert written and written <= known, sorted(written - known)
    for f in t.fates:
        assert f.kind in (verl.MAPPED, verl.REFUSED, verl.IGNORED) and f.text or f.target, f
        assert "no counterpart" not in f.text


def test_every_map_rule_targets_an_rlforge_key(registry) -> None:
    known = set().union(*(_schema_keys(registry, a) for a in ("ppo", "grpo", "gdpo")))
    for key, rule in [*TABLE.items(), *SFT_TABLE.items()]:
        if isinstance(rule, Map):
            assert rule.target in known, (key, rule.target)


def test_verl_loss_modes_and_estimators_are_registered_in_rlforge(registry) -> None:
    from rlforge.config.verl_derived import ESTIMATORS, POLICY_LOSSES

    assert set(POLICY_LOSSES) <= set(registry.policy_loss.available())
    assert set(ESTIMATORS.values()) <= set(registry.algorithm.available())
