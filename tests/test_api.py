"""vsagen.apply (vsagen/api.py): the Python API on a diffusers WanPipeline the user built (conftest's `tiny_pipe`,
float32 on CPU), and the README's "Python API" example run as pasted (it loads its pipeline with
`vsagen.load_pipeline`, whose own tests are in models/test_loading.py)."""

from __future__ import annotations

import os
import re
import warnings
from pathlib import Path

import pytest
import torch

import vsagen
from vsagen.attention import BackendSpec, make_backend
from vsagen.errors import BadInput

# Fewest steps that exercise the loop and the step counter (CFG on: two transformer forwards a step).
STEPS = 2
# The tiny pipeline's call: 9 frames of 80 x 112 -> latent 3 x 10 x 14, grid 3 x 5 x 7 (partial tiles only).
CALL = {"prompt": "a red fox in the snow", "num_frames": 9, "height": 80, "width": 112, "num_inference_steps": STEPS,
        "output_type": "latent", "return_dict": False}
# `full` through vsagen's processor vs diffusers' own: the same SDPA on q/k/v built by the same ops (RoPE rounds
# identically in fp32, tests/attention/test_processor.py TOL_FULL_FP32 = 1e-6 per forward). Relative L2 of the
# final latents after STEPS UniPC steps with CFG: observed 0; 1e-5 allows a different but equally rounded SDPA
# kernel choice.
TOL_FULL_VS_STOCK = 1e-5
# vsa with sparsity 0 selects every tile: dense attention, but in tile order with the fine stage's per-tile softmax
# sums (conftest.py TOL_REORDER_FP32 per forward). Relative L2 of the final latents: observed 4.9e-7;
# 1e-5 is ~20x that. Sparsity 0.5 (the negative control) moves them by ~1.6e-2.
TOL_DENSE_VSA = 1e-5


def latents(pipe) -> torch.Tensor:
    """Final latents of one seeded pipeline call (no VAE decode)."""
    return pipe(**CALL, generator=torch.Generator("cpu").manual_seed(0))[0]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def processors(pipe) -> list:
    return [block.attn1.processor for block in pipe.transformer.blocks]


@pytest.mark.slow
def test_full_reports_dit_and_attention_and_remove_restores_stock(tiny_pipe):
    stock_procs = processors(tiny_pipe)
    stock = latents(tiny_pipe)
    handle = vsagen.apply(tiny_pipe, "full")
    assert handle.spec == BackendSpec("full", handle.backend.options) and handle.backend.name == "full"
    assert all(type(p).__name__ == "VsagenAttnProcessor" for p in processors(tiny_pipe))
    patched = latents(tiny_pipe)
    report = handle.report()
    assert report.dit_forwards == 2 * STEPS  # CFG: two forwards a step
    assert len(report.dit_per_step_s) == STEPS  # steps counted at the scheduler, no callback passed
    assert report.dit_s > 0 and report.self_attention_s > 0 and report.attn1_s >= report.self_attention_s
    assert 0 < report.attention_share_of_dit < 1
    assert report.to_dict()["dit_by_expert_s"].keys() == {"transformer"}
    handle.remove()
    handle.remove()  # a second remove does nothing
    assert processors(tiny_pipe) == stock_procs
    assert "step" not in vars(tiny_pipe.scheduler)  # the scheduler's own method again
    assert not tiny_pipe.transformer._forward_pre_hooks and not tiny_pipe.transformer._forward_hooks
    after = latents(tiny_pipe)
    assert torch.equal(after, stock)  # same ops, same seed: the stock pipeline again
    assert rel(patched, stock) <= TOL_FULL_VS_STOCK


@pytest.mark.slow
def test_vsa_at_sparsity_zero_is_full(tiny_pipe):
    with vsagen.apply(tiny_pipe, "full") as h:
        full = latents(tiny_pipe)
    assert h.report().dit_forwards == 2 * STEPS
    with vsagen.apply(tiny_pipe, "vsa:sparsity=0", impl="torch") as h:
        assert (h.spec.sparsity, h.spec.impl) == (0.0, "torch")
        dense_vsa = latents(tiny_pipe)
    assert rel(dense_vsa, full) <= TOL_DENSE_VSA
    with vsagen.apply(tiny_pipe, "vsa", sparsity=0.5, impl="torch"):
        sparse = latents(tiny_pipe)
    assert rel(sparse, full) > TOL_DENSE_VSA  # negative control: skipping tiles is seen


