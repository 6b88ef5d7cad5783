"""vsagen/models/transformer_files.py: transformer-only checkpoint files (`--transformer FILE[,FILE]`, the
TurboDiffusion presets' `[transformer_files]`), written here in each real layout from the tiny presets' architectures:
TurboDiffusion's .pth (original Wan key names, proj_l, a Linear patch embedding), its -quant int8 files, diffusers-named
safetensors, two experts; the weights-only rule (a pickle that would run code is refused and runs nothing); bad inputs
(one line, exit 2, nothing written)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from conftest import noise_image, one_error_line, original_name
from safetensors.torch import save_file
from typer.testing import CliRunner

from vsagen.models import transformer_files as tf
from vsagen.cli.app import app
from vsagen.commands.generate_config import resolve_generate
from vsagen.errors import BadInput
from vsagen.models.presets import load_preset, preset_names

runner = CliRunner()
PROJ = "blocks.{i}.self_attn.attn_op.local_attn.proj_l"


def source_state(preset: str = "tiny", expert: str = "transformer", seed: int = 0) -> dict[str, torch.Tensor]:
    """Random diffusers-named weights of a tiny preset's transformer (every tensor random, norms included)."""
    from diffusers import WanTransformer3DModel

    p = load_preset(preset)
    torch.manual_seed(seed)
    t = WanTransformer3DModel(**(p.transformer if expert == "transformer" else p.transformer_2))
    g = torch.Generator().manual_seed(seed + 1)
    return {k: torch.randn(v.shape, generator=g) for k, v in t.state_dict().items()}


def turbo_file(path: Path, state: dict[str, torch.Tensor], proj: bool = True, seed: int = 5,
               head_dim: int | None = None) -> dict:
    """A TurboDiffusion-layout .pth: original Wan names, patch_embedding as a Linear, proj_l per layer (fp32)."""
    out = {original_name(k): v.clone() for k, v in state.items()}
    w = out["patch_embedding.weight"]
    out["patch_embedding.weight"] = w.reshape(w.shape[0], -1)
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    d = head_dim or load_preset("tiny").transformer["attention_head_dim"]
    g = torch.Generator().manual_seed(seed)
    for i in range(layers if proj else 0):
        out[f"{PROJ.format(i=i)}.weight"] = torch.randn(d, d, generator=g)
        out[f"{PROJ.format(i=i)}.bias"] = torch.randn(d, generator=g)
    torch.save(out, path)
    return out


def quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """TurboDiffusion's rule (ops/quant/quant.hpp): per 128x128 tile, scale = amax / 128, q = round(w / scale)
    clamped to int8."""
    out, inp = w.shape
    rows, cols = -(-out // 128), -(-inp // 128)
    scale = torch.empty(rows, cols)
    q = torch.empty(out, inp, dtype=torch.int8)
    for r in range(rows):
        for c in range(cols):
            tile = w[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128]
            s = tile.abs().max().clamp_min(1e-8) / 128
            scale[r, c] = s
            q[r * 128:(r + 1) * 128, c * 128:(c + 1) * 128] = (tile / s).round().clamp(-128, 127).to(torch.int8)
    return q, scale


def loaded(transformer) -> dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in transformer.state_dict().items()}


# ------------------------------------------------------------------------------------------------ reading and loading


def test_turbodiffusion_pth_loads_key_by_key(tmp_path):
    src = source_state()
    written = turbo_file(tmp_path / "turbo.pth", src)
    t, backend, note = tf.load_transformer_file(tmp_path / "turbo.pth", load_preset("tiny").transformer, torch.float32)
    got = loaded(t)
    assert set(got) == set(src)
    for k, v in src.items():
        assert torch.equal(got[k], v), k
    assert set(backend) == {k for k in written if "proj_l" in k}
    assert all(torch.equal(backend[k], written[k]) for k in backend)
    assert "converted by diffusers' convert_wan_transformer_to_diffusers" in note and "set aside" in note


def test_diffusers_named_safetensors_load_as_is(tmp_path):
    src = source_state()
    save_file(src, str(tmp_path / "t.safetensors"))
    t, backend, note = tf.load_transformer_file(tmp_path / "t.safetensors", load_preset("tiny").transformer,
                                                torch.float32)
    assert not backend and "convert" not in note
    assert all(torch.equal(loaded(t)[k], v) for k, v in src.items())


def test_quant_file_matches_its_dequantized_weights(tmp_path):
    """Every block Linear but proj_l as int8 + per-tile fp32 scales (+ bias): the loaded weight equals int8 x the
    tile's scale computed in float64 (partial edge tiles: the tiny Linears are smaller than one tile, the FFN 2 x 1)."""
    src = source_state()
    state = {original_name(k): v.clone() for k, v in src.items()}
    refs = {}
    for k in [k for k in state if k.startswith("blocks.") and k.endswith(".weight") and state[k].dim() == 2]:
        name = k[: -len(".weight")]
        w = state.pop(k)
        q, s = quantize(w)
        state[f"{name}.int8_weight"], state[f"{name}.scale"] = q, s
        rows = s.double().repeat_interleave(128, 0).repeat_interleave(128, 1)[: w.shape[0], : w.shape[1]]
        refs[name] = (q.double() * rows)
    d = load_preset("tiny").transformer["attention_head_dim"]
    state[f"{PROJ.format(i=0)}.weight"] = torch.randn(d, d)
    torch.save(state, tmp_path / "q.pth")
    t, backend, note = tf.load_transformer_file(tmp_path / "q.pth", load_preset("tiny").transformer, torch.float32)
    got = {original_name(k): v for k, v in loaded(t).items()}
    assert refs and "dequantized" in note and list(backend) == [f"{PROJ.format(i=0)}.weight"]
    for name, ref in refs.items():
        assert torch.equal(got[f"{name}.weight"], ref.float()), name
        assert (got[f"{name}.weight"].double() - src_value(src, name)).abs().max() < 0.05  # a faithful quantization


