"""vsagen.request.options: the option groups check every bound they own when they are built, with one message per
bound, so every command refuses the same value with the same line before anything loads (issue 28: `vsagen compare`
took `--fps 10000` and `--flow-shift 5000` that t2v refuses); the choices are str Enums; keyword arguments named as
the flags route to their groups."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import one_error_line
from PIL import Image
from typer.testing import CliRunner

from vsagen.cli.app import app
from vsagen.errors import BadInput
from vsagen.request.options import (FLAGS, GROUPS, MAX_FPS, AttentionOptions, Device, Dtype, ModelOptions, Offload,
                                    OutputOptions, PlacementOptions, RequestOptions, SamplingOptions, TileFit,
                                    VaeDecoder, VaeSpec, VaeTiling, request_options)

runner = CliRunner()

# (flag, bad value, the line's words): the same words from every command that takes the flag
BOUNDS = [
    ("--fps", "10000", f"--fps must be an integer in [1, {MAX_FPS}], got 10000"),
    ("--fps", "0", "--fps must be an integer in [1, 240], got 0"),
    ("--flow-shift", "5000", "--flow-shift must be a number in (0, 1000], got 5000.0"),
    ("--flow-shift", "0", "--flow-shift must be a number in (0, 1000], got 0.0"),
    ("--steps", "0", "--steps must be in [1, 10000], got 0"),
    ("--warmup", "-1", "--warmup must be in [0, 10000], got -1"),
    ("--guidance", "101", "--guidance must be a number in [0, 100], got 101.0"),
    ("--guidance", "nan", "--guidance must be a number in [0, 100], got nan"),
    ("--seed", "-3", "--seed must be in [0, 2^63), got -3"),
    ("--sparsity", "1.0", "--sparsity must be in [0, 1), got 1.0"),
    ("--device", "gpu", "--device must be one of auto, cuda, cpu, got 'gpu'"),
    ("--dtype", "fp8", "--dtype must be one of auto, bf16, fp16, fp32, got 'fp8'"),
    ("--tile-fit", "pad", "--tile-fit must be one of partial, crop, got 'pad'"),
    ("--ulysses", "0", "--ulysses must be an integer of at least 1, got 0"),
    ("--gpus", "0", "--gpus must be an integer of at least 1, got 0"),
    ("--nproc", "-2", "--gpus must be an integer of at least 1, got -2"),
    ("--attn-impl", "cuda", "--attn-impl cuda is not an implementation any backend has; choose from auto, fa4, "
                            "torch, triton"),
]
# each command with the arguments it needs, and the flags it takes (from the command line's own declarations)
COMMANDS = {
    "t2v": (["t2v", "a fox"], {"--attn-impl", "--fps", "--flow-shift", "--steps", "--warmup", "--guidance", "--seed", "--sparsity",
                               "--device", "--dtype", "--tile-fit", "--ulysses", "--gpus", "--nproc"}),
    "i2v": (["i2v", "IMG", "a fox"], {"--attn-impl", "--fps", "--flow-shift", "--steps", "--warmup", "--guidance", "--seed",
                                      "--sparsity", "--device", "--dtype", "--tile-fit", "--ulysses", "--gpus", "--nproc"}),
    "compare": (["compare", "a fox", "--attn", "full,vsa"], {"--attn-impl", "--fps", "--flow-shift", "--steps", "--warmup",
                                                             "--guidance", "--seed", "--sparsity", "--device",
                                                             "--dtype", "--tile-fit"}),
    "profile": (["profile", "--attn", "full,vsa"], {"--attn-impl", "--steps", "--warmup", "--guidance", "--seed", "--sparsity",
                                                    "--device", "--dtype", "--tile-fit", "--ulysses", "--gpus", "--nproc"}),
    "search": (["search", "--prompt", "a fox"], {"--attn-impl", "--flow-shift", "--steps", "--guidance", "--seed", "--device",
                                                 "--dtype", "--tile-fit"}),
}
CASES = [(cmd, flag, value, words) for cmd, (_, takes) in COMMANDS.items() for flag, value, words in BOUNDS
         if flag in takes]


@pytest.mark.parametrize("command,flag,value,words", CASES, ids=[f"{c}{f}={v}" for c, f, v, _ in CASES])
def test_every_command_refuses_a_bound_with_the_same_line_before_loading(vsagen_cache, tmp_path, monkeypatch, command,
                                                                         flag, value, words):
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "in").mkdir()
    Image.new("RGB", (64, 48), (200, 90, 40)).save(tmp_path / "in" / "first.png")
    args = [a.replace("IMG", str(tmp_path / "in" / "first.png")) for a in COMMANDS[command][0]]
    res = runner.invoke(app, [*args, "--model", "tiny-i2v" if command == "i2v" else "tiny", flag, value])
    if command == "search":  # search scores with vsagen's own kernels: no fa4 (vsa's FlashAttention-4 fine stage)
        words = words.replace("auto, fa4, torch", "auto, torch")
    assert one_error_line(res) == f"error: {words}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in"], "something was written"


@pytest.mark.parametrize("command", ["t2v", "compare", "search"])
def test_a_command_of_one_tile_fit_refuses_a_list(vsagen_cache, tmp_path, monkeypatch, command):
    """Review: after the request layer, t2v and compare took `--tile-fit partial,crop` and ran the first entry."""
    monkeypatch.setattr("vsagen.pipeline.Session.load", lambda *a, **k: pytest.fail("loaded despite bad input"))
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*COMMANDS[command][0], "--model", "tiny", "--tile-fit", "partial,crop"])
    assert one_error_line(res).startswith("error: --tile-fit must be one of partial, crop, got 'partial,crop' (this "
                                          "command runs one tile fit")
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_declares_each_shared_option_once():
    """Every flag routed to a group is declared in one place (`vsagen.cli.shared_options.SHARED`) and every field of
    every group has its keyword, so no command can take an option another command validates differently."""
    from dataclasses import fields

    from vsagen.cli.shared_options import COMPARE, GENERATE, PROFILE, SEARCH, SHARED

    assert set(SHARED) == set(FLAGS) - {"fused_blocks"}  # fused_blocks: from the environment, once per command
    routed = {(g, f) for g, f in FLAGS.values()}
    assert routed == {(g, f.name) for g, cls in GROUPS.items() for f in fields(cls)}
    for keywords in (GENERATE, PROFILE, COMPARE, SEARCH):
        assert set(keywords) <= set(SHARED) and len(set(keywords)) == len(keywords)


def test_groups_route_keywords_and_coerce_choices():
    o = request_options(model="tiny", tile_fit="partial,crop", device="cpu", dtype="fp32", attn="vsa", fps=8,
                        out="x.mp4", steps=None)
    assert o.model == ModelOptions(model="tiny", tile_fits=(TileFit.PARTIAL, TileFit.CROP))
    assert o.placement.device is Device.CPU and o.placement.dtype == "fp32" and o.placement.offload is Offload.NONE
    assert o.attention == AttentionOptions(attn="vsa") and o.output == OutputOptions(out=Path("x.mp4"), fps=8)
    assert o.sampling == SamplingOptions() and request_options() == RequestOptions()
    assert str(Device.CUDA) == "cuda" and VaeTiling.values() == ("auto", "on", "off") and Dtype("bf16") is Dtype.BF16
    with pytest.raises(TypeError, match="not an option of a request: nope"):
        request_options(nope=1)


@pytest.mark.parametrize("make,needle", [
    (lambda: ModelOptions(model=" "), "--model is empty"),
    (lambda: ModelOptions(height=96.5), "--height must be an integer"),
    (lambda: ModelOptions(tile_fits="partial,partial"), "--tile-fit lists 'partial' twice"),
    (lambda: ModelOptions(tile_fits=" , "), "--tile-fit ' , ' has an empty entry"),
    (lambda: ModelOptions(tile_fits=""), "--tile-fit is empty"),
    (lambda: SamplingOptions(steps=True), "--steps"),
    (lambda: SamplingOptions(guidance_2=-1.0), "--guidance-2 must be a number in [0, 100]"),
    (lambda: SamplingOptions(seed=2**63), "--seed"),
    (lambda: PlacementOptions(offload="disk"), "--offload must be one of none, model, group, got 'disk'"),
    (lambda: PlacementOptions(vae_tiling="maybe"), "--vae-tiling must be one of auto, on, off, got 'maybe'"),
    (lambda: PlacementOptions(ulysses=True), "--ulysses must be an integer of at least 1"),
    (lambda: PlacementOptions(gpus=0), "--gpus must be an integer of at least 1, got 0"),
    (lambda: PlacementOptions(gpus=2.0), "--gpus must be an integer of at least 1, got 2.0"),
    (lambda: AttentionOptions(sparsity=-0.1), "--sparsity must be in [0, 1)"),
    (lambda: OutputOptions(fps=24.0), "--fps must be an integer"),
])
def test_each_group_refuses_what_it_owns(make, needle):
    with pytest.raises(BadInput) as info:
        make()
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_vae_is_parsed_once_into_its_typed_value(tmp_path, monkeypatch):
    """`--vae` text -> `VaeSpec` in the placement group (a weights file absolute, checked to exist), the same object
    in the resolved request and back to its text in the run's config; every malformed value one line."""
    from vsagen.models.sources import resolve_model
    from vsagen.request.resolve import resolve

    import torch

    from vsagen.decode.tiny_decoder import TinyVaeConfig, random_decoder

    monkeypatch.chdir(tmp_path)  # a real decoder: resolve reads a .pth (memory-mapped) before loading
    torch.save(random_decoder(TinyVaeConfig(16, 1, (8, 8, 8, 8)), seed=0).state_dict(), tmp_path / "taew2_1.pth")
    (tmp_path / "folder.pth").mkdir()
    (tmp_path / "w.bin").write_bytes(b"x")
    assert PlacementOptions().vae.one() == VaeSpec() == VaeSpec.parse("auto") == VaeSpec.parse(VaeDecoder.AUTO)
    spec = VaeSpec.parse(" tiny:weights=taew2_1.pth")
    assert spec == VaeSpec(VaeDecoder.TINY, weights=tmp_path / "taew2_1.pth") and spec.weights.is_absolute()
    assert spec.text() == f"tiny:weights={tmp_path / 'taew2_1.pth'}" and VaeSpec.parse(spec) is spec
    assert VaeSpec.parse("tiny:name=lighttaew2_2") == VaeSpec(VaeDecoder.TINY, name="lighttaew2_2")
    assert VaeSpec.parse("tiny:name=lighttaew2_2").text() == "tiny:name=lighttaew2_2"
    options = request_options(model="tiny", vae="tiny:weights=taew2_1.pth")
    assert options.placement.vae.one() == spec
    assert resolve(resolve_model("tiny"), options, prompt="p").vae_decoder is options.placement.vae.one()
    for bad, says in (("tiny:weights=none.pth", "--vae tiny:weights=none.pth: no such file"),
                      ("tiny:weights=folder.pth", "not a file (a TAEHV decoder is one .safetensors or .pth file)"),
                      ("tiny:weights=w.bin", "reads .safetensors, .pth, .pt files only"),
                      ("tiny:weights=", "tiny takes one option, weights=FILE or name=NAME"),
                      ("tiny:size=2", "tiny takes one option"), ("light:name=taew2_1", "tiny takes one option"),
                      ("tiny:name=taew2_3", "--vae tiny:name must be one of taew2_1, taew2_2, lighttaew2_1, "
                                            "lighttaew2_2, got 'taew2_3'"),
                      ("small", "--vae must be one of auto, light, stock, tiny, got 'small'")):
        with pytest.raises(BadInput) as info:
            PlacementOptions(vae=bad)
        assert says in str(info.value) and "\n" not in str(info.value), bad