def test_bad_option_names_the_backend_options(tiny_pipe):
    with pytest.raises(BadInput, match=r"no option 'spasity'.*sparsity, impl, tile, query_rows, gate_weights"):
        vsagen.apply(tiny_pipe, "vsa", spasity=0.9)
    with pytest.raises(BadInput, match=r"no option 'x'.*its options: sparsity"):
        vsagen.apply(tiny_pipe, "vsa:x=1")
    with pytest.raises(BadInput, match="full has no option 'sparsity'; full takes no options"):
        vsagen.apply(tiny_pipe, "full", sparsity=0.5)
    with pytest.raises(BadInput, match=r"sparsity.*\[0, 1\)"):
        vsagen.apply(tiny_pipe, BackendSpec("vsa", make_backend("vsa").options), sparsity=1.5)
    with pytest.raises(BadInput, match="given in the text and as a keyword"):
        vsagen.apply(tiny_pipe, "vsa:sparsity=0.9", sparsity=0.8)
    with pytest.raises(BadInput, match="unknown vsagen.apply backend 'nope'; available: full, vsa"):
        vsagen.apply(tiny_pipe, "nope")
    with pytest.raises(BadInput, match="neither a Wan pipeline"):
        vsagen.apply(object(), "full")
    assert all(type(p).__name__ != "VsagenAttnProcessor" for p in processors(tiny_pipe))  # nothing left behind


def test_backend_is_checked_on_the_transformers_device_and_dtype(tiny_pipe):
    """`apply` asks the backend whether it runs on the transformer's own device and dtype, before anything is
    installed; a refusal is the backend's BadInput."""
    from vsagen.attention.full import FullAttention

    seen = []

    class Refusing(FullAttention):
        def check(self, device, dtype):
            seen.append((device, dtype))
            raise BadInput("not here")

    with pytest.raises(BadInput, match="not here"):
        vsagen.apply(tiny_pipe, Refusing(make_backend("full").options))
    assert seen == [(torch.device("cpu"), torch.float32)]
    assert all(type(p).__name__ != "VsagenAttnProcessor" for p in processors(tiny_pipe))


