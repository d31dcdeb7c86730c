"""The everyday tools behind the CLI, one small module each.

- ``scaffold``: ``rlforge new plugin|experiment`` (renders ``rlforge.templates``)
- ``inference``: what ``eval`` and ``generate`` share (config for a model, rollout engine, prompt batches)
- ``evaluate``: ``rlforge eval`` (mean reward, accuracy, pass@k)
- ``generate``: ``rlforge generate`` (samples to JSONL)
- ``export``: ``rlforge export`` and finding the model folder of a checkpoint or run
- ``data_prep``: ``rlforge data gsm8k|math`` (verl-compatible parquet)
- ``plots``: training curves as PNG, ``rlforge report``
- ``tiny_chat``: a tiny Qwen2 chat model built offline (tests, docs, ``scripts/build_tiny_chat_model.py``)
"""
