"""vsagen.sparsity.files: pattern files saved and loaded back, every malformed variant refused as one BadInput line
naming the file, the architecture and grid checks (remap), the step ranges' modes, density and mode counts."""

from __future__ import annotations

import copy
import hashlib
import json
import math

import pytest

from conftest import make_transformer
from vsagen.errors import BadInput
from vsagen.architecture import ARCH_FIELDS, architecture_of
from vsagen.sparsity.files import PatternFile, StepRange, file_hash, load_patterns, parse_patterns, save_patterns
from vsagen.sparsity.patterns import block_density, dense, diagonal, mixed, skip, vertical_stripe

# The tiny preset's transformer (vsagen/preset_data/tiny.toml [transformer]): 2 layers of 2 heads of 16.
ARCH = {"layers": 2, "heads": 2, "head_dim": 16, "in_channels": 16, "ffn_dim": 32, "patch_size": [1, 2, 2]}
GRID = (5, 6, 10)
MODES = {"dense": dense(), "skip": skip(), "diag": diagonal(1, name="diag"),
         "stripe": vertical_stripe(1, 3, name="stripe"),
         "both": mixed(diagonal(0), vertical_stripe(0, 4), name="both")}


def make_file(experts=("transformer",), scores=None) -> PatternFile:
    early = {e: (("dense", "diag"), ("skip", "both")) for e in experts}
    late = {e: (("stripe", "stripe"), ("dense", "skip")) for e in experts}
    if len(experts) > 1:
        late[experts[1]] = (("diag", "diag"), ("diag", "diag"))
    return PatternFile(model="tiny", architecture=dict(ARCH), experts=tuple(experts), height=96, width=160,
                       frames=17, grid=GRID, steps=4, lam=0.25, eps=0.01, prompts=2, modes=dict(MODES),
                       ranges=(StepRange(0, 1, early), StepRange(1, 4, late)),
                       scores={} if scores is None else scores)


def good_json() -> dict:
    return make_file(scores={"transformer/0/1": {"dense": 0.0, "diag": 0.125}}).to_json()


def test_save_load_round_trip(tmp_path):
    for pf in (make_file(), make_file(("transformer", "transformer_2")),
               make_file(scores={"transformer/1/0": {"dense": 0.0, "skip": 1.5}})):
        path = tmp_path / f"p{len(pf.experts)}{len(pf.scores)}.json"
        save_patterns(pf, path)
        back = load_patterns(path)
        assert back == pf
        assert back.to_json() == pf.to_json() == json.loads(path.read_text())
        assert file_hash(path) == hashlib.sha256(path.read_bytes()).hexdigest()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p10.json", "p11.json", "p20.json"]  # no temporaries