def test_quant_file_runs_its_own_int8_weights(tmp_path):
    """`keep_int8` (`--quant int8`): each quantized linear becomes an Int8Linear holding the file's int8 values and
    scales as stored (TurboDiffusion's W8A8), under diffusers' name, with the file's bias; the transformer's output
    matches the dequantized one's within int8 activation error."""
    from vsagen.quant.int8_linear import Int8Linear
    from vsagen.quant.swap import block_linears, precision_summary

    src = source_state()
    state = {original_name(k): v.clone() for k, v in src.items()}
    stored = {}
    for k in [k for k in state if k.startswith("blocks.") and k.endswith(".weight") and state[k].dim() == 2]:
        name = k[: -len(".weight")]
        q, scale = quantize(state.pop(k))
        state[f"{name}.int8_weight"], state[f"{name}.scale"] = q, scale
        stored[name] = (q, scale, state[f"{name}.bias"])
    torch.save(state, tmp_path / "q.pth")
    arch = load_preset("tiny").transformer
    t, _, note = tf.load_transformer_file(tmp_path / "q.pth", arch, torch.float32, keep_int8=True)
    plain, _, _ = tf.load_transformer_file(tmp_path / "q.pth", arch, torch.float32)
    assert "run as int8 W8A8 GEMMs" in note and precision_summary(t) == {"int8": 20, "fp8": 0, "dtype": 0}
    diffusers_name = {original_name(f"{n}.weight")[: -len(".weight")]: n
                      for n, _ in block_linears(t, kind=Int8Linear)}
    assert sorted(diffusers_name) == sorted(stored)
    for name, (q, scale, bias) in stored.items():
        layer = t.get_submodule(diffusers_name[name])
        assert isinstance(layer, Int8Linear), name
        assert torch.equal(layer.int8_weight, q) and torch.equal(layer.scale, scale) and torch.equal(layer.bias, bias)
        assert torch.equal(layer.weight, plain.get_submodule(diffusers_name[name]).weight.detach())  # the dequantized
    g = torch.Generator().manual_seed(4)
    x = dict(hidden_states=torch.randn(1, 16, 2, 8, 8, generator=g), timestep=torch.tensor([400.0]),
             encoder_hidden_states=torch.randn(1, 5, arch["text_dim"], generator=g), return_dict=False)
    with torch.no_grad():
        got, want = t(**x)[0], plain(**x)[0]
    assert float((got - want).norm() / want.norm()) < 1e-2


def src_value(src: dict, original: str) -> torch.Tensor:
    return next(v for k, v in src.items() if original_name(k) == f"{original}.weight").double()