def test_a_vae_list_is_parsed_once_and_taken_whole_by_compare_only(tmp_path, monkeypatch):
    """`--vae stock,tiny:weights=F,light` -> a `VaeList` of typed entries, in order; a command that decodes with one
    refuses a list, compare (`several`) takes it; an empty entry, `auto` in a list, an entry twice: one line each."""
    from vsagen.models.sources import resolve_model
    from vsagen.request.options import VaeList, parse_vaes
    from vsagen.request.resolve import resolve

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.pth").write_bytes(b"x")
    vaes = PlacementOptions(vae=" stock, tiny:weights=t.pth ,light").vae
    assert isinstance(vaes, VaeList) and vaes.text == "stock, tiny:weights=t.pth ,light"
    assert vaes.several() == (VaeSpec(VaeDecoder.STOCK), VaeSpec(VaeDecoder.TINY, weights=tmp_path / "t.pth"),
                              VaeSpec(VaeDecoder.LIGHT))
    assert vaes.specs[1].short_text() == "tiny:weights=t.pth" and parse_vaes(VaeSpec()).specs == (VaeSpec(),)
    assert PlacementOptions(vae="auto").vae.several() == (VaeSpec(),)  # compare's default: one decoder
    options = request_options(model="tiny", vae="stock,tiny")
    req = resolve(resolve_model("tiny"), options, prompt="p", several_vaes=True)
    assert req.vae_decoders == options.placement.vae.specs and req.vae_decoder is options.placement.vae.specs[0]
    with pytest.raises(BadInput, match=r"^--vae 'stock,tiny': this command decodes with one decoder; `vsagen "
                                       r"compare` compares several"):
        resolve(resolve_model("tiny"), options, prompt="p")
    for bad, says in (("stock,,tiny", "--vae 'stock,,tiny' has an empty entry"), ("", "--vae '' has an empty entry"),
                      ("stock,auto", "--vae 'stock,auto': a list names its decoders"),
                      ("tiny,stock,tiny", "--vae 'tiny,stock,tiny' lists tiny twice"),
                      ("stock,tiny:name=x", "--vae tiny:name must be one of")):
        with pytest.raises(BadInput) as info:
            PlacementOptions(vae=bad).vae.several()
        assert says in str(info.value) and "\n" not in str(info.value), bad


