"""Data parallelism under `torchrun`: the process group and the two collectives training uses.

Owns: `Dist` (rank, world size, sums and barriers that are no-ops in one process), joining the
process group (`init_dist`: gloo on CPU, nccl on CUDA) and summing gradients (`all_reduce_grads`).
We reduce gradients ourselves instead of wrapping the draft in DistributedDataParallel because the
unroll calls the module K times per step and ranks may hold no sample of a short last batch; the
arithmetic is the same. Does not own which samples a rank takes (`training.batches.rank_share`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Dist:
    """This process's place in the run: rank, world size, and the few collectives the loop needs."""

    rank: int = 0  # this process's rank
    world: int = 1  # number of processes
    owns_group: bool = False  # we initialised the process group (and destroy it at the end)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.world > 1:
            import torch.distributed as dist

            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()


def init_dist(device: str | None) -> tuple[Dist, torch.device]:
    """Join the torchrun process group when WORLD_SIZE > 1 (gloo on CPU, nccl on CUDA)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    from specwire.target.load import default_device

    if world <= 1:
        return Dist(), torch.device(device or default_device())
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device(device or default_device())
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", local)
        torch.cuda.set_device(dev)
    owns = False
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if dev.type == "cuda" else "gloo")
        owns = True
    return Dist(rank=dist.get_rank(), world=dist.get_world_size(), owns_group=owns), dev


def all_reduce_grads(params: list[nn.Parameter], d: Dist) -> None:
    """Sum gradients over ranks with one flat all-reduce (the loss is already globally normalised)."""
    if d.world <= 1:
        return
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    d.all_sum(flat)
    a = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[a:a + n].view_as(p).clone()
        a += n