def test_save_refuses_to_overwrite_unless_asked(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("keep")
    with pytest.raises(BadInput, match="exists"):
        save_patterns(make_file(), path)
    assert path.read_text() == "keep"
    save_patterns(make_file(), path, overwrite=True)
    assert load_patterns(path) == make_file()


def _drop(key):
    def f(d):
        del d[key]
    return f


def _set(*path_and_value):
    *path, value = path_and_value

    def f(d):
        for k in path[:-1]:
            d = d[k]
        d[path[-1]] = value
    return f


MALFORMED = {
    **{f"missing-{k}": (_drop(k), "") for k in ("format", "version", "model", "architecture", "experts", "height",
                                                "width", "frames", "grid", "steps", "lam", "eps", "prompts", "modes",
                                                "ranges")},
    **{f"architecture-lacks-{k}": (lambda d, k=k: d["architecture"].pop(k), f"architecture lacks '{k}'")
       for k in ARCH_FIELDS},
    "wrong-format": (_set("format", "vsagen-profile"), "not a vsagen pattern file"),
    "version-2": (_set("version", 2), "version 2"),
    "version-text": (_set("version", "1"), "version '1'"),
    "version-true": (_set("version", True), "version True"),
    "layers-zero": (_set("architecture", "layers", 0), "positive integers"),
    "heads-true": (_set("architecture", "heads", True), "positive integers"),
    "architecture-list": (_set("architecture", [2, 2]), "'architecture' has the wrong type"),
    "experts-empty": (_set("experts", []), "distinct names"),
    "experts-repeated": (_set("experts", ["transformer", "transformer"]), "distinct names"),
    "experts-number": (_set("experts", [1]), "distinct names"),
    "grid-two": (_set("grid", [5, 6]), "three positive integers"),
    "grid-zero": (_set("grid", [5, 0, 10]), "three positive integers"),
    "grid-float": (_set("grid", [5, 6.5, 10]), "three positive integers"),
    "mode-unknown-kind": (_set("modes", "diag", {"kind": "blur"}), "unknown pattern kind"),
    "mode-negative-radius": (_set("modes", "diag", {"kind": "diagonal", "radius": -1}), "radius must be"),
    "mode-extra-param": (_set("modes", "dense", {"kind": "dense", "radius": 2}), "dense takes no radius"),
    "mode-mixed-of-mixed": (_set("modes", "both", {"kind": "mixed", "parts": [{"kind": "mixed", "parts": [
        {"kind": "dense"}]}]}), "none of them mixed"),
    "mode-not-object": (_set("modes", "diag", "diagonal"), "a definition is an object"),
    "mode-name-spaces": (lambda d: d["modes"].update({"two words": {"kind": "dense"}}), "one word"),
    "modes-list": (_set("modes", []), "'modes' has the wrong type"),
    "unknown-mode": (_set("ranges", 0, "heads", "transformer", 1, ["skip", "blur"]), "blur"),
    "mode-number": (_set("ranges", 0, "heads", "transformer", 1, ["skip", 3]), "mode names"),
    "layer-count": (lambda d: d["ranges"][1]["heads"]["transformer"].pop(), "must list 2 layers"),
    "layer-count-more": (lambda d: d["ranges"][1]["heads"]["transformer"].append(["dense", "dense"]),
                         "must list 2 layers"),
    "edited-architecture": (_set("architecture", "layers", 3), 'must list 3 layers (its "architecture" block'),
    "head-count": (_set("ranges", 0, "heads", "transformer", 0, ["dense"]), "must list 2 head modes"),
    "head-count-more": (_set("ranges", 0, "heads", "transformer", 0, ["dense"] * 3), "must list 2 head modes"),
    "heads-missing-expert": (_set("ranges", 0, "heads", {}), "one entry per expert"),
    "heads-extra-expert": (_set("ranges", 0, "heads", "transformer_2", [["dense"] * 2] * 2), "one entry per expert"),
    "ranges-empty": (_set("ranges", []), "no step ranges"),
    "ranges-not-from-0": (_set("ranges", 0, "start", 1), "ranges[0] must start at step 0"),
    "ranges-gap": (_set("ranges", 1, "start", 2), "ranges[1] must start at step 1"),
    "ranges-overlap": (_set("ranges", 1, "start", 0), "ranges[1] must start at step 1"),
    "ranges-empty-range": (_set("ranges", 0, "stop", 0), "ranges[0] must start at step 0 and end after it"),
    "ranges-short": (_set("ranges", 1, "stop", 3), "end at step 3, not at steps (4)"),
    "ranges-long": (_set("ranges", 1, "stop", 9), "end at step 9, not at steps (4)"),
    "ranges-float": (_set("ranges", 1, "stop", 4.0), "ranges[1] must start"),
    "range-not-object": (_set("ranges", 1, [1, 4]), "ranges[1] is not an object"),
    "steps-zero": (_set("steps", 0), "steps must be a positive integer"),
    "steps-text": (_set("steps", "4"), "'steps' has the wrong type"),
    "height-zero": (_set("height", 0), "'height' must be an integer >= 1"),
    "frames-float": (_set("frames", 17.5), "'frames' has the wrong type"),
    "prompts-negative": (_set("prompts", -1), "'prompts' must be an integer >= 0"),
    "lam-text": (_set("lam", "0.5"), "'lam' has the wrong type"),
    "lam-nan": (_set("lam", math.nan), "'lam' must be a finite number"),
    "eps-true": (_set("eps", True), "'eps' has the wrong type"),
    "model-number": (_set("model", 3), "'model' has the wrong type"),
    "scores-list": (_set("scores", []), "scores must be an object"),
    "scores-number": (_set("scores", "transformer/0/1", 0.5), "scores must be an object"),
    "scores-nan": (_set("scores", "transformer/0/1", "dense", math.nan), "scores must be an object"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_files_are_refused_in_one_line(tmp_path, case):
    mutate, match = MALFORMED[case]
    data = copy.deepcopy(good_json())
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))  # NaN is written as the NaN literal, which Python's json reads back
    with pytest.raises(BadInput) as info:
        load_patterns(path)
    msg = str(info.value)
    assert "\n" not in msg and f"pattern file {path}" in msg and match in msg, msg
    with pytest.raises(BadInput, match="here"):
        parse_patterns(data, "here")


def test_the_good_variant_loads(tmp_path):
    """The base of the malformed variants is itself accepted (so each refusal is the mutation's)."""
    path = tmp_path / "good.json"
    path.write_text(json.dumps(good_json()))
    assert load_patterns(path).to_json() == good_json()
    data = good_json()
    del data["scores"]  # the one optional field
    assert parse_patterns(data, "x").scores == {}


@pytest.mark.parametrize("text,match", [("{not json", "is not JSON"), ("", "is not JSON"), ("[1, 2]", "not a vsagen"),
                                        ('"vsagen-sparse-vdit"', "not a vsagen"), ("null", "not a vsagen")])
def test_not_json_or_not_an_object(tmp_path, text, match):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(BadInput, match=match) as info:
        load_patterns(path)
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_missing_unreadable_and_binary_files(tmp_path):
    with pytest.raises(BadInput, match="does not exist") as info:
        load_patterns(tmp_path / "none.json")
    assert "\n" not in str(info.value)
    with pytest.raises(BadInput, match="cannot be read"):
        load_patterns(tmp_path)  # a directory
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(BadInput, match="cannot be read") as info:
        load_patterns(tmp_path / "bin.json")
    assert "\n" not in str(info.value)


def test_check_architecture():
    pf = make_file()
    pf.check_architecture(dict(ARCH), None, "f")
    pf.check_architecture({**ARCH, "patch_size": (1, 2, 2)}, "transformer", "f")  # tuple or list alike
    for key, other in [("layers", 3), ("heads", 4), ("in_channels", 48), ("head_dim", 8), ("ffn_dim", 64),
                       ("patch_size", [1, 4, 4])]:
        with pytest.raises(BadInput, match="searched on tiny") as info:
            pf.check_architecture({**ARCH, key: other}, None, "f")
        msg = str(info.value)
        assert "\n" not in msg and f"{key} {ARCH[key]} vs {other}" in msg and "vsagen search" in msg, msg
    with pytest.raises(BadInput, match="covers transformer, not this pipeline's transformer_2"):
        pf.check_architecture(dict(ARCH), "transformer_2", "f")
    make_file(("transformer", "transformer_2")).check_architecture(dict(ARCH), "transformer_2", "f")


def test_check_grid_refuses_another_grid_unless_remap():
    pf = make_file()
    pf.check_grid(GRID, False, "f")
    pf.check_grid(list(GRID), False, "f")
    for grid in [(5, 6, 12), (9, 6, 10), (8, 8, 12)]:
        with pytest.raises(BadInput, match="remap=true") as info:
            pf.check_grid(grid, False, "f")
        msg = str(info.value)
        assert "\n" not in msg and "17x96x160 (frames x height x width" in msg and "5x6x10" in msg and "x".join(map(str, grid)) in msg
        pf.check_grid(grid, True, "f")


def test_architecture_of_the_tiny_transformer_and_a_stub():
    assert architecture_of(make_transformer()) == ARCH

    class Attn:
        heads = 4

        class to_q:  # noqa: N801 - stands in for an nn.Linear
            class weight:  # noqa: N801
                shape = (256, 128)

    class Block:
        attn1 = Attn()

    class Cfg:
        in_channels, ffn_dim, patch_size = 36, 512, (1, 2, 2)

    class Stub:
        config = Cfg()
        blocks = [Block()] * 3

    assert architecture_of(Stub()) == {"layers": 3, "heads": 4, "head_dim": 64, "in_channels": 36, "ffn_dim": 512,
                                       "patch_size": [1, 2, 2]}


def test_a_run_of_another_step_count_maps_the_ranges_by_fraction_of_the_schedule():
    pf = make_file()  # 4 steps: step 0 the early range, steps 1-3 the late one
    assert [pf.search_step(s, 8) for s in range(8)] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert [pf.search_step(s, 2) for s in range(2)] == [0, 2]
    assert [pf.search_step(s, 3) for s in range(3)] == [0, 1, 2]
    assert pf.search_step(3, None) == 3 and pf.search_step(3, 4) == 3 and pf.search_step(-1, 8) == -1
    names = lambda modes: [p.name for p in modes]  # noqa: E731
    assert names(pf.layer_modes(None, 0, 1, run_steps=8)) == ["dense", "diag"]  # step 1 of 8 -> the file's 0
    assert names(pf.layer_modes(None, 0, 1)) == ["stripe", "stripe"]  # by index: the late range
    assert names(pf.layer_modes(None, 0, 2, run_steps=8)) == ["stripe", "stripe"]
    assert names(pf.layer_modes(None, 0, 1, run_steps=2)) == ["stripe", "stripe"]  # step 1 of 2 -> the file's 2


def test_layer_modes_picks_the_step_range_and_expert():
    pf = make_file(("transformer", "transformer_2"))
    names = lambda modes: [p.name for p in modes]  # noqa: E731
    assert names(pf.layer_modes(None, 0, 0)) == ["dense", "diag"]
    assert names(pf.layer_modes(None, 0, -1)) == ["dense", "diag"]  # outside a loop (Timer.step -1): the first
    assert names(pf.layer_modes("transformer", 1, 0)) == ["skip", "both"]
    for step in (1, 2, 3, 4, 50):  # past the last range: the last range's modes
        assert names(pf.layer_modes(None, 0, step)) == ["stripe", "stripe"]
        assert names(pf.layer_modes("transformer", 1, step)) == ["dense", "skip"]
        assert names(pf.layer_modes("transformer_2", 1, step)) == ["diag", "diag"]
    assert pf.layer_modes(None, 1, 0)[1] == MODES["both"]
    assert pf.layer_modes("transformer_2", 0, 0)[0] is MODES["dense"]


def test_density_and_mode_counts():
    pf = make_file()
    d = {n: block_density(p, pf.tiles) for n, p in MODES.items()}
    early = d["dense"] + d["diag"] + d["skip"] + d["both"]
    late = 2 * d["stripe"] + d["dense"] + d["skip"]
    assert pf.tiles == (2, 2, 3)
    assert pf.density() == pytest.approx((1 * early + 3 * late) / (4 * 4))
    other = (3, 4, 7)
    d2 = {n: block_density(p, other) for n, p in MODES.items()}
    want = (d2["dense"] + d2["diag"] + d2["skip"] + d2["both"] + 3 * (2 * d2["stripe"] + d2["dense"] + d2["skip"])) / 16
    assert pf.density(other) == pytest.approx(want)
    assert pf.mode_counts() == {"dense": 2, "skip": 2, "diag": 1, "stripe": 2, "both": 1}
    two = make_file(("transformer", "transformer_2"))
    assert two.mode_counts() == {"dense": 3, "skip": 3, "diag": 6, "stripe": 2, "both": 2}


def test_layer_modes_refuses_an_uncovered_layer_or_expert_in_one_line():
    """A layer or expert outside the file was a KeyError / IndexError traceback; now one BadInput line."""
    pf = make_file()
    for expert, layer in (("transformer_2", 0), (None, 99), (None, -1)):
        with pytest.raises(BadInput, match="covers layers") as e:
            pf.layer_modes(expert, layer)
        assert "\n" not in str(e.value)
