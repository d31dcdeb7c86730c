"""``BaseStrategy``: what every strategy shares. A strategy owns the parts of training that depend on how the
model is laid out over devices: placement, precision (autocast and loss scaling, ``model.precision``),
backward, gradient clipping, the optimizer step, state dicts and the sharded checkpoint layout (the
``Strategy`` Protocol in ``rlforge.protocols``).

State dicts go through ``torch.distributed.checkpoint.state_dict``, which handles plain and FSDP2 models
alike: full state dicts are gathered on the CPU (complete on rank 0), sharded ones are written by every rank
into one ``torch.distributed.checkpoint`` folder that any number of ranks can load. Subclasses implement
``setup_model`` and the collectives (``all_reduce_sum``/``all_reduce_max``; one process: the identity).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlforge import precision
from rlforge.capabilities import StrategyCapabilities

if TYPE_CHECKING:
    import torch


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc mallopt() parameters (malloc.h)


def keep_freed_memory() -> bool:
    """Make this process's C allocator (glibc malloc) keep the memory of freed tensors for the next allocation: no
    ``mmap`` for large blocks and no trimming of the heap. By default a tensor above 32 MiB gets pages of its own that
    go back to the operating system when it is freed, so every training step faults the memory of its activations in
    again, page by page (measured: 0.7-1.5 s of kernel time in a 5 s forward and backward of the 20.6M benchmark model,
    3-5 s with a vLLM engine alive beside it; docs/performance.md). Afterwards the resident memory stays at its peak.
    Returns whether it applied (False where the C library is not glibc)."""
    import ctypes

    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1))


def _full_options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # gathered on rank 0, on the CPU: what full checkpoints store and what any number of ranks can load
    return StateDictOptions(full_state_dict=True, cpu_offload=True)


class BaseStrategy:
    """Defaults for the ``Strategy`` contract; a subclass sets ``device``, ``rank``, ``world_size``."""

    device: torch.device
    rank = 0
    world_size = 1
    precision: precision.Precision = precision.resolve("32-true")
    scaler: Any = None  # torch.amp.GradScaler with 16-mixed
    capabilities = StrategyCapabilities()  # a subclass declares its own (rlforge.capabilities)

    def configure_precision(self, config: Any) -> None:
        """Set ``precision`` (and the loss scaler of ``16-mixed``) from ``model.precision`` for ``self.device``.
        Subclasses call it once ``self.device`` is known."""
        self.precision = precision.resolve(config.model.precision, self.device)
        if self.precision.scaler:
            import torch

            self.scaler = torch.amp.GradScaler(self.device.type)

    def autocast(self) -> Any:
        """The context for forward passes: autocast to the compute dtype of a mixed precision, else nothing."""
        if self.precision.compute is None:
            return contextlib.nullcontext()
        import torch

        return torch.autocast(self.device.type, dtype=self.precision.dtype("compute"))

    def setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        raise NotImplementedError(f"{type(self).__name__}.setup_model")  # abstract

    @property
    def sequence_parallel_size(self) -> int:
        """The ranks that share each packed micro-batch (1: none); the workers scale token budgets by it."""
        return 1

    def setup_model_for(self, model: torch.nn.Module, role: str) -> torch.nn.Module:
        """``setup_model`` for a worker's model of ``role`` (actor, ref, critic, a plugin role's): a strategy that
        places models by role (fsdp: ``strategy.fsdp.offload_params``) overrides it."""
        return self.setup_model(model)

    def setup_optimizer(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer
                        ) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        """Model and optimizer set up together, for a strategy that wraps both (DeepSpeed through ``fabric``); by
        default both as they are."""
        return model, optimizer

    def all_reduce_sum(self, value: float) -> float:
        raise NotImplementedError(f"{type(self).__name__}.all_reduce_sum")  # abstract

    def all_reduce_max(self, value: float) -> float:
        raise NotImplementedError(f"{type(self).__name__}.all_reduce_max")  # abstract

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the loss scale (``16-mixed``), before they are measured or clipped."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float) -> float:
        """Clip the gradients of ``model`` to ``max_norm`` (0: only measure) and return their total norm."""
        import torch

        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if max_norm and max_norm > 0:
            return float(torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.grad is not None],
                                                        max_norm))
        return float(torch.nn.utils.get_total_norm(grads))

    def optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self.scaler is not None:
            self.scaler.step(optimizer)
            self.scaler.update()
        else:
            optimizer.step()

    def skip_step(self, optimizer: torch.optim.Optimizer) -> None:
        """A step skipped for a non-finite gradient: with loss scaling, lower the scale for the next one."""
        if self.scaler is not None:
            self.scaler.update()

    def precision_state(self) -> dict[str, Any]:
        """The loss scaler's state (for exact resume); empty without one."""
        return self.scaler.state_dict() if self.scaler is not None else {}

    def load_precision_state(self, state: dict[str, Any]) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)

    def named_weights(self, model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
        """The full weights, name by name, for the rollout engine (a sharded strategy gathers them)."""
        for name, p in model.named_parameters():
            yield name, p.detach()

    # --- state ------------------------------------------------------------------------------------------
    def model_state_dict(self, model: torch.nn.Module) -> dict[str, torch.Tensor]:
        """The model's full weights on the CPU (complete on rank 0 only). Collective."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return get_model_state_dict(model, options=_full_options())

    def load_model_state_dict(self, model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> None:
        """Load full weights (every rank gets them; sharded models keep their shard)."""
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
        )

        set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))

    def optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer state, gathered (complete on rank 0 only). Collective."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        return get_optimizer_state_dict(_sharded_params(model), optimizer, options=_full_options())

    def load_optimizer_state_dict(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                                  state: dict[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )

        if _restores_only_settings(optimizer, state):
            return
        options = StateDictOptions(full_state_dict=True)
        set_optimizer_state_dict(_sharded_params(model), optimizer, state, options=options)

    def save_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Write model and optimizer shards to ``path`` (every rank its own part). Collective."""
        import torch.distributed.checkpoint as dcp

        dcp.save(_sharded_state(model, optimizer), checkpoint_id=str(path))

    def save_sharded_async(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Future[Any]:
        """Start writing what :meth:`save_sharded` writes (``strategy.checkpoint=async``): returns once model and
        optimizer state are copied to CPU memory, and the future completes when the files are written (by a thread;
        its collectives go over a gloo group of their own, so they never interleave with training's). Collective.
        A strategy declares that its :meth:`load_sharded` reads this layout with ``async_checkpoint=True``."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        group = _checkpoint_group() if dist.is_initialized() else None  # None: one process (the single strategy)
        return dcp.async_save(_sharded_state(model, optimizer), checkpoint_id=str(path), process_group=group)

    def load_sharded(self, path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Load what :meth:`save_sharded` wrote, into any number of ranks. Collective."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        state = _sharded_state(model, optimizer)
        dcp.load(state, checkpoint_id=str(path))
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optimizer"])


SCHEDULER_KEY = "initial_lr"  # what torch's learning-rate schedulers add to an optimizer's parameter groups


def _restores_only_settings(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> bool:
    """Check that the saved optimizer ``state`` (``get_optimizer_state_dict``'s layout) is one of ``optimizer``'s
    kind (a scheduler's ``initial_lr`` in its groups follows this run's: a scheduler added or dropped on resume is not
    another optimizer); where it holds no per-parameter tensors (a stateless optimizer: SGD without momentum), restore
    its groups' settings here and return True (torch's loader cannot place such a state on a device)."""
    import torch

    from rlforge.errors import RLForgeError

    saved, groups = state.get("param_groups", []), optimizer.param_groups
    for old, now in zip(saved, groups):  # a learning-rate scheduler's mark: it follows this run's scheduler, if any
        old.pop(SCHEDULER_KEY, None)
        if SCHEDULER_KEY in now:
            old[SCHEDULER_KEY] = now[SCHEDULER_KEY]
    missing = sorted({k for g in groups for k in g} - {k for g in saved for k in g}) if len(saved) == len(groups) \
        else [f"{len(groups)} parameter groups (it has {len(saved)})"]
    if missing:
        raise RLForgeError(f"The checkpoint's optimizer state lacks what this run's optimizer "
                           f"({type(optimizer).__name__}) holds: {', '.join(missing)}. It was written by another "
                           f"optimizer (configure_optimizers changed since): resume with the optimizer that wrote it, "
                           f"or start a new run.")
    if any(isinstance(t, torch.Tensor) and t.dim() > 0 for entry in state.get("state", {}).values()
           for t in entry.values()):
        return False
    for group, settings in zip(groups, saved):
        group.update({k: v for k, v in settings.items() if k != "params"})
    return True


def load_sharded_model(path: Path, model: torch.nn.Module) -> None:
    """Load the model part of what :meth:`BaseStrategy.save_sharded` wrote (any number of ranks) into ``model``, in
    one process without a process group (``rlforge export`` of a ``strategy.checkpoint=async`` checkpoint)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict

    state = {"model": get_model_state_dict(model)}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    set_model_state_dict(model, state["model"])


def sharded_problem(folder: Path) -> str | None:
    """What is wrong with a folder :meth:`BaseStrategy.save_sharded` wrote, or None when it is complete: its
    ``.metadata`` (written last) reads, and every file it lists is there and as long as the bytes it places in it
    (a truncated or deleted ``.distcp`` file shows). Reads the metadata only."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = folder / ".metadata"
    if not metadata.is_file():
        return f"{metadata} is missing: the checkpoint is incomplete"
    try:
        storage = FileSystemReader(str(folder)).read_metadata().storage_data
        ends: dict[str, int] = {}
        for info in storage.values():
            ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    except Exception as exc:
        return f"{metadata} cannot be read: it is truncated or corrupted ({type(exc).__name__})"
    for name, end in sorted(ends.items()):
        if not (folder / name).is_file():
            return f"{folder / name} is missing (listed by {metadata}): the checkpoint is incomplete"
        if (size := (folder / name).stat().st_size) < end:
            return (f"{folder / name} cannot be read: it is truncated or corrupted ({size} bytes; {metadata} places "
                    f"data up to byte {end})")
    return None


def _sharded_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    model = _sharded_params(model)
    return {"model": get_model_state_dict(model), "optimizer": get_optimizer_state_dict(model, optimizer)}


_CHECKPOINT_GROUP: list[Any] = []  # [the default group, the group of background checkpoint writes made beside it]


def _checkpoint_group() -> Any:
    """A gloo group over all ranks for :meth:`BaseStrategy.save_sharded_async`'s writer thread, made once per default
    process group (collective then: every rank saves together)."""
    import torch.distributed as dist

    if not _CHECKPOINT_GROUP or _CHECKPOINT_GROUP[0] is not dist.group.WORLD:
        _CHECKPOINT_GROUP[:] = [dist.group.WORLD, dist.new_group(backend="gloo")]
    return _CHECKPOINT_GROUP[1]


def _sharded_params(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its sharded parameters registered: FSDP2 keeps the root module's (embeddings, norm, head)
    gathered after a forward pass that no backward follows (a scoring or generation pass), and the optimizer's
    parameters are the sharded ones, which the optimizer state is keyed by. Other models are returned as they are."""
    from torch.distributed.fsdp import FSDPModule

    if isinstance(model, FSDPModule):
        model.reshard()
    return model


class ProcessGroupCollectives:
    """``all_reduce_sum``/``all_reduce_max`` of a float over torch.distributed, for the strategies with one process
    per rank: over ``reduce_group()`` (None: the default group), on the strategy's ``device``."""

    device: torch.device

    def reduce_group(self) -> Any:
        return None

    def all_reduce_sum(self, value: float) -> float:
        return self._all_reduce(value, "SUM")

    def all_reduce_max(self, value: float) -> float:
        return self._all_reduce(value, "MAX")

    def _all_reduce(self, value: float, op: str) -> float:
        import torch

        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t, op=getattr(torch.distributed.ReduceOp, op), group=self.reduce_group())
        return float(t.item())
