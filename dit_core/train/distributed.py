"""Beyond one GPU: the same training loop in several processes with DistributedDataParallel (DDP).

``torchrun --nproc_per_node N -m dit_core.train ...`` starts N copies of the trainer and sets ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and the rendezvous address in their environment. Each process then

1. joins the process group (NCCL between GPUs, gloo on the CPU) and takes GPU ``LOCAL_RANK``;
2. reads only its own slice of every global batch (:func:`dit_core.train.batches.micro_slice`: the
   "sampler sharding"), so the global batch stays ``batch_size`` whatever N is;
3. wraps the model in DDP, which all-reduces (averages) the gradients during ``backward`` so that every
   process applies the same update to the same weights; with gradient accumulation only the last
   micro-batch synchronises (``no_sync`` for the others);
4. logs, saves checkpoints and writes samples on rank 0 only; the logged loss is averaged over ranks.

The random numbers of a step are drawn for the whole global batch from ``(seed, step)`` and sliced (the
official code instead seeds each rank with ``seed * N + rank``, which gives a different but equally valid
run for each N): here a run on N processes computes the same thing as on one, up to the order of float
additions in the gradient average.

DDP keeps a full copy of the weights, gradients and AdamW moments on every GPU (16 bytes per parameter,
~11 GB for DiT-XL/2 before activations). Models that do not fit that way are trained with Fully Sharded
Data Parallel (``torch.distributed.fsdp.fully_shard``), which splits those tensors across the GPUs; DiT-XL/2
fits comfortably on one 24 GB GPU with DDP, so this library stays with DDP.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..runtime import resolve_device


@dataclass
class Processes:
    """Where this process stands: its rank among ``world_size`` processes and its device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def setup(device: str = "auto") -> Processes:
    """Join the process group when started by torchrun (``WORLD_SIZE`` > 1); a single process otherwise."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    dev = resolve_device(device, local_rank)
    if world_size > 1 and not dist.is_initialized():
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
    return Processes(rank, world_size, local_rank, dev)


def wrap(model: torch.nn.Module, procs: Processes) -> torch.nn.Module:
    """DistributedDataParallel around ``model`` when there are several processes; ``model`` itself otherwise."""
    if not procs.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    ids = [procs.device.index] if procs.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=ids)


def mean_over_processes(value: torch.Tensor, procs: Processes) -> torch.Tensor:
    """The average of ``value`` over all processes (itself with one process)."""
    if not procs.distributed:
        return value
    value = value.detach().clone()
    dist.all_reduce(value, op=dist.ReduceOp.SUM)
    return value / procs.world_size


def max_over_processes(value: int | float, procs: Processes) -> float:
    if not procs.distributed:
        return value
    t = torch.tensor([float(value)], device=procs.device if procs.device.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def barrier(procs: Processes) -> None:
    if procs.distributed:
        dist.barrier()


def cleanup(procs: Processes) -> None:
    if procs.distributed and dist.is_initialized():
        dist.destroy_process_group()
