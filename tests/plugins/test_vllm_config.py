"""The vllm engine's options (rollout.vllm.*, engine_kwargs included) are checked when the config is composed, and
engine_kwargs reach the engine's arguments: no engine starts; vLLM is imported only by the last test (its argument
names)."""

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
    with pytest.raises(ConfigError, match="'rollout.vllm.max_num_seqs' must be a positive integer, got 0"):
        load_config("grpo", [*VLLM, "rollout.vllm.max_num_seqs=0"], plugins=pm)
    cfg = load_config("grpo", [*VLLM, "rollout.vllm.enable_chunked_prefill=true", "rollout.vllm.max_num_batched_tokens=16",
                               "rollout.vllm.sleep=false", "rollout.vllm.enable_prefix_caching=false"], plugins=pm)
    assert cfg.rollout.vllm.max_num_batched_tokens == 16 and cfg.rollout.vllm.sleep is False


def test_engine_kwargs_refuse_what_rlforge_sets_and_what_vllm_lacks(pm, monkeypatch) -> None:
    from rlforge.plugins.rollout import vllm_args

    monkeypatch.setattr(vllm_args, "engine_arg_names", lambda: frozenset({"async_scheduling", "compilation_config"}))
    cfg = load_config("grpo", [*VLLM, "rollout.vllm.engine_kwargs.async_scheduling=true",
                               "rollout.vllm.engine_kwargs.compilation_config.cudagraph_mode=PIECEWISE"], plugins=pm)
    assert vllm_args.engine_kwargs(cfg) == {"async_scheduling": True,
                                            "compilation_config": {"cudagraph_mode": "PIECEWISE"}}
    with pytest.raises(ConfigError, match=r"rollout.vllm.engine_kwargs.max_model_len: vLLM's 'max_model_len' is set by "
                                          r"rollout.vllm.max_model_len; set it there instead"):
        load_config("grpo", [*VLLM, "rollout.vllm.engine_kwargs.max_model_len=4096"], plugins=pm)
    with pytest.raises(ConfigError, match=r"rollout.vllm.engine_kwargs.logprobs_mode: rlforge fixes vLLM's"):
        load_config("grpo", [*VLLM, "rollout.vllm.engine_kwargs.logprobs_mode=raw_logprobs"], plugins=pm)
    with pytest.raises(ConfigError, match=r"rollout.vllm.engine_kwargs.async_schedulin: 'async_schedulin' is not an "
                                          r"engine argument of the installed vLLM .* Did you mean: async_scheduling\?"):
        load_config("grpo", [*VLLM, "rollout.vllm.engine_kwargs.async_schedulin=true"], plugins=pm)


def test_engine_kwargs_and_model_config_overrides_reach_the_engine(pm, monkeypatch) -> None:
    from types import SimpleNamespace

    from transformers import LlamaConfig

    from rlforge.plugins.rollout import vllm as plugin
    from rlforge.plugins.rollout import vllm_args

    monkeypatch.setattr(vllm_args, "engine_arg_names", lambda: frozenset({"mm_processor_cache_gb"}))
    cfg = load_config("grpo", [*VLLM, "rollout.vllm.engine_kwargs.mm_processor_cache_gb=0",
                               "model.config_overrides.max_position_embeddings=512"], plugins=pm)
    for var in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
        monkeypatch.setenv(var, "1")  # _start only sets them where unset; restored after the test
    engine = plugin.VLLMRollout.__new__(plugin.VLLMRollout)  # the engine's state without starting vLLM
    engine.config, engine.on_cpu, engine.tp, engine.dtype, engine.model_path = cfg, True, 1, "float32", "/m"
    engine.model = SimpleNamespace(config=LlamaConfig(num_attention_heads=4, hidden_size=256))
    engine.adapters, engine.supports_sleep = False, False
    engine.weight_sync = SimpleNamespace(engine_args=dict)
    seen: dict = {}
    monkeypatch.setattr(plugin, "interruptible", lambda fn, **kw: seen.update(kw))
    engine._start()
    assert seen["mm_processor_cache_gb"] == 0 and seen["logprobs_mode"] == "processed_logprobs"
    assert seen["hf_overrides"] == {"max_position_embeddings": 512}  # the engine's model is the trainer's


def test_the_installed_vllm_takes_the_arguments_verl_launches_pass() -> None:
    pytest.importorskip("vllm")
    from rlforge.plugins.rollout.vllm_args import (FIXED_BY_RLFORGE, SET_BY_RLFORGE, check_engine_kwargs,
                                                    engine_arg_names)

    assert set(SET_BY_RLFORGE) | set(FIXED_BY_RLFORGE) <= engine_arg_names()  # each refused one is a real argument
    check_engine_kwargs({"async_scheduling": True, "mm_processor_cache_gb": 0, "additional_config": {"x": 1},
                         "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE", "cudagraph_capture_sizes": [1]}})
