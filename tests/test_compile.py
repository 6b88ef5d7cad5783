"""`--compile`: the transformer blocks under torch.compile (inductor on CPU here).

A backend that can be traced (`full`, `vsa` with the torch reference or with the Triton kernels, which run as the
custom ops `vsagen::coarse_stage` and `vsagen::block_sparse_attn`, here under the Triton interpreter) is compiled
into each block's graph with no graph break (`fullgraph=True`); a backend that cannot be traced keeps the graph
breaks around it and runs, timed, between the graphs. The tiny model, small sizes; each test pays one
compilation (seconds to tens of seconds on CI).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from conftest import assert_one_error_line, make_transformer
from typer.testing import CliRunner

from vsagen.attention import make_backend, resolve_spec
from vsagen.attention.full import FullAttention
from vsagen.attention.hooks import patch_transformer
from vsagen.cli.app import app
from vsagen.compiling import compile_breaks, compile_untimed
from vsagen.timing import Timer, TimingReport

runner = CliRunner()
SMALL = ["--frames", "5", "--height", "64", "--width", "64", "--steps", "2"]

# Compiled (inductor, CPU) vs eager fp32 block outputs: the same ops on the same inputs, but inductor fuses the
# elementwise chains (layer norms, modulation, RMS norm, RoPE, GELU) and reorders their fp32 arithmetic; the
# attention kernels themselves run unchanged. Observed up to 3.0e-7 on outputs of magnitude ~3.6 (a few ulps);
# 1e-5 is ~30x that. A wrong token order or a dropped attention term moves outputs by 1e-2 or more.
TOL_COMPILED_BLOCK = 1e-5

LATENT = (16, 5, 12, 20)  # (C, F_lat, H_lat, W_lat) -> grid (5, 6, 10), 300 tokens, 12 tiles (10 partial)
TEXT_LEN = 9
# name -> (--attn, sparsity, --attn-impl, with the backend's trained per-layer weights: VSA's gate
# attn1.to_gate_compress, sla-star's projection attn1.sla_proj_l, the compiler backend)
# What these cases guard is vsagen's side: that dynamo traces each backend into one graph (no graph break, the
# Triton stages as custom ops with fake implementations that AOTAutograd's functionalization accepts). Inductor's
# C++ code generation on top of that is torch's, and cost 11-31 s of CPU a case (pytest --durations, 2-core
# machine, 2026-12-07): every case runs under "aot_eager" (dynamo + AOTAutograd, no code generation), and
# test_compiled_t2v_gives_the_frames_of_eager runs inductor end to end on the gated Triton path (the Triton custom
# ops lowered as inductor's fallback kernels inside the compiled blocks, what `--compile` runs on a GPU).
BLOCK_CASES = {
    "full": ("full", None, "auto", False, "aot_eager"),
    "vsa-torch-gate": ("vsa", 0.5, "torch", True, "aot_eager"),
    # (the Triton path without gates is the gated one's subset: left to the gated case, for the suite's time)
    "vsa-triton-gate": ("vsa", 0.5, "triton", True, "aot_eager"),
    "sla-star-global-proj": ("sla-star", 0.5, "torch", True, "aot_eager"),
    "sla-star:scope=marginal-proj": ("sla-star:scope=marginal", 0.5, "torch", True, "aot_eager"),
}


def block_inputs(transformer, seed: int):
    """Fresh random inputs of blocks[0] as the transformer forward hands them over: hidden states (1, S, dim) in
    raster order (blocks[0]'s tile-order pre-hook reorders them), text states (1, TEXT_LEN, dim), the timestep
    projection (1, 6, dim) and the RoPE tables (a `TiledRope` once the tile-order hooks are installed)."""
    g = torch.Generator().manual_seed(seed)
    dim = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    c, f, h, w = LATENT
    s = f * (h // 2) * (w // 2)
    with torch.no_grad():
        rope = transformer.rope(torch.randn(1, c, f, h, w, generator=g))
    return (torch.randn(1, s, dim, generator=g), torch.randn(1, TEXT_LEN, dim, generator=g),
            torch.randn(1, 6, dim, generator=g) * 0.1, rope)


def patched_block(case: str, timer: Timer):
    """blocks[0] of the tiny transformer (seeded random weights) patched with the case's backend, and the
    transformer."""
    attn, sparsity, impl, gate, _ = BLOCK_CASES[case]
    transformer = make_transformer()
    backend = resolve_spec(attn, flags={"--sparsity": sparsity, "--attn-impl": impl}).build()
    if gate:
        torch.manual_seed(1)
        for block in transformer.blocks:
            out_f, in_f = backend.weights.shapes(block.attn1)["weight"]
            setattr(block.attn1, backend.weights.attr, torch.nn.Linear(in_f, out_f))
    patch_transformer(transformer, backend, timer)
    return transformer.blocks[0], transformer, backend


@pytest.mark.parametrize("case", list(BLOCK_CASES))
def test_block_compiles_without_graph_breaks_and_matches_eager(case):
    """blocks[0] compiled as `compile_transformers` does (diffusers' `compile_repeated_blocks` calls
    `block.compile(fullgraph=True, dynamic=False)`), under the case's compiler backend: no graph break anywhere (fullgraph raises on one; dynamo's
    break counter stays empty), the block's forward is one graph holding the attention (the Triton stages as the
    two custom ops), blocks[0]'s tile-order pre-hook a graph of its own; on fresh inputs (not the ones it was
    compiled with) the compiled block gives the eager block's output, and no region is timed inside it."""
    from torch._dynamo import lookup_backend
    from torch._dynamo.utils import counters

    graphs = []
    compiler = lookup_backend(BLOCK_CASES[case][4])

    def recording(gm, example_inputs):  # the case's compiler backend, recording the graphs dynamo hands it
        graphs.append(gm)
        return compiler(gm, example_inputs)

    timer = Timer("cpu")
    block, transformer, backend = patched_block(case, timer)
    assert compile_breaks([backend]) is None
    fresh = block_inputs(transformer, seed=2)
    with torch.no_grad():
        eager = block(*fresh)
        torch._dynamo.reset()
        counters.clear()
        block.compile(fullgraph=True, dynamic=False, backend=recording)
        block(*block_inputs(transformer, seed=1))  # compiles
        compiled = block(*fresh)
    assert dict(counters["graph_break"]) == {}
    assert len(graphs) == (2 if backend.tiled else 1)  # the pre-hook's gather, then the block's forward
    code = graphs[-1].code
    if BLOCK_CASES[case][2] == "triton":
        assert "torch.ops.vsagen.coarse_stage" in code and "torch.ops.vsagen.block_sparse_attn" in code
    else:
        assert "vsagen" not in code
    assert compiled.shape == eager.shape == fresh[0].shape
    assert (compiled - eager).abs().max().item() <= TOL_COMPILED_BLOCK
    # Eager forwards record attn1 and self_attention; the compiled one records nothing.
    names = [n for n, _, _ in timer.finish()]
    assert names.count("attn1") == 1 and names.count("self_attention") == 1


