"""Controllers: drive the workers (actor, reference, rollout, reward) for the trainer's dataflow."""