def test_dequantize_partial_edge_tiles():
    """A 200 x 300 weight: 2 x 3 tiles, the last row and column partial; each element uses its own tile's scale."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(200, 300, generator=g, dtype=torch.float64) * torch.linspace(0.1, 4, 300, dtype=torch.float64)
    q, s = quantize(w.float())
    state = {"x.int8_weight": q, "x.scale": s}
    codes = tf.dequantize(state, torch.float64, "f")
    assert list(codes) == ["x"] and codes["x"][0] is q and torch.equal(codes["x"][1], s)
    rows, cols = torch.arange(200) // 128, torch.arange(300) // 128  # each element's tile
    ref = q.double() * s.double()[rows][:, cols]
    assert torch.equal(state["x.weight"], ref)
    assert ((state["x.weight"] - w).abs() <= s.double()[rows][:, cols] + 1e-6).all()  # within a step (127 clamp)
    with pytest.raises(BadInput, match="x.int8_weight has no x.scale"):
        tf.dequantize({"x.int8_weight": q}, torch.float32, "f")
    with pytest.raises(BadInput, match="one scale per 128x128 tile"):
        tf.dequantize({"x.int8_weight": q, "x.scale": s[:1]}, torch.float32, "f")


def test_two_experts_load_from_two_files(tmp_path):
    for preset in ("tiny-a14b", "tiny-i2v-a14b"):
        high, low = source_state(preset, "transformer", 1), source_state(preset, "transformer_2", 2)
        p = load_preset(preset)
        turbo_file(tmp_path / f"{preset}-high.pth", high, head_dim=p.transformer["attention_head_dim"])
        turbo_file(tmp_path / f"{preset}-low.pth", low, seed=9, head_dim=p.transformer["attention_head_dim"])
        for src, arch, f in ((high, p.transformer, "high"), (low, p.transformer_2, "low")):
            t, backend, _ = tf.load_transformer_file(tmp_path / f"{preset}-{f}.pth", arch, torch.float32)
            assert all(torch.equal(loaded(t)[k], v) for k, v in src.items())
            assert len(backend) == 2 * p.transformer["num_layers"]


def test_a_pickle_that_would_run_code_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "MARKER"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"blocks.0.self_attn.q.weight": Payload()}, tmp_path / "evil.pth")
    with pytest.raises(BadInput, match=r"evil.pth: refused: it holds objects other than tensors") as e:
        tf.read_state_dict(tmp_path / "evil.pth", "--transformer evil.pth")
    assert "\n" not in str(e.value) and not marker.exists()
    # the unpickler's reason, not torch's advice to turn the check off (a new-user trial saw that quoted)
    assert re.search(r"GLOBAL (posix|os)\.system", str(e.value)) and "weights_only" not in str(e.value)


@pytest.mark.parametrize("text, reason", [
    ("Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed.\n\n\n"
     "Trying to load unsupported GLOBAL posix.system whose module posix is blocked.\n\nCheck the documentation",
     "Trying to load unsupported GLOBAL posix.system whose module posix is blocked"),
    ("Weights only load failed. Re-running ...\n Please file an issue\n\nWeightsUnpickler error: Unsupported global: "
     "GLOBAL posix.system was not an allowed global by default.", "Unsupported global: GLOBAL posix.system"),
    ("Weights only load failed. Re-running `torch.load` with `weights_only` set to `False`.",
     "the weights-only unpickler refused it"),
])
def test_the_unpickler_reason_is_its_own_line_of_each_torch(text, reason):
    import pickle

    assert tf._unpickler_reason(pickle.UnpicklingError(text)) == reason


@pytest.mark.parametrize("content, match", [
    ({"a": torch.zeros(2), "b": 3}, "not a flat state dict of tensors"),
    ({"a": {"b": torch.zeros(2)}}, "not a flat state dict of tensors"),
    ([torch.zeros(2)], "holds a list, not a state dict"),
    ({1: torch.zeros(2)}, r"key 1 is int, not str"),
    ({}, r"holds no tensors \(an empty state dict\)"),
])
def test_non_tensor_content_is_refused(tmp_path, content, match):
    torch.save(content, tmp_path / "x.pth")
    with pytest.raises(BadInput, match=match):
        tf.read_state_dict(tmp_path / "x.pth", "w")


def test_the_legacy_non_zip_format_loads(tmp_path):
    """torch.save(..., _use_new_zipfile_serialization=False) holds tensors but cannot be memory-mapped (a new-user
    trial had it called damaged): it is read whole, still by the weights-only loader."""
    state = {"a": torch.randn(3, 2), "b": torch.arange(4)}
    torch.save(state, tmp_path / "legacy.pth", _use_new_zipfile_serialization=False)
    got = tf.read_state_dict(tmp_path / "legacy.pth", "legacy.pth")
    assert got.keys() == state.keys() and all(torch.equal(got[k], v) for k, v in state.items())
    marker = tmp_path / "MARKER"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"a": Payload()}, tmp_path / "evil.pth", _use_new_zipfile_serialization=False)
    with pytest.raises(BadInput, match="refused: it holds objects other than tensors"):
        tf.read_state_dict(tmp_path / "evil.pth", "evil.pth")
    assert not marker.exists()


def test_damaged_files_are_said_to_be_damaged_not_pickle(tmp_path):
    torch.save({"a": torch.zeros(64)}, tmp_path / "good.pth")
    data = (tmp_path / "good.pth").read_bytes()
    (tmp_path / "cut.pth").write_bytes(data[: len(data) // 2])
    (tmp_path / "junk.pt").write_bytes(os.urandom(200))
    save_file({"a": torch.zeros(64)}, str(tmp_path / "good.safetensors"))
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "good.safetensors").read_bytes()[:-40])
    for name in ("cut.pth", "junk.pt", "cut.safetensors"):
        with pytest.raises(BadInput, match="damaged") as e:
            tf.read_state_dict(tmp_path / name, name)
        assert "\n" not in str(e.value) and "refused" not in str(e.value), name


def test_unknown_and_missing_keys_are_one_line(tmp_path):
    src = source_state()
    extra = {**src, "blocks.0.attn1.to_zz.weight": torch.zeros(2)}
    save_file(extra, str(tmp_path / "extra.safetensors"))
    with pytest.raises(BadInput, match="does not have, e.g. blocks.0.attn1.to_zz.weight"):
        tf.load_transformer_file(tmp_path / "extra.safetensors", load_preset("tiny").transformer, torch.float32)
    src.pop("proj_out.weight")
    save_file(src, str(tmp_path / "less.safetensors"))
    with pytest.raises(BadInput, match="lacks 1 tensor.*proj_out.weight"):
        tf.load_transformer_file(tmp_path / "less.safetensors", load_preset("tiny").transformer, torch.float32)


# ---------------------------------------------------------------------------------------------------- the commands


def test_t2v_runs_a_turbo_file_with_auto_choosing_sla(tmp_path, vsagen_cache):
    turbo_file(tmp_path / "f.pth", source_state())
    out = tmp_path / "o.mp4"
    res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--transformer", str(tmp_path / "f.pth"),
                              "--out", str(out), "--steps", "2", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "--attn auto chose sla: this checkpoint was trained for it (f.pth holds" in res.output
    assert "loaded trained sla weights (sla_proj_l) for 2 of 2 layers" in res.output
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["config"]["model_source"]["transformer_files"] == [str((tmp_path / "f.pth").resolve())]
    assert report["config"]["backend"]["name"] == "sla"


def test_a_file_with_nan_weights_runs_with_a_note_on_its_latents(tmp_path, vsagen_cache):
    """A new-user trial: one NaN weight gave an all-black video, exit 0, no word."""
    state = source_state()
    key = next(k for k in state if k.endswith("ffn.net.0.proj.weight"))
    state[key][0, 0] = float("nan")
    save_file(state, str(tmp_path / "nan.safetensors"))
    out = tmp_path / "o.mp4"
    res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--transformer", str(tmp_path / "nan.safetensors"),
                              "--attn", "full", "--out", str(out), "--steps", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    notes = json.loads(out.with_suffix(".json").read_text())["timing"]["notes"]
    assert any("values that are NaN or infinite, so the video is black or garbage" in n for n in notes), notes


def test_nonfinite_latents_note_counts_and_is_silent_when_finite():
    from vsagen.commands.generate import nonfinite_latents_note

    x = torch.randn(1, 4, 2, 3, 3)
    assert nonfinite_latents_note(x) is None
    x[0, 0, 0, 0, :2] = torch.tensor([float("nan"), float("inf")])
    assert nonfinite_latents_note(x).startswith("the denoised latents hold 2 of 72 values that are NaN or infinite")


def test_trained_weights_another_backend_would_use_are_noted(tmp_path, vsagen_cache):
    """A new-user trial: `--transformer f.pth --attn vsa` set the file's proj_l aside without a word."""
    turbo_file(tmp_path / "f.pth", source_state())
    for attn, said in (("vsa", True), ("full", True), ("sla-star", False), ("sla", False)):
        cfg = resolve_generate("a cat", model="tiny", transformer=str(tmp_path / "f.pth"), attn=attn, device="cpu",
                               out=tmp_path / f"{attn}.mp4")
        note = [n for n in cfg.notes if "does not use them" in n]
        assert bool(note) == said, (attn, cfg.notes)
        if said:
            assert note[0] == (f"f.pth holds blocks.0.self_attn.attn_op.local_attn.proj_l.* (trained for sla): --attn "
                               f"{attn} does not use them; --attn sla (or auto) runs the file as trained")