class _UntraceableFull(FullAttention):
    """`full` declared not traceable: the fallback path (graph breaks around the backend)."""

    name = "untraceable-full"
    traceable = False


def test_untraceable_backend_runs_between_graphs_and_stays_timed():
    """A backend that is not `traceable` is not asked to trace: `compile_breaks` names it (so
    `compile_transformers` keeps fullgraph=False), the block graph breaks around `run_backend_eager`, and the
    backend runs eagerly inside the compiled block, timed, with the same output."""
    from torch._dynamo.utils import counters

    backend = _UntraceableFull()
    assert "untraceable-full" in compile_breaks([FullAttention(), backend])
    assert compile_untimed(backend) == ("attn1",)
    timer = Timer("cpu")
    transformer = make_transformer()
    patch_transformer(transformer, backend, timer)
    block = transformer.blocks[0]
    inputs = block_inputs(transformer, seed=3)
    with torch.no_grad():
        eager = block(*inputs)
        torch._dynamo.reset()
        counters.clear()
        block.compile(fullgraph=False, dynamic=False, backend="eager")
        compiled = block(*inputs)
    assert sum(counters["graph_break"].values()) >= 1
    assert torch.equal(compiled, eager)  # dynamo's eager backend: the same ops
    names = [n for n, _, _ in timer.finish()]
    assert names.count("self_attention") == 2 and names.count("attn1") == 1  # eager, then compiled: backend only


