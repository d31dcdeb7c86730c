"""Environment adapters (docs/environments.md): reasoning-gym tasks, verifiers environments, gymnasium-style text
environments."""