def test_a_backends_refusal_names_what_a_python_caller_sets(tiny_pipe, monkeypatch):
    """The backends' checks word their refusals for the commands (`--attn-impl triton`, `--dtype bf16`); through
    `apply` they name the Python side (impl='triton', a bf16 pipeline), on the CPU tiny pipeline (no interpreter)."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(BadInput) as exc:
        vsagen.apply(tiny_pipe, "vsa", impl="triton")
    msg = str(exc.value)
    assert msg.startswith("vsagen.apply: ") and "impl='triton'" in msg and "--" not in msg and "\n" not in msg
    with pytest.raises(BadInput) as exc:
        vsagen.apply(tiny_pipe, "vsa:impl=fa4:tile=4x4x8")
    assert "--" not in str(exc.value) and "impl='fa4'" in str(exc.value) and "NVIDIA CUDA GPUs" in str(exc.value)
    assert vsagen.api.python_words("needs --dtype bf16 or fp16") == \
        "vsagen.apply: needs a bf16 or fp16 pipeline: pipe.to(torch.bfloat16)"
    assert all(type(p).__name__ != "VsagenAttnProcessor" for p in processors(tiny_pipe))


def test_bare_transformer_and_timing_only():
    from conftest import make_transformer

    t = make_transformer()
    with vsagen.apply(t, make_backend("full")) as h:
        assert h.device == torch.device("cpu") and all(
            type(b.attn1.processor).__name__ == "VsagenAttnProcessor" for b in t.blocks)
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            t(hidden_states=torch.randn(1, 16, 5, 12, 20, generator=g), timestep=torch.tensor([500.0]),
              encoder_hidden_states=torch.randn(1, 9, 32, generator=g), return_dict=False)
    assert h.report().dit_forwards == 1 and "dit_by_expert_s" in h.report().to_dict()
    with vsagen.apply(t, None) as h:  # timing only: the stock processors stay
        assert h.backend is None and all(type(b.attn1.processor).__name__ != "VsagenAttnProcessor" for b in t.blocks)
    with pytest.raises(BadInput, match="need a backend name or spec"):
        vsagen.apply(t, None, sparsity=0.5)


def test_quant_swaps_the_block_linears_and_remove_puts_them_back():
    """`quant="int8"`: every block linear runs as TurboDiffusion's int8 W8A8 while applied (the output close to the
    float32 one), the originals back after remove(); fp8 on the CPU and unknown precisions refused, nothing
    changed."""
    from conftest import make_transformer, rel_l2
    from vsagen.quant.int8_linear import Int8Linear
    from vsagen.quant.swap import block_linears

    t = make_transformer()
    before = dict(block_linears(t))
    g = torch.Generator().manual_seed(0)
    x = dict(hidden_states=torch.randn(1, 16, 1, 8, 8, generator=g), timestep=torch.tensor([500.0]),
             encoder_hidden_states=torch.randn(1, 5, 32, generator=g), return_dict=False)
    with torch.no_grad():
        want = t(**x)[0]
    with vsagen.apply(t, make_backend("full"), quant="int8") as h:
        assert all(isinstance(t.get_submodule(n), Int8Linear) for n in before)
        assert any("20 block linears run as int8 W8A8" in n for n in h.notes)
        with torch.no_grad():
            got = t(**x)[0]
    assert 0 < rel_l2(got, want) < 2e-2
    assert dict(block_linears(t)) == before  # the same modules back
    with pytest.raises(BadInput, match=r"^vsagen.apply: quant='fp8' needs a GPU with FP8 tensor cores"):
        vsagen.apply(t, None, quant="fp8")
    with pytest.raises(BadInput, match="quant must be one of none, fp8, int8, got 'fp4'"):
        vsagen.apply(t, None, quant="fp4")
    assert dict(block_linears(t)) == before and all(
        type(b.attn1.processor).__name__ != "VsagenAttnProcessor" for b in t.blocks)


def test_import_vsagen_is_light():
    """`vsagen.apply` and `vsagen.load_pipeline` are imported on first use: `import vsagen` loads neither torch nor
    diffusers."""
    import subprocess
    import sys

    code = "import sys, vsagen; print(any(m.split('.')[0] in ('torch', 'diffusers') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert vsagen.__version__ and callable(vsagen.apply) and callable(vsagen.load_pipeline)
    assert {"apply", "load_pipeline", "BackendSpec"} <= set(vsagen.__all__)
    assert vsagen.BackendSpec is BackendSpec  # the README says apply takes "a BackendSpec"
    assert all(getattr(vsagen, name) is not None for name in vsagen.__all__)


def readme_python_api_block(index: int = 0) -> str:
    """The `index`-th ```python block under README.md's "## Python API" heading."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = text.split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)[index]


@pytest.mark.slow
def test_readme_python_api_example_runs_as_pasted(vsagen_cache, capsys):
    """README's example, verbatim, in a namespace of its own: it loads the tiny pipeline itself
    (`vsagen.load_pipeline`), prints the report table, and leaves the pipeline stock."""
    from vsagen.attention.hooks import is_patched

    block = readme_python_api_block()
    assert "torch_dtype" not in block  # diffusers 0.42 takes `dtype=` (torch_dtype is deprecated)
    namespace: dict = {"__name__": "__main__"}
    with warnings.catch_warnings():  # no FutureWarning (diffusers' on `torch_dtype=` among them) from the example
        warnings.simplefilter("error", FutureWarning)
        exec(compile(block, "README.md#python-api", "exec"), namespace)
    out = capsys.readouterr().out
    assert "attention backend" in out and "DiT" in out and "coarse" in out  # vsa's table, its stages included
    assert re.search(r"^full: \d+\.\d{3} s of DiT$", out, re.M)
    assert "{'name': 'vsa', 'sparsity': 0.875, 'impl': 'auto', 'tile': '4x4x4', 'impl_ran': 'torch'}" in out
    pipe = namespace["pipe"]
    assert type(pipe).__name__ == "WanPipeline"
    fresh = vsagen.load_pipeline("tiny")
    assert [type(p) for p in processors(pipe)] == [type(p) for p in processors(fresh)]  # stock processors again
    assert not is_patched(pipe.transformer) and "step" not in vars(pipe.scheduler)  # no hooks, scheduler's own step
    assert not pipe.transformer._forward_pre_hooks and not pipe.transformer._forward_hooks
    assert namespace["video"].shape[-1] == 3  # frames (F, H, W, 3)
    # the next block (issue 30): a few-step sampler on the same pipeline, its scheduler given back
    own = pipe.scheduler
    exec(compile(readme_python_api_block(1), "README.md#python-api-sampler", "exec"), namespace)
    assert namespace["dmd"].name == "dmd" and pipe.scheduler is own


def test_backend_spec_merges_text_and_keywords():
    from vsagen.api import apply, backend_spec
    from vsagen.attention.base import NoOptions
    from vsagen.attention.vsa import VSAOptions

    assert vsagen.apply is apply  # the package attribute is the api module's function
    assert backend_spec("full", {}) == BackendSpec("full", NoOptions())
    spec = backend_spec("vsa:sparsity=0.9", {"impl": "torch"})
    assert spec == BackendSpec("vsa", VSAOptions(0.9, "torch"))
    assert backend_spec(spec, {"sparsity": 0.5}).options == VSAOptions(0.5, "torch")
    assert backend_spec("vsa", {"sparsity": 0}).sparsity == 0.0  # typed from the Options dataclass
    # a str reads as the spec text's value does (sparsity="0" was refused while "vsa:sparsity=0" ran: a trial)
    assert backend_spec("vsa", {"sparsity": "0.5", "tile": "4x4x8"}) == backend_spec("vsa:sparsity=0.5:tile=4x4x8", {})
    with pytest.raises(BadInput, match=r"vsagen.apply: sparsity='half' is not a number"):
        backend_spec("vsa", {"sparsity": "half"})
    # a preset's tables fill what neither the text nor a keyword sets (as the commands' [attention.NAME] tables)
    fastwan = {"vsa": {"sparsity": 0.8}}
    assert backend_spec("vsa", {}, fastwan).sparsity == 0.8
    assert backend_spec("vsa:sparsity=0.9", {}, fastwan).sparsity == 0.9
    assert backend_spec("vsa", {"sparsity": 0.5}, fastwan).sparsity == 0.5
    with pytest.raises(BadInput, match="given in the text and as a keyword"):
        backend_spec("vsa:sparsity=0.9", {"sparsity": 0.5})
    with pytest.raises(BadInput, match=r"full has no option 'sparsity'; full takes no options"):
        backend_spec("full", {"sparsity": 0.5})
    with pytest.raises(BadInput, match="unknown vsagen.apply backend 'nope'"):
        backend_spec("nope", {})


@pytest.mark.slow
def test_applying_twice_is_refused_and_the_first_patch_stays_whole(tiny_pipe):
    """A second patch on top of the first would reorder the tokens twice while the layout describes one reordering
    (the new-user trial measured 1.8e-2 wrong latents): it is refused, and after remove() the pipeline is stock."""
    stock = latents(tiny_pipe)
    handle = vsagen.apply(tiny_pipe, "vsa", sparsity=0.5, impl="torch")
    once = latents(tiny_pipe)
    with pytest.raises(BadInput, match="already patched by vsagen"):
        vsagen.apply(tiny_pipe, "vsa", sparsity=0.5, impl="torch")
    with pytest.raises(BadInput, match="already patched by vsagen"):
        vsagen.apply(tiny_pipe, None)
    assert rel(latents(tiny_pipe), once) == 0.0  # the refused call changed nothing
    handle.remove()
    assert rel(latents(tiny_pipe), stock) == 0.0
    with vsagen.apply(tiny_pipe, "full"):  # patchable again
        pass


def test_what_is_not_a_backend_or_a_wan_pipeline_is_one_bad_input(tiny_pipe):
    with pytest.raises(BadInput, match="the backend must be a name"):
        vsagen.apply(tiny_pipe, 5)

    class NotWan:
        transformer = torch.nn.Linear(2, 2)

    with pytest.raises(BadInput, match="neither a Wan pipeline"):
        vsagen.apply(NotWan(), "full")


def test_the_report_of_apply_leaves_the_regions_it_does_not_time_null():
    """New-user trial: apply's report said total_s, text_encode_s, vae_decode_s (and the encodes) 0.0, which read
    as "took no time"; apply times the DiT only, so they are None (null in the JSON), and so is wait_s."""
    from conftest import make_transformer

    from vsagen.api import OUTER_REGIONS

    t = make_transformer()
    with vsagen.apply(t, "full") as h:
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            t(hidden_states=torch.randn(1, 16, 5, 12, 20, generator=g), timestep=torch.tensor([500.0]),
              encoder_hidden_states=torch.randn(1, 9, 32, generator=g), return_dict=False)
    data = h.report().to_dict()
    assert {f"{region}_s" for region in OUTER_REGIONS} == {
        "total_s", "text_encode_s", "denoise_s", "vae_decode_s", "image_encode_s", "condition_encode_s"}
    assert all(data[f"{region}_s"] is None for region in OUTER_REGIONS)
    assert data["wait_s"] is None and data["decode_share_of_wait"] is None and data["write_share_of_wait"] is None
    assert data["dit_s"] > 0 and data["dit_forwards"] == 1
    with h.timer.region("total"):  # a region the caller timed on the handle's timer is reported
        pass
    assert h.report().total_s >= 0 and h.report().text_encode_s is None
    assert h.report(load_s=0.25).load_s == 0.25  # extra fields still set


def test_a_note_a_kernel_gave_is_in_the_report_of_apply(monkeypatch):
    """Issue 44: a kernel that falls back while running (the warp-specialized Gluon forward failing to compile) says
    so through `kernels.runtime_notes`; apply's report carries the note, once however often it is said."""
    from conftest import make_transformer

    import vsagen.kernels.runtime_notes as notes

    monkeypatch.setattr(notes, "_NOTES", [])
    t = make_transformer()
    with vsagen.apply(t, "full") as h:
        assert h.report().notes == []
        notes.add_note("a kernel fell back")
        notes.add_note("a kernel fell back")
    assert h.report().notes == ["a kernel fell back"]


@pytest.mark.parametrize("root,why", [("/nope/no-such-folder", "no such folder"), (__file__, "not a folder")])
def test_a_weights_root_that_is_not_a_folder_is_refused(root, why):
    """New-user trial: `weights_root="/nope"` attached weights to 0 layers and said nothing."""
    from conftest import make_transformer

    t = make_transformer()
    with pytest.raises(BadInput) as exc:
        vsagen.apply(t, "vsa", weights_root=root)
    assert str(exc.value) == f"vsagen.apply: weights_root={root!r}: {why}"
    assert all(type(b.attn1.processor).__name__ != "VsagenAttnProcessor" for b in t.blocks)  # nothing installed


@pytest.mark.slow
def test_checkpoint_gates_load_from_the_folder_the_pipeline_came_from(tiny_dir, tmp_path):
    """A pipeline loaded from a local checkpoint whose transformer safetensors hold trained gates: apply finds them
    without weights_root (as the CLI does), and remove() detaches them."""
    import shutil

    from diffusers import WanPipeline
    from safetensors.torch import load_file, save_file

    ckpt = tmp_path / "gated"
    shutil.copytree(tiny_dir, ckpt)
    weights = next((ckpt / "transformer").glob("*.safetensors"))
    sd = load_file(weights)
    inner = sd["blocks.0.attn1.to_q.weight"].shape
    g = torch.Generator().manual_seed(11)
    layers = sum(1 for k in sd if k.endswith("attn1.to_q.weight"))
    gates = {f"blocks.{i}.attn1.to_gate_compress.weight": torch.randn(*inner, generator=g) for i in range(layers)}
    save_file({**sd, **gates}, weights)
    pipe = WanPipeline.from_pretrained(ckpt, use_safetensors=True)
    with vsagen.apply(pipe, "vsa", sparsity=0.5, impl="torch") as handle:
        assert handle.weight_layers == layers
        assert torch.equal(pipe.transformer.blocks[0].attn1.to_gate_compress.weight,
                           gates["blocks.0.attn1.to_gate_compress.weight"])
    assert not hasattr(pipe.transformer.blocks[0].attn1, "to_gate_compress")
    with vsagen.apply(pipe, "vsa", attach_weights=False) as handle:
        assert handle.weight_layers == 0


def test_a_refused_apply_leaves_the_first_handles_gates_and_remove_restores_what_was_there(tmp_path):
    """Review: a second apply used to attach (and on refusal detach) gates before finding the transformer patched,
    stripping the live first handle's; and remove() deleted any `to_gate_compress`, also one it had not attached."""
    from safetensors.torch import save_file

    from conftest import make_transformer

    t = make_transformer()
    out_f, in_f = t.blocks[0].attn1.to_q.weight.shape
    g = torch.Generator().manual_seed(3)
    f = tmp_path / "g.safetensors"
    save_file({f"blocks.{i}.attn1.to_gate_compress.weight": torch.randn(out_f, in_f, generator=g)
               for i in range(len(t.blocks))}, f)
    own = torch.nn.Linear(in_f, out_f)  # a gate the model had before vsagen came
    t.blocks[0].attn1.to_gate_compress = own
    h1 = vsagen.apply(t, "vsa", impl="torch", gate_weights=f)
    assert h1.weight_layers == len(t.blocks)
    gates = [b.attn1.to_gate_compress for b in t.blocks]
    with pytest.raises(BadInput, match="already patched"):
        vsagen.apply(t, "vsa", impl="torch", gate_weights=f)
    assert [b.attn1.to_gate_compress for b in t.blocks] == gates  # untouched by the refusal
    h1.remove()
    assert t.blocks[0].attn1.to_gate_compress is own  # what was there before, back
    assert not hasattr(t.blocks[1].attn1, "to_gate_compress")


def test_a_failing_patch_leaves_the_transformer_unmarked():
    """Review: an error half-way through patch_transformer left the transformer marked (every later apply refused)
    and half patched."""
    from conftest import make_transformer

    from vsagen.attention.hooks import is_patched, patch_transformer
    from vsagen.timing import Timer

    t = make_transformer()
    stock = [b.attn1.processor for b in t.blocks]
    with pytest.raises(ValueError, match="fused_prologue"):
        patch_transformer(t, make_backend("full"), Timer("cpu"), fused_prologue="sometimes")
    backend = make_backend("vsa", 0.5, "torch")  # tiled: the tile-order hooks come last

    class Boom(RuntimeError):
        pass

    def boom(*a, **k):
        raise Boom

    real = t.proj_out.register_forward_hook  # the very last registration fails
    t.proj_out.register_forward_hook = boom
    with pytest.raises(Boom):
        patch_transformer(t, backend, Timer("cpu"))
    t.proj_out.register_forward_hook = real
    assert not is_patched(t) and [b.attn1.processor for b in t.blocks] == stock
    assert not t._forward_pre_hooks and not t._forward_hooks and not t.rope._forward_hooks
    with vsagen.apply(t, "full"):
        pass


@pytest.mark.slow
def test_the_step_a_backend_sees_starts_at_zero_in_every_call(tiny_pipe):
    """AttnContext.step counts the steps of the current pipeline call (review: it ran -1, 0, ... in warm-up and went
    on counting across calls), while the report's steps count on across calls."""
    from vsagen.attention.full import FullAttention

    class Recording(FullAttention):
        name = "full"

        def __init__(self):
            super().__init__()
            self.steps = []

        def __call__(self, q, k, v, ctx):
            self.steps.append(ctx.step)
            return super().__call__(q, k, v, ctx)

    backend = Recording()
    layers = len(tiny_pipe.transformer.blocks)
    with vsagen.apply(tiny_pipe, backend) as handle:
        latents(tiny_pipe)
        latents(tiny_pipe)
    per_call = [s for s in range(STEPS) for _ in range(2 * layers)]  # CFG: two forwards a step
    assert backend.steps == per_call + per_call
    assert len(handle.report().dit_per_step_s) == 2 * STEPS


def test_a_backend_class_is_one_bad_input_and_a_prepare_without_notes_is_none(tiny_pipe):
    """Review: `apply(pipe, VSAAttention)` (the class) raised a raw AttributeError; a backend whose `prepare` returns
    None (docs/adding-a-backend.md's skeleton with its optional methods left empty) failed after loading."""
    from vsagen.attention.base import Backend
    from vsagen.attention.full import FullAttention
    from vsagen.attention.vsa import VSAAttention

    with pytest.raises(BadInput, match=r"give a backend object \(VSAAttention\(\)\) or its name, not the class"):
        vsagen.apply(tiny_pipe, VSAAttention)

    class Quiet(FullAttention):
        def prepare(self, run):
            Backend.prepare(self, run)  # returns nothing

    with vsagen.apply(tiny_pipe, Quiet()) as handle:
        assert handle.notes == ()


@pytest.mark.slow
def test_a_whole_compiled_transformer_times_nothing_and_the_report_says_how_to_compile(tiny_pipe):
    """torch.compile(pipe.transformer) after apply runs around the DiT timers: the report had 0 forwards and said
    nothing (new-user trial); now a note names compile_repeated_blocks. A plain run has no such note."""
    handle = vsagen.apply(tiny_pipe, "full")
    latents(tiny_pipe)
    assert handle.report().dit_forwards == 2 * STEPS and not any("no DiT forward" in n for n in handle.report().notes)
    handle.remove()
    handle = vsagen.apply(tiny_pipe, "full")
    tiny_pipe.transformer = torch.compile(tiny_pipe.transformer, backend="eager")
    latents(tiny_pipe)
    report = handle.report()
    assert report.dit_forwards == 0
    assert any(f"stepped {STEPS} times but no DiT forward was timed" in n and "compile_repeated_blocks" in n
               for n in report.notes), report.notes


@pytest.mark.slow
def test_a_load_pipeline_pipeline_takes_its_presets_backend_defaults(vsagen_cache):
    """`vsagen.load_pipeline("tiny")` then `apply(pipe, "sparse-vdit")`: the preset's bundled pattern file is used
    as the CLI uses it (it was "needs a pattern file": a new-user trial); a stock diffusers pipeline has no preset."""
    from vsagen.models.presets import load_preset

    pipe = vsagen.load_pipeline("tiny")
    with vsagen.apply(pipe, "sparse-vdit", impl="torch") as handle:
        assert handle.spec.options.patterns == load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
        pipe(prompt="a fox", num_frames=17, height=96, width=160, num_inference_steps=1,  # the file's size
             generator=torch.Generator("cpu").manual_seed(0))
        assert handle.report().dit_forwards == 2


def test_the_handle_describes_the_backend_that_ran(tiny_pipe):
    """`handle.describe()` is the backend as the commands' JSON gives it (name, options, `impl_ran`)."""
    with vsagen.apply(tiny_pipe, "vsa:tile=4x4x8") as handle:
        assert handle.describe() == handle.backend.describe(handle.device)
        assert handle.describe()["tile"] == "4x4x8" and handle.describe()["impl_ran"] == "torch"
    with vsagen.apply(tiny_pipe, None) as timing_only:
        assert timing_only.describe() == {"name": None}


def test_apply_keeps_compiled_code_in_the_vsagen_cache(monkeypatch, tmp_path):
    """Issue 47: `vsagen.apply` (which may install compiled block regions and runs vsagen's Triton kernels) points
    torch's compile caches into the vsagen cache, as the commands do; torch is imported by then, so Inductor's
    default written into the environment by torch._dynamo counts as unset, and a user's own folder is kept."""
    from conftest import make_transformer
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("VSAGEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    with vsagen.apply(make_transformer(), "full"):
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "cache" / "compile" / "inductor")
        assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")


@pytest.mark.slow
def test_a_lora_loads_under_the_backend_and_remove_takes_it_out(tiny_pipe, tmp_path):
    from lora_files import write_lora

    path = tmp_path / "l.safetensors"
    write_lora(path, "original", tiny_pipe.transformer, seed=2)
    stock = latents(tiny_pipe)
    weights = {k: v.clone() for k, v in tiny_pipe.transformer.state_dict().items()}
    with pytest.raises(BadInput, match=r"^vsagen.apply: lora .*: expert=2 names transformer_2, and the model has one"):
        vsagen.apply(tiny_pipe, "full", lora=f"{path}:expert=2")
    with pytest.raises(BadInput, match=r"^vsagen.apply: lora .*:fused=false keeps PEFT layers .* quant='int8'"):
        vsagen.apply(tiny_pipe, "full", lora=f"{path}:fused=false", quant="int8")
    with vsagen.apply(tiny_pipe, "vsa:sparsity=0", impl="torch", lora=[f"{path}:scale=0.8"]) as handle:
        assert handle.loras[0]["scale"] == 0.8 and handle.loras[0]["components"] == ["transformer"]
        with_lora = latents(tiny_pipe)
    assert rel(with_lora, stock) > 1e-3  # the LoRA moved the video; sparsity 0 alone does not (above)
    # remove() subtracted the fused product: the weights as they were, up to fp32 rounding
    assert all((v - weights[k]).abs().max() < 1e-6 for k, v in tiny_pipe.transformer.state_dict().items())
