"""A dozen of verl's own example launches (from the corpus) run by `rlforge verl` for one step on the tiny chat model,
their data and model swapped for local files and their sizes for tiny ones by overrides appended in verl's syntax.
Launches that ask for a feature rlforge lacks must be refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlforge.cli import main
from tests.tools.verl_corpus import launches

ARO = "actor_rollout_ref"
# corpus source -> None (trains) or the missing feature its refusal must name
REPRESENTATIVE = {
    "examples/grpo_trainer/run_qwen3_8b_fsdp.sh": None,  # GSM8K + MATH GRPO
    "examples/ppo_trainer/run_qwen3_8b_fsdp.sh": None,  # PPO with a critic
    "examples/rloo_trainer/run_qwen3_8b_fsdp.sh": None,
    "examples/reinforce_plus_plus_trainer/run_qwen3_8b_fsdp.sh": None,
    "examples/gspo_trainer/run_qwen3_8b_fsdp.sh": None,
    "examples/tuning/lora/run_qwen3_8b_fsdp.sh": None,
    "examples/remax_trainer/run_qwen3_8b_fsdp.sh": None,
    "examples/rollout_correction/run_qwen2_5_7b_fsdp.sh": None,
    # DAPO (dynamic sampling on acc, overlong shaping, sampled validation with top_p); run on the CPU, the prompts drawn
    # two at a time for at most two rounds (EXTRA)
    "dapo/run_dapo_qwen3_30b_fsdp_6k_npu.sh": None,
    "examples/ppo_trainer/run_qwen3_8b_megatron.sh": "pipeline parallelism",  # megatron with PP 2
    # megatron with TP 2 (verl's ppo_megatron_trainer config): two CPU processes on Ray, fp32 for its fp16 (EXTRA)
    "dapo/test_dapo_8b_megatron_fp16.sh": None,
    # multi-turn tool GRPO; its tool config swapped for a local one of the same schema (_tools)
    "partial_rollout/run/run_qwen3-0.6b_gsm8k_grpo_tool_baseline.sh": None,
    "examples/sft/gsm8k/run_qwen2_5_0_5b_fsdp.sh": None,  # SFT (its schedule: verl's, through transformers)
    # on-policy distillation (k1 as a policy gradient, no task rewards); the teacher is the tiny model too (_local)
    "examples/on_policy_distillation_trainer/run_qwen3_8b_fsdp.sh": None,
    # several teachers routed by data_source (MOPD); both teachers the tiny model, the rows all openai/gsm8k
    "examples/on_policy_distillation_trainer/run_qwen3_8b_mopd_fsdp.sh": None,
    # verl's veomni training engine (rlforge's fsdp strategy; its cosine schedule), distilling from one teacher
    "examples/on_policy_distillation_trainer/run_qwen3_0.6b_opd_veomni.sh": None,
}
EXTRA = {"partial_rollout/run/run_qwen3-0.6b_gsm8k_grpo_tool_baseline.sh": ["data.max_prompt_length=512"],  # + schema
         # its tensor-parallel size 2 as two CPU processes (as the others' GPUs become one); fp16 is a GPU dtype
         "dapo/test_dapo_8b_megatron_fp16.sh": [f"{ARO}.actor.megatron.dtype=float32", "trainer.n_gpus_per_node=2"],
         "dapo/run_dapo_qwen3_30b_fsdp_6k_npu.sh": [  # main_dapo's config; its overlong window within 8 tokens
    "--config-name=dapo_trainer", "data.gen_batch_size=2", "algorithm.filter_groups.max_num_gen_batches=2",
    "reward.reward_kwargs.max_resp_len=8", "reward.reward_kwargs.overlong_buffer_cfg.len=4"]}


def _launch(source: str) -> dict:
    return next(x for x in launches() if x["source"].split(":", 1)[1] == source)


def _local(launch: dict, tmp_path, model, data) -> list[str]:
    if launch["entry"].endswith("sft_trainer"):
        return [f"data.train_files={data['sft']}", f"data.val_files={data['val']}", f"model.path={model}",
                "trainer.total_training_steps=1", "data.train_batch_size=2", "data.micro_batch_size_per_gpu=2",
                "data.max_length=128",
                f"trainer.default_local_dir={tmp_path}/run", "trainer.logger=[console]", "trainer.n_gpus_per_node=1"]
    return [f"data.train_files={data['train']}", f"data.val_files={data['val']}", f"{ARO}.model.path={model}",
            "data.train_batch_size=2", f"{ARO}.actor.ppo_mini_batch_size=2", f"{ARO}.actor.ppo_micro_batch_size_per_gpu=2",
            f"{ARO}.rollout.n=2", "data.max_prompt_length=128", "data.max_response_length=8", f"{ARO}.rollout.name=hf",
            "trainer.nnodes=1", "trainer.n_gpus_per_node=1", "trainer.device=cpu", "trainer.total_training_steps=1",
            "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console]",
            "trainer.resume_mode=disable", f"trainer.default_local_dir={tmp_path}/run", f"critic.model.path={model}",
            "critic.ppo_micro_batch_size_per_gpu=2", "data.filter_overlong_prompts=True",
            *_teachers(launch, model)]


GRADER = '''
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class Grader(BaseTool):
    """The answer against the row's ground truth (create_kwargs from extra_info.tools_kwargs), as a GSM8K tool."""

    async def create(self, instance_id=None, **kwargs):
        self.truth = kwargs.get("create_kwargs", {}).get("ground_truth")
        return "grader", ToolResponse()

    async def execute(self, instance_id, parameters, **kwargs):
        ok = str(parameters.get("answer", "")).strip() == str(self.truth)
        return ToolResponse(text=f"Current parsed answer={parameters.get('answer')!r} reward={float(ok)}"), float(ok), {}