# The functions that read `--attn`, `--attn-impl`, `--sampler`, `--cache` and `--vae` text, by the module that defines them.
PARSERS = {"vsagen.request.backends": ("parse_attn", "check_impl"), "vsagen.attention.spec": ("parse_entry",),
           "vsagen.request.sampling": ("parse_sampler_list", "split_sampler_list", "parse_sampler"),
           "vsagen.cache.cache_spec": ("parse_caches", "parse_cache_list", "parse_cache"),
           "vsagen.request.options": ("parse_vaes",)}


def count_parses(monkeypatch) -> dict[str, int]:
    """Count every call of the `PARSERS`, wherever vsagen bound them (each importing module's name patched too)."""
    import importlib
    import sys

    counts: dict[str, int] = {}
    for module, names in PARSERS.items():
        for name in names:
            original = getattr(importlib.import_module(module), name)

            def counted(*args, _original=original, _name=name, **kwargs):
                counts[_name] = counts.get(_name, 0) + 1
                return _original(*args, **kwargs)

            for mod in [m for n, m in sys.modules.items() if n.startswith("vsagen") and m is not None]:
                if getattr(mod, name, None) is original:
                    monkeypatch.setattr(mod, name, counted)
    return counts


def test_each_option_is_parsed_once_on_its_way_to_the_kernel(vsagen_cache, tiny_dir, tmp_path, monkeypatch):
    """Issue 44: `--attn` was split or parsed six times on its way to the kernel, `--attn-impl` checked twice, the
    sampler parsed in the option group, thrown away and parsed again, `--cache` parsed three times. A whole `vsagen
    t2v` run now reads each text once, when its option group is built; everything below takes the typed values."""
    import json

    import vsagen.commands.generate_config  # noqa: F401 - bound before counting, as the command line binds it
    import vsagen.pipeline  # noqa: F401

    from vsagen.media.video import Encoding

    counts = count_parses(monkeypatch)
    parse_codec = Encoding.parse.__func__

    def counted_codec(cls, text):
        counts["Encoding.parse"] = counts.get("Encoding.parse", 0) + 1
        return parse_codec(cls, text)

    monkeypatch.setattr(Encoding, "parse", classmethod(counted_codec))
    out = tmp_path / "v.mp4"
    res = runner.invoke(app, ["t2v", "a fox", "--model", "tiny", "--device", "cpu", "--frames", "5", "--height", "64",
                              "--width", "64", "--attn", "vsa:sparsity=0.5:tile=4x4x8", "--attn-impl", "torch",
                              "--sampler", "default:steps=2", "--cache", "first-block:threshold=0.2",
                              "--codec", "x264:crf=12", "--vae", "stock", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert counts == {"parse_attn": 1, "parse_entry": 1, "check_impl": 1, "parse_sampler_list": 1,
                      "split_sampler_list": 1, "parse_sampler": 1, "parse_caches": 1, "parse_cache_list": 1,
                      "parse_cache": 1, "parse_vaes": 1, "Encoding.parse": 1}  # --codec was parsed at each of five reads
    data = json.loads(out.with_suffix(".json").read_text())  # and the typed values reached the run
    assert (data["backend"]["sparsity"], data["backend"]["tile"], data["backend"]["impl_ran"]) == (0.5, "4x4x8",
                                                                                                  "torch")
    assert data["config"]["steps"] == 2 and data["config"]["cache"]["threshold"] == 0.2


def test_the_resolved_request_carries_the_groups_typed_values():
    """`resolve` takes the parsed values the groups hold (the same objects), and a group replaced by a command
    (`dataclasses.replace`, as profile sets its warm-up) keeps them without parsing again."""
    import dataclasses

    from vsagen.models.sources import resolve_model
    from vsagen.request.resolve import SEVERAL, resolve

    options = request_options(model="tiny", attn="full,vsa:sparsity=0.5", sampler="default:steps=2",
                              cache="none,first-block")
    sampling = dataclasses.replace(options.sampling, warmup=1)
    assert sampling.sampler is options.sampling.sampler and sampling.cache is options.sampling.cache
    req = resolve(resolve_model("tiny"), dataclasses.replace(options, sampling=sampling), prompt="p",
                  backends=SEVERAL)
    assert req.samplers[0].sampler is options.sampling.sampler.samplers[0]
    assert req.caches == options.sampling.cache.specs and all(a is b for a, b in zip(req.caches,
                                                                                       options.sampling.cache.specs))
    assert [s.sparsity for s in req.backends] == [None, 0.5] and req.attn_requested == "full,vsa:sparsity=0.5"


def test_seeds_are_parsed_once_in_order_and_refused_with_seed_or_twice():
    from vsagen.request.options import parse_seeds

    assert SamplingOptions(seeds="3, 1,2").seeds == (3, 1, 2) and SamplingOptions(seeds=(5,)).seeds == (5,)
    assert request_options(seeds="7,8").sampling == SamplingOptions(seeds=(7, 8))
    assert SamplingOptions().seed is None and SamplingOptions().seeds is None
    assert parse_seeds(f"0,{2**63 - 1}") == (0, 2**63 - 1)
    for bad, needle in [("", "comma-separated integers"), ("1,,2", "comma-separated integers"),
                        ("1,-2", "comma-separated integers"), (str(2**63), "comma-separated integers"),
                        ("1.5", "comma-separated integers"), ((), "comma-separated integers"),
                        ((True,), "comma-separated integers"), ("²", "comma-separated integers"),
                        ("4,2,4", "names a seed twice")]:
        with pytest.raises(BadInput, match=needle):
            parse_seeds(bad)
    with pytest.raises(BadInput, match=r"^--seed and --seeds together"):
        SamplingOptions(seed=0, seeds="1,2")


def test_a_request_of_one_seed_refuses_seeds(vsagen_cache):
    from vsagen.models.sources import resolve_model
    from vsagen.request.resolve import resolve

    with pytest.raises(BadInput, match="--seeds is taken by vsagen t2v and vsagen i2v only"):
        resolve(resolve_model("tiny"), request_options(model="tiny", seeds="1,2"), prompt="a fox")
    assert resolve(resolve_model("tiny"), request_options(model="tiny", device="cpu"), prompt="a fox").seed == 0