def test_load_pipeline_takes_transformer_files(tmp_path, vsagen_cache):
    import vsagen

    src = source_state()
    turbo_file(tmp_path / "f.pth", src)
    pipe = vsagen.load_pipeline("tiny", device="cpu", transformer=tmp_path / "f.pth")
    assert all(torch.equal(loaded(pipe.transformer)[k], v) for k, v in src.items())
    high, low = source_state("tiny-i2v-a14b", "transformer", 1), source_state("tiny-i2v-a14b", "transformer_2", 2)
    turbo_file(tmp_path / "h.pth", high, head_dim=load_preset("tiny-i2v-a14b").transformer["attention_head_dim"])
    save_file(low, str(tmp_path / "l.safetensors"))
    both = f"{tmp_path / 'h.pth'},{tmp_path / 'l.safetensors'}"
    pipe = vsagen.load_pipeline("tiny-i2v-a14b", device="cpu", transformer=both)
    assert all(torch.equal(loaded(pipe.transformer)[k], v) for k, v in high.items())
    assert all(torch.equal(loaded(pipe.transformer_2)[k], v) for k, v in low.items())


def test_a_file_that_does_not_fit_is_refused_before_the_components_load(tmp_path, vsagen_cache, monkeypatch):
    """A new-user trial: a bad `--transformer` file was refused only after the text encoder and VAE had loaded (a
    download of a real model's components first). The user's files are now read first; a preset's downloaded files
    still come after the components."""
    torch.save({"a": torch.zeros(2), "b": "text"}, tmp_path / "str.pth")
    (tmp_path / "cut.pth").write_bytes(b"PK\x03\x04" + os.urandom(100))
    save_file({**source_state(), "blocks.0.attn1.to_zz.weight": torch.zeros(2)}, str(tmp_path / "extra.safetensors"))
    save_file(source_state("tiny-ti2v"), str(tmp_path / "ti2v.safetensors"))  # another architecture
    monkeypatch.setattr("vsagen.models.loading._from_pretrained",
                        lambda *a, **k: pytest.fail("the components loaded before the file was checked"))
    for name, match in (("str.pth", "not a flat state dict"), ("cut.pth", "damaged"),
                        ("extra.safetensors", "does not have, e.g. blocks.0.attn1.to_zz.weight"),
                        ("ti2v.safetensors", "ti2v.safetensors")):
        res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--device", "cpu", "--attn", "full",
                                  "--out", str(tmp_path / "out" / "o.mp4"), "--transformer", str(tmp_path / name)])
        assert res.exit_code == 2 and match in one_error_line(res), (name, res.output)
    assert not (tmp_path / "out").exists()


def test_a_safetensors_file_of_another_model_is_refused_from_its_header_before_loading(tmp_path, vsagen_cache,
                                                                                      monkeypatch):
    """New-user trial (issue 44): a `--transformer` file with wrong keys printed "loading tiny" and failed ~7 s later;
    its safetensors header (keys, shapes; no tensor read, no torch) is now checked against the architecture with the
    other inputs: no Wan keys, other blocks, other width, other input channels: one line, before any load. A file
    that fits (original or diffusers names, a Linear patch embedding) passes."""
    state = source_state()
    dim = load_preset("tiny").transformer["num_attention_heads"] * load_preset("tiny").transformer["attention_head_dim"]
    conv = state["patch_embedding.weight"]
    cases = {
        "foo.safetensors": ({"foo.weight": torch.zeros(4, 4)},
                            "holds no Wan transformer tensors (its keys: foo.weight;"),
        "one-block.safetensors": ({k: v for k, v in state.items() if not k.startswith("blocks.1.")},
                                  "holds 1 transformer blocks and --model tiny has 2: a checkpoint of another model"),
        "wide.safetensors": ({**state, "blocks.0.attn1.to_q.weight": torch.zeros(2 * dim, 2 * dim)},
                             f"its blocks are {2 * dim} wide and --model tiny's are {dim}"),
        "i2v.safetensors": ({**state, "patch_embedding.weight": torch.zeros(conv.shape[0], 36, *conv.shape[2:])},
                            "takes 36 input channels and --model tiny 16"),
    }
    architecture = load_preset("tiny").transformer
    for name, (tensors, said) in cases.items():
        save_file(tensors, str(tmp_path / name))
        with pytest.raises(BadInput) as info:
            tf.check_header(tmp_path / name, architecture, "tiny")
        assert str(info.value).startswith(f"--transformer {tmp_path / name}") and said in str(info.value), name
    original = {original_name(k): v for k, v in state.items()}
    original["patch_embedding.weight"] = conv.reshape(conv.shape[0], -1)  # TurboDiffusion's Linear
    for name, tensors in (("diffusers.safetensors", state), ("original.safetensors", original)):
        save_file(tensors, str(tmp_path / name))
        tf.check_header(tmp_path / name, architecture, "tiny")
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loading began"))
    res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--device", "cpu", "--out", str(tmp_path / "o.mp4"),
                              "--transformer", str(tmp_path / "foo.safetensors")])
    assert "holds no Wan transformer tensors" in one_error_line(res) and not (tmp_path / "o.mp4").exists()


