"""vsagen.commands.compare_quant and `vsagen compare --quant LIST`: every precision's block linears built once on two
tiny transformers (fresh random weights, float32 on the CPU: int8 runs there through torch._int_mm, FP8 through its
emulation), each set's forward bitwise that of the same transformer quantized at load, the loaded linears back after
(also when a run fails); a `-quant` file's own int8 linears kept for int8 and dequantized for none; the runs, labels
and files of a precision list; bad lists refused in one line before anything loads, and a list refused by t2v and
profile; end to end on the tiny model (slow): a row per precision, the table's column, the JSON's and CSV's fields."""

from __future__ import annotations

import copy
import csv
import io
import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import make_transformer, one_error_line
from torch import nn
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.commands.compare_config import resolve_compare
from vsagen.commands.compare_quant import PrecisionSets, load_request, precision_sets
from vsagen.errors import BadInput
from vsagen.quant.fp8_linear import Fp8Linear
from vsagen.quant.int8_linear import Int8Linear, quantize_int8_blocks
from vsagen.quant.lowbit import LowBitLinear
from vsagen.quant.swap import block_linears, install_int8, precision_summary, quantize_transformer

runner = CliRunner()
SMALL = ["--frames", "5", "--height", "64", "--width", "64", "--steps", "1", "--warmup", "0"]


def inputs(t, seed):
    """A batch of 2 (odd latent grid 3 x 6 x 10) on fresh random values."""
    g = torch.Generator().manual_seed(seed)
    c = t.config
    return dict(hidden_states=torch.randn(2, c.in_channels, 3, 6, 10, generator=g),
                timestep=torch.tensor([700.0, 250.0]), encoder_hidden_states=torch.randn(2, 5, c.text_dim, generator=g),
                return_dict=False)


def forward(t, seed=5):
    with torch.no_grad():
        return t(**inputs(t, seed))[0]


def linears(t):
    return dict(block_linears(t, kind=(nn.Linear, LowBitLinear)))


def captured_loads(monkeypatch) -> list:
    """Each `Session.load` of the test, as (the session, its transformer's block linears right after loading)."""
    import vsagen.pipeline

    loads, original = [], vsagen.pipeline.Session.load.__func__

    def load(cls, request, *a, **k):
        session = original(cls, request, *a, **k)
        loads.append((session, linears(session.pipe.transformer)))
        return session

    monkeypatch.setattr(vsagen.pipeline.Session, "load", classmethod(load))
    return loads


def test_each_precision_runs_as_if_quantized_at_load_and_the_loaded_linears_come_back():
    """none, int8, fp8 on a two-expert pipeline: each set's output bitwise that of a copy quantized as `--quant` does
    at load; sets built once (the same modules each time they are put); the summaries; the originals back after."""
    pipe = SimpleNamespace(transformer=make_transformer(seed=2), transformer_2=make_transformer(seed=3))
    own = {name: linears(getattr(pipe, name)) for name in ("transformer", "transformer_2")}
    want = {}
    for precision in ("int8", "fp8"):
        for name in own:
            twin = copy.deepcopy(getattr(pipe, name))
            quantize_transformer(twin, precision)
            want[precision, name] = forward(twin)
    plain = {name: forward(getattr(pipe, name)) for name in own}
    sets = PrecisionSets(pipe, ("int8", "none", "fp8"), torch.float32)
    assert all(linears(getattr(pipe, n)) == own[n] for n in own)  # building leaves the loaded ones in place
    fp8_kept = "; 4 kept in the run's dtype (e.g. blocks.0.attn2.to_k: text / image tokens"
    assert [note.split(": FP8's")[0] for note in sets.notes] == [
        f"--quant {p}: {n}: {c} block linears run as {w}" for p, c, w in
        (("int8", 20, "int8 W8A8 (128x128 block scales)"), ("fp8", 16, "FP8 e4m3 W8A8 (row-wise scales)" + fp8_kept))
        for n in own]
    assert [s["transformer_2"] for s in sets.summaries] == [{"int8": 20, "fp8": 0, "dtype": 0},
                                                           {"int8": 0, "fp8": 0, "dtype": 20},
                                                           {"int8": 0, "fp8": 16, "dtype": 4}]
    for index, precision in ((2, "fp8"), (0, "int8"), (1, "none"), (0, "int8")):
        sets.put(index)
        for name in own:
            t = getattr(pipe, name)
            got = forward(t)
            assert torch.equal(got, plain[name] if precision == "none" else want[precision, name])
            assert linears(t) == sets.sets[index][name]  # the same modules every time
    sets.restore()
    for name in own:
        assert all(linears(getattr(pipe, name))[k] is m for k, m in own[name].items())
        assert torch.equal(forward(getattr(pipe, name)), plain[name])


