"""docs/adding-a-backend.md made true: a backend defined in one module of its own (`toy_backend.py`, beside this
file) plus one registry entry runs through `vsagen t2v`, `vsagen profile` (and `--kernels`), `vsagen compare`,
`--attn auto` and `vsagen backends` on the tiny model, with no other edit; and what the document says of the code
(its class skeleton, the members it names, the files it points to) is checked against the code.

The toy is dense attention in tile order times a known factor (`scale`) and, where trained gains are loaded, a
per-head gain, so its outputs are known: with scale 1 its latents are `full`'s, and `compare`'s attention error
against dense attention is |scale - 1| exactly. It records every `RunInfo` it was prepared with and every call
(`toy_backend.SEEN`)."""

from __future__ import annotations

import ast
import inspect
import json
import re
import shutil
from dataclasses import fields
from pathlib import Path

import pytest
import torch
from conftest import one_error_line
from safetensors.torch import save_file
from toy_backend import GAIN_ALIAS, MISSING_NOTE, SEEN, STAGE, ToyAttention
from typer.testing import CliRunner

from vsagen.attention import registry
from vsagen.attention.base import PROTOCOL_MEMBERS, AttnContext, Backend, LayerWeights, RunInfo
from vsagen.cli.app import app
from vsagen.media.video import read_mp4

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-a-backend.md"
runner = CliRunner()
# Small runs of the tiny model (2 blocks, 2 heads of 16, CFG: two forwards a step): 5 frames of 64 x 64 are the
# post-patch grid 2 x 4 x 4, 32 tokens in one partial tile.
SMALL = ("--model", "tiny", "--device", "cpu", "--frames", "5", "--height", "64", "--width", "64", "--steps", "1")
GRID, TOKENS, HEADS, HEAD_DIM, LAYERS, FORWARDS = (2, 4, 4), 32, 2, 16, 2, 2


TOY_LINE = "toy_backend:ToyAttention"  # its line in `_BACKENDS`, as the shipped backends' (".vsa:VSAAttention")


@pytest.fixture
def toy(monkeypatch, vsagen_cache, tiny_dir):
    """The toy registered exactly as the shipped backends are: its line added to `_BACKENDS`, `REGISTRY` built
    from them by `registry_of` (which imports and checks each class); undone after the test. Its record starts
    empty."""
    monkeypatch.setattr(registry, "_BACKENDS", (*registry._BACKENDS, TOY_LINE))
    built = registry.registry_of(registry._BACKENDS)  # as `REGISTRY` is built when the registry is imported
    for name, cls in built.items():  # into the one dict every caller reads
        monkeypatch.setitem(registry.REGISTRY, name, cls)
    assert registry.REGISTRY == built and built["toy"] is ToyAttention and registry.backend_names()[-1] == "toy"
    SEEN.clear()
    yield SEEN
    SEEN.clear()


def check_calls(calls, n: int, gains=None) -> None:
    """`n` calls, each as the processor makes them: (B, S, H, D) in tile order of the run's grid, every layer of
    the one transformer at step 0, with the gains given (None: none loaded)."""
    assert len(calls) == n
    assert {c.shape for c in calls} == {(1, TOKENS, HEADS, HEAD_DIM)}
    assert {(c.grid, c.expert, c.step, c.gains) for c in calls} == {(GRID, "transformer", 0, gains)}
    assert sorted({c.layer for c in calls}) == list(range(LAYERS))


def check_runs(runs, predicted_grid=GRID) -> None:
    """`Session.load` prepared the toy before loading (the predicted run), then with the loaded model, and the run's
    `vsagen.apply` once more: each with the device, dtype, the one expert's architecture, the grid and the steps."""
    assert [r.predicted for r in runs] == [True, False, False]
    assert [r.grid for r in runs] == [predicted_grid, GRID, GRID]
    for r in runs:
        assert (r.device.type, r.dtype, r.steps, r.expert_names) == ("cpu", torch.float32, 1, ("transformer",))
        assert r.experts[0].layers == LAYERS and r.experts[0].architecture["heads"] == HEADS