def test_bad_inputs_are_one_line_exit_2_nothing_written(tmp_path, vsagen_cache):
    marker = tmp_path / "MARKER"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    torch.save({"a": Payload()}, tmp_path / "evil.pth")
    torch.save({"a": torch.zeros(2), "b": "text"}, tmp_path / "str.pth")
    (tmp_path / "cut.pth").write_bytes(b"PK\x03\x04" + os.urandom(100))
    turbo_file(tmp_path / "f.pth", source_state())
    out = tmp_path / "out" / "o.mp4"
    cases = [
        (["--transformer", str(tmp_path / "nope.pth")], "no such file"),
        (["--transformer", f"{tmp_path / 'f.pth'},{tmp_path / 'f.pth'}"],
         "names 2 file(s) and --model tiny has 1 transformer(s): give one file (--transformer FILE)"),
        (["--transformer", str(tmp_path / "evil.pth")], "refused: it holds objects other than tensors"),
        (["--transformer", str(tmp_path / "str.pth")], "not a flat state dict of tensors"),
        (["--transformer", str(tmp_path / "cut.pth")], "damaged"),
        (["--transformer", str(tmp_path / "f.pth"), "--random-weights"], "--random-weights"),
        (["--transformer", f"{tmp_path / 'f.pth'},"], "empty entry"),
        (["--transformer", str(tmp_path)], "not a file"),
    ]
    for args, match in cases:
        res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--out", str(out), "--device", "cpu", *args])
        assert res.exit_code == 2, (args, res.output)
        assert match in one_error_line(res), (args, res.output)
        assert not out.parent.exists() and not marker.exists()
    noise_image(tmp_path / "x.png")
    res = runner.invoke(app, ["i2v", str(tmp_path / "x.png"), "a cat", "--model", "tiny-i2v-a14b", "--out", str(out),
                              "--transformer", str(tmp_path / "f.pth")])
    assert res.exit_code == 2 and "has 2 transformer(s): give 2 files, the high-noise expert first" in \
        one_error_line(res)


def test_every_command_takes_transformer():
    for command in ("t2v", "i2v", "profile", "compare", "search"):
        res = runner.invoke(app, [command, "--help"])
        assert "--transformer" in res.output, command


# ---------------------------------------------------------------------------------------------------- the presets

TURBO = [n for n in preset_names() if n.startswith("turbowan")]


def test_turbo_presets_parse():
    assert len(TURBO) == 9
    for name in TURBO:
        p = load_preset(name)
        repo, files = p.transformer_files
        assert repo.startswith("loayrashid/TurboWan" if name.endswith("-fv") else "TurboDiffusion/TurboWan")
        assert len(files) == p.experts
        assert p.defaults.attn == "sla" and p.defaults.attention["sla"] == {"block_q": 64, "block_k": 128, "topk": 0.1}
        assert p.defaults.sampler == ("rcm:sigma_max=200:ode=true" if p.image_to_video else "rcm")
        assert p.defaults.image_size == ("adaptive" if p.image_to_video else "fixed")
        assert (p.boundary_ratio == 0.9) == (p.experts == 2) and p.hub_id.startswith("Wan-AI/")
        assert ("quant" in name) == all("-quant.pth" in f for f in files)


@pytest.mark.parametrize("fv,same", [("turbowan2.1-t2v-1.3b-fv", "turbowan2.1-t2v-1.3b"),
                                     ("turbowan2.1-t2v-14b-fv", "turbowan2.1-t2v-14b-720p"),
                                     ("turbowan2.2-i2v-a14b-fv", "turbowan2.2-i2v-a14b")])
def test_fastvideo_conversions_run_as_the_turbodiffusion_presets(fv, same):
    """FastVideo's conversions (one diffusion_pytorch_model.safetensors per expert folder of its repository, the
    A14B's high-noise expert in transformer/ and the low-noise one in transformer_2/, inferred from FastVideo's loader
    and denoising stage) run with the TurboDiffusion preset's defaults, sampler and attention, on the same base
    checkpoint and architecture (the 14B at 720p, as FastVideo's turbo_t2v_14b preset:
    fastvideo/pipelines/basic/turbodiffusion/presets.py:33-49)."""
    a, b = load_preset(fv), load_preset(same)
    experts = ("transformer", "transformer_2")[: b.experts]
    assert a.transformer_files[1] == tuple(f"{e}/diffusion_pytorch_model.safetensors" for e in experts)
    assert a.transformer_files[0] == "loayrashid/" + b.transformer_files[0].split("/")[1].rsplit("-", 1)[0] + \
        "-Diffusers"
    assert (a.defaults, a.hub_id, a.transformer, a.transformer_2, a.vae, a.boundary_ratio, a.pipeline) == \
        (b.defaults, b.hub_id, b.transformer, b.transformer_2, b.vae, b.boundary_ratio, b.pipeline)


def test_turbo_presets_never_describe_their_base_checkpoint():
    from vsagen.models.sources import resolve_model

    assert resolve_model("Wan-AI/Wan2.1-T2V-1.3B-Diffusers").preset.name == "wan2.1-t2v-1.3b"
    assert resolve_model("Wan-AI/Wan2.2-I2V-A14B-Diffusers").preset.name == "wan2.2-i2v-a14b"


def test_turbo_preset_random_weights_auto_picks_sla_and_rcm(tmp_path):
    cfg = resolve_generate("a cat", model="turbowan2.1-t2v-1.3b", random_weights=True, device="cpu",
                           out=tmp_path / "o.mp4")
    assert cfg.backend.name == "sla" and cfg.backend.options.topk == 0.1
    assert "--attn auto chose sla: turbowan2.1-t2v-1.3b was trained for it" in cfg.attn_note
    assert cfg.sampler.name == "rcm" and cfg.steps == 4 and cfg.guidance <= 1 and cfg.transformer_sources == ()
    cfg = resolve_generate("a cat", model="turbowan2.1-t2v-1.3b", device="cpu", out=tmp_path / "o.mp4")
    assert cfg.backend.name == "sla"  # its files not downloaded: the preset says
    assert cfg.transformer_sources == ("TurboDiffusion/TurboWan2.1-T2V-1.3B-480P/TurboWan2.1-T2V-1.3B-480P.pth",)


