"""`vsagen.decode.tiny_files`: where `--vae tiny` finds its weights. The published files by latent width and name,
LightX2V's un-normalised-latents rule, the checks before anything loads (a name or a safetensors file of another
width, a damaged file; a published file neither cached nor reachable: one line, the hub not asked offline) and a
cached one found, in a private Hugging Face cache (`hub`, conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vsagen.decode.tiny_decoder import TinyVaeConfig, random_decoder, save_file
from vsagen.decode.tiny_files import (PUBLISHED, check_distinct_decoders, check_tiny_request, check_tiny_vae, hub_file, published_for,
                                      raw_latents_file, tiny_model_file)
from vsagen.errors import BadInput, ModelNotFound
from vsagen.models.sources import resolve_model
from vsagen.request.options import VaeSpec

from conftest import one_error_line


def test_the_published_files_by_width_and_name():
    assert published_for(16).hub_text == "madebyollin/taehv/taew2_1.pth"
    assert published_for(48).hub_text == "madebyollin/taehv/taew2_2.pth"
    light = published_for(48, "lighttaew2_2")
    assert light.hub_text == "lightx2v/Autoencoders/lighttaew2_2.safetensors" and light.raw_latents
    assert {n: (f.latent_channels, f.patch_size) for n, f in PUBLISHED.items()} == {
        "taew2_1": (16, 1), "taew2_2": (48, 2), "lighttaew2_1": (16, 1), "lighttaew2_2": (48, 2)}
    assert raw_latents_file("/x/LightTAEW2_1.safetensors") and not raw_latents_file("/lighttae/taew2_1.pth")
    assert tiny_model_file(Path("/c/tiny-pipeline"), light) == Path("/c/tiny-pipeline/vae/tiny/lighttaew2_2.safetensors")


def test_a_name_or_a_file_of_another_width_is_refused_before_loading(tmp_path):
    tiny, ti2v = resolve_model("tiny"), resolve_model("tiny-ti2v")
    with pytest.raises(BadInput, match="taew2_2 decodes 48-channel latents and --model tiny's VAE makes 16-channel "
                                       "ones; its published decoders are taew2_1, lighttaew2_1"):
        check_tiny_request(VaeSpec.parse("tiny:name=taew2_2"), tiny, "tiny")
    f = tmp_path / "taew2_2.safetensors"
    save_file(random_decoder(TinyVaeConfig(48, 2, (8, 8, 8, 8)), seed=0), f)
    check_tiny_request(VaeSpec.parse(f"tiny:weights={f}"), ti2v, "tiny-ti2v")
    with pytest.raises(BadInput, match="decodes 48-channel latents and --model tiny's VAE makes 16-channel"):
        check_tiny_request(VaeSpec.parse(f"tiny:weights={f}"), tiny, "tiny")
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(f.read_bytes()[:1000])
    with pytest.raises(BadInput, match="damaged or truncated"):
        check_tiny_request(VaeSpec.parse(f"tiny:weights={cut}"), ti2v, "tiny-ti2v")
    for fine in ("tiny", "stock", "tiny:name=lighttaew2_1"):
        check_tiny_request(VaeSpec.parse(fine), tiny, "tiny")


def test_an_uncached_published_file_offline_is_one_line_at_once(hub):
    for model, name, file in (("wan2.1-t2v-1.3b", "tiny", "madebyollin/taehv/taew2_1.pth"),
                              ("fastwan2.2-ti2v-5b", "tiny", "madebyollin/taehv/taew2_2.pth"),
                              ("wan2.1-t2v-1.3b", "tiny:name=lighttaew2_1",
                               "lightx2v/Autoencoders/lighttaew2_1.safetensors")):
        with pytest.raises(ModelNotFound) as info:
            check_tiny_vae(VaeSpec.parse(name), resolve_model(model), random_weights=False)
        msg = str(info.value)
        assert msg.startswith(f"--vae tiny: {file} is not in the local Hugging Face cache and the hub is off "
                              "(HF_HUB_OFFLINE is set)") and "\n" not in msg and info.value.exit_code == 2
        assert "hf download " in msg and "--vae tiny:weights=DIR/" in msg
    assert hub.asked == []
    for nothing_to_read in (("stock", "wan2.1-t2v-1.3b", False), ("tiny", "wan2.1-t2v-1.3b", True),
                            ("tiny", "tiny", False)):
        check_tiny_vae(VaeSpec.parse(nothing_to_read[0]), resolve_model(nothing_to_read[1]), nothing_to_read[2])


def test_a_cached_file_is_found_and_a_reachable_hub_goes_on(hub, tmp_path, monkeypatch):
    import huggingface_hub.constants

    folder = tmp_path / "snap"
    folder.mkdir()
    (folder / "taew2_1.pth").write_bytes(b"weights")
    hub.store("madebyollin/taehv", folder)
    check_tiny_vae(VaeSpec.parse("tiny"), resolve_model("wan2.1-t2v-1.3b"), random_weights=False)
    assert hub_file(PUBLISHED["taew2_1"], local_only=True).read_bytes() == b"weights"
    assert hub_file(PUBLISHED["taew2_2"], local_only=True) is None
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    check_tiny_vae(VaeSpec.parse("tiny"), resolve_model("fastwan2.2-ti2v-5b"), random_weights=False)
    assert hub.asked == ["madebyollin/taehv"]  # taew2_2 is not cached: the hub answered for its repository


def test_the_command_line_refuses_before_loading(hub, tiny_dir, tmp_path):
    """A local checkpoint (nothing to download for it) with `--vae tiny` offline: one line, exit 2, nothing
    written, before anything loads."""
    from vsagen.cli.app import app

    out = tmp_path / "out"
    out.mkdir()
    res = CliRunner().invoke(app, ["t2v", "a fox", "--model", str(tiny_dir), "--vae", "tiny", "--steps", "1",
                                   "--out", str(out / "f.mp4")])
    assert one_error_line(res).startswith("error: --vae tiny: madebyollin/taehv/taew2_1.pth is not in the local")
    assert list(out.iterdir()) == []


def test_a_weights_file_without_a_whole_decoder_is_refused_before_loading(tmp_path):
    """Found by trying bad files as a new user: these were refused only once the model had loaded (a safetensors
    file read by its header, a .pth memory-mapped)."""
    from safetensors.torch import save_file as save

    tiny = resolve_model("tiny")
    state = random_decoder(TinyVaeConfig(16, 1, (8, 8, 8, 8)), seed=3).state_dict()
    cases = {"unknown": ({"foo": state["decoder.1.weight"].clone()}, "decoder.1.weight missing"),
             "missing": ({k: v for k, v in state.items() if k != "decoder.9.conv.4.weight"},
                         "lacks decoder.9.conv.4.weight"),
             "shape": ({**state, "decoder.10.conv.2.weight": state["decoder.10.conv.2.weight"][:, :7].contiguous()},
                       r"decoder.10.conv.2.weight has shape \(8, 7, 3, 3\)"),
             "int8": ({k: v.to(torch.int8) for k, v in state.items()}, "holds int8 values, not floating point"),
             "extra": ({**state, "decoder.30.weight": state["decoder.1.bias"].clone()}, "has decoder.30.weight")}
    for name, (bad, match) in cases.items():
        f = tmp_path / f"{name}.safetensors"
        save(bad, str(f))
        with pytest.raises(BadInput, match=match) as info:
            check_tiny_request(VaeSpec.parse(f"tiny:weights={f}"), tiny, "tiny")
        assert "\n" not in str(info.value) and str(info.value).startswith(f"--vae tiny:weights={f}: ")
    save({**{k: v.half() for k, v in state.items()}, "encoder.0.weight": state["decoder.1.bias"].clone()},
         str(tmp_path / "half.safetensors"))
    check_tiny_request(VaeSpec.parse(f"tiny:weights={tmp_path / 'half.safetensors'}"), tiny, "tiny")
    wide = random_decoder(TinyVaeConfig(48, 2, (8, 8, 8, 8)), seed=4).state_dict()
    torch.save({**state, "encoder.0.weight": torch.zeros(2)}, tmp_path / "fine.pth")
    check_tiny_request(VaeSpec.parse(f"tiny:weights={tmp_path / 'fine.pth'}"), tiny, "tiny")
    for name, content, match in (("wide.pth", wide, "decodes 48-channel latents and --model tiny's VAE makes 16"),
                                 ("other.pth", {"w": torch.zeros(2)}, "decoder.1.weight missing"),
                                 ("code.pth", {"w": Path("x")}, "refused: it holds objects other than tensors")):
        torch.save(content, tmp_path / name)  # a .pth was checked only once the model had loaded
        with pytest.raises(BadInput, match=match):
            check_tiny_request(VaeSpec.parse(f"tiny:weights={tmp_path / name}"), tiny, "tiny")


def test_one_decoder_listed_twice_under_two_names_is_refused(tmp_path):
    """Found as a new user: `compare --vae tiny,tiny:name=taew2_1` ran the same decoder twice (PSNR inf)."""
    from vsagen.cli.app import app

    def check(text, model):
        check_distinct_decoders([VaeSpec.parse(x) for x in text.split(",")], resolve_model(model), model)

    for text, model, same in (("tiny,tiny:name=taew2_1", "tiny", "taew2_1"),
                              ("stock,tiny:name=taew2_2,tiny", "tiny-ti2v", "taew2_2"),
                              ("tiny:name=taew2_1,stock,tiny", "wan2.1-t2v-1.3b", "taew2_1")):
        with pytest.raises(BadInput, match=rf"are the same decoder for --model {model} \({same}, ") as info:
            check(text, model)
        assert "\n" not in str(info.value)
    save_file(random_decoder(TinyVaeConfig(16, 1, (8, 8, 8, 8)), seed=0), tmp_path / "taew2_1.safetensors")
    for fine, model in (("tiny,tiny:name=lighttaew2_1,stock", "tiny"), ("tiny,tiny:name=taew2_2", "tiny"),
                        (f"tiny,tiny:weights={tmp_path / 'taew2_1.safetensors'}", "tiny")):
        check(fine, model)  # another decoder (taew2_2's width is check_tiny_request's refusal), a file of one's own
    res = CliRunner().invoke(app, ["compare", "a fox", "--model", "tiny", "--attn", "full", "--vae",
                                   "tiny,tiny:name=taew2_1", "--out", str(tmp_path / "cmp")])
    assert one_error_line(res) == ("error: --vae: tiny and tiny:name=taew2_1 are the same decoder for --model tiny "
                                   "(taew2_1, for its 16-channel latents); list it once")
    assert not (tmp_path / "cmp").exists()
