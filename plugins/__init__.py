"""Built-in plugins (import name ``rlforge.plugins``): rollout, reward, strategy, logger, data."""