def load_preset_files(tmp_path: Path, monkeypatch, name: str, tiny: str, image: Path | None = None):
    """Load `name` (a [transformer_files] preset) with no hub: snapshot_download (of the preset's files only) answers
    from `tmp_path`, where the test wrote them; the base components come from the saved tiny checkpoint `tiny`, whose
    architecture replaces the preset's. Returns (the loaded model, the (repo, *files) each download asked for)."""
    import dataclasses

    import huggingface_hub
    from conftest import saved_tiny

    from vsagen.models import loading
    from vsagen.models.sources import ModelSource

    asked = []

    def download(repo, allow_patterns=None, local_files_only=False, **_):
        asked.append((repo, *allow_patterns))
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", download)
    small = load_preset(tiny)
    preset = dataclasses.replace(load_preset(name), transformer=small.transformer, transformer_2=small.transformer_2,
                                 vae=small.vae)
    cfg = resolve_generate("a cat", image=image, model=tiny, device="cpu", out=tmp_path / "o.mp4", attn="full")
    cfg = dataclasses.replace(cfg, source=ModelSource("dir", str(saved_tiny(tiny)), preset))
    return loading.load_model(cfg, lambda line: None), asked


def test_turbo_preset_downloads_its_files_with_snapshot_download(tmp_path, monkeypatch, vsagen_cache):
    """No hub here: snapshot_download (of the preset's files only) is replaced by a local folder; the base
    components come from a local tiny checkpoint standing in for the hub id (the preset's architecture is replaced
    by the tiny one)."""
    src = source_state()
    turbo_file(tmp_path / "TurboWan2.1-T2V-1.3B-480P.pth", src)
    model, asked = load_preset_files(tmp_path, monkeypatch, "turbowan2.1-t2v-1.3b", "tiny")
    assert asked == [("TurboDiffusion/TurboWan2.1-T2V-1.3B-480P", "TurboWan2.1-T2V-1.3B-480P.pth")]
    assert all(torch.equal(loaded(model.pipe.transformer)[k], v) for k, v in src.items())
    assert model.weight_root is not None and (model.weight_root / "transformer" / tf.BACKEND_FILE).is_file()


@pytest.mark.parametrize("name,tiny", [("lightx2v-wan2.1-t2v-14b", "tiny"),
                                       ("lightx2v-wan2.2-i2v-a14b", "tiny-i2v-a14b")])
def test_lightx2v_presets_download_their_original_key_safetensors(tmp_path, monkeypatch, vsagen_cache, name, tiny):
    """LightX2V's distill files as their configs name them (configs/distill/wan21/wan_t2v_distill_model_4step_cfg.json,
    wan22/wan_moe_i2v_distill_model.json @f8aee98), in the layout their loader reads (the original Wan keys, a Conv3d
    patch embedding: lightx2v/models/networks/base_model.py:441-471): the preset fetches just those files, converts
    each into its expert (high-noise first) of a tiny architecture standing in for the 14B, and takes the other
    components from the base checkpoint."""
    from conftest import noise_image

    repo, files = load_preset(name).transformer_files
    experts = ["transformer", "transformer_2"][: len(files)]
    states = [source_state(tiny, e, seed=3 + i) for i, e in enumerate(experts)]
    for f, state in zip(files, states):
        save_file({original_name(k): v.contiguous() for k, v in state.items()}, str(tmp_path / f))
    image = noise_image(tmp_path / "img.png", size=(64, 48)) if load_preset(tiny).takes_image else None
    model, asked = load_preset_files(tmp_path, monkeypatch, name, tiny, image)
    assert asked == [(repo, *files)]
    for expert, state in zip(experts, states):
        got = loaded(getattr(model.pipe, expert))
        assert set(got) == set(state) and all(torch.equal(got[k], v) for k, v in state.items()), expert
    assert model.weight_root is None  # nothing but the transformer in these files


# FastVideo's TurboDiffusion conversion (scripts/checkpoint_conversion/convert_turbodiffusion_to_diffusers.py:30-65,
# @2f3d407) as facts about names: an original Wan key's pattern -> FastVideo's name for it (the test writes files so)
FASTVIDEO_NAMES = [(r"blocks\.(\d+)\.self_attn\.([qkv])\.(.+)", r"blocks.\1.to_\2.\3"),
                   (r"blocks\.(\d+)\.self_attn\.o\.(.+)", r"blocks.\1.to_out.\2"),
                   (r"blocks\.(\d+)\.self_attn\.norm_([qk])\.(.+)", r"blocks.\1.norm_\2.\3"),
                   (r"blocks\.(\d+)\.self_attn\.attn_op\.local_attn\.proj_l\.(.+)",
                    r"blocks.\1.attn1.attn_impl.proj_l.\2"),
                   (r"blocks\.(\d+)\.cross_attn\.([qkv])\.(.+)", r"blocks.\1.attn2.to_\2.\3"),
                   (r"blocks\.(\d+)\.cross_attn\.o\.(.+)", r"blocks.\1.attn2.to_out.\2"),
                   (r"blocks\.(\d+)\.cross_attn\.norm_([qk])\.(.+)", r"blocks.\1.attn2.norm_\2.\3"),
                   (r"blocks\.(\d+)\.norm3\.(.+)", r"blocks.\1.self_attn_residual_norm.norm.\2"),
                   (r"blocks\.(\d+)\.ffn\.0\.(.+)", r"blocks.\1.ffn.fc_in.\2"),
                   (r"blocks\.(\d+)\.ffn\.2\.(.+)", r"blocks.\1.ffn.fc_out.\2"),
                   (r"blocks\.(\d+)\.modulation", r"blocks.\1.scale_shift_table"),
                   (r"text_embedding\.0\.(.+)", r"condition_embedder.text_embedder.fc_in.\1"),
                   (r"text_embedding\.2\.(.+)", r"condition_embedder.text_embedder.fc_out.\1"),
                   (r"time_embedding\.0\.(.+)", r"condition_embedder.time_embedder.mlp.fc_in.\1"),
                   (r"time_embedding\.2\.(.+)", r"condition_embedder.time_embedder.mlp.fc_out.\1"),
                   (r"time_projection\.1\.(.+)", r"condition_embedder.time_modulation.linear.\1"),
                   (r"head\.head\.(.+)", r"proj_out.\1"), (r"head\.norm\.(.+)", r"norm_out.\1"),
                   (r"head\.modulation", r"scale_shift_table")]