def test_a_quant_files_int8_linears_run_as_stored_and_as_their_dequantized_weight():
    """A transformer loaded as `--quant int8` loads a `-quant` file (every block linear an `Int8Linear` of the file's
    codes): int8 keeps those very modules, none runs their weight dequantized in float64 and cast once (as loading the
    file with `--quant none`), fp8 is quantized from that weight."""
    t = make_transformer(seed=4)
    codes = {name: quantize_int8_blocks(m.weight.detach()) for name, m in block_linears(t)}
    install_int8(t, codes)
    loaded = linears(t)
    sets = PrecisionSets(SimpleNamespace(transformer=t), ("none", "int8", "fp8"), torch.float32)
    none, int8, fp8 = (s["transformer"] for s in sets.sets)
    assert all(int8[k] is m for k, m in loaded.items())
    for name, (q, scale) in codes.items():
        exact = q.double() * scale.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[:q.shape[0], :q.shape[1]]
        assert type(none[name]) is nn.Linear and torch.equal(none[name].weight, exact.float())
        text_kv = name.split(".", 2)[2] in ("attn2.to_k", "attn2.to_v")  # FP8 keeps them in the run's dtype
        assert fp8[name] is none[name] if text_kv else isinstance(fp8[name], Fp8Linear)
    assert sets.notes[0] == "--quant int8: transformer: 20 block linears run as int8 W8A8 (128x128 block scales) " \
                            "(20 as loaded)"
    assert sets.notes[1].startswith("--quant fp8: transformer: 16 block linears run as FP8 e4m3 W8A8 (row-wise "
                                    "scales); 4 kept in the run's dtype")
    assert precision_summary(t) == {"int8": 20, "fp8": 0, "dtype": 0} and linears(t) == loaded


def test_the_loaded_linears_come_back_when_a_run_fails():
    pipe = SimpleNamespace(transformer=make_transformer(seed=6))
    own = linears(pipe.transformer)
    cfg = SimpleNamespace(several_quants=True, quants=("none", "int8"), dtype="fp32", quant="none")
    notes: list[str] = []
    with pytest.raises(RuntimeError, match="out of memory"):
        with precision_sets(cfg, pipe, notes) as put:
            assert put(1) == {"precision": "int8", "transformer": {"int8": 20, "fp8": 0, "dtype": 0}}
            assert isinstance(pipe.transformer.blocks[1].ffn.net[2], Int8Linear)
            raise RuntimeError("out of memory")
    assert linears(pipe.transformer) == own and any("built once" in n for n in notes)
    one = SimpleNamespace(several_quants=False, quant="none")  # one precision: the model as loaded, nothing swapped
    with precision_sets(one, pipe, notes) as put:
        assert put(0) == {"precision": "none", "transformer": {"int8": 0, "fp8": 0, "dtype": 20}}
        assert linears(pipe.transformer) == own


