"""The names of the loss-aggregation modes and KL estimators (no torch here: config validation uses them
before any model or heavy library loads)."""

from __future__ import annotations

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
KL_ESTIMATORS = ("k1", "kl", "k2", "mse", "k3", "low_var_kl", "abs")
PF_REWEIGHT_METHODS = ("pow", "max_min", "max_random")  # PF-PPO reweight modes (rlforge.algorithms.policy_filtration)
PF_FILTER_METHODS = ("best_of_n", "best_random", "best_worst")  # PF-PPO per-prompt filters
