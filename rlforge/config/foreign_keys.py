"""Hints for the keys of other trainers that users write as rlforge keys: Lightning's ``Trainer`` arguments (by
their full key, ``trainer.max_steps``), TRL's ``GRPOConfig`` fields and OpenRLHF's ``train_ppo_ray`` flags (by their
last part, under whatever section they were written: ``algorithm.scale_rewards``, ``actor.eps_clip``). verl's keys
have their own table (``rlforge.config.verl.hint``)."""

from __future__ import annotations

LIGHTNING = {
    "trainer.max_steps": "rlforge's is 'trainer.total_steps'",
    "trainer.max_epochs": "rlforge's is 'trainer.total_epochs'",
    "trainer.gradient_clip_val": "rlforge's is 'actor.grad_clip' (a global norm)",
    "trainer.accumulate_grad_batches": "rlforge's is 'actor.ppo_micro_batch_size' (samples per forward and backward "
                                       "of an optimizer step of actor.ppo_mini_batch_size prompts)",
    "trainer.val_check_interval": "rlforge's is 'trainer.val_every' (in steps)",
    "trainer.check_val_every_n_epoch": "rlforge's is 'trainer.val_every' (in steps)",
    "trainer.precision": "rlforge's is 'model.precision'",
    "trainer.default_root_dir": "rlforge's is 'trainer.runs_root'",
    "trainer.accelerator": "rlforge's is 'strategy.device'",
    "trainer.devices": "rlforge's ranks are the strategy's and the controller's (docs/distributed.md)",
    "trainer.strategy": "rlforge's is 'strategy.name'",
    "trainer.resume_from_checkpoint": "rlforge's is 'trainer.resume' (auto, or a checkpoint or run folder)",
    "trainer.ckpt_path": "rlforge's is 'trainer.resume' (auto, or a checkpoint or run folder)",
    "trainer.min_steps": "rlforge trains trainer.total_steps unless a hook sets trainer.should_stop",
    "trainer.log_every_n_steps": "rlforge logs every step", "trainer.fast_dev_run": "set trainer.total_steps=1",
    "trainer.callbacks": "callbacks are objects: Trainer(cfg, callbacks=[...]) (docs/hooks.md)",
}

# GRPOConfig fields, for an unknown key whose last part is one (beta, epsilon or temperature are rlforge keys in other
# sections: there they are not unknown, and an algorithm's own, such as algorithm.epsilon, is checked by that algorithm)
TRL = {
    "beta": "'actor.use_kl_loss=true actor.kl_loss_type=k3 actor.kl_loss_coef=<beta>' (beta=0: no KL term)",
    "epsilon": "'actor.clip_ratio_low' (algorithm.epsilon is the advantage's std epsilon, TRL's fixed 1e-4)",
    "delta": "'actor.clip_ratio_c' (the dual clip, on at 3.0 by default)",
    "temperature": "'rollout.temperature'",
    "steps_per_generation": "data.train_batch_size / actor.ppo_mini_batch_size optimizer steps per generation",
    "top_entropy_quantile": "none", "min_p": "none",
    "adam_beta1": "'actor.betas=[beta1,beta2]'", "adam_beta2": "'actor.betas=[beta1,beta2]'",
    "entropy_coef": "'actor.entropy_coeff'",
    "scale_rewards": "group: 'algorithm.norm_adv_by_std=true' (the default), batch: 'algorithm.std_scope=batch', "
                     "none: 'algorithm.norm_adv_by_std=false'",
    "loss_type": "'actor.loss_agg_mode' (dapo: token-mean, grpo: seq-mean-token-mean, dr_grpo: "
                 "seq-mean-token-sum-norm)",
    "num_generations": "'rollout.n'",
    "max_completion_length": "'rollout.max_new_tokens'",
    "epsilon_high": "'actor.clip_ratio_high' (epsilon is 'actor.clip_ratio_low')",
    "mask_truncated_completions": "'algorithm.mask_truncated'",
    "num_iterations": "'actor.ppo_epochs'",
    "reward_funcs": "'reward.trl.functions' with reward.manager=trl",
    "reward_weights": "'reward.trl.weights' with reward.manager=trl (--algo gdpo has algorithm.reward_weights: the "
                      "weights of one reward's components)",
    "importance_sampling_level": "sequence: 'actor.policy_loss=gspo' (--algo gspo)",
    "generation_batch_size": "'data.train_batch_size' (in prompts) x 'rollout.n'",
    "per_device_train_batch_size": "'actor.ppo_mini_batch_size' (prompts per optimizer step) and "
                                   "'actor.ppo_micro_batch_size' (samples per forward and backward)",
    "gradient_accumulation_steps": "'actor.ppo_micro_batch_size' (samples per forward and backward)",
    "learning_rate": "'actor.lr'",
    "max_grad_norm": "'actor.grad_clip'",
    "use_vllm": "'rollout.name=vllm'",
}

