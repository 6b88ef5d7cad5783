"""vsagen.commands.generate_config: `resolve_generate` (a t2v / i2v request: flag > preset default, every check that
needs no weights, through `vsagen.request.resolve.resolve`) and the request layer's helpers: `--vae-tiling` as asked, valid frame counts, output targets and folders, choices, devices."""

from __future__ import annotations

from pathlib import Path

import pytest

from vsagen.commands.generate_config import resolve_generate as resolve
from vsagen.request.options import check_choice
from vsagen.request.resolve import nearest_valid_frames, resolve_device
from vsagen.errors import BadInput
from vsagen.models.presets import load_preset


def test_vae_tiling_is_carried_as_asked(tmp_path):
    """The request carries `--vae-tiling` as given, `auto` included: the decode decides it by memory when it runs
    (`vsagen.decode.tiling`), not the request by the frame size."""
    assert resolve("p", model="wan2.1-t2v-14b", device="cpu", out=tmp_path / "a.mp4").vae_tiling == "auto"
    assert resolve("p", model="tiny", device="cpu", vae_tiling="on", out=tmp_path / "b.mp4").vae_tiling == "on"


@pytest.mark.parametrize("frames,stride,want", [(10, 4, (9, 13)), (9, 4, (9, 13)), (1, 4, (1, 5)), (0, 4, (1, 5)),
                                                (82, 4, (81, 85)), (7, 2, (7, 9))])
def test_nearest_valid_frames(frames, stride, want):
    lo, hi = nearest_valid_frames(frames, stride)
    assert (lo, hi) == want
    assert (lo - 1) % stride == 0 and hi - lo == stride and lo <= max(frames, 1) < hi + (frames == hi)


def test_flags_win_over_the_preset_defaults(tmp_path):
    d = load_preset("tiny").defaults
    cfg = resolve("a fox", model="tiny", device="cpu", out=tmp_path / "a.mp4")
    assert (cfg.frames, cfg.height, cfg.width, cfg.steps, cfg.fps) == (d.frames, d.height, d.width, d.steps, d.fps)
    assert (cfg.guidance, cfg.flow_shift) == (d.guidance, d.flow_shift)
    cfg = resolve("a fox", model="tiny", device="cpu", frames=9, height=64, width=80, steps=3, guidance=1.0, fps=8,
                  seed=5, flow_shift=2.5, out=tmp_path / "b.mp4")
    assert (cfg.frames, cfg.height, cfg.width, cfg.steps, cfg.guidance, cfg.fps, cfg.seed, cfg.flow_shift) == (
        9, 64, 80, 3, 1.0, 8, 5, 2.5)
    assert cfg.out == tmp_path / "b.mp4" and cfg.json_out == tmp_path / "b.json"
    assert cfg.backend.name == "full" and cfg.device == "cpu"