'''


def _tools(launch: dict, tmp_path, monkeypatch) -> list[str]:
    """A launch's tool config swapped for a local one: a verl BaseTool with the schema of verl's GSM8K tool."""
    key = f"{ARO}.rollout.multi_turn.tool_config_path"
    if not any(a.startswith(f"{key}=") for a in launch["args"]):
        return []
    (tmp_path / "gsm8k_grader.py").write_text(GRADER)
    monkeypatch.syspath_prepend(str(tmp_path))
    schema = {"type": "function", "function": {"name": "calc_gsm8k_reward", "description": "The reward of an answer",
                                               "parameters": {"type": "object", "properties": {"answer": {
                                                   "type": "string", "description": "The answer, digits"}},
                                                   "required": ["answer"]}}}
    config = {"tools": [{"class_name": "gsm8k_grader.Grader", "config": {"type": "native"}, "tool_schema": schema}]}
    (tmp_path / "tools.yaml").write_text(json.dumps(config))
    return [f"{key}={tmp_path / 'tools.yaml'}"]


CPU_MEGATRON = """
import sys

sys.path.insert(0, {root!r})
from tests.plugins.megatron_cpu import allow_megatron_forward_on_cpu  # noqa: E402

allow_megatron_forward_on_cpu()  # in every process that imports this plugin: the driver and the Ray ranks
"""


def _megatron(launch: dict, tmp_path) -> list[str]:
    """megatron-core's forward calls torch.cuda: on the CPU a launch on verl's megatron config runs through the
    test-only shim (tests/plugins/megatron_cpu.py), loaded as a plugin file by the driver and each Ray rank."""
    if not any("megatron" in a for a in launch["args"] if a.startswith(("--config-name", "model_engine"))):
        return []
    shim = tmp_path / "cpu_megatron.py"
    shim.write_text(CPU_MEGATRON.format(root=str(Path(__file__).resolve().parents[2])))
    return ["--", f"plugins.modules=[{shim}]"]


def _teachers(launch: dict, model) -> list[str]:
    """Every teacher entry's model_path (the default entry where the launch names none) set to the tiny model."""
    if "distillation.enabled=True" not in launch["args"]:
        return []
    keys = {a.lstrip("+").split("=", 1)[0] for a in launch["args"] if ".model_path=" in a and "teacher_models" in a}
    return [f"{key}={model}" for key in sorted(keys or {"distillation.teacher_models.teacher_model.model_path"})]


@pytest.fixture(scope="module")
def local_data(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("verl_data")
    rows = [{"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": f"{a}+{b}? Answer after '####'."}],
             "reward_model": {"style": "rule", "ground_truth": str(a + b)},
             "extra_info": {"index": i, "tools_kwargs": {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": str(a + b)}}}},
             "messages": [{"role": "user", "content": f"{a}+{b}?"}, {"role": "assistant", "content": f"#### {a + b}"}]}
            for i, (a, b) in enumerate(zip(range(3, 11), range(5, 13)))]
    pq.write_table(pa.Table.from_pylist(rows[:6]), root / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows[6:]), root / "val.parquet")
    return {"train": root / "train.parquet", "val": root / "val.parquet", "sft": root / "train.parquet"}


@pytest.mark.slow
@pytest.mark.parametrize("source", list(REPRESENTATIVE))
def test_a_verl_example_launch_trains_or_names_what_is_missing(source, tmp_path, tiny_chat_model, local_data, capsys,
                                                              monkeypatch):
    launch = _launch(source)
    args = [*(["--sft"] if launch["entry"].endswith("sft_trainer") else []), *launch["args"],
            *_local(launch, tmp_path, tiny_chat_model, local_data), *_tools(launch, tmp_path, monkeypatch),
            *EXTRA.get(source, []), *_megatron(launch, tmp_path)]
    code = main(["verl", *args])
    err = capsys.readouterr().err
    missing = REPRESENTATIVE[source]
    if missing is None:
        assert code == 0, err[-3000:]
        sft = launch["entry"].endswith("sft_trainer")  # an SFT run leaves the fine-tuned model, RL a summary
        assert list((tmp_path / "run").rglob("model.safetensors" if sft else "summary.json"))
    else:
        assert code == 2 and missing in err and "is not in rlforge" in err, err[-3000:]


def test_val_only_validates_and_writes_its_report_into_the_run_folder(tmp_path, tiny_chat_model, local_data, capsys,
                                                                       monkeypatch):
    """verl's val_only (with val_before_train) validates and stops; the report lands in the launch's run folder
    (trainer.default_local_dir), never in the current folder, and the metrics go to the launch's loggers at the
    validated checkpoint's step (0: the model), under the names a training run's validation logs."""
    launch = _launch("examples/grpo_trainer/run_qwen3_8b_fsdp.sh")
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    local = [a for a in _local(launch, tmp_path, tiny_chat_model, local_data) if not a.startswith("trainer.logger=")]
    code = main(["verl", *launch["args"], *local, "trainer.logger=[console,file]", "trainer.val_before_train=True",
                 "trainer.val_only=True"])
    err = capsys.readouterr().err
    assert code == 0 and f"validating model.path={tiny_chat_model}: no checkpoint" in err, err[-3000:]
    report = json.loads((tmp_path / "run" / "eval_report_step_000000.json").read_text())
    assert report["model"] == str(tiny_chat_model) and not list((tmp_path / "cwd").iterdir())
    assert not list((tmp_path / "run").rglob("summary.json"))  # nothing trained
    (logged,) = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert logged["step"] == 0 and logged["val/reward"] == report["metrics"]["reward/mean"]
    assert logged["val/accuracy"] == report["metrics"]["accuracy"]
    assert any(k.startswith("val-core/") and k.endswith("/mean@1") for k in logged)  # verl's own names
    # with a checkpoint in the run folder, verl loads it before validating (resume_mode=auto): so does rlforge
    train = [a for a in local if not a.startswith("trainer.resume_mode")]
    assert main(["verl", *launch["args"], *train, "trainer.logger=[console]", "trainer.resume_mode=auto"]) == 0
    code = main(["verl", *launch["args"], *train, "trainer.logger=[console,file]", "trainer.resume_mode=auto",
                 "trainer.val_before_train=True", "trainer.val_only=True"])
    err = capsys.readouterr().err
    assert code == 0 and "validating " in err and "step_000001" in err, err[-2000:]
    report = json.loads((tmp_path / "run" / "eval_report_step_000001.json").read_text())
    assert report["model"].endswith("step_000001/actor")
    assert main(["verl", *launch["args"], *train, "trainer.logger=[console]", "trainer.resume_mode=auto",
                 "trainer.val_before_train=True", "trainer.val_only=True"]) == 0  # again: a report of its own
    assert sorted(p.name for p in (tmp_path / "run").glob("eval_report*")) == [
        "eval_report_step_000000.json", "eval_report_step_000001.json", "eval_report_step_000001_2.json"]
    assert json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 1
