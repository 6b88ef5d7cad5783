"""`vsagen.decode.tiny_decoder`: the TAEHV family's decoder (taew2_1, taew2_2, lighttaew2_*).

Against madebyollin's own module carried as data (`tests/data/taehv_reference.npz`, written by
`benchmarks/make_taehv_reference.py` from their taehv.py @1f14a56: the published widths, weights by the rule that
script defines, odd latent frame counts, a batch of two, both latent widths): the same frames within 1e-4 relative L2
in float32 and the same frame count after the trim. Then, on a narrow decoder: the stream equals the whole decode for
every window, the trim for odd counts, the files (.safetensors and weights-only .pth, published key names, the time
growth's extra rows) and the refusals (damaged file, another network, the `super` variant) in one line.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from vsagen.decode.tiny_decoder import (PUBLISHED_WIDTHS, TinyVaeConfig, TinyVaeDecoder, config_of, from_state_dict,
                                        random_decoder, read_file, save_file)
from vsagen.errors import BadInput

from conftest import rel_l2

ROOT = Path(__file__).resolve().parents[2]
NARROW = TinyVaeConfig(latent_channels=16, patch_size=1, widths=(16, 8, 8, 8))


def reference_script():
    spec = importlib.util.spec_from_file_location("make_taehv_reference", ROOT / "benchmarks" /
                                                  "make_taehv_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reference():
    script = reference_script()
    data = np.load(ROOT / "tests" / "data" / "taehv_reference.npz")
    assert str(data["commit"]) == script.COMMIT and str(data["rule"]) == script.RULE  # written by this rule
    decoders = {}
    for latent, patch in {(c[0], c[1]) for c in script.CASES.values()}:
        with torch.device("meta"):
            shapes = {k: tuple(v.shape) for k, v in TinyVaeDecoder(TinyVaeConfig(latent, patch)).state_dict().items()}
        decoders[latent] = from_state_dict(script.seeded_state(shapes), "reference")
    return script, data, decoders


def test_frames_equal_madebyollins_module(reference):
    script, data, decoders = reference
    for name, (latent, patch, batch, frames, h, w) in script.CASES.items():
        dec = decoders[latent]
        assert dec.config == TinyVaeConfig(latent, patch, PUBLISHED_WIDTHS)  # read back from the shapes
        z, want = torch.from_numpy(data[f"{name}/latents"]), torch.from_numpy(data[f"{name}/frames"])
        with torch.inference_mode():
            whole, chunks = dec.decode(z), list(dec.decode_chunks(z))
        assert want.shape == whole.shape == (batch, 3, 4 * frames - 3, 8 * patch * h, 8 * patch * w), name
        assert rel_l2(whole, want) <= 1e-4, name
        assert rel_l2(torch.cat(chunks, dim=2), want) <= 1e-4, name
        assert [c.shape[2] for c in chunks] == [1] + [4] * (frames - 1)


@pytest.mark.parametrize("frames", [1, 2, 3, 6])
def test_the_stream_is_the_whole_decode_for_every_window(frames):
    dec = random_decoder(NARROW, seed=3)
    z = torch.randn(2, 16, frames, 3, 2, generator=torch.Generator().manual_seed(frames))
    with torch.inference_mode():
        whole = dec.decode(z)
        assert whole.shape == (2, 3, 4 * frames - 3, 24, 16)
        assert 0.0 <= float(whole.min()) and float(whole.max()) <= 1.0
        for window in (1, 2, 5):
            chunks = list(dec.decode_chunks(z, window=window))
            torch.testing.assert_close(torch.cat(chunks, dim=2), whole, rtol=1e-6, atol=1e-6)
            sizes = [min(window, frames - s) * 4 for s in range(0, frames, window)]
            assert [c.shape[2] for c in chunks] == [sizes[0] - 3, *sizes[1:]]  # the video's first 3 frames dropped


def test_causal_a_frame_does_not_see_later_latents():
    dec = random_decoder(NARROW, seed=4)
    z = torch.randn(1, 16, 4, 2, 2)
    changed = z.clone()
    changed[:, :, 2:] += 1.0
    with torch.inference_mode():
        a, b = dec.decode(z), dec.decode(changed)
    assert torch.equal(a[:, :, :5], b[:, :, :5]) and not torch.equal(a[:, :, 5:], b[:, :, 5:])


def test_bad_input_is_a_value_error():
    dec = random_decoder(NARROW, seed=0)
    with pytest.raises(ValueError, match=r"\(B, 16, T, h, w\)"):
        list(dec.decode_chunks(torch.zeros(1, 48, 2, 2, 2)))
    with pytest.raises(ValueError, match="window"):
        list(dec.decode_chunks(torch.zeros(1, 16, 2, 2, 2), window=0))


def published_file(dec: TinyVaeDecoder) -> dict[str, torch.Tensor]:
    """The state dict as their files hold it: encoder tensors beside the decoder's, the stride-1 time growth stored
    with twice its rows (a decoder trained with time upsampling there; the last rows are the ones used)."""
    state = {f"encoder.{i}.weight": torch.randn(4, 4) for i in range(2)}
    for k, v in dec.state_dict().items():
        state[k] = torch.cat([torch.randn_like(v), v]) if k == "decoder.7.conv.weight" else v.clone()
    return state


@pytest.mark.parametrize("suffix", [".safetensors", ".pth"])
def test_files_read_back_with_the_published_keys(tmp_path, suffix):
    dec = random_decoder(TinyVaeConfig(48, 2, (16, 8, 8, 8)), seed=5)
    path = tmp_path / f"taew2_2{suffix}"
    if suffix == ".pth":
        torch.save(published_file(dec), path)
    else:
        from safetensors.torch import save_file as save

        save(published_file(dec), str(path))
    back = read_file(path, "--vae tiny:weights=x", raw_latents=True)
    assert back.config == TinyVaeConfig(48, 2, (16, 8, 8, 8), raw_latents=True) and back.origin == str(path)
    z = torch.randn(1, 48, 3, 2, 2)
    with torch.inference_mode():
        assert torch.equal(back.decode(z), dec.decode(z))
    save_file(dec, tmp_path / "again.safetensors")
    assert torch.equal(read_file(tmp_path / "again.safetensors", "x").decoder[22].weight, dec.decoder[22].weight)


def test_other_files_are_refused_in_one_line(tmp_path):
    dec = random_decoder(NARROW, seed=0)
    state = dec.state_dict()
    cases = [({**state, "decoder.0.weight": torch.zeros(256, 16, 1, 1)}, "'super' decoder"),
             ({k: v for k, v in state.items() if k != "decoder.8.weight"}, "decoder.8.weight missing"),
             ({k: v for k, v in state.items() if k != "decoder.4.conv.2.bias"}, "lacks decoder.4.conv.2.bias"),
             ({**state, "decoder.30.weight": torch.zeros(1)}, "has decoder.30.weight"),
             ({**state, "decoder.13.conv.weight": torch.zeros(8, 9, 1, 1)}, "decoder.13.conv.weight has shape"),
             ({**state, "decoder.22.weight": torch.zeros(5, 8, 3, 3)}, r"not 3 p\^2 pixels"),
             ({"encoder.0.weight": torch.zeros(1)}, "not a TAEHV decoder")]
    for bad, match in cases:
        with pytest.raises(BadInput, match=match) as info:
            from_state_dict(bad, "--vae tiny:weights=f")
        assert "\n" not in str(info.value) and str(info.value).startswith("--vae tiny:weights=f: ")
    save_file(dec, tmp_path / "t.safetensors")
    whole = (tmp_path / "t.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(whole[:len(whole) // 2])
    (tmp_path / "junk.pth").write_bytes(b"not a checkpoint" * 10)
    for name, match in (("cut.safetensors", "damaged or truncated"), ("junk.pth", "cannot read it")):
        with pytest.raises(BadInput, match=match):
            read_file(tmp_path / name, "w")


def test_config_of_reads_the_widths_and_the_patch():
    state = random_decoder(TinyVaeConfig(48, 2, (32, 16, 8, 4)), seed=0).state_dict()
    assert config_of(state, "w") == TinyVaeConfig(48, 2, (32, 16, 8, 4))
    c = TinyVaeConfig(48, 2)
    assert (c.temporal_ratio, c.spatial_ratio, c.frames_to_trim) == (4, 16, 3)


def test_integer_tensors_are_refused_not_cast():
    """Found by a new user's int8 file: its values were cast to float and decoded as if they were weights."""
    state = random_decoder(NARROW, seed=1).state_dict()
    bad = {**state, "decoder.22.weight": (state["decoder.22.weight"] * 100).to(torch.int8)}
    with pytest.raises(BadInput, match="decoder.22.weight holds int8 values, not floating point weights") as info:
        from_state_dict(bad, "--vae tiny:weights=f")
    assert "\n" not in str(info.value)
    back = from_state_dict({k: v.to(torch.bfloat16) for k, v in state.items()}, "w")
    assert back.decoder[22].weight.dtype == torch.float32