KL_COEF = ("'actor.kl_loss_coef' with actor.use_kl_loss=true, or 'algorithm.kl_coef' with "
           "algorithm.use_kl_in_reward=true")
CLIP = "'actor.clip_ratio_low' and 'actor.clip_ratio_high'"
# train_ppo_ray flags, the flat names of OpenRLHF before 0.10.2 and the last parts of its dotted ones
OPENRLHF = {
    "advantage_estimator": "an algorithm: gae is --algo ppo, group_norm --algo grpo, rloo --algo rloo, "
                           "reinforce_baseline --algo reinforce_pp_baseline, reinforce --algo reinforce_pp",
    "n_samples_per_prompt": "'rollout.n'",
    "rollout_batch_size": "'data.train_batch_size' (prompts per step)",
    "micro_train_batch_size": "'actor.ppo_micro_batch_size'",
    "micro_rollout_batch_size": "'actor.log_prob.micro_batch_size'",
    "init_kl_coef": KL_COEF, "init_coef": KL_COEF,
    "kl_estimator": "'actor.kl_loss_type' (or 'algorithm.kl_penalty' for the KL in the reward)",
    "eps_clip": CLIP, "eps_clip_low_high": CLIP,
    "dual_clip": "'actor.clip_ratio_c'",
    "value_clip": "'critic.cliprange_value'",
    "entropy_loss_coef": "'actor.entropy_coeff'",
    "entropy_coef": "'actor.entropy_coeff'",
    "actor_learning_rate": "'actor.lr'",
    "critic_learning_rate": "'critic.lr'",
    "lambd": "'algorithm.lam'",
    "overlong_buffer_len": "'algorithm.overlong_buffer'",
    "overlong_penalty_factor": "'algorithm.overlong_penalty'",
    "dynamic_filtering": "'algorithm.filter_groups=true'",
    "max_epochs": "'actor.ppo_epochs'",
    "num_episodes": "'trainer.total_epochs'",
    "generate_max_len": "'rollout.max_new_tokens'",
    "normalize_reward": "none",
}


def hint(full: str) -> str:
    """A sentence naming the trainer ``full`` (an unknown key) belongs to and rlforge's key for it; "" when none."""
    if full in LIGHTNING:
        return f" '{full}' is Lightning's Trainer argument; {LIGHTNING[full]}."
    leaf = full.rpartition(".")[2]
    if leaf in TRL and leaf in OPENRLHF:
        return (f" '{leaf}' is TRL's GRPOConfig field and OpenRLHF's flag; rlforge's: {TRL[leaf]} "
                f"(docs/migration-from-trl.md, docs/migration-from-openrlhf.md).")
    if leaf in TRL:
        return f" '{leaf}' is TRL's GRPOConfig field; rlforge's: {TRL[leaf]} (docs/migration-from-trl.md)."
    if leaf in OPENRLHF:
        return f" '{leaf}' is OpenRLHF's flag; rlforge's: {OPENRLHF[leaf]} (docs/migration-from-openrlhf.md)."
    return ""