def test_compile_breaks_names_the_reason():
    vsa = make_backend("vsa", 0.5, "torch")
    assert compile_breaks([FullAttention(), vsa]) is None
    assert compile_untimed(vsa) == ("attn1", "self_attention")
    assert "--offload group" in compile_breaks([vsa], offload="group")


def test_report_of_untimed_regions():
    """Regions compiled into the graphs are None (JSON null, 'not timed' in the table), never 0."""
    records = [("dit", 0, 2.0), ("total", -1, 3.0), ("self_attention", 0, 0.5), ("self_attention/fine", 0, 0.4)]
    timed = TimingReport.from_records(records, "cpu", untimed=("attn1",))
    assert timed.attn1_s is None and timed.self_attention_s == 0.5 and timed.attention_share_of_dit == 0.25
    assert timed.self_attention_stages_s == {"fine": 0.4}
    report = TimingReport.from_records(records[:2], "cpu", untimed=("attn1", "self_attention"))
    assert report.attn1_s is None and report.self_attention_s is None and report.attention_share_of_dit is None
    assert report.self_attention_stages_s == {}
    assert json.loads(json.dumps(report.to_dict()))["self_attention_s"] is None
    from rich.console import Console

    con = Console(width=120, record=True)
    con.print(report.rich_table())
    text = con.export_text()
    assert "attention backend" in text and "not timed" in text
    with pytest.raises(ValueError):
        TimingReport.from_records(records, "cpu", untimed=("dit",))


def random_gate_file(path):
    """A safetensors file of fresh random VSA gates (`blocks.{i}.attn1.to_gate_compress.{weight,bias}`) for every
    layer of the tiny transformer, as `--attn vsa:gate_weights=FILE` reads them."""
    from safetensors.torch import save_file

    torch.manual_seed(4)
    tensors = {}
    for i, block in enumerate(make_transformer().blocks):
        gate = torch.nn.Linear(block.attn1.to_q.in_features, block.attn1.to_q.out_features)
        tensors.update({f"blocks.{i}.attn1.to_gate_compress.{n}": p.detach() for n, p in gate.named_parameters()})
    save_file(tensors, path)
    return path


@pytest.mark.slow
def test_compiled_t2v_gives_the_frames_of_eager(tiny_dir, tmp_path, encoder_frames):
    """vsa with its trained gates on the Triton kernels (the custom ops, here under the Triton interpreter) with and
    without --compile (inductor: the ops lowered as its fallback kernels inside each block's graph): same frames
    (compiled fp32 arithmetic rounds a little differently: at most 1 uint8 level apart), every block one graph
    (fullgraph; a graph break would fail the run), the attention rows null with a note that says why, and no
    recompilation in the timed steps (the warm-up step pays the compilation: timed steps are far below it)."""
    gates = random_gate_file(tmp_path / "gates.safetensors")
    common = ["--model", "tiny", "--attn", f"vsa:gate_weights={gates}:impl=triton", "--warmup", "1", *SMALL,
              "--json"]
    eager = runner.invoke(app, ["t2v", "a fox", *common, "--out", str(tmp_path / "eager.mp4")])
    assert eager.exit_code == 0, eager.output
    res = runner.invoke(app, ["t2v", "a fox", *common, "--compile", "--out", str(tmp_path / "comp.mp4")])
    assert res.exit_code == 0, res.output
    data, eager_data = json.loads(res.stdout), json.loads(eager.stdout)
    t = data["timing"]
    assert data["config"]["compile"] is True and eager_data["config"]["compile"] is False
    for d in (data, eager_data):  # the gated Triton path ran in both
        assert d["backend"]["impl"] == "triton" and (d["backend_weight_layers"], d["layers"]) == (2, 2), d["backend"]
    assert data["compile_fullgraph"] is True and eager_data["compile_fullgraph"] is None
    # Inside the compiled graphs: not timed, and said so (null, not 0).
    assert t["self_attention_s"] is None and t["self_attention_stages_s"] == {}
    assert t["attn1_s"] is None and t["attention_share_of_dit"] is None
    assert t["dit_s"] > 0 and eager_data["timing"]["self_attention_s"] > 0
    note = next(n for n in t["notes"] if "--compile" in n)
    assert "no graph breaks" in note and "vsagen profile --kernels" in note
    assert f"note: {note}" in res.stderr  # printed too, not only in the JSON (new-user trial)
    assert t["warmup_s"] > 3 * max(t["dit_per_step_s"])  # compilation stayed in the warm-up
    assert 0 < t["warmup_parts_s"]["compile"] < t["warmup_parts_s"]["denoise"]  # and the run JSON says how much
    a, b = encoder_frames["eager"].astype(int), encoder_frames["comp"].astype(int)
    assert a.shape == b.shape == (5, 64, 64, 3)
    assert np.abs(a - b).max() <= 1


