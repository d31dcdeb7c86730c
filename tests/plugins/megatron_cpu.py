"""Test-only: run megatron-core 0.16's forward on a CPU build of torch.

Its forward asks ``torch.cuda.current_device()`` for the device of RoPE's frequencies and of its global memory
buffer, and enters a CUDA RNG-tracker fork around attention (for dropout); its ``dist_checkpointing`` save calls
``torch.cuda.synchronize()``. On CPU the first answers ``cpu``, the fork does nothing (rlforge's models have no
dropout) and there is nothing to synchronize. The ``megatron`` strategy itself does not patch anything:
on a GPU none of this is needed (``tests/plugins/test_megatron.py``'s ``gpu`` tests run without it).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from unittest import mock

import torch

from rlforge.controller.rendezvous import rendezvous_port


def allow_megatron_forward_on_cpu() -> None:
    from megatron.core.tensor_parallel import random as megatron_random

    torch.cuda.current_device = lambda: torch.device("cpu")
    torch.cuda.synchronize = lambda *args, **kwargs: None
    megatron_random.get_cuda_rng_tracker().fork = lambda *args, **kwargs: contextlib.nullcontext()


def free_port() -> int:
    return rendezvous_port("127.0.0.1")  # below the ephemeral range: no outgoing connection takes it meanwhile


def launch_env(rank: int, world: int, port: int) -> None:
    """The torchrun variables of one rank on this machine."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))


@contextlib.contextmanager
def launched(rank: int, world: int, port: int) -> Iterator[None]:
    """:func:`launch_env` for the block, the environment as it was after it (a module-scoped fixture outlives the
    per-test restore in tests/conftest.py; a RANK left behind would reach the next file's Ray workers)."""
    with mock.patch.dict(os.environ):
        launch_env(rank, world, port)
        yield
