"""vsagen.cache.cache_spec: `--cache NAME[:KEY=VALUE...]` specs, parsed and validated without torch, one line per bad
input."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vsagen.cache.cache_spec import (CACHES, NO_CACHE, WAN_TAYLORSEER_MODULES, CacheList, CacheSpec, FirstBlockOptions,
                          MagOptions, TaylorSeerOptions, cache_options_help, parse_cache, parse_cache_list,
                          parse_caches)
from vsagen.errors import BadInput


def test_names_defaults_and_texts():
    assert list(CACHES) == ["none", "first-block", "mag", "taylorseer"]
    assert parse_cache("none") == NO_CACHE and not NO_CACHE.enabled
    fb = parse_cache("first-block")
    assert fb == CacheSpec("first-block", FirstBlockOptions()) and fb.enabled
    assert fb.text() == "first-block:threshold=0.05" and fb.short_text() == "first-block"
    spec = parse_cache(" first-block : threshold = 0.1 ")
    assert spec.options.threshold == 0.1 and spec.short_text() == "first-block:threshold=0.1"
    mag = parse_cache("mag:calibrate=true:file=/tmp/x/r.json:max_skip_steps=2")
    assert mag.options == MagOptions(max_skip_steps=2, calibrate=True, file=Path("/tmp/x/r.json"))
    assert mag.short_text() == "mag:max_skip_steps=2:calibrate=true:file=r.json"
    assert parse_cache("taylorseer:lite=on").options == TaylorSeerOptions(lite=True)
    assert mag.summary()["file"] == "/tmp/x/r.json" and mag.summary()["name"] == "mag"
    assert dict(cache_options_help())["mag"][-1] == "file=none"


def test_list_keeps_order_and_refuses_repeats():
    assert [s.name for s in parse_cache_list("none,first-block,first-block:threshold=0.2")] == \
        ["none", "first-block", "first-block"]
    with pytest.raises(BadInput, match="lists first-block:threshold=0.05 twice"):
        parse_cache_list("first-block,first-block:threshold=0.05")
    caches = parse_caches(" none,first-block:threshold=0.2")  # what `--cache` is held as: its text and its specs
    assert caches == CacheList(" none,first-block:threshold=0.2", (NO_CACHE, parse_cache("first-block:threshold=0.2")))


@pytest.mark.parametrize("text, words", [
    ("teacache", "unknown --cache 'teacache'; available: none, first-block, mag, taylorseer"),
    ("first-block:thresh=1", "first-block has no option 'thresh'; its options: threshold"),
    ("none:x=1", "none has no option 'x'; none takes no options"),
    ("first-block:0.1", "options are written NAME:KEY=VALUE, got '0.1'"),
    ("first-block:threshold=1:threshold=2", "option 'threshold' given twice"),
    ("first-block:threshold=-0.1", "threshold must be a number >= 0, got -0.1"),
    ("first-block:threshold=nan", "threshold='nan' is not a number"),
    ("mag:max_skip_steps=0", "max_skip_steps must be an integer > 0, got 0"),
    ("mag:retention_ratio=1.5", "retention_ratio must be in [0, 1], got 1.5"),
    ("mag:calibrate=maybe", "calibrate='maybe' is not true or false"),
    ("taylorseer:cache_interval=0", "cache_interval must be an integer > 0, got 0"),
    ("taylorseer:max_order=1.5", "max_order='1.5' is not an integer"),
    ("none,", "has an empty entry"),
])
def test_bad_specs_are_one_line(text, words):
    with pytest.raises(BadInput) as e:
        parse_cache_list(text)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_taylorseer_modules_match_wan_and_diffusers_defaults_do_not():
    """REFERENCE.md: diffusers' default TaylorSeer patterns (fullmatch) match no Wan module; vsagen's do."""
    import re

    names = ["blocks.0.attn1", "blocks.12.attn2", "blocks.3.ffn", "blocks.0", "blocks.0.attn1.to_q", "proj_out"]
    from diffusers.hooks.taylorseer_cache import _TRANSFORMER_BLOCK_IDENTIFIERS

    assert not [n for n in names if any(re.fullmatch(p, n) for p in _TRANSFORMER_BLOCK_IDENTIFIERS)]
    hit = [n for n in names if any(re.fullmatch(p, n) for p in WAN_TAYLORSEER_MODULES)]
    assert hit == ["blocks.0.attn1", "blocks.12.attn2", "blocks.3.ffn"]


def test_parsing_imports_neither_torch_nor_diffusers():
    code = ("import sys; from vsagen.cache.cache_spec import parse_cache_list; parse_cache_list('mag,first-block');"
            "print('torch' in sys.modules, 'diffusers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["False", "False"]


def test_cache_counts_of_a_run():
    """`cache_counts` fills `CacheCounts` from a run's timing: the entry without and with every option, the forwards
    computed and reused, their share and seconds each; an uncached row has no label suffix."""
    from types import SimpleNamespace

    from vsagen.cache.cache_spec import CacheCounts, cache_counts, parse_cache

    timing = SimpleNamespace(dit_computed_forwards=2, dit_reused_forwards=6, dit_computed_s=1.0, dit_reused_s=0.6,
                             dit_reused_steps=[1, 2, 3], cache_stats=lambda: {
        "dit_reuse_share": 0.75, "dit_per_computed_forward_s": 0.5, "dit_per_reused_forward_s": 0.1})
    counts = CacheCounts(**cache_counts(parse_cache("first-block:threshold=0.1"), timing))
    assert (counts.cache, counts.cache_spec, counts.cached, counts.cache_suffix) == (
        "first-block:threshold=0.1", "first-block:threshold=0.1", True, " + first-block:threshold=0.1")
    assert (counts.dit_computed_forwards, counts.dit_reused_forwards, counts.dit_reuse_share) == (2, 6, 0.75)
    assert (counts.dit_computed_s, counts.dit_reused_s, counts.dit_reused_steps) == (1.0, 0.6, [1, 2, 3])
    assert CacheCounts(**cache_counts(parse_cache("taylorseer"), timing)).cache_spec == (
        "taylorseer:cache_interval=5:disable_cache_before_step=3:max_order=1:lite=false")
    assert (CacheCounts().cached, CacheCounts().cache_suffix, NO_CACHE.short_text()) == (False, "", "none")


def test_no_reuse_note_names_what_kept_the_run_computing():
    """A cached run that reused no forward gets one note naming the option to change; none when it reused, without a
    cache, or while MagCache calibrates (it never reuses)."""
    from vsagen.cache.cache_spec import no_reuse_note

    computed = [("dit", 0, 1.0), ("dit_computed", 0, 1.0)] * 4
    assert no_reuse_note(parse_cache("first-block"), computed) == (
        "first-block reused no forward: its threshold 0.05 was never met; raise it to reuse")
    assert no_reuse_note(parse_cache("first-block:threshold=0"), computed, "comparing vsa + first-block:threshold=0") \
        == ("first-block:threshold=0 reused no forward when comparing vsa + first-block:threshold=0: its threshold 0 "
            "was never met; raise it to reuse")
    assert "raise threshold (or lower retention_ratio)" in no_reuse_note(parse_cache("mag:threshold=0"), computed)
    assert "cache_interval 5 after disable_cache_before_step 3" in no_reuse_note(parse_cache("taylorseer"), computed)
    assert no_reuse_note(parse_cache("first-block"), [*computed, ("dit_reused", 1, 0.1)]) is None
    assert no_reuse_note(NO_CACHE, [("dit", 0, 1.0)]) is None
    assert no_reuse_note(parse_cache("mag:calibrate=true"), computed) is None