@pytest.mark.slow
def test_compiled_profile_rows(tiny_dir, tmp_path, monkeypatch):
    """--compile in profile: attention columns null, compile_fullgraph, the plot's "not timed" bar drawn into a
    folder that did not exist, and --warmup 0 flagged (its timed steps include the compilation). What is tested is
    profile's handling of compiled blocks, so the blocks compile under "aot_eager" (dynamo + AOTAutograd, fullgraph
    as ever) instead of inductor's C++ code generation (12 s of the suite's CPU; t2v's test above runs inductor)."""
    module_compile = torch.nn.Module.compile
    monkeypatch.setattr(torch.nn.Module, "compile",
                        lambda self, *a, **k: module_compile(self, *a, **{**k, "backend": "aot_eager"}))
    plot = tmp_path / "new" / "dit.png"
    res = runner.invoke(app, ["profile", "--model", "tiny", "--attn", "full,vsa", "--steps", "1", "--no-stock",
                              "--compile", "--warmup", "0", "--format", "json", "--plot", str(plot)])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["settings"]["compile"] is True and data["compile_fullgraph"] is True
    assert any("--warmup 0" in n and "compiler" in n for n in data["notes"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    full, vsa = data["rows"]
    assert full["speedup_vs_full"] == 1.0 and vsa["speedup_vs_full"] > 0 and full["dit_s_per_step"] > 0
    for row in (full, vsa):  # the attention is compiled into the blocks: not measured, not 0
        assert row["attention_s_per_step"] is None and row["attention_share_of_dit"] is None
        assert row["attention_stages_s_per_step"] == {} and row["attn1_s_per_step"] is None
    assert vsa["layout_s_per_step"] > 0  # the reorderings outside the blocks are still timed
    assert any("no graph breaks" in n and "--kernels" in n for n in data["notes"])
    assert 0 < vsa["latents_rel_l2_vs_full"] < 1


def test_compile_with_kernels_is_refused(tiny_dir):
    res = runner.invoke(app, ["profile", "--model", "tiny", "--kernels", "--compile"])
    assert res.exit_code == 2
    assert "--compile" in assert_one_error_line(res.stderr, res.stdout)


def test_torch_compile_failures_name_the_option(monkeypatch, tmp_path):
    """An error raised inside torch.compile (inductor, dynamo) names neither vsagen nor --compile: the one error
    line says where it came from (new-user trial: a broken C++ toolchain gave a bare InductorError)."""
    from torch._inductor.exc import InductorError

    import vsagen.commands.generate

    def broken(*args, **kwargs):
        try:
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")
        except RuntimeError as e:
            raise InductorError(e, "") from e

    monkeypatch.setattr(vsagen.commands.generate, "generate", broken)
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", *SMALL, "--compile", "--out",
                              str(tmp_path / "x.mp4")])
    assert res.exit_code == 1
    line = assert_one_error_line(res.stderr, res.stdout)
    assert "InductorError" in line and "try without --compile" in line
    monkeypatch.setattr(vsagen.commands.generate, "generate", lambda *a, **k: (_ for _ in ()).throw(ValueError("plain")))
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", *SMALL, "--out", str(tmp_path / "y.mp4")])
    assert res.exit_code == 1 and "--compile" not in res.stderr
