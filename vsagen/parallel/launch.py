"""A sequence-parallel run under torchrun (issue 15): the launcher's ranks, the process group, and diffusers' context
parallelism (Ulysses) switched on for a pipeline's transformers with vsagen's plan.

`torchrun --nproc_per_node N -m vsagen t2v ... --ulysses N` starts N processes with RANK, WORLD_SIZE and LOCAL_RANK
set (torchrun's contract, read once by the CLI and passed here as a `Launch`). Every rank loads the model and runs
the same denoising loop on the same seed; the transformer's sequence is split across the ranks (diffusers' plan
for Wan, `ulysses.context_parallel_plan`) and vsagen's processors exchange sequence for heads around the backend
(`ulysses.UlyssesAttention`), so every rank ends each step with the same latents. Rank 0 decodes and writes; the
others write nothing. The process group is NCCL on CUDA (one GPU per local rank) and gloo on the CPU.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterator, Mapping

from ..errors import BadInput

# How long a rank waits in a collective for its peers (a peer that died mid-run ends the others after this).
TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Launch:
    """The process a launcher started: its global rank, the number of processes, its rank on its host."""

    rank: int
    world_size: int
    local_rank: int

    @property
    def writer(self) -> bool:
        """Rank 0 prints, decodes and writes the files."""
        return self.rank == 0


def torchrun_launch(env: Mapping[str, str]) -> Launch | None:
    """The `Launch` that torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK) describes, or None outside a launcher.

    Raises:
        BadInput: the variables are present but not integers with 0 <= rank < world size.
    """
    if "WORLD_SIZE" not in env or "RANK" not in env:
        return None
    try:
        rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
        local = int(env.get("LOCAL_RANK", rank))
    except ValueError:
        raise BadInput(f"RANK={env.get('RANK')!r} / WORLD_SIZE={env.get('WORLD_SIZE')!r} / LOCAL_RANK="
                       f"{env.get('LOCAL_RANK')!r} are not integers (set them with torchrun)") from None
    if world < 1 or not 0 <= rank < world or local < 0:
        raise BadInput(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_RANK={local} do not describe a process of a launch")
    return Launch(rank, world, local)


def check_launch(ulysses: int, launch: Launch | None, command: str = "t2v") -> None:
    """Refuse `--ulysses` without a launcher of as many processes, and several processes without `--ulysses`.

    Raises:
        BadInput: ulysses > 1 outside torchrun, a world size other than ulysses, or a launch of several processes
            with ulysses 1 (each would write the same files).
    """
    world = 1 if launch is None else launch.world_size
    if ulysses > 1 and launch is None:
        raise BadInput(f"--ulysses {ulysses} splits the run across {ulysses} processes: start it with torchrun, "
                       f"e.g. torchrun --nproc_per_node {ulysses} -m vsagen {command} ... --ulysses {ulysses}")
    if ulysses != world:
        if ulysses == 1:
            raise BadInput(f"this command runs in {world} processes (torchrun): give --ulysses {world} to split the "
                           "sequence across them, or start one process")
        raise BadInput(f"--ulysses {ulysses} needs {ulysses} processes, torchrun started {world} "
                       f"(--nproc_per_node x --nnodes)")


def start(launch: Launch, device: str, timeout_s: float = TIMEOUT_S) -> None:
    """Join the launch's process group (NCCL on CUDA with GPU `local_rank` made current, gloo on the CPU); the
    rendezvous address comes from the launcher's environment (MASTER_ADDR, MASTER_PORT).

    Raises:
        BadInput: a CUDA run with fewer GPUs on this host than its local rank needs.
    """
    import torch
    import torch.distributed as dist

    if device == "cuda":
        if launch.local_rank >= torch.cuda.device_count():
            raise BadInput(f"local rank {launch.local_rank} needs GPU {launch.local_rank}, this host has "
                           f"{torch.cuda.device_count()}: lower --nproc_per_node")
        torch.cuda.set_device(launch.local_rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=launch.rank,
                            world_size=launch.world_size, timeout=timedelta(seconds=timeout_s))


def finish() -> None:
    """Wait for every rank, then leave the process group (nothing if none was joined)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    with contextlib.suppress(Exception):  # a peer already gone: this rank leaves anyway
        dist.barrier()
    dist.destroy_process_group()


@contextlib.contextmanager
def _one_device_on_cpu() -> Iterator[None]:
    """diffusers 0.42's `enable_parallelism` picks the rank's device as rank % torch.accelerator.device_count(),
    which is 0 on a machine without an accelerator: report one device there while it runs."""
    import torch

    if torch.accelerator.device_count() > 0:
        yield
        return
    count = torch.accelerator.device_count
    torch.accelerator.device_count = lambda: 1
    try:
        yield
    finally:
        torch.accelerator.device_count = count


def enable_ulysses(transformer: Any, degree: int) -> None:
    """Split `transformer`'s sequence across the `degree` ranks of the current process group (diffusers'
    `enable_parallelism` with `ContextParallelConfig(ulysses_degree=degree)` and `ulysses.context_parallel_plan`);
    call it after `vsagen.apply` (its processors must be in place to receive the parallel config).

    Raises:
        RuntimeError: no process group (`start` first).
    """
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    from .ulysses import context_parallel_plan

    if not dist.is_initialized():
        raise RuntimeError("enable_ulysses needs the process group: call vsagen.parallel.launch.start first")
    with _one_device_on_cpu():
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=degree),
                                       cp_plan=context_parallel_plan(transformer))