@pytest.mark.parametrize("kwargs,needle", [
    (dict(frames=10), "--frames"), (dict(steps=0), "--steps"), (dict(tile_fit="pad"), "--tile-fit"),
    (dict(dtype="fp8"), "--dtype"), (dict(offload="disk"), "--offload"), (dict(vae_tiling="maybe"), "--vae-tiling"),
    (dict(attn="nope"), "--attn"), (dict(attn="vsa", sparsity=1.0), "--sparsity"),
    (dict(flow_shift=0.0), "--flow-shift"),
    (dict(height=60), "--height"),
    (dict(attn="auto:sparsity=0.5"), "--attn auto takes no options"),
    (dict(fps=99999999999999999999), "--fps must be an integer in [1, 240]"),  # ffmpeg wrote an empty mp4
    (dict(fps=0), "--fps"),
    (dict(sparsity=0.5), "--attn auto chose full"),  # the default (auto) on a checkpoint without sparse weights
    (dict(sampler="dmd", guidance=5.0), "--guidance 5 turns CFG on, and the dmd sampler runs without CFG"),
    (dict(sampler="dmd", steps=4), "--steps 4: the dmd sampler runs 3 steps"),
    (dict(sampler="dmd", flow_shift=5.0), "--flow-shift does not apply to the dmd sampler"),
    (dict(sampler="dmd,default"), "this command runs one sampler"),
    (dict(sampler="dmd:sigmas=1,2"), "every sigma must be in (0, 1]"),
    (dict(sampler="default:steps=3", steps=4), "--steps and --sampler default:steps=3 both set the steps"),
    (dict(sampler="dmd", cfg_parallel=True), "and the dmd sampler runs without CFG; drop --cfg-parallel"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_settings_are_one_line_naming_the_flag(tmp_path, kwargs, needle):
    with pytest.raises(BadInput) as info:
        resolve("a fox", model="tiny", device="cpu", out=tmp_path / "x.mp4", **kwargs)
    assert needle in str(info.value) and "\n" not in str(info.value)
    assert list(tmp_path.iterdir()) == []


def test_check_choice_lists_the_choices():
    check_choice("--fit", "crop", ("crop", "resize"))
    with pytest.raises(BadInput, match=r"^--fit must be one of crop, resize, got 'stretch'$"):
        check_choice("--fit", "stretch", ("crop", "resize"))


def test_resolve_device(monkeypatch):
    import torch

    assert resolve_device("cpu") == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(BadInput, match="--device cuda: CUDA is not available"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == "cuda" and resolve_device("cuda") == "cuda"
    with pytest.raises(BadInput, match="--device must be one of auto, cuda, cpu"):
        resolve_device("tpu")


def test_the_default_attn_is_auto_full_on_the_tiny_model_with_a_note(tmp_path):
    cfg = resolve("a fox", model="tiny", device="cpu", out=tmp_path / "a.mp4")
    assert cfg.backend.name == "full" and cfg.attn_requested == "auto"
    assert cfg.attn_note.startswith("--attn auto chose full") and "--attn vsa" in cfg.attn_note
    named = resolve("a fox", model="tiny", attn="vsa", device="cpu", out=tmp_path / "b.mp4")
    assert named.attn_requested == "vsa" and named.attn_note is None
    assert cfg.summary()["attn_requested"] == "auto" and cfg.summary()["attn"] == "full"


def test_auto_on_a_folder_with_gate_weights_is_vsa_with_the_preset_options(vsagen_cache, tiny_dir, tmp_path):
    import shutil

    import torch
    from safetensors.torch import save_file

    ckpt = tmp_path / "gated"
    shutil.copytree(tiny_dir, ckpt)
    save_file({"blocks.0.attn1.to_gate_compress.weight": torch.randn(32, 32)},
              str(ckpt / "transformer" / "gates.safetensors"))
    cfg = resolve("a fox", model=str(ckpt), device="cpu", out=tmp_path / "g.mp4")
    assert cfg.backend.name == "vsa"
    assert cfg.backend.sparsity == load_preset("tiny").defaults.attention["vsa"]["sparsity"]
    assert "chose vsa" in cfg.attn_note and "to_gate_compress" in cfg.attn_note


def test_out_names_a_file_and_a_folder_is_refused_as_one(tmp_path, monkeypatch):
    """--out DIR (an existing folder, `.` or the empty path) is not an errno text nor a .mp4 complaint: --out is the
    file, and the line shows the file name to give."""
    (tmp_path / "clips").mkdir()
    with pytest.raises(BadInput) as info:
        resolve("a fox", model="tiny", device="cpu", out=tmp_path / "clips")
    assert str(info.value) == ("--out is the video file to write (.mp4, .webm, .gif, or .png for PNG frames); "
                               f"{tmp_path / 'clips'} is a folder: use --out {tmp_path / 'clips' / 'name.mp4'}")
    monkeypatch.chdir(tmp_path)
    for out in (".", ""):
        with pytest.raises(BadInput, match=r"^--out is the video file to write \(\.mp4, \.webm, \.gif, or \.png for "
                                           r"PNG frames\); \. is a folder: use --out name\.mp4$"):
            resolve("a fox", model="tiny", device="cpu", out=Path(out))


@pytest.mark.parametrize("target,why", [("/proc/v.mp4", "virtual or special file system"),
                                        ("/proc/new/sub/v.mp4", "it would be created in /proc")])
def test_an_unwritable_folder_is_named_as_such_not_as_a_missing_file(target, why):
    with pytest.raises(BadInput) as info:
        resolve("a fox", model="tiny", device="cpu", out=Path(target))
    line = str(info.value)
    assert line.startswith(f"cannot write to {Path(target).parent}: ") and "does not take new files" in line
    assert why in line and "No such file" not in line


@pytest.mark.parametrize("negative,guidance,noted", [("blurry", 1.0, True), ("blurry", 0.0, True),
                                                     ("blurry", 5.0, False), (None, 1.0, False), ("  ", 1.0, False)])
def test_a_negative_prompt_without_cfg_is_a_note(tmp_path, negative, guidance, noted):
    cfg = resolve("a fox", model="tiny", device="cpu", out=tmp_path / "a.mp4", negative_prompt=negative,
                  guidance=guidance)
    notes = [n for n in cfg.notes if n.startswith("--negative-prompt has no effect")]
    assert len(notes) == noted
    if noted:
        assert f"--guidance {guidance:g} <= 1" in notes[0]
    assert list(cfg.summary()["notes"]) == list(cfg.notes)


def test_a14b_negative_prompt_follows_the_first_expert_s_guidance(tmp_path):
    """diffusers' Wan pipelines run CFG for every expert iff the first expert's scale is above 1."""
    off = resolve("a fox", model="tiny-a14b", device="cpu", out=tmp_path / "a.mp4", negative_prompt="x",
                  guidance=1.0, guidance_2=4.0)
    on = resolve("a fox", model="tiny-a14b", device="cpu", out=tmp_path / "b.mp4", negative_prompt="x",
                 guidance=4.0, guidance_2=1.0)
    assert [n.split(" ")[0] for n in off.notes] == ["--negative-prompt", "--guidance-2"] and on.notes == ()


def test_a_tiny_input_image_is_refused_and_a_small_one_noted(tmp_path):
    from conftest import noise_image

    for name, size in (("dot.png", (1, 1)), ("strip.png", (200, 8))):
        noise_image(tmp_path / name, size=size)
        with pytest.raises(BadInput, match=rf"^image {tmp_path / name} is {size[1]}x{size[0]} pixels \(height x width\): too small"):
            resolve("a fox", model="tiny-i2v", device="cpu", image=tmp_path / name, out=tmp_path / "a.mp4")
    noise_image(tmp_path / "small.png", size=(20, 16))  # to 96x160 with crop: 8x up
    cfg = resolve("a fox", model="tiny-i2v", device="cpu", image=tmp_path / "small.png", out=tmp_path / "b.mp4")
    assert len(cfg.notes) == 1 and "scaled up 8.0x to fit the 96x160 video (--fit crop)" in cfg.notes[0]
    noise_image(tmp_path / "fine.png", size=(160, 96))  # the video's own size and shape: nothing to say
    assert resolve("a fox", model="tiny-i2v", device="cpu", image=tmp_path / "fine.png",
                   out=tmp_path / "c.mp4").notes == ()
    noise_image(tmp_path / "square.png", size=(48, 40))  # issue 29: a crop of 28% of the height is said
    notes = resolve("a fox", model="tiny-i2v", device="cpu", image=tmp_path / "square.png",
                    out=tmp_path / "d.mp4").notes
    assert len(notes) == 1 and "(40x48, height x width) loses 28% of its height to the crop" in notes[0]


def test_guidance_2_without_cfg_is_a_note(tmp_path):
    cfg = resolve("a fox", model="tiny-a14b", device="cpu", guidance=1.0, guidance_2=9.0, out=tmp_path / "a.mp4")
    assert any(n.startswith("--guidance-2 9 has no effect: CFG is off for both experts") for n in cfg.notes)
    on = resolve("a fox", model="tiny-a14b", device="cpu", guidance=4.0, guidance_2=9.0, out=tmp_path / "b.mp4")
    assert not any("--guidance-2" in n for n in on.notes)


def test_default_output_name_in_the_current_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = resolve("a fox", model="tiny", attn="vsa", seed=3, device="cpu")
    assert cfg.out == Path("vsagen-tiny-vsa-seed3.mp4") and cfg.json_out == Path("vsagen-tiny-vsa-seed3.json")
    # a cached run is another video: its name says the cache (its name only, as the backend's), `none` nothing
    cached = resolve("a fox", model="tiny", attn="vsa", cache="first-block:threshold=0.1", device="cpu")
    assert cached.out == Path("vsagen-tiny-vsa-first-block-seed0.mp4")
    uncached = resolve("a fox", model="tiny", attn="vsa", cache="none", device="cpu")
    assert uncached.out == Path("vsagen-tiny-vsa-seed0.mp4")
    # two cubes are two videos: a cube other than VSA's 4x4x4 is in the name (as compare names its files)
    assert resolve("a fox", model="tiny", attn="vsa:tile=4x4x8", device="cpu").out == \
        Path("vsagen-tiny-vsa-tile-4x4x8-seed0.mp4")
    assert resolve("a fox", model="tiny", attn="vsa:tile=4x4x4", device="cpu").out == Path("vsagen-tiny-vsa-seed0.mp4")
    # a MagCache calibration is not a MagCache run (it reuses nothing): its own name
    monkeypatch.setenv("VSAGEN_CACHE", str(tmp_path / "cache"))
    calibration = resolve("a fox", model="tiny", attn="vsa", cache="mag:calibrate=true", device="cpu")
    assert calibration.out == Path("vsagen-tiny-vsa-mag-calibrate-seed0.mp4")


def test_the_default_name_and_the_metadata_say_a_precision_other_than_the_default(tmp_path, monkeypatch):
    """New-user trial: runs differing only in precision (`--attn vsa:precision=int8`, `--quant int8`) got names that
    differed by the -1 suffix only. The fine stage's precision other than bf16 and the linears' other than the
    model's default (`--quant auto`: int8 for a -quant preset's files) are in the name; default names unchanged."""
    monkeypatch.chdir(tmp_path)
    out = lambda **kw: resolve("a fox", model="tiny", device="cpu", **kw).out  # noqa: E731
    assert out() == Path("vsagen-tiny-full-seed0.mp4")
    assert out(attn="vsa:precision=bf16") == Path("vsagen-tiny-vsa-seed0.mp4")
    assert out(attn="vsa:precision=int8") == Path("vsagen-tiny-vsa-int8-seed0.mp4")
    assert out(attn="sla:precision=int8") == Path("vsagen-tiny-sla-int8-seed0.mp4")
    assert out(quant="int8") == Path("vsagen-tiny-full-int8-linears-seed0.mp4")
    assert out(quant="none") == out(quant="auto") == Path("vsagen-tiny-full-seed0.mp4")
    quant = lambda q: resolve("a fox", model="turbowan2.1-t2v-1.3b-quant", device="cpu", quant=q).out  # noqa: E731
    assert quant("auto") == quant("int8") == Path("vsagen-turbowan2.1-t2v-1.3b-quant-sla-rcm-seed0.mp4")
    assert quant("none") == Path("vsagen-turbowan2.1-t2v-1.3b-quant-sla-fp32-linears-rcm-seed0.mp4")
    described = resolve("a fox", model="tiny", device="cpu", quant="int8").metadata()["description"]
    assert ", --attn full, --quant int8, 4 steps" in described
    assert "--quant" not in resolve("a fox", model="tiny", device="cpu").metadata()["description"]


def test_an_existing_sheet_is_refused_before_the_run_unless_overwrite(tmp_path):
    """--sheet: the contact sheet's path is checked as the mp4's (`vsagen.media.paths.check_target`), before loading."""
    assert resolve("a fox", model="tiny", device="cpu", out=tmp_path / "v.mp4").sheet_out is None
    (tmp_path / "v.sheet.png").write_text("an earlier sheet")
    with pytest.raises(BadInput, match=r"v\.sheet\.png exists; pass --overwrite to replace it, or choose another --out"):
        resolve("a fox", model="tiny", device="cpu", out=tmp_path / "v.mp4", sheet=True)
    cfg = resolve("a fox", model="tiny", device="cpu", out=tmp_path / "v.mp4", sheet=True, overwrite=True)
    assert cfg.sheet_out == tmp_path / "v.sheet.png" and cfg.summary()["sheet_out"] == str(cfg.sheet_out)
    assert (tmp_path / "v.sheet.png").read_text() == "an earlier sheet"


def test_overwrite_without_sheet_says_an_earlier_sheet_stays(tmp_path):
    """New-user trial: `--overwrite` without `--sheet` replaced the pair and silently kept an older run's sheet."""
    (tmp_path / "v.sheet.png").write_text("an earlier sheet")
    cfg = resolve("a fox", model="tiny", device="cpu", out=tmp_path / "v.mp4", overwrite=True)
    assert any("v.sheet.png is an earlier run's contact sheet and stays as it was" in n for n in cfg.notes)
    assert not any("contact sheet" in n for n in resolve("a fox", model="tiny", device="cpu", sheet=True,
                                                          out=tmp_path / "v.mp4", overwrite=True).notes)


def test_out_png_checks_every_frame_file_and_says_an_earlier_longer_runs_frames_go(tmp_path):
    """`--out f.png` writes f-0000.png ... (one per frame): each is checked before loading as the mp4 is, and with
    --overwrite a longer earlier run's frames past this run's count are removed once the new ones are in place
    (`vsagen.media.formats.write_video`), which a note says."""
    cfg = resolve("a fox", model="tiny", device="cpu", frames=5, out=tmp_path / "f.png")
    assert cfg.video_format == "png" and cfg.json_out == tmp_path / "f.json" and cfg.summary()["video_format"] == "png"
    (tmp_path / "f-0004.png").write_bytes(b"x")
    with pytest.raises(BadInput, match=r"f-0004\.png exists; pass --overwrite"):
        resolve("a fox", model="tiny", device="cpu", frames=5, out=tmp_path / "f.png")
    (tmp_path / "f-0005.png").write_bytes(b"x")  # an earlier run of more frames
    cfg = resolve("a fox", model="tiny", device="cpu", frames=5, out=tmp_path / "f.png", overwrite=True)
    assert f"{tmp_path / 'f-0005.png'} of an earlier run goes once this run's 5 frames are in place (--overwrite)" \
        in cfg.notes
    (tmp_path / "f-0006.png").write_bytes(b"x")
    cfg = resolve("a fox", model="tiny", device="cpu", frames=5, out=tmp_path / "f.png", overwrite=True)
    assert any(n.startswith(f"{tmp_path / 'f-0005.png'} and 1 more frame file of an earlier run go once")
               for n in cfg.notes)
    assert not any("earlier run" in n for n in resolve("a fox", model="tiny", device="cpu", frames=9,
                                                       out=tmp_path / "f.png", overwrite=True).notes)


def test_the_settings_of_a_tiny_weights_file_are_json(tmp_path):
    """`--vae tiny:weights=FILE`: the run's settings hold the decoder as its text (the file absolute), and the list
    compare takes (`vae_decoders`, whose entries hold a Path) is not in them: they go into t2v's JSON as they are."""
    import json

    import torch

    from vsagen.decode.tiny_decoder import TinyVaeConfig, random_decoder

    # a real decoder: a .pth is read (memory-mapped) before loading now, as a safetensors file's header is
    torch.save(random_decoder(TinyVaeConfig(16, 1, (8, 8, 8, 8)), seed=0).state_dict(), tmp_path / "taew2_1.pth")
    cfg = resolve("a fox", model="tiny", device="cpu", vae=f"tiny:weights={tmp_path / 'taew2_1.pth'}",
                  out=tmp_path / "a.mp4")
    settings = json.loads(json.dumps(cfg.summary()))
    assert settings["vae_decoder"] == f"tiny:weights={tmp_path / 'taew2_1.pth'}" and "vae_decoders" not in settings


def test_a_prompt_with_a_nul_or_past_the_metadata_s_limit_is_refused_before_anything_runs(tmp_path):
    """Found on 2026-12-07 (serve and --prompts take any text): a NUL in the prompt, or a prompt of 200,000
    characters, ran the whole video, then failed writing it ("embedded null byte"; "Argument list too long": the
    prompt goes into the mp4's metadata on ffmpeg's command line). Refused at the request now; the limit itself
    passes."""
    from vsagen.commands.generate_config import PROMPT_BYTES

    flags = dict(model="tiny", device="cpu", out=tmp_path / "a.mp4")
    with pytest.raises(BadInput, match=r"^the prompt holds a NUL character$"):
        resolve("a\0b", **flags)
    with pytest.raises(BadInput, match=r"^the negative prompt is 16385 bytes long; at most 16384 "):
        resolve("a fox", negative_prompt="x" * (PROMPT_BYTES + 1), **flags)
    with pytest.raises(BadInput, match=r"^the prompt is 16386 bytes long"):  # UTF-8 bytes, not characters
        resolve("é" * 8193, **flags)
    assert resolve("x" * PROMPT_BYTES, **flags).prompt == "x" * PROMPT_BYTES
    assert not list(tmp_path.iterdir())


def test_a_resident_image_to_video_request_is_taken_without_an_image(tmp_path):
    """`images_per_video` (vsagen serve's loaded request): an image-to-video model without an image is image to
    video, its videos bringing theirs; a text-to-video model, or a request with its image, is as without it."""
    from vsagen.commands.generate_config import resolve_run
    from vsagen.request.options import request_options

    flags = dict(steps=1, height=32, width=32, frames=1, device="cpu", out=tmp_path / "a.mp4")
    with pytest.raises(BadInput, match="is an image-to-video model; use `vsagen i2v IMAGE PROMPT`"):
        resolve_run("x", request_options(model="tiny-i2v", **flags))
    cfg = resolve_run("x", request_options(model="tiny-i2v", **flags), images_per_video=True)
    assert (cfg.image, cfg.images_per_video, cfg.image_to_video) == (None, True, True)
    t2v = resolve_run("x", request_options(model="tiny", **flags), images_per_video=True)
    assert (t2v.images_per_video, t2v.image_to_video) == (False, False)


def test_turbowan22_i2v_sizes_the_video_by_the_image_and_runs_rcm_as_ode(tmp_path):
    """turbowan2.2-i2v-a14b runs as TurboDiffusion's Wan2.2 I2V script (--ode --adaptive_resolution): the image's
    aspect at 720 x 1280's area (a 2:3 portrait: 1168 x 784), said in a note; --height / --width still win."""
    from conftest import noise_image

    noise_image(tmp_path / "portrait.png", size=(200, 300))
    flags = dict(model="turbowan2.2-i2v-a14b", device="cpu", image=tmp_path / "portrait.png")
    cfg = resolve("a fox", **flags, out=tmp_path / "a.mp4")
    assert (cfg.height, cfg.width, cfg.sampler.text, cfg.sampler.noise) == (
        1168, 784, "rcm:sigma_max=200:ode=true", "none")
    assert "the video is 1168x784" in cfg.notes[0] and "--adaptive_resolution" in cfg.notes[0]
    cfg = resolve("a fox", **flags, height=480, width=832, out=tmp_path / "b.mp4")
    assert (cfg.height, cfg.width) == (480, 832) and not any("adaptive" in n for n in cfg.notes)


def test_lightx2v_wan22_i2v_sizes_the_video_by_the_image_rounding_down(tmp_path):
    """lightx2v-wan2.2-i2v-a14b sizes as LightX2V's Wan runner does: the image's aspect at 720 x 1280's area, the
    sides rounded down to multiples of 16 (a 2:3 portrait: 1168 x 768, where TurboDiffusion's rule gives 1168 x 784);
    its 4 Euler steps, CFG off."""
    from conftest import noise_image

    noise_image(tmp_path / "portrait.png", size=(200, 300))
    cfg = resolve("a fox", model="lightx2v-wan2.2-i2v-a14b", device="cpu", image=tmp_path / "portrait.png",
                  out=tmp_path / "a.mp4")
    assert (cfg.height, cfg.width, cfg.sampler.text, cfg.steps, cfg.guidance) == (1168, 768, "lightx2v-4step", 4, 1.0)
    assert "the video is 1168x768" in cfg.notes[0] and "LightX2V's sizing, sides rounded down" in cfg.notes[0]
    assert cfg.transformer_sources == tuple(f"lightx2v/Wan2.2-Distill-Models/wan2.2_i2v_A14b_{n}_noise_lightx2v_4step"
                                            ".safetensors" for n in ("high", "low"))


def test_turbowan_presets_run_sla_in_turbodiffusions_hopper_geometry(tmp_path):
    """TurboDiffusion's default SageSLA selects 64-token query x 128-token key blocks on Hopper (SLA/core.py:186-187);
    the TurboWan presets set that; an entry's blocks still win."""
    cfg = resolve("a fox", model="turbowan2.1-t2v-1.3b", device="cpu", out=tmp_path / "a.mp4")
    o = cfg.backend.options
    assert (cfg.attn, o.block_q, o.block_k, o.topk) == ("sla", 64, 128, 0.1)
    o = resolve("a fox", model="turbowan2.1-t2v-1.3b", device="cpu", attn="sla:block_q=128:block_k=64",
                out=tmp_path / "b.mp4").backend.options
    assert (o.block_q, o.block_k) == (128, 64)


def test_the_json_reports_no_flow_shift_for_a_fixed_sigma_sampler(tmp_path):
    """New-user trial: with a re-noise sampler (lightx2v-4step, dmd, rcm: a fixed sigma list, used as given) the run
    JSON's `flow_shift` said the preset's shift, which that sampler does not use: null then, the shift the
    checkpoint's scheduler runs otherwise; `vsagen profile` and `vsagen compare` say the same."""
    from vsagen.commands.compare_config import resolve_compare
    from vsagen.commands.profile_config import resolve_profile

    fixed = resolve("a fox", model="lightx2v-wan2.1-t2v-14b", device="cpu", out=tmp_path / "a.mp4")
    assert fixed.sampler.name == "lightx2v-4step" and fixed.summary()["flow_shift"] is None
    assert resolve("a fox", model="tiny", device="cpu", sampler="dmd", out=tmp_path / "b.mp4").summary()[
        "flow_shift"] is None
    own = resolve("a fox", model="tiny", device="cpu", flow_shift=4.0, out=tmp_path / "c.mp4")
    assert own.summary()["flow_shift"] == 4.0 and own.summary()["sampler"]["name"] == "default"
    assert resolve_profile(model="tiny", device="cpu", sampler="dmd").summary()["flow_shift"] is None
    shift = load_preset("tiny").defaults.flow_shift
    assert resolve_profile(model="tiny", device="cpu").summary()["flow_shift"] == shift
    compare = resolve_compare("a fox", model="tiny", device="cpu", sampler="dmd,default", out=tmp_path / "cmp")
    assert compare.summary()["flow_shift"] is None
    assert [s["flow_shift"] for s in compare.summary()["samplers"]] == [None, shift]