def test_t2v_runs_the_toy(toy, tmp_path):
    out = tmp_path / "toy.mp4"
    res = runner.invoke(app, ["t2v", "a prompt", *SMALL, "--attn", "toy:scale=0.5", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert read_mp4(out).shape == (5, 64, 64, 3)
    data = json.loads(out.with_suffix(".json").read_text())
    assert (data["attn"], data["attn_requested"]) == ("toy", "toy:scale=0.5")
    # the backend's own report (`describe` through `report`): its options and the calls since `prepare`
    assert data["backend"] == {"name": "toy", "scale": 0.5, "max_tokens": 1 << 20, "calls": FORWARDS * LAYERS}
    assert data["config"]["backend"]["name"] == "toy"
    notes = data["timing"]["notes"]
    assert "toy: dense attention times 0.5" in notes and MISSING_NOTE in notes  # prepare's note, weights' note
    assert set(data["timing"]["attention_backend_stages_s"]) == {STAGE.split("/")[1]}  # its own timer region
    check_calls(toy.calls, FORWARDS * LAYERS)
    check_runs(toy.runs)


def test_profile_has_a_row_for_the_toy_with_its_layers(toy):
    res = runner.invoke(app, ["profile", *SMALL, "--attn", "full,toy", "--warmup", "0", "--no-stock",
                              "--format", "json"])
    assert res.exit_code == 0, res.output
    full, row = json.loads(res.stdout)["rows"]
    assert (full["backend"], row["backend"], row["kind"]) == ("full", "toy", "backend")
    assert row["spec"] == "toy:scale=1:max_tokens=1048576" and row["grid"] == list(GRID) and row["tokens"] == TOKENS
    assert row["backend_info"] == {"name": "toy", "scale": 1.0, "max_tokens": 1 << 20, "calls": FORWARDS * LAYERS}
    # dense attention in tile order: the same latents as full's (the tile-order hooks put every token back)
    assert row["latents_rel_l2_vs_full"] < 1e-5 and row["speedup_vs_full"] > 0
    assert set(row["attention_stages_s_per_step"]) == {"dense"}
    # per_layer: report()'s rows, one per (expert, layer), summed by profile
    assert row["layers"] == [{"expert": "transformer", "layer": i, "heads": HEADS, "launches": 1, "groups": 1,
                              "density": 1.0, "sdpa_heads": HEADS, "modes": {"dense": HEADS}} for i in range(LAYERS)]
    assert (row["launches_per_forward"], row["block_density"]) == (LAYERS, 1.0)
    check_calls(toy.calls, FORWARDS * LAYERS)
    check_runs(toy.runs)


def test_profile_kernels_times_the_toy_at_every_layer_with_its_bench_params(toy):
    res = runner.invoke(app, ["profile", "--model", "tiny", "--device", "cpu", "--frames", "5", "--height", "64",
                              "--width", "64", "--attn", "full,toy", "--kernels", "--format", "json"])
    assert res.exit_code == 0, res.output
    rows = [r for r in json.loads(res.stdout)["rows"] if r["kernel"] == "toy"]
    assert [r["kind"] for r in rows] == ["fwd", "fwd+bwd"] and all(r["ms"] > 0 for r in rows)
    assert {r["layers"] for r in rows} == {LAYERS}  # per_layer: timed at each layer
    assert toy.runs[0].predicted and toy.runs[0].grid == GRID  # prepared before any timing
    assert {c.gains for c in toy.calls} == {(1.0, 1.0)} and {c.layer for c in toy.calls} == set(range(LAYERS))


def test_compare_measures_the_toy_against_full(toy, tmp_path):
    out = tmp_path / "cmp"
    res = runner.invoke(app, ["compare", "a prompt", *SMALL, "--attn", "full,toy:scale=0.5", "--warmup", "0",
                              "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads((out / "compare.json").read_text())
    ref, row = data["rows"]
    assert (ref["backend"], row["backend"], row["label"]) == ("full", "toy", "toy")
    assert row["spec"] == "toy:scale=0.5:max_tokens=1048576" and row["backend_info"]["name"] == "toy"
    # the probe compares every call with dense attention on the same q, k, v: ||0.5 o - o|| / ||o|| = 0.5
    assert row["attention_rel_l2_mean"] == pytest.approx(0.5, abs=1e-5)
    assert [x["rel_l2"] for x in row["attention_rel_l2_per_layer"]] == pytest.approx([0.5] * LAYERS, abs=1e-5)
    assert ref["attention_rel_l2_mean"] < 1e-6 and row["latents_rel_l2"] > 1e-3  # halved attention moves the output
    assert read_mp4(Path(row["file"])).shape == (5, 64, 64, 3) and Path(row["file"]).parent == out
    check_calls(toy.calls, FORWARDS * LAYERS)


def test_auto_chooses_the_toy_for_a_checkpoint_holding_its_gains(toy, tiny_dir, tmp_path):
    """`auto_priority` and `weights` make the toy a candidate of `--attn auto` (no edit of auto.py); its gains are
    found under an alias, loaded from the checkpoint and handed to every layer's call as `ctx.params`."""
    from vsagen.attention.auto import auto_rule, candidates

    assert candidates() == ["toy", "sla", "sla-star", "vsa"]
    assert auto_rule().startswith("the backend the checkpoint was trained for: toy if it holds "
                                  "blocks.N.attn1.toy_gain.* (or blocks.N.attn1.gain.*), sla if")
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_dir, ckpt)
    save_file({GAIN_ALIAS.format(layer=i) + ".weight": torch.tensor([1.0, 0.25]) for i in range(LAYERS)},
              str(ckpt / "transformer" / "toy.safetensors"))
    out = tmp_path / "auto.mp4"
    res = runner.invoke(app, ["t2v", "a prompt", *SMALL[2:], "--model", str(ckpt), "--out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.with_suffix(".json").read_text())
    assert (data["attn"], data["attn_requested"]) == ("toy", "auto")
    notes = data["timing"]["notes"]
    assert notes[0].startswith("--attn auto chose toy: this checkpoint was trained for it (transformer/ holds "
                               "blocks.0.attn1.gain.weight)")
    assert f"loaded trained toy weights (toy_gain) for {LAYERS} of {LAYERS} layers" in notes
    check_calls(toy.calls, FORWARDS * LAYERS, gains=(1.0, 0.25))
    check_runs(toy.runs, predicted_grid=None)  # a local folder: its config gives the architecture, not the grid


def test_the_toy_refuses_before_loading(toy, tmp_path, monkeypatch):
    """Its Options' validation and `prepare`'s refusal are one error line each, before the model loads."""
    import vsagen.pipeline

    monkeypatch.setattr(vsagen.pipeline, "load_model", lambda *a, **k: pytest.fail("loaded"))
    for attn, needle in (("toy:max_tokens=8", "--attn toy: the grid 2x4x4 is 32 tokens, more than max_tokens=8"),
                         ("toy:scale=0", "scale must be a number > 0"),
                         ("toy:nope=1", "toy has no option 'nope'; its options: scale, max_tokens, gains")):
        res = runner.invoke(app, ["t2v", "a prompt", *SMALL, "--attn", attn, "--out", str(tmp_path / "x.mp4")])
        assert res.exit_code == 2 and needle in one_error_line(res), (attn, res.output)
    assert toy.calls == [] and not list(tmp_path.iterdir())


def test_the_listing_and_the_option_precedence_see_the_toy(toy):
    from vsagen.attention.spec import resolve_spec

    res = runner.invoke(app, ["backends"], env={"COLUMNS": "100"})
    assert res.exit_code == 0
    block = " ".join(next(b for b in res.stdout.split("\n\n") if b.startswith("toy ")).split())
    assert block.startswith("toy (sparse) - default: --attn auto runs it for a checkpoint holding "
                            "blocks.N.attn1.toy_gain.*")  # `sparse`: the listing's word for a tiled backend
    assert "Dense attention in tile order times a known factor" in block
    assert "scale=1 a number" in block and "max_tokens=1048576 an integer" in block and "gains=none a file" in block
    # entry > preset table > default (the toy takes neither --sparsity nor --attn-impl)
    tables = {"toy": {"scale": 2.0}}
    assert resolve_spec("toy").options.scale == 1.0
    assert resolve_spec("toy", preset=tables).options.scale == 2.0
    assert resolve_spec("toy:scale=3", preset=tables, flags={"--sparsity": 0.5}).options.scale == 3.0


# ------------------------------------------------------------------------------------------------ the document


def skeleton() -> ast.ClassDef:
    """The backend class of the document's Python block."""
    block = re.search(r"```python\n(.*?)```", DOC.read_text(), re.S).group(1)
    return next(n for n in ast.parse(block).body
                if isinstance(n, ast.ClassDef) and any(getattr(b, "id", None) == "Backend" for b in n.bases))


def test_the_documents_skeleton_is_the_protocol():
    """Every member of the protocol is in the skeleton, and nothing else; each method with `Backend`'s parameters."""
    cls = skeleton()
    members = {t.id for n in cls.body if isinstance(n, ast.Assign) for t in n.targets}
    methods = {n.name: [a.arg for a in n.args.args] for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert members | set(methods) == set(PROTOCOL_MEMBERS) | {"__init__"}
    for name, args in methods.items():
        assert args == list(inspect.signature(getattr(Backend, name)).parameters), name
    assert set(PROTOCOL_MEMBERS) <= set(dir(ToyAttention))  # the toy is built as the skeleton says


def test_the_document_names_the_real_fields_names_and_files():
    """Every field of the values a backend meets is documented; every name and file it points to exists."""
    import vsagen.attention.auto
    import vsagen.attention.shared
    import vsagen.attention.spec
    import vsagen.attention.weights
    import vsagen.bench
    import vsagen.commands.profile
    import vsagen.kernels.tuning
    import vsagen.request.backends

    text = DOC.read_text()
    for cls in (LayerWeights, RunInfo, AttnContext):
        for f in fields(cls):
            assert re.search(rf"`{f.name}[`(]", text), (cls.__name__, f.name)
    assert "`step`" in text and "`timestep`" in text  # AttnContext's properties
    for path in set(re.findall(r"`((?:vsagen|kernels|tests|presets|docs)/[\w/.*]+)`", text)):
        assert list(ROOT.glob(path)), path
    where = {registry: ("registry_of", "check_backend_class", "backend_names", "backend_class", "_BACKENDS",
                        "backend_at"),
             vsagen.attention.auto: ("candidates", "FALLBACK", "choose_backend"),
             vsagen.attention.shared: ("weights_path_option", "check_tuning", "kernel_lists", "QUERY_LAUNCH"),
             vsagen.attention.weights: ("check_weights_file",),
             vsagen.attention.spec: ("FLAG_OPTIONS", "spec_of", "text_options"),
             vsagen.request.backends: ("known_impls",), vsagen.bench: ("timed_layers",),
             vsagen.kernels.tuning: ("default_tuning", "PROFILES", "ROCM_VSA_CHANGES", "_tuning_for"),
             vsagen.commands.profile: ("BASELINE",)}
    for module, names in where.items():
        for name in names:
            assert f"`{name}" in text and hasattr(module, name), (module.__name__, name)


def test_the_toy_module_imports_no_torch_as_the_shipped_ones():
    """Registering a backend imports its module (`registry_of`), and the listings and the checks of `--attn` read
    the registry before torch loads: the toy, as every shipped backend (tests/attention/test_registry.py), imports
    torch only inside the methods that compute."""
    import json
    import subprocess
    import sys

    probe = ("import sys, json\nfrom vsagen.attention.registry import registry_of\n"
             f"cls = registry_of(({TOY_LINE!r},))['toy']\n"
             "print(json.dumps([cls.__name__, [m for m in sys.modules if m.split('.')[0] == 'torch']]))")
    res = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).parent)
    assert json.loads(res.stdout) == ["ToyAttention", []], res.stderr
