"""The rlforge settings that several verl keys decide together (the ``Derived`` rules of ``verl_keys``).

Each function reads the keys it owns from the translation context and gives every one of them a fate (mapped,
refused or ignored); ``verl.translate`` calls them after the one-key rules, in ``ORDER``. They follow verl 0.9.1's code:
which key wins, and which is read only when another is set. The device layout (strategy, parallel sizes, offload,
precision) is ``verl_layout``'s, the micro-batches, the learning-rate schedule and dynamic sampling
``verl_training``'s, the reward manager, function and overlong shaping ``verl_reward``'s, the trainer module and
its loop's frequencies ``verl_loop``'s.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TYPE_CHECKING

from rlforge.config import verl_agent as AG
from rlforge.config import verl_distill
from rlforge.config import verl_layout as L
from rlforge.config import verl_loop as LP
from rlforge.config import verl_reward as RW
from rlforge.config import verl_rollout as RO
from rlforge.config import verl_training as T
from rlforge.config.verl_fates import TRAINER_NAMES
from rlforge.config.schema import RUN_NAME_CHARS, RUN_NAME_WHAT
from rlforge.config.verl_rules import RESUME_PATH, count, file_list, integral, nest, non_negative, project_name, same_value, top_k

if TYPE_CHECKING:
    from rlforge.config.verl_fates import Context

ARO = "actor_rollout_ref"
A, R, REF = f"{ARO}.actor", f"{ARO}.rollout", f"{ARO}.ref"
# verl's adv_estimator -> rlforge's algorithm (the algorithm name carries its estimator)
ESTIMATORS = {"gae": "ppo", "grpo": "grpo", "grpo_vectorized": "grpo", "rloo": "rloo", "rloo_vectorized": "rloo",
              "reinforce_plus_plus": "reinforce_pp", "reinforce_plus_plus_baseline": "reinforce_pp_baseline",
              "remax": "remax", "opo": "opo", "gpg": "gpg", "gdpo": "gdpo", "optimal_token_baseline": "otb",
              "tir_optimal_token_baseline": "tir_otb"}
VERL_ONLY_ESTIMATORS = ("grpo_passk",)  # the rest of verl 0.9.1's estimator registry (ADV_ESTIMATOR_REGISTRY)
# verl's policy_loss.loss_mode names, all registered in rlforge's policy_loss registry (actor.policy_loss)
POLICY_LOSSES = ("vanilla", "gspo", "gpg", "cispo", "sapo", "clip_cov", "kl_cov", "geo_mean", "dppo_tv", "dppo_kl",
                 "dro", "bypass_mode")
# the algorithm-specific keys verl's estimators read, and the rlforge algorithms that have them
READS = {"algorithm.gamma": ({"gae", "reinforce_plus_plus"}, {"ppo", "pf_ppo", "reinforce_pp"}),
         "algorithm.lam": ({"gae"}, {"ppo", "pf_ppo"}),
         # verl's gdpo estimator is called without it and always divides by the std (rlforge's gdpo default)
         "algorithm.norm_adv_by_std_in_grpo": ({"grpo", "grpo_vectorized"}, {"grpo"})}
TARGET = {"algorithm.gamma": "algorithm.gamma", "algorithm.lam": "algorithm.lam",
          "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std"}
LOGGERS = {"console": "console", "wandb": "wandb", "mlflow": "mlflow", "tensorboard": "tensorboard",
           "swanlab": "swanlab", "trackio": "trackio", "file": "jsonl"}
# where rlforge's logger keeps its records elsewhere than verl's
LOGGER_NOTES = {"file": "verl's file logger writes {step, data} lines to $VERL_FILE_LOGGER_PATH or "
                        "<project>/<experiment>.jsonl; rlforge's jsonl logger writes the metrics to <run>/metrics.jsonl"}
TABLE_LOGGERS = ("swanlab", "trackio")  # where verl shows validation generations and rlforge's loggers do not
def algorithm(c: Context) -> None:
    est, mode = c.get("algorithm.adv_estimator"), c.get(f"{A}.policy_loss.loss_mode")
    algo = ESTIMATORS.get(est)
    if algo is None and est in VERL_ONLY_ESTIMATORS:
        c.refuse("algorithm.adv_estimator", f"verl's adv_estimator={est} (rlforge's: {', '.join(sorted(ESTIMATORS))})")
    elif algo is None:
        c.stop("algorithm.adv_estimator", f"not an advantage estimator of verl 0.9.1, which stops on it ('Unknown "
               f"advantage estimator'; a project that has one registers it in its own code); verl's and rlforge's: "
               f"{', '.join(sorted(ESTIMATORS))}")
    else:
        c.map("algorithm.adv_estimator", "--algo", algo)
    bypass = f"{T.RC}.bypass_mode"
    if not c.get(bypass):
        c.same(bypass, "old log-probs from the actor")
    elif c.trainer == "dapo":
        c.unread(bypass, "not read by verl's DAPO recipe trainer: it recomputes the old log-probs and applies rollout "
                         "correction as configured")
    else:  # the fully-async and one-step-off trainers' apply_bypass_mode sets loss_mode=bypass_mode on the driver's
        # config only, after the workers built their loss from theirs: the configured loss runs there too
        trainer = TRAINER_NAMES.get(c.trainer, "verl 0.9.1's main_ppo")
        c.map(bypass, "actor.reuse_rollout_log_probs", True, f"{trainer}: the old log-probs are the engine's, rollout "
              "correction (rollout_is, rollout_rs) is skipped and the loss is policy_loss.loss_mode's")
    if mode in POLICY_LOSSES:
        c.map(f"{A}.policy_loss.loss_mode", "actor.policy_loss", mode)
    else:
        c.stop(f"{A}.policy_loss.loss_mode", f"not a policy loss of verl 0.9.1, which stops on it ('Unsupported loss "
               f"mode'; a project that has one registers it in its own code, and in rlforge as a plugin's "
               f"policy_loss: docs/plugins.md); verl's and rlforge's: {', '.join(POLICY_LOSSES)}")
    if c.get("algorithm.use_pf_ppo") and est == "gae":
        algo = "pf_ppo"
        c.map("algorithm.use_pf_ppo", "--algo", algo)
        c.map("algorithm.pf_ppo.reweight_method", "algorithm.reweight_method", c.get("algorithm.pf_ppo.reweight_method"))
        c.map("algorithm.pf_ppo.weight_pow", "algorithm.weight_pow", c.get("algorithm.pf_ppo.weight_pow"))
    else:
        c.same("algorithm.use_pf_ppo", "every sample weighted equally" if not c.get("algorithm.use_pf_ppo") else
               f"every sample weighted equally (verl reads use_pf_ppo only with gae, not {est})")
        for key in ("algorithm.pf_ppo.reweight_method", "algorithm.pf_ppo.weight_pow"):
            c.unread(key, "read only with algorithm.use_pf_ppo and adv_estimator=gae")
    c.algorithm = algo or c.algorithm
    for key, (verl_reads, ours) in READS.items():
        if est not in verl_reads:
            c.unread(key, f"not read by verl's {est} estimator" + (
                " (it always divides by the std, as rlforge's gdpo does)" if est == "gdpo" else ""))
        elif c.algorithm in ours:
            c.map(key, TARGET[key], c.get(key))
        else:
            c.refuse(key, f"{key} with --algo {c.algorithm}")
    enable, critic = c.get("critic.enable"), est == "gae"
    if enable is None or bool(enable) == critic:
        c.same("critic.enable", "a critic exactly for PPO (adv_estimator=gae)")
    else:
        c.refuse("critic.enable", f"critic.enable={enable} with adv_estimator={est}")


def model_config(c: Context) -> None:
    """verl's ``model.override_config``: fields set on the policy's Hugging Face config (its ``model_config`` entry
    instead, where given, as verl's HFModelConfig reads it), rlforge's ``model.config_overrides``."""
    top = f"{ARO}.model.override_config."
    inner = [k for k in c.owned if k.startswith(top + "model_config.")]
    prefix = top + "model_config." if inner else top
    overrides = nest({k[len(prefix):]: c.get(k) for k in (inner or c.owned)})
    note = ("verl 0.9.1's vLLM server loads config.json without it (it sizes its max_model_len by it, and vLLM then "
            "refuses a length over config.json's without VLLM_ALLOW_LONG_MAX_MODEL_LEN=1); rlforge's vllm engine "
            "gets it too (hf_overrides): the rollout runs the model the trainer trains") if c.get(f"{R}.name") == \
        "vllm" else ""
    for key in c.owned:
        if key.startswith(prefix):
            c.map(key, "model.config_overrides", overrides, note)
        else:
            c.unread(key, f"not read: verl applies {top}model_config alone where it is given")


def lengths(c: Context) -> None:
    """The rollout's lengths (copies of data.max_prompt_length / max_response_length), and data.truncation, which verl
    0.9.1 never reads: its agent loop keeps the last tokens of a longer text prompt, as rlforge's data.truncation=left."""
    for rollout_key, data_key in ((f"{R}.prompt_length", "data.max_prompt_length"),
                                  (f"{R}.response_length", "data.max_response_length")):
        if same_value(c.get(rollout_key), c.get(data_key)):  # its default is data's: NaN there too
            c.same(rollout_key, f"{data_key} (mapped there)")
        else:
            c.refuse(rollout_key, f"a rollout length ({c.get(rollout_key)}) other than {data_key} ({c.get(data_key)})")
    # verl 0.9.1 stores data.truncation (RLHFDataset) and reads it nowhere: its agent loop keeps the last
    # rollout.prompt_length tokens of a longer text prompt (_cap_text_prompt_length) and refuses one with images.
    # rlforge's data.truncation=left does the same, behind the same filter (data.filter_overlong_prompts) where it is on.
    mode = c.get("data.truncation")
    behind = (" behind data.filter_overlong_prompts, which drops such prompts first in both" if
              c.get("data.filter_overlong_prompts") else "")
    c.map("data.truncation", "data.truncation", "left", "" if mode == "left" else
          f"verl 0.9.1 does not read data.truncation={mode}: its agent loop keeps the last rollout.prompt_length "
          f"tokens of a longer text prompt, as data.truncation=left does{behind} (a longer prompt with images is an "
          "error in both)")


def validation(c: Context) -> None:
    """val_kwargs: verl 0.9.1's agent loop (its only rollout path) samples validation at val_kwargs.temperature,
    top_p and top_k whatever do_sample says (do_sample goes into the batch's meta_info, which only the legacy
    HFRollout, not in its rollout registry, reads); temperature 0 is greedy."""
    v = f"{R}.val_kwargs"
    temperature, n = float(c.get(f"{v}.temperature") or 0.0), c.get(f"{v}.n", 1)
    if c.get(f"{v}.do_sample") and not float(c.get(f"{R}.temperature") or 0.0) > 0:
        c.refuse(f"{v}.do_sample", "val_kwargs.do_sample=True with rollout.temperature <= 0 (verl 0.9.1's "
                                   "validate_config refuses it too: 'validation gen temperature should be greater than 0 "
                                   "when enabling do_sample')")
    c.unread(f"{v}.do_sample", "verl 0.9.1's agent loop samples at val_kwargs.temperature/top_p/top_k whatever it says "
                               "(it goes into the batch's meta_info only)")
    c.map(f"{v}.temperature", "rollout.val_temperature", temperature, "" if temperature else "greedy")
    c.map(f"{v}.top_p", "rollout.val_top_p", float(c.get(f"{v}.top_p", 1.0)))
    c.map(f"{v}.top_k", "rollout.val_top_k", top_k(c.get(f"{v}.top_k")))
    if not temperature and not count(1)(n):
        # greedy validation generates one answer; verl still repeats the batch n times, which n must allow
        c.stop(f"{v}.n", "verl 0.9.1 repeats each validation prompt val_kwargs.n times: it takes a positive integer")
        return
    c.map(f"{v}.n", "rollout.val_n", n if temperature else 1, "" if temperature or n <= 1 else
          f"verl's {n} greedy answers per prompt are one answer {n} times: rlforge generates it once (its metrics are "
          f"named mean@1, not mean@{n}; the values are the same, std 0)")


def rollout_log_probs(c: Context) -> None:
    """verl's rollout.calculate_log_probs: the engine's log-probs, and with them the metrics comparing them to the
    actor's recomputation; rlforge's engines always report them and its old-log-prob stage logs the same metrics."""
    key = f"{R}.calculate_log_probs"
    if c.get(key):
        c.same(key, "the engine's log-probs; with the actor's recomputation (actor.reuse_rollout_log_probs off) "
               "training/rollout_probs_diff_* and training/rollout_actor_probs_pearson_corr are logged")
    else:
        c.ignore(key, "rlforge's engines report their log-probs anyway (what is computed does not change; the "
                 "training/rollout_probs_diff_* metrics come in addition)")


def chat_template(c: Context) -> None:
    """``data.apply_chat_template_kwargs`` (an empty mapping, or its entries as keys of their own) as one mapping."""
    top = "data.apply_chat_template_kwargs"
    if top in c.owned and c.get(top) is not None and not isinstance(c.get(top), dict) and len(c.owned) == 1:
        c.refuse(top, f"a data.apply_chat_template_kwargs that is not a mapping of the template's variables "
                      f"({c.get(top)!r})")
        return
    kwargs = nest({k[len(top) + 1:]: c.get(k) for k in c.owned if k != top})
    for key in c.owned:
        c.map(key, top, kwargs)


def data(c: Context) -> None:
    """The data files; ``data.return_raw_chat``, which verl 0.9.1 stores and never reads: its dataset always hands each
    row's chat messages to the agent loop, which applies the chat template (rlforge's prompts are rendered the same)."""
    cls_path, cls_name = c.get("data.custom_cls.path"), c.get("data.custom_cls.name")
    if cls_path:  # verl's dataset class by path: rlforge's verl_class dataset builds it as verl does
        c.set("data.name", "verl_class")
        c.map("data.custom_cls.path", "data.verl_class.path", cls_path)
        c.map("data.custom_cls.name", "data.verl_class.name", cls_name)
        # the launch's data keys and the tool files verl's data section interpolates (its overlong filter renders the
        # tools' schemas); verl's defaults for the rest (plugins/data/verl_class.py)
        keys = [k for k in sorted(c.given) if k.startswith("data.")
                and not k.startswith(("data.custom_cls.", "data.train_files", "data.val_files"))]
        keys += [k for k in ("data.filter_overlong_prompts", "data.tool_config_path", "data.function_tool_path")
                 if c.get(k) is not None and k not in keys]
        c.set("data.verl_class.config", {k.split(".", 1)[1]: c.get(k) for k in keys})
        # the class filters overlong prompts itself, as it reads (RLHFDataset's filter; a class that reads otherwise
        # may not): rows it yields are kept, a longer prompt cut from the left as verl's agent loop cuts it
        c.same("data.filter_overlong_prompts", f"read by the dataset class, which filters as it reads, as in verl "
               f"(data.verl_class.config.filter_overlong_prompts={bool(c.get('data.filter_overlong_prompts'))}); "
               f"rlforge keeps the rows it yields (data.filter_overlong_prompts=false, data.truncation=left)")
        c.set("data.filter_overlong_prompts", False)
    else:
        c.set("data.name", "files")
        c.map("data.filter_overlong_prompts", "data.filter_overlong_prompts", bool(c.get("data.filter_overlong_prompts")))
        for key in ("data.custom_cls.path", "data.custom_cls.name"):
            c.same(key, "verl's RLHFDataset: verl-format rows (data.name=files)")
    for key, split in (("data.train_files", "training"), ("data.val_files", "validation")):
        files = file_list(c.get(key))
        if files or cls_path:  # a dataset class may read no files
            c.map(key, key, files)
        else:  # RLHFDataset: None -> a TypeError, [] -> "Unable to concatenate an empty list of datasets"
            c.stop(key, f"no files: verl 0.9.1 builds its {split} dataset in every launch and stops without one" +
                   ("; to skip validation keep files there and set trainer.test_freq=-1, trainer.val_before_train="
                    "False" if split == "validation" else ""))
    raw = "data.return_raw_chat"
    (c.same(raw, "each row's chat messages go to the rollout, rendered with the model's chat template") if c.get(raw)
     else c.unread(raw, "not read by verl 0.9.1: its dataset hands every row's chat messages to the agent loop, which "
                   "applies the chat template (as with return_raw_chat=True)"))


MULTIMODAL_MISSING = {
    "data.video_key": "rows with videos (data.video_key; rlforge's rows carry images)",
    "data.audio_key": "rows with audio (data.audio_key; rlforge's rows carry images)",
    "data.image_patch_size": "resizing images to a patch size set in the config (data.image_patch_size; rlforge's "
                             "images are resized by the model's processor, to its own patch size)",
    "data.mm_processor_kwargs": "processor keyword arguments (data.mm_processor_kwargs)",
}


def multimodal(c: Context) -> None:
    """verl's image column is rlforge's (``data.image_key``, docs/multimodal.md); videos, audio and processor options a
    launch sets are refused, and read by nothing when it leaves them."""
    c.map("data.image_key", "data.image_key", c.get("data.image_key"))
    for key in c.owned:
        if key in c.given and key in MULTIMODAL_MISSING:
            c.refuse(key, MULTIMODAL_MISSING[key])
        else:
            c.ignore(key, "read only for rows with videos or audio, or by verl's image resizing (rlforge's processor "
                     "resizes images)")


def steps(c: Context) -> None:
    """verl trains total_training_steps steps when it is set (its schedule spans them), else total_epochs x batches per
    epoch; either way its loop ends after total_epochs passes over the data."""
    total, epochs = c.get("trainer.total_training_steps"), c.get("trainer.total_epochs")
    note = ("with dynamic sampling verl's DAPO recipe stops once total_epochs passes over the prompts are used up, "
            "however many steps that is; rlforge counts total_epochs x rows // data.train_batch_size steps, drawing "
            "more prompts as needed"
            if c.get("algorithm.filter_groups.enable") and c.trainer == "dapo" else "")  # main_ppo counts steps
    whole = isinstance(epochs, int) or float(epochs).is_integer()
    if total is not None:
        c.map("trainer.total_training_steps", "trainer.total_steps", integral(total))
    else:
        c.unread("trainer.total_training_steps", "null: verl counts total_epochs")
    if not whole:  # verl runs floor(epochs x batches) steps, or with total_training_steps ceil(epochs) whole passes
        c.refuse("trainer.total_epochs", f"a fractional number of epochs (total_epochs={epochs}; rlforge's "
                                         f"trainer.total_epochs and epoch_limit count whole passes)")
    else:
        c.map("trainer.total_epochs", "trainer.epoch_limit" if total is not None else "trainer.total_epochs",
              int(epochs), note)


def loggers(c: Context) -> None:
    value = c.get("trainer.logger")
    names = [value] if isinstance(value, str) else list(value or [])
    unknown = [n for n in names if n not in LOGGERS]
    if unknown:
        c.refuse("trainer.logger", f"the {', '.join(unknown)} logger{'s' if len(unknown) > 1 else ''} (rlforge's: "
                 f"{', '.join(LOGGERS)})")
    else:
        c.map("trainer.logger", "logger.backends", [LOGGERS[n] for n in names] or ["console"],
              "; ".join(LOGGER_NOTES[n] for n in names if n in LOGGER_NOTES))
    # verl's validation generations: wandb's table, tensorboard's text and mlflow's file, as rlforge's; swanlab/trackio
    generations, unshown = int(c.get("trainer.log_val_generations") or 0), [n for n in names if n in TABLE_LOGGERS]
    c.map("trainer.log_val_generations", "trainer.log_val_generations", generations, "" if not generations or not
          unshown else f"verl shows them in {', '.join(unshown)} as a table; rlforge's {', '.join(unshown)} logger "
          "keeps only the file val_generations/val_step<N>.json")


def resume(c: Context) -> None:
    mode, path = c.get("trainer.resume_mode"), c.get("trainer.resume_from_path")
    folder = c.get("trainer.default_local_dir")
    if folder is None and (mode != "disable" or (c.get("trainer.save_freq") or 0) > 0):
        c.stop("trainer.default_local_dir", "verl 0.9.1 stops on null here: it looks for checkpoints in this folder at "
                                            "start (resume_mode other than disable) and saves them there (save_freq > 0)")
    c.map("trainer.default_local_dir", "trainer.run_dir", file_list(folder)[0] if folder else None,
          "rlforge's run folder layout (checkpoints/step_N) is its own: verl's checkpoints are not resumed")
    if mode == "auto":
        c.map("trainer.resume_mode", "trainer.resume", "auto")
    elif mode == "disable":
        c.map("trainer.resume_mode", "trainer.resume", "never")
    elif mode == "resume_path" and path:
        c.same("trainer.resume_mode", "resume from trainer.resume_from_path")
        c.map("trainer.resume_from_path", "trainer.resume", file_list(path)[0], RESUME_PATH)
        return
    else:
        c.stop("trainer.resume_mode", f"resume_mode={mode}" + (" without resume_from_path" if mode == "resume_path"
                                                                 else "") + ": verl 0.9.1 stops on it too")
    c.unread("trainer.resume_from_path", "read only with resume_mode=resume_path")


def checkpoints(c: Context) -> None:
    actor, critic = c.get("trainer.max_actor_ckpt_to_keep"), c.get("trainer.max_critic_ckpt_to_keep")
    c.map("trainer.max_actor_ckpt_to_keep", "trainer.keep_last_n", non_negative(actor))
    if critic is None or critic == actor or c.algorithm != "ppo":
        c.same("trainer.max_critic_ckpt_to_keep", "one count for every checkpoint (trainer.keep_last_n)")
    else:
        c.refuse("trainer.max_critic_ckpt_to_keep", "separate checkpoint counts for the actor and the critic")


def experiment(c: Context) -> None:
    """``trainer.experiment_name``: in verl a label (the loggers' run name, a piece of default_local_dir's default),
    rlforge's ``trainer.experiment``, a folder name: other characters become ``_`` (null: rlforge's default).
    ``trainer.project_name`` is rlforge's ``trainer.project`` (null or empty: rlforge's default name, said so)."""
    project_name(c)
    key = "trainer.experiment_name"
    value = c.get(key)
    name = re.sub(f"[^{RUN_NAME_CHARS}]", "_", str(value)).lstrip(".-")[:128] if value is not None else ""
    name = name or "default"
    c.map(key, "trainer.experiment", name, "" if name == value else
          f"rlforge's experiment name is {RUN_NAME_WHAT}: {value!r} becomes {name!r}, the loggers' "
          f"run name too")


def val_only(c: Context) -> None:
    if c.get("trainer.val_only") and not c.get("trainer.val_before_train"):  # verl checks it in that block only
        c.unread("trainer.val_only", "read only with trainer.val_before_train=True: without it verl trains")
    elif c.get("trainer.val_only"):
        c.command = "eval"
        c.map("trainer.val_only", "rlforge eval", True, "validation only: `rlforge verl` runs `rlforge eval` on "
              "data.val_files")
    else:
        c.same("trainer.val_only", "train, then validate")


DERIVED: dict[str, Callable[[Context], None]] = {
    "algorithm": algorithm, "distillation": verl_distill.distillation, "parallel": L.parallel, "offload": L.offload,
    "grad_offload": L.grad_offload, "chat_template": chat_template, "rollout_correction": T.rollout_correction,
    "weight_decay": T.weight_decay, "loss_scale": T.loss_scale, "rollout_log_probs": rollout_log_probs,
    "sequence_parallel": L.sequence_parallel, "data": data, "reward": RW.reward, "overlong": RW.overlong,
    "micro_batches": T.micro_batches, "scoring": T.scoring, "clip": T.clip, "grad_clip": T.grad_clip,
    "betas": T.betas, "recompute": T.recompute, "entropy": T.entropy, "warmup": T.warmup, "schedule": T.schedule,
    "precision": L.precision, "rollout_engine": RO.rollout_engine, "model_config": model_config, "lengths": lengths,
    "validation": validation, "multi_turn": AG.multi_turn, "filter_groups": T.filter_groups, "multimodal": multimodal,
    "steps": steps, "loggers": loggers, "resume": resume, "checkpoints": checkpoints, "val_only": val_only,
    "experiment": experiment, "main_ppo_trainer": LP.main_ppo_trainer, "val_freq": LP.val_freq, "save_freq": LP.save_freq,
}
# the order they run in: the algorithm (distillation may turn it into opd) and the parallel layout first (others read
# them), steps before warm-up
ORDER = ("algorithm", "distillation", "parallel", "offload", "grad_offload", "chat_template", "rollout_correction",
         "weight_decay", "loss_scale", "rollout_log_probs", "sequence_parallel", "data", "reward", "overlong",
         "filter_groups", "steps", "warmup", "schedule", "micro_batches", "scoring", "clip", "grad_clip", "betas",
         "recompute", "entropy", "precision", "rollout_engine", "model_config", "lengths", "validation", "multi_turn",
         "multimodal", "loggers", "resume", "checkpoints", "val_only", "experiment", "main_ppo_trainer", "val_freq",
         "save_freq")
