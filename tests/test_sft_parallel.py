"""``rlforge sft`` on several CPU processes (gloo): Lightning's ddp, and Ulysses sequence parallelism
(``sft.sequence_parallel_size``), each against one device: the same weights after the same steps; and the FSDP
wrapping policy (each decoder layer its own unit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.plugins.megatron_cpu import free_port
from tests.test_sft import save_small_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    """The small model with 2 attention heads (sequence parallelism splits the heads over the devices)."""
    return save_small_model(tmp_path_factory.mktemp("two_heads"), heads=2)


def _sft(out: Path, model: Path, *extra: str) -> tuple[dict[str, torch.Tensor], str]:
    """``rlforge sft`` as a command (Lightning's ddp starts the other ranks by running it again) writing ``out``:
    the weights it saved and the loss it printed."""
    val = out.parent / "val.jsonl"
    rows = [{"prompt": f"What is {i}+1?", "response": str(i + 1)} for i in range(5)]
    val.write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = [f"sft.init={model}", "sft.accelerator=cpu", "sft.steps=2", "sft.batch_size=8", "data.arith.train_size=32",
              "sft.progress=false", "sft.save_every=0", "sft.loggers=[]", "sft.val_accuracy=false", f"sft.val_file={val}"]
    # a clean environment: nothing the suite's earlier tests left in this process (launch variables, thread settings)
    # reaches Lightning's launcher
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RLFORGE_DISABLE_PLUGIN_AUTOLOAD="1")
    proc = subprocess.run([str(Path(sys.executable).with_name("rlforge")), "sft", *common, *extra,
                           f"sft.output_dir={out}"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    loss = next(line.rsplit("| loss ", 1)[1] for line in proc.stdout.splitlines() if "| loss " in line)
    return load_file(str(out / "model.safetensors")), loss


@pytest.fixture(scope="module")
def one_device(two_heads, tmp_path_factory):
    return _sft(tmp_path_factory.mktemp("one") / "out", two_heads, "sft.devices=1")


@pytest.mark.parametrize(("devices", "extra"), [
    (2, ["sft.strategy=ddp"]),
    (2, ["sft.strategy=ddp", "sft.sequence_parallel_size=2"]),  # one data-parallel group of 2 devices
    (4, ["sft.strategy=ddp", "sft.sequence_parallel_size=2", "sft.micro_batch_size=2"]),  # 2 groups of 2
], ids=["ddp", "sequence_parallel", "ddp_x_sequence_parallel"])
def test_several_processes_give_the_weights_of_one_device(tmp_path, two_heads, one_device, devices, extra):
    (a, loss_a), (b, loss_b) = one_device, _sft(tmp_path / "out", two_heads, f"sft.devices={devices}", *extra)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    assert loss_a == loss_b  # the logged loss is the token mean over the global batch, counted once per group
    assert json.loads((tmp_path / "out" / "config.json").read_text()).get("_attn_implementation") is None


def test_sequence_parallel_size_must_divide_the_devices(tmp_path):
    from omegaconf import OmegaConf

    from rlforge.errors import ConfigError
    from rlforge.sft.data import BatchPlan

    s = OmegaConf.create({"sequence_parallel_size": 3, "batch_size": 8, "micro_batch_size": None})
    with pytest.raises(ConfigError, match=r"sft.sequence_parallel_size=3 must divide the number of devices \(4\)"):
        BatchPlan.from_config(s, 4)
    s.devices = "auto"  # Lightning's count of them: named when it is not the number given
    with pytest.raises(ConfigError, match=r"must divide the number of devices \(1: sft.devices=auto\)"):
        BatchPlan.from_config(s, 1)
    s.sequence_parallel_size, s.batch_size = 2, 9
    with pytest.raises(ConfigError, match=r"sft.batch_size=9 must be a multiple of the number of data-parallel groups "
                                          r"\(devices / sft.sequence_parallel_size\) \(2\)"):
        BatchPlan.from_config(s, 4)
    s.batch_size = 8
    assert BatchPlan.from_config(s, 4) == BatchPlan(8, 2, 4, 2) and BatchPlan(8, 2, 4, 2).rank(3) == 1


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork_find_unused_parameters_false", "ddp_notebook"])
def test_strategies_that_start_ranks_from_this_process_are_refused(strategy):
    from omegaconf import OmegaConf

    from rlforge.config.schema import SFTConfig
    from rlforge.errors import ConfigError
    from rlforge.sft.run import check_config

    with pytest.raises(ConfigError, match=f"sft.strategy={strategy} is not supported: .* Use sft.strategy=ddp"):
        check_config(OmegaConf.structured(SFTConfig(strategy=strategy)))


def test_fsdp_wraps_each_decoder_layer(char_tokenizer):
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    from rlforge.models import build_tiny_llama
    from rlforge.sft.run import HFBlocks

    model = build_tiny_llama(char_tokenizer, hidden=64, layers=2, heads=1, ffn=128)
    policy = HFBlocks()
    wrapped = []

    def visit(module):  # the order in which FSDP asks: a parent with recurse=True, then its children
        if policy(module, True, 0):
            for child in module.children():
                visit(child)
        if policy(module, False, 0):
            wrapped.append(module)

    visit(model)
    assert [type(m) for m in wrapped] == [LlamaDecoderLayer, LlamaDecoderLayer]
