"""`--compile` and the eager runs' fused block regions: which runs get which, why a compiled block graph breaks, what
a compiled run cannot time, and the run notes that say so (used by `vsagen.pipeline.Session` and `vsagen profile`).
"""

from __future__ import annotations

from typing import Any, Sequence

from .architecture import experts

# `--compile`: dynamo's per-code-object cache must hold the block graphs of every configuration a process runs
# (`vsagen profile` recompiles per backend / tile fit; blocks[0] carries the tile-order pre-hook).
COMPILE_CACHE_SIZE = 64


FUSED_BLOCKS_NOTE = ("eager blocks: each transformer block's elementwise modulation, norm and gated-residual steps "
                     "run as small torch.compile regions (vsagen.blocks; same arithmetic as diffusers; "
                     "VSAGEN_FUSED_BLOCKS=0 in the environment of the vsagen command turns them off), compiled in the "
                     "first step")


def fused_blocks_note(warmup: int) -> str:
    """The run note for `vsagen.blocks`' regions; with no warm-up step their compile time is inside the timed
    first step, and the note says so."""
    if warmup > 0:
        return FUSED_BLOCKS_NOTE + " (a warm-up step)"
    return FUSED_BLOCKS_NOTE + ", which is timed (--warmup 0): pass --warmup 1 to keep the compile time out"


def fused_blocks_apply(device: str, compiled: bool, offload: str = "none", enabled: bool = True) -> bool:
    """Whether a run gets `vsagen.blocks`' compiled elementwise regions: eager (not `--compile`, which compiles
    whole blocks) CUDA runs without offloading (its hooks replace the blocks' forward), when the run's
    `fused_blocks` setting (`enabled`) allows them."""
    return enabled and device.startswith("cuda") and not compiled and offload == "none"


def compile_breaks(backends: Sequence[Any], offload: str = "none") -> str | None:
    """Why `--compile` cannot compile each transformer block as one graph, or None when it can.

    Args:
        backends: the attention backends the compiled blocks will run (`AttentionBackend`s).
        offload: the run's `--offload`.

    Returns:
        None when every backend is `traceable` and nothing else breaks the graph; else the reason, for the
        run's notes: a backend that is not traceable (its call runs eagerly between graphs), or `--offload
        group`, whose per-block onload hook diffusers (0.42.1) keeps out of torch.compile.
    """
    eager = [b.name for b in backends if not b.traceable]
    if eager:
        return f"--attn {', '.join(eager)} cannot be traced, so it runs between the compiled graphs"
    if offload == "group":
        return "--offload group's onload hook on every block is not traceable"
    return None


def compile_untimed(backend: Any) -> tuple[str, ...]:
    """The regions a `--compile` run cannot time with `backend` (`TimingReport.from_records(untimed=...)`):
    "attn1" (the processor is compiled into the block graphs), and "self_attention" when the backend is
    `traceable`, so that it is compiled into them too."""
    return ("attn1", "self_attention") if backend.traceable else ("attn1",)


def compile_note(breaks: str | None, in_graph: Sequence[str], warmup: int) -> str:
    """The run's note on `--compile` (`vsagen t2v` / `i2v` and `vsagen profile` alike).

    Args:
        breaks: `compile_breaks`' reason, or None (each block one graph).
        in_graph: names of the backends compiled into the graphs (`traceable`), so not timed.
        warmup: untimed warm-up steps; 0 means the timed steps include the compilation.
    """
    note = ("--compile: every transformer block is one compiled graph (torch.compile, no graph breaks)"
            if breaks is None else f"--compile: transformer blocks compiled with graph breaks ({breaks})")
    if in_graph:
        note += (f"; the attention backend ({', '.join(in_graph)}) runs inside the graphs, so neither attn1 nor "
                 "the backend and its stages are timed (null in the JSON, '-' in profile tables): `vsagen profile "
                 "--kernels` times the attention alone")
    else:
        note += "; attn1 is inside the graphs and not timed, the attention backend is"
    note += "; layout counts only the reorderings outside the blocks (blocks[0]'s gather is compiled)"
    if not warmup:
        note += "; --warmup 0: the timed steps include the compilation, so their times measure the compiler"
    return note


def compile_transformers(pipe: Any, *, fullgraph: bool) -> None:
    """torch.compile every transformer's repeated blocks (diffusers' `compile_repeated_blocks`, one graph
    shared by all `WanTransformerBlock`s; `dynamic=False`, as the shapes of a run are fixed).

    Args:
        pipe: a Wan pipeline whose transformers are patched (or about to be) with vsagen's processor.
        fullgraph: True (see `compile_breaks`) compiles each block's forward as one graph, the attention backend
            included (its custom ops, e.g. `vsagen::coarse_stage` and `vsagen::block_sparse_attn`, are nodes of
            it), and any graph break is an error at the first forward. False lets the graphs break: around a
            backend that is not `traceable` (`run_backend_eager`), or at diffusers' group-offload hooks.

    Projections, q/k norm and RoPE, the output projection, cross-attention, FFN and modulation are compiled in
    either mode; blocks[0]'s tile-order pre-hook (a gather of the hidden states) is compiled as a graph of its
    own. Regions inside the graphs are not timed (`compile_untimed`). Compilation happens on the first forward
    of each configuration: `--warmup` keeps it out of the timed steps.
    """
    import torch

    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, COMPILE_CACHE_SIZE)
    for _, t in experts(pipe):
        t.compile_repeated_blocks(fullgraph=fullgraph, dynamic=False)