def test_the_runs_of_a_precision_list(tmp_path):
    """Precision-major: every (backend, decoder) run once per precision, the first precision's first run the
    reference; labels and files name the precision (none: the run's dtype); the model loads in the dtype."""
    cfg = resolve_compare("a cat", model="tiny", attn="full,vsa", vae="stock,tiny", quant="none,int8", device="cpu",
                          frames=5, height=64, width=64, steps=1, out=tmp_path / "o", plot=False)
    assert (cfg.quant, cfg.quants, cfg.several_quants) == ("none", ("none", "int8"), True)
    runs = cfg.runs
    assert [(r.quant_index, r.backend_index, r.vae_index) for r in runs] == [
        (q, b, v) for q in (0, 1) for b in (0, 1) for v in (0, 1)]
    assert runs[0].label == "full / stock VAE / fp32 linears" and runs[-1].label == "vsa 0.875 / tiny VAE / int8 linears"
    assert [r.file.name for r in runs[:2]] == ["full-vae-stock-quant-none.mp4", "full-vae-tiny-quant-none.mp4"]
    assert runs[4].file.name == "full-vae-stock-quant-int8.mp4"
    assert cfg.summary()["quants"] == ["none", "int8"]
    assert (load_request(cfg).quant, load_request(cfg).keep_int8_files) == ("none", True)  # built after loading
    first = resolve_compare("a cat", model="tiny", attn="full", quant="int8,none", device="cpu", frames=5, height=64,
                            width=64, steps=1, out=tmp_path / "p", plot=False)
    assert [r.label for r in first.runs] == ["full / int8 linears", "full / fp32 linears"]
    assert first.quant == "int8" and load_request(first).quant == "none"  # int8 is built from the loaded weights
    one = resolve_compare("a cat", model="tiny", attn="full,vsa", quant="int8", device="cpu", frames=5, height=64,
                          width=64, steps=1, out=tmp_path / "q", plot=False)
    assert one.quants == ("int8",) and [r.label for r in one.runs] == ["full", "vsa 0.875"]
    assert load_request(one) is one  # one precision: applied at load, as t2v does


@pytest.mark.parametrize("args,words", [
    (["compare", "--attn", "full,vsa", "--quant", "none,fp8"], "--quant fp8 needs a GPU with FP8 tensor cores"),
    (["compare", "--attn", "full,vsa", "--quant", "none,fp4"], "--quant must be one of auto, none, fp8, int8"),
    (["compare", "--attn", "full,vsa", "--quant", "none,,int8"], "has an empty entry"),
    (["compare", "--attn", "full,vsa", "--quant", "int8,int8"], "--quant lists 'int8' twice"),
    (["compare", "--attn", "full,vsa", "--quant", "auto,none"], "auto and none both run none here"),
    (["compare", "--attn", "full", "--quant", "int8"], "two precisions (e.g. --quant none,int8)"),
    (["t2v", "--quant", "none,int8"], "--quant 'none,int8': this command runs one precision; `vsagen compare`"),
    (["profile", "--prompt", "a cat", "--quant", "none,int8"], "--quant 'none,int8': this command runs one "
                                                                "precision"),
])
def test_bad_lists_are_refused_in_one_line_before_loading(vsagen_cache, tmp_path, monkeypatch, args, words):
    import vsagen.models.loading

    def never(*a, **k):
        raise AssertionError("loaded")

    monkeypatch.setattr(vsagen.models.loading, "load_model", never)
    out = tmp_path / ("o.mp4" if args[0] == "t2v" else "o")
    res = runner.invoke(app, [args[0], *(["a cat"] if args[0] != "profile" else []), "--model", "tiny", "--device",
                              "cpu", *args[1:], "--out", str(out)])
    assert res.exit_code == 2 and words in one_error_line(res)
    assert not out.exists()


def test_precisions_and_lora_scales_are_not_listed_together(vsagen_cache, tiny_dir, tmp_path):
    """The low-bit linears are built from the weights with the LoRA fused at one scale, so a --quant list and a
    --lora scale list at once are refused in one line (the branches that added each axis met here)."""
    from diffusers import WanTransformer3DModel
    from lora_files import write_lora

    from vsagen.commands.compare_config import resolve_compare

    lora = tmp_path / "l.safetensors"
    write_lora(lora, "diffusers", WanTransformer3DModel.from_pretrained(tiny_dir, subfolder="transformer"))
    with pytest.raises(BadInput, match=r"^--quant with several precisions and a LoRA with several scales"):
        resolve_compare("a cat", model="tiny", attn="full", quant="none,int8", lora=[f"{lora}:scale=0,1"],
                        device="cpu", out=tmp_path / "o")
    one = resolve_compare("a cat", model="tiny", attn="full", quant="none,int8", lora=[f"{lora}:scale=0.5"],
                          device="cpu", out=tmp_path / "o")
    assert [r.label for r in one.runs] == ["full / fp32 linears", "full / int8 linears"]


def test_a_list_through_the_library_is_refused_by_a_one_precision_request():
    from vsagen.commands.generate_config import resolve_generate

    with pytest.raises(BadInput, match=r"^--quant 'none,int8': this command runs one precision"):
        resolve_generate("a cat", model="tiny", quant="none,int8", device="cpu")


