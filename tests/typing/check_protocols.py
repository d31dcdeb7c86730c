"""Type-checked (not run): every built-in component satisfies its kind's Protocol (``rlforge.protocols``).

``tests/test_typecheck.py`` runs mypy over the package and this file. A component that drifts from its
contract (a renamed method, a missing attribute, a wrong signature) fails the type check, naming it here.
"""

from __future__ import annotations

from rlforge.algorithms import policy_losses as losses
from rlforge.algorithms.arith_pairs import arith_pairs_dataset
from rlforge.controller.local import LocalController
from rlforge.controller.ray_controller import RayController
from rlforge.controller.torchrun import TorchrunController
from rlforge.plugins.data.builtin import arith_dataset, files_dataset
from rlforge.plugins.logger.console import ConsoleLogger
from rlforge.plugins.logger.mlflow_logger import MlflowLogger
from rlforge.plugins.logger.tensorboard import TensorBoardLogger
from rlforge.plugins.logger.wandb_logger import WandbLogger
from rlforge.plugins.reward.code import code_exec_score
from rlforge.plugins.reward.functions import arith_score, gsm8k_score
from rlforge.plugins.reward.model import ModelRewardManager
from rlforge.plugins.reward.rule import RuleRewardManager
from rlforge.plugins.rollout.hf import HFRollout, MemorySync
from rlforge.plugins.rollout.vllm import VLLMRollout
from rlforge.plugins.rollout.vllm_native import NativeSync
from rlforge.plugins.rollout.vllm_weights import FileSync
from rlforge.plugins.strategy.fabric import FabricStrategy
from rlforge.plugins.strategy.fsdp import FSDPStrategy
from rlforge.plugins.strategy.megatron import MegatronStrategy
from rlforge.plugins.strategy.single import SingleDeviceStrategy
from rlforge.plugins.strategy.tp import TPStrategy
from rlforge.protocols import (
    Controller,
    Dataset,
    Logger,
    PolicyLoss,
    RewardFunction,
    RewardManager,
    RolloutEngine,
    Strategy,
    WeightSnapshots,
    WeightSync,
)


def rollout_engines(hf: HFRollout, vllm: VLLMRollout) -> list[RolloutEngine]:
    return [hf, vllm]


def weight_syncs(memory: MemorySync, files: FileSync, native: NativeSync) -> list[WeightSync]:
    return [memory, files, native]


def reward_managers(rule: RuleRewardManager, model: ModelRewardManager) -> list[RewardManager]:
    return [rule, model]


def strategies(single: SingleDeviceStrategy, fsdp: FSDPStrategy, tp: TPStrategy, megatron: MegatronStrategy,
               fabric: FabricStrategy) -> list[Strategy]:
    return [single, fsdp, tp, megatron, fabric]


def controllers(local: LocalController, ray: RayController, torchrun: TorchrunController) -> list[Controller]:
    return [local, ray, torchrun]


def weight_snapshots(local: LocalController, ray: RayController) -> list[WeightSnapshots]:  # what the pipelines need
    return [local, ray]


def loggers(console: ConsoleLogger, mlflow: MlflowLogger, tb: TensorBoardLogger, wandb: WandbLogger) -> list[Logger]:
    return [console, mlflow, tb, wandb]


REWARD_FUNCTIONS: list[RewardFunction] = [arith_score, gsm8k_score, code_exec_score]
DATASETS: list[Dataset] = [arith_dataset, files_dataset, arith_pairs_dataset]
POLICY_LOSSES: list[PolicyLoss] = [
    losses.vanilla, losses.gspo, losses.gpg, losses.cispo, losses.sapo, losses.clip_cov, losses.kl_cov, losses.geo_mean,
    losses.dppo_tv, losses.dppo_kl, losses.sppo, losses.Dro(), losses.BypassMode(),
]