def fastvideo_file(path: Path, state: dict[str, torch.Tensor], seed: int = 5,
                   head_dim: int | None = None) -> dict[str, torch.Tensor]:
    """A transformer/diffusion_pytorch_model.safetensors as FastVideo's TurboDiffusion conversion writes it: FastVideo's
    module names, the Conv3d patch embedding, SLA's proj_l per layer ([head_dim, head_dim] + [head_dim], default the
    tiny preset's); returns the proj_l tensors by original key."""
    out, proj = {}, {}
    layers = 1 + max(int(k.split(".")[1]) for k in state if k.startswith("blocks."))
    d = head_dim or load_preset("tiny").transformer["attention_head_dim"]
    g = torch.Generator().manual_seed(seed)
    for i in range(layers):
        for part, shape in (("weight", (d, d)), ("bias", (d,))):
            proj[f"{PROJ.format(i=i)}.{part}"] = torch.randn(shape, generator=g)
    for key, value in {**{original_name(k): v for k, v in state.items()}, **proj}.items():
        name = next((re.sub(a, b, key) for a, b in FASTVIDEO_NAMES if re.fullmatch(a, key)), key)
        out[name] = value.contiguous()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(out, str(path))
    return proj


def save_keys(path: Path) -> list[str]:
    """A safetensors file's keys as stored."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return list(f.keys())


def test_fastvideo_module_names_load_back_key_by_key(tmp_path):
    src = source_state()
    proj = fastvideo_file(tmp_path / "t.safetensors", src)
    keys = tf.file_keys(tmp_path / "t.safetensors", "x")
    assert tf.is_fastvideo_layout(list(save_keys(tmp_path / "t.safetensors"))) and set(proj) <= set(keys)
    tf.check_header(tmp_path / "t.safetensors", load_preset("tiny").transformer, "tiny")
    t, backend, note = tf.load_transformer_file(tmp_path / "t.safetensors", load_preset("tiny").transformer,
                                                torch.float32)
    got = loaded(t)
    assert set(got) == set(src) and all(torch.equal(got[k], v) for k, v in src.items())
    assert set(backend) == set(proj) and all(torch.equal(backend[k], v) for k, v in proj.items())
    assert "FastVideo's module names read back to the original Wan ones" in note
    wide = dict(load_preset("tiny").transformer, attention_head_dim=2 * load_preset("tiny").transformer[
        "attention_head_dim"])
    with pytest.raises(BadInput, match="blocks.0.to_q"):  # the width check finds FastVideo's query weight
        tf.check_header(tmp_path / "t.safetensors", wide, "tiny")


def test_a_fastvideo_named_file_runs_with_transformer_and_auto_sees_its_proj_l(tmp_path, vsagen_cache):
    """A local copy of a FastVideo conversion: `--transformer DIR/transformer/diffusion_pytorch_model.safetensors`
    over the base model; `--attn auto` finds SLA's proj_l under FastVideo's name and runs sla."""
    import vsagen

    src = source_state()
    fastvideo_file(tmp_path / "transformer" / "diffusion_pytorch_model.safetensors", src)
    file = str(tmp_path / "transformer" / "diffusion_pytorch_model.safetensors")
    cfg = resolve_generate("a cat", model="tiny", transformer=file, device="cpu", out=tmp_path / "o.mp4")
    assert cfg.backend.name == "sla" and "proj_l" in cfg.attn_note
    pipe = vsagen.load_pipeline("tiny", device="cpu", transformer=file)
    assert all(torch.equal(loaded(pipe.transformer)[k], v) for k, v in src.items())


def test_the_fastvideo_turbowan_preset_fetches_only_the_transformer_file(tmp_path, monkeypatch, vsagen_cache):
    """turbowan2.1-t2v-1.3b-fv: the one file FastVideo's conversion puts in the repository's transformer/, read into a
    tiny architecture standing in for the 1.3B, its proj_l set aside for sla; the components from the stock
    checkpoint (a tiny one here)."""
    from safetensors.torch import load_file

    src = source_state()
    repo, files = load_preset("turbowan2.1-t2v-1.3b-fv").transformer_files
    assert (repo, files) == ("loayrashid/TurboWan2.1-T2V-1.3B-Diffusers",
                             ("transformer/diffusion_pytorch_model.safetensors",))
    proj = fastvideo_file(tmp_path / files[0], src)
    model, asked = load_preset_files(tmp_path, monkeypatch, "turbowan2.1-t2v-1.3b-fv", "tiny")
    assert asked == [(repo, *files)]
    assert all(torch.equal(loaded(model.pipe.transformer)[k], v) for k, v in src.items())
    kept = load_file(str(model.weight_root / "transformer" / tf.BACKEND_FILE))
    assert set(kept) == set(proj) and all(torch.equal(kept[k], v) for k, v in proj.items())
    cfg = resolve_generate("a cat", model="turbowan2.1-t2v-1.3b-fv", random_weights=True, device="cpu",
                           out=tmp_path / "r.mp4")
    assert (cfg.backend.name, cfg.sampler.name, cfg.steps) == ("sla", "rcm", 4)


def test_the_fastvideo_a14b_preset_loads_each_expert_from_its_folder(tmp_path, monkeypatch, vsagen_cache):
    """turbowan2.2-i2v-a14b-fv: the repository as FastVideo's loader and pipeline need it (inferred: transformer/ the
    high-noise expert, transformer_2/ the low-noise one, each one diffusion_pytorch_model.safetensors in FastVideo's
    names, written by convert_turbodiffusion_i2v_to_diffusers.py @2f3d407), a tiny-i2v-a14b architecture standing in
    for the A14B: transformer/'s file loads into the pipeline's transformer (t >= boundary), transformer_2/'s into
    transformer_2, each with its own proj_l set aside for sla; the components from the stock checkpoint (a tiny one)."""
    from safetensors.torch import load_file

    name, tiny = "turbowan2.2-i2v-a14b-fv", "tiny-i2v-a14b"
    repo, files = load_preset(name).transformer_files
    assert (repo, files) == ("loayrashid/TurboWan2.2-I2V-A14B-Diffusers",
                             ("transformer/diffusion_pytorch_model.safetensors",
                              "transformer_2/diffusion_pytorch_model.safetensors"))
    d = load_preset(tiny).transformer["attention_head_dim"]
    high, low = source_state(tiny, "transformer", 11), source_state(tiny, "transformer_2", 12)
    proj = [fastvideo_file(tmp_path / f, state, seed=s, head_dim=d) for f, state, s in zip(files, (high, low), (5, 6))]
    model, asked = load_preset_files(tmp_path, monkeypatch, name, tiny, noise_image(tmp_path / "i.png", (64, 48)))
    assert asked == [(repo, *files)]
    for expert, state, kept in (("transformer", high, proj[0]), ("transformer_2", low, proj[1])):
        got = loaded(getattr(model.pipe, expert))
        assert set(got) == set(state) and all(torch.equal(got[k], v) for k, v in state.items()), expert
        backend = load_file(str(model.weight_root / expert / tf.BACKEND_FILE))
        assert set(backend) == set(kept) and all(torch.equal(backend[k], v) for k, v in kept.items()), expert
    key = "blocks.0.attn1.to_q.weight"  # the two experts differ: each tensor is where its folder says
    assert not torch.equal(high[key], low[key])
    assert torch.equal(loaded(model.pipe.transformer)[key], high[key])
    assert torch.equal(loaded(model.pipe.transformer_2)[key], low[key])


def test_a_turbo_preset_without_a_network_fails_at_once_naming_every_file(tmp_path, monkeypatch, vsagen_cache):
    """New-user trial: without a network the preset's download retried for ~27 s, printing ~15 lines, and its advice
    named one of the two experts' files (the one-file --transformer it suggested was then refused)."""
    import time

    from vsagen.errors import ModelNotFound
    from vsagen.models.transformer_files import hub_files

    import huggingface_hub.constants

    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    # no network, whatever the machine has (the real hub must never be asked for these multi-GB files here)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    t0 = time.perf_counter()
    with pytest.raises(ModelNotFound) as info:
        hub_files(load_preset("turbowan2.2-i2v-a14b"), "turbowan2.2-i2v-a14b")
    assert time.perf_counter() - t0 < 5
    msg = str(info.value)
    assert "\n" not in msg and "TurboWan2.2-I2V-A14B-high-720P.pth TurboWan2.2-I2V-A14B-low-720P.pth" in msg
    assert "--transformer DIR/TurboWan2.2-I2V-A14B-high-720P.pth,DIR/TurboWan2.2-I2V-A14B-low-720P.pth" in msg
    assert hub_files(load_preset("turbowan2.2-i2v-a14b"), "x", local_only=True) is None


