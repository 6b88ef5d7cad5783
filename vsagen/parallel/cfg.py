"""CFG parallel (issue 15): with classifier-free guidance on, the conditional and the unconditional transformer passes
of every step run on different ranks, and the two predictions are exchanged, so that every rank combines the guidance
exactly as one process does.

diffusers 0.42.1 has no CFG-parallel mechanism (its `ParallelConfig` holds context and tensor parallelism only), so
vsagen runs it around diffusers' own denoising loop: the Wan pipelines call each step's transformer twice, inside
`cache_context("cond")` and then `cache_context("uncond")`, with the same latents. `CfgSplit` wraps both methods on
the transformer instances: in the "cond" call, a rank of branch 0 runs the conditional pass and a rank of branch 1
the unconditional one (the negative prompt embeddings swapped in); the pair all-gathers the two predictions, the call
returns the conditional one and keeps the unconditional one for the "uncond" call, which then runs nothing.

Ranks: a run of W = 2 x U processes (U = `--ulysses`, 1 without it) is a device mesh ("cfg", "ring", "ulysses") of
shape (2, 1, U): rank r is in branch r // U (0 conditional, 1 unconditional) at Ulysses position r % U; the U ranks of
a branch split its sequence (diffusers' context parallelism on the mesh's "ulysses" dimension), and ranks r and
r + U exchange predictions (the "cfg" dimension). Both experts of a two-expert model (Wan2.2 A14B) are wrapped; each
step's pair of calls goes to one of them, with its own guidance scale, applied by diffusers.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from ..errors import BadInput


def check_cfg_parallel(guidance: float, *, offload: str, compile: bool) -> None:
    """Refuse `--cfg-parallel` where it cannot run (before anything loads).

    Args:
        guidance: the run's CFG scale (of the first expert: diffusers runs the unconditional pass only when it is
            > 1).
        offload: the run's `--offload`; compile: its `--compile`.

    Raises:
        BadInput: guidance <= 1 (no unconditional pass to run elsewhere), offloading, or torch.compile.
    """
    if guidance <= 1.0:
        raise BadInput(f"--cfg-parallel runs the unconditional pass on other processes, but --guidance {guidance:g} "
                       "turns classifier-free guidance off (it needs a scale > 1); drop --cfg-parallel")
    if offload != "none":
        raise BadInput(f"--cfg-parallel cannot run with --offload {offload} (multi-process runs keep the weights on "
                       "the GPU); use --offload none")
    if compile:
        raise BadInput("--cfg-parallel with --compile is not supported yet; drop --compile")


@dataclass(frozen=True)
class CfgRanks:
    """Where this rank sits in a CFG-parallel run.

    Attributes:
        mesh: the ("cfg", "ring", "ulysses") device mesh of shape (2, 1, U); diffusers' context parallelism takes
            it (`ContextParallelConfig(mesh=...)`) when U > 1.
        branch: 0 (conditional pass) or 1 (unconditional pass).
        group: the process group of the pair that exchanges predictions (this rank and its peer in the other
            branch, in branch order).
    """

    mesh: Any
    branch: int
    group: Any


def cfg_ranks(ulysses: int, device: str) -> CfgRanks:
    """Build the device mesh of a CFG-parallel run (every rank calls it; the process group must exist and hold
    2 x `ulysses` processes).

    Raises:
        RuntimeError: no process group, or a world size other than 2 x ulysses.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if not dist.is_initialized() or dist.get_world_size() != 2 * ulysses:
        raise RuntimeError(f"CFG parallel with Ulysses {ulysses} needs a process group of {2 * ulysses} ranks "
                           "(vsagen.parallel.launch.start)")
    mesh = init_device_mesh("cuda" if device == "cuda" else "cpu", (2, 1, ulysses),
                            mesh_dim_names=("cfg", "ring", "ulysses"))
    return CfgRanks(mesh, mesh.get_local_rank("cfg"), mesh["cfg"].get_group())


@dataclass
class CfgSplit:
    """The wrappers that run one CFG branch per rank (module docstring). Set `negative` to the pipeline call's
    negative prompt embeddings before each call; `remove()` restores the transformers.

    Attributes:
        branch: 0 (this rank runs the conditional passes) or 1 (the unconditional ones).
        group: the pair's process group (`CfgRanks.group`).
        timer: receives "cfg_exchange" around each exchange; a served "uncond" call's "dit" regions are discarded
            (no forward ran).
        negative: (1, L, text_dim) negative prompt embeddings, swapped in by branch 1.
    """

    branch: int
    group: Any
    timer: Any
    negative: Any = None
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def install(self, transformers: Sequence[Any]) -> "CfgSplit":
        """Wrap `cache_context` and `forward` of every transformer (after diffusers' context parallelism, whose
        hooks replace `forward` too: these wrappers go outside them). Returns self."""
        from ..wrapping import wrap_method

        for t in transformers:
            state: dict[str, Any] = {"name": None, "pending": None}
            self._undo.append(wrap_method(t, "cache_context", lambda orig, st=state: self._context(orig, st)))
            self._undo.append(wrap_method(t, "forward", lambda orig, st=state: self._forward(orig, st)))
        return self

    def remove(self) -> None:
        """Give the transformers their own methods back (again: nothing)."""
        while self._undo:
            self._undo.pop()()

    @staticmethod
    def _context(original: Callable, state: dict[str, Any]) -> Callable:
        @contextlib.contextmanager
        def cache_context(name: str, **kwargs: Any) -> Iterator[None]:
            state["name"] = name
            try:
                with original(name, **kwargs):
                    yield
            finally:
                state["name"] = None
        return cache_context

    def _forward(self, original: Callable, state: dict[str, Any]) -> Callable:
        def forward(*args: Any, **kwargs: Any) -> Any:
            name = state["name"]
            if args or "hidden_states" not in kwargs or kwargs.get("return_dict", True):
                raise RuntimeError("CFG parallel: the transformer must be called with keyword arguments and "
                                   "return_dict=False (as diffusers' Wan pipelines do)")
            if name == "cond":
                return self._both(original, state, kwargs)
            pending, state["pending"] = state["pending"], None
            if name != "uncond" or pending is None or pending[0] is not kwargs["hidden_states"]:
                raise RuntimeError(f"CFG parallel: a transformer call in context {name!r} that is not the "
                                   "unconditional half of a conditional call on the same latents")
            self.timer.discard("dit")  # served by the exchange: no forward ran on this rank
            return (pending[1],)
        return forward

    def _both(self, original: Callable, state: dict[str, Any], kwargs: dict[str, Any]) -> tuple[Any]:
        """This rank's branch of a "cond" call, then the pair's exchange: returns (conditional prediction,), keeps
        the unconditional one for the "uncond" call."""
        import torch
        import torch.distributed as dist

        if self.branch == 1:
            if self.negative is None:
                raise RuntimeError("CFG parallel: no negative prompt embeddings for the unconditional branch")
            cond = kwargs["encoder_hidden_states"]
            kwargs = {**kwargs, "encoder_hidden_states": self.negative.to(cond.device, cond.dtype)}
        mine = original(**kwargs)[0].contiguous()
        both = [torch.empty_like(mine) for _ in range(2)]
        with self.timer.region("cfg_exchange"):
            dist.all_gather(both, mine, group=self.group)
        state["pending"] = (kwargs["hidden_states"], both[1])
        return (both[0],)
