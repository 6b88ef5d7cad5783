"""A sequence-parallel run under a launcher (issue 15): the launcher's ranks, the process group, and diffusers' context
parallelism (Ulysses) switched on for a pipeline's transformers with vsagen's plan.

`vsagen t2v ... --gpus N` (`spawn`) or `torchrun --nproc_per_node N -m vsagen t2v ... --ulysses N` starts N processes
with RANK, WORLD_SIZE and LOCAL_RANK set (torchrun's contract, read once by the CLI and passed here as a `Launch`). Every rank loads the model and runs
the same denoising loop on the same seed; the transformer's sequence is split across the ranks (diffusers' plan
for Wan, `ulysses.context_parallel_plan`) and vsagen's processors exchange sequence for heads around the backend
(`ulysses.UlyssesAttention`), so every rank ends each step with the same latents. With `--cfg-parallel` the ranks
form two halves, one per CFG branch (`cfg`). Rank 0 decodes and writes, with every rank's timing
(`gather_to_writer`); the others write nothing. The process group is NCCL on CUDA (one GPU per local rank) and gloo on the CPU.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Callable, Iterator, Mapping, Sequence

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


def check_launch(ulysses: int, launch: Launch | None, command: str = "t2v", cfg_parallel: bool = False) -> None:
    """Refuse `--ulysses` / `--cfg-parallel` without a launcher of as many processes (ulysses, times 2 with
    cfg_parallel), and several processes without either.

    Raises:
        BadInput: a parallel run outside torchrun, a world size other than ulysses x (2 with cfg_parallel), or a
            launch of several processes with neither (each would write the same files).
    """
    world = 1 if launch is None else launch.world_size
    need = ulysses * (2 if cfg_parallel else 1)
    flags = " ".join(([f"--ulysses {ulysses}"] if ulysses > 1 else []) + (["--cfg-parallel"] if cfg_parallel else []))
    if need > 1 and launch is None:
        raise BadInput(f"{flags} splits the run across {need} processes: add --gpus {need} (or start it with "
                       f"torchrun --nproc_per_node {need} -m vsagen {command} ... {flags})")
    if need != world:
        if need == 1:
            raise BadInput(f"this command runs in {world} processes (torchrun): give --ulysses {world} to split the "
                           "sequence across them"
                           + (f" (or --cfg-parallel with --ulysses {world // 2})" if world % 2 == 0 else "")
                           + ", or start one process")
        how = f" (2 x --ulysses {ulysses})" if cfg_parallel and ulysses > 1 else ""
        raise BadInput(f"{flags} needs {need} processes{how}, torchrun started {world} "
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


@contextlib.contextmanager
def joined(launch: Launch | None, request: Any, prepare: Callable[[], Any] = lambda: None) -> Iterator[None]:
    """Run the body as this launch's rank of a multi-process `request` (a `vsagen.request.resolve.Request` whose
    `processes` > 1): `prepare()` first, before the group exists (the caller's files to build: e.g. the tiny checkpoint,
    `vsagen.models.loading.prepare_model_files`, which transformers writes on rank 0 only under a group), the process
    group joined (`start`), and left after the body (`finish`), however it ends. Outside a launch, or for a one-process
    request, just the body.

    Raises:
        BadInput: as `start`; whatever `prepare` raises.
    """
    if launch is not None and request.processes > 1:
        prepare()
        start(launch, request.device)
    try:
        yield
    except KeyboardInterrupt:
        finish(wait=False)
        raise
    finally:
        finish()


def finish(wait: bool = True) -> None:
    """Wait for every rank (`wait`), then leave the process group (nothing if none was joined).

    An interrupted rank leaves without waiting (`wait=False`): a peer may sit in a collective this rank will never
    join (rank 1 in `gather_to_writer` while rank 0 decodes), and a barrier would then block both in C++, where
    no signal reaches Python, until the launcher's SIGKILL; without it this process ends, its connections
    close, and the peer's collective fails at once (an error that its own held signal turns into its interrupt)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        return
    if wait:
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


def enable_ulysses(transformer: Any, degree: int, mesh: Any = None) -> None:
    """Split `transformer`'s sequence across the `degree` ranks of the current process group (diffusers'
    `enable_parallelism` with `ContextParallelConfig(ulysses_degree=degree)` and `ulysses.context_parallel_plan`);
    call it after `vsagen.apply` (its processors must be in place to receive the parallel config). `mesh`: a device
    mesh with "ring" (size 1) and "ulysses" (size degree) dimensions among others (CFG parallel's,
    `cfg.cfg_ranks`), else diffusers builds one over the whole group.

    Raises:
        RuntimeError: no process group (`start` first).
    """
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    from .ulysses import context_parallel_plan

    if not dist.is_initialized():
        raise RuntimeError("enable_ulysses needs the process group: call vsagen.parallel.launch.start first")
    # diffusers 0.42's hooks gather the output with a torch function torch deprecates: a FutureWarning on every
    # rank's first step that its users cannot act on
    warnings.filterwarnings("ignore", message=r".*all_gather_tensor.* is deprecated", category=FutureWarning)
    with _one_device_on_cpu():
        transformer.enable_parallelism(config=ContextParallelConfig(ulysses_degree=degree, mesh=mesh),
                                       cp_plan=context_parallel_plan(transformer))


def disable_ulysses(transformer: Any) -> None:
    """Undo `enable_ulysses` (nothing where it was not enabled): remove diffusers' context-parallel hooks of
    vsagen's plan and forget the parallel config, so that the transformer runs in one process again, or gets
    `enable_ulysses` anew (diffusers refuses a second `enable_parallelism` while a config is recorded). The
    processors that received the config are vsagen's, removed with `vsagen.apply`'s handle."""
    from diffusers.hooks.context_parallel import remove_context_parallel

    from .ulysses import context_parallel_plan

    if getattr(transformer, "_parallel_config", None) is None:
        return
    remove_context_parallel(transformer, context_parallel_plan(transformer))
    transformer._parallel_config = None  # back to the class's None


def enable_parallel(transformers: Sequence[Any], ulysses: int, cfg_parallel: bool, device: str,
                    timer: Any) -> Any:
    """Switch on a multi-process run's parallelism for every transformer of a pipeline (each expert), after
    `vsagen.apply`: Ulysses over `ulysses` ranks (if > 1) and, with `cfg_parallel`, one CFG branch per half of the
    ranks (`cfg.CfgSplit`, returned: set its `negative` before each pipeline call, `remove()` it after; then
    `disable_ulysses` each transformer, so that the next run can switch on its own).

    Returns:
        The installed `cfg.CfgSplit`, or None without `cfg_parallel`.

    Raises:
        RuntimeError: no process group, or one of another size than ulysses x (2 with cfg_parallel).
    """
    ranks = None
    if cfg_parallel:
        from .cfg import cfg_ranks

        ranks = cfg_ranks(ulysses, device)
    if ulysses > 1:
        for t in transformers:
            enable_ulysses(t, ulysses, mesh=None if ranks is None else ranks.mesh)
    if ranks is None:
        return None
    from .cfg import CfgSplit

    return CfgSplit(ranks.branch, ranks.group, timer).install(transformers)


def gather_to_writer(row: dict) -> list[dict] | None:
    """Every rank's `row` (a small JSON-ready dict, e.g. `TimingReport.rank_row`), in rank order, on rank 0; None
    on the other ranks. A collective: every rank of the process group calls it."""
    import torch.distributed as dist

    rows: list | None = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(row, rows, dst=0)
    return rows