@pytest.mark.slow
def test_compare_none_and_int8_on_the_tiny_model(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """`--attn full --quant none,int8`: the model loads once, two rows (the reference fp32, int8 against it: close,
    not equal), the linears column, the JSON's and CSV's quant fields; the loaded linears are back after."""
    loads = captured_loads(monkeypatch)
    out = tmp_path / "o"
    res = runner.invoke(app, ["compare", "a cat", "--model", "tiny", "--device", "cpu", "--attn", "full", "--quant",
                              "none,int8", *SMALL, "--out", str(out), "--no-plot", "--error-steps", "none"],
                        env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert len(loads) == 1
    session, own = loads[0]
    assert linears(session.pipe.transformer) == own and all(type(m) is nn.Linear for m in own.values())
    table = [line.split("│") for line in res.stdout.splitlines() if line.startswith("│")]
    assert "linears" in res.stdout and [cells[2].strip() for cells in table] == ["fp32", "20/20", "int8", "20/20"]
    data = json.loads((out / "compare.json").read_text())
    ref, low = data["rows"]
    assert (ref["label"], low["label"]) == ("full / fp32 linears", "full / int8 linears")
    assert ref["quant"] == {"precision": "none", "transformer": {"int8": 0, "fp8": 0, "dtype": 20}}
    assert low["quant"] == {"precision": "int8", "transformer": {"int8": 20, "fp8": 0, "dtype": 0}}
    assert ref["psnr_db"] == "inf" and 20 < low["psnr_db"] < math.inf and 0.9 < low["ssim"] < 1
    assert 0 < low["latents_rel_l2"] < 0.05 and low["speedup_vs_reference"] > 0
    assert data["settings"]["quants"] == ["none", "int8"] and data["settings"]["quant"] == "none"
    rows = list(csv.DictReader(io.StringIO((out / "compare.csv").read_text())))
    assert [(r["quant"], r["quant_linears"]) for r in rows] == [("none", "transformer:int8=0:fp8=0:dtype=20"),
                                                               ("int8", "transformer:int8=20:fp8=0:dtype=0")]
    assert sorted(p.name for p in out.iterdir()) == ["compare.csv", "compare.json", "full-quant-int8.mp4",
                                                     "full-quant-none.mp4", "side-by-side.mp4"]


@pytest.mark.slow
def test_a_transformer_files_int8_weights_run_as_stored(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """`--transformer` a file of TurboDiffusion's int8 weights with `--quant none,int8`: the model loads once with the
    file's int8 linears as stored (not dequantized and quantized again), the int8 rows run them, the none rows their
    dequantized weights; those very modules are in place again after."""
    from safetensors.torch import save_file

    t = make_transformer(seed=7)
    state = {k: v.detach().clone().contiguous() for k, v in t.state_dict().items()}
    codes = {}
    for name, _ in block_linears(t):
        codes[name] = quantize_int8_blocks(state.pop(f"{name}.weight"))
        state[f"{name}.int8_weight"], state[f"{name}.scale"] = codes[name]
    save_file(state, str(tmp_path / "q.safetensors"))
    loads = captured_loads(monkeypatch)
    out = tmp_path / "o"
    res = runner.invoke(app, ["compare", "a cat", "--model", "tiny", "--device", "cpu", "--attn", "full", "--quant",
                              "none,int8", "--transformer", str(tmp_path / "q.safetensors"), *SMALL, "--out", str(out),
                              "--no-plot", "--error-steps", "none"])
    assert res.exit_code == 0, res.output
    (session, own), = loads
    assert sorted(own) == sorted(codes) and all(isinstance(m, Int8Linear) for m in own.values())
    assert all(torch.equal(own[n].int8_weight, q) and torch.equal(own[n].scale, s) for n, (q, s) in codes.items())
    assert linears(session.pipe.transformer) == own
    data = json.loads((out / "compare.json").read_text())
    assert [r["quant"]["transformer"] for r in data["rows"]] == [{"int8": 0, "fp8": 0, "dtype": 20},
                                                                 {"int8": 20, "fp8": 0, "dtype": 0}]
    assert any("20 block linears run as int8 W8A8 (128x128 block scales) (20 as loaded)" in n for n in data["notes"])