def test_presets_lists_the_turbo_presets():
    res = runner.invoke(app, ["presets"])
    assert res.exit_code == 0
    for name in TURBO:
        assert name in res.output


@pytest.mark.parametrize("fv", [n for n in TURBO if n.endswith("-fv")])
def test_a_fastvideo_conversion_hub_id_is_refused_naming_its_preset(tmp_path, fv):
    """`--model loayrashid/...` (FastVideo's names in its transformer folders: diffusers cannot load it as a
    pipeline): exit 2, one line naming the preset that runs it, nothing loaded."""
    p = load_preset(fv)
    repo = p.transformer_files[0]
    command = ["i2v", str(noise_image(tmp_path / "i.png"))] if p.image_to_video else ["t2v"]
    res = runner.invoke(app, [*command, "a cat", "--model", repo, "--out", str(tmp_path / "o.mp4"), "--device", "cpu"])
    line = one_error_line(res)
    assert line.endswith(f"--model {repo}: vsagen runs this repository's transformer files beside their base "
                         f"checkpoint through a preset: --model {fv}"), line
    assert not (tmp_path / "o.mp4").exists()


def test_sla_star_loads_proj_l_from_a_turbo_file(tmp_path, vsagen_cache):
    """sla-star takes TurboDiffusion's proj_l too (an alias of its key): named explicitly, it loads the file's."""
    turbo_file(tmp_path / "f.pth", source_state())
    res = runner.invoke(app, ["t2v", "a cat", "--model", "tiny", "--transformer", str(tmp_path / "f.pth"),
                              "--attn", "sla-star", "--out", str(tmp_path / "o.mp4"), "--steps", "1", "--device", "cpu"])
    assert res.exit_code == 0, res.output
    assert "loaded trained sla-star weights" in res.output and "for 2 of 2 layers" in res.output
