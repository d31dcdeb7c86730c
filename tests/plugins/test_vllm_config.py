"""The vllm engine's pass-through options (rollout.vllm.*) are checked when the config is composed: no engine starts,
vLLM is not imported."""

from __future__ import annotations

import pytest

from rlforge import load_config
from rlforge.errors import ConfigError
from rlforge.plugin_manager import PluginManager

VLLM = ["rollout.name=vllm"]  # the default run: prompts of 64 tokens + 8 new tokens = 72


@pytest.fixture(scope="module")
def pm():
    return PluginManager()


def test_engine_lengths_hold_the_longest_sequence(pm) -> None:
    with pytest.raises(ConfigError, match=r"rollout.vllm.max_model_len=50 must hold the longest sequence: "
                                          r"data.max_prompt_length \+ rollout.max_new_tokens = 72 tokens"):
        load_config("grpo", [*VLLM, "rollout.vllm.max_model_len=50"], plugins=pm)
    with pytest.raises(ConfigError, match=r"max_num_batched_tokens=100 is below the engine's context of 200 tokens: "
                                          r"without rollout.vllm.enable_chunked_prefill"):
        load_config("grpo", [*VLLM, "rollout.vllm.max_model_len=200", "rollout.vllm.max_num_batched_tokens=100"],
                    plugins=pm)
    with pytest.raises(ConfigError, match="rollout.vllm.max_num_seqs must be >= 1 or null, got 0"):
        load_config("grpo", [*VLLM, "rollout.vllm.max_num_seqs=0"], plugins=pm)
    cfg = load_config("grpo", [*VLLM, "rollout.vllm.enable_chunked_prefill=true", "rollout.vllm.max_num_batched_tokens=16",
                               "rollout.vllm.sleep=false", "rollout.vllm.enable_prefix_caching=false"], plugins=pm)
    assert cfg.rollout.vllm.max_num_batched_tokens == 16 and cfg.rollout.vllm.sleep is False
