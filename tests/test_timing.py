"""vsagen.timing: `Timer` regions (nesting, steps, disabled timers, carving a region out of an enclosing one),
`NullTimer`, and `TimingReport` (totals, per-step sums, experts, shares, untimed regions, the table)."""

from __future__ import annotations

import time

import pytest

from vsagen.timing import NullTimer, Timer, TimingReport

# Sums of disjoint perf_counter intervals vs their enclosing one: equal up to float rounding of the sum.
SUM_SLACK_S = 1e-9


def test_timer_region_apart_from_an_enclosing_region():
    from vsagen.timing import Timer

    timer = Timer("cpu")
    with timer.region("total"):
        with timer.region("denoise"):
            time.sleep(0.01)
            with timer.region("image_encode", apart_from="denoise"):
                time.sleep(0.02)
                with timer.region("inner"):  # regions inside a carved-out one nest as usual
                    time.sleep(0.001)
            time.sleep(0.01)
        with timer.region("other", apart_from="denoise"):  # no open "denoise": nothing to carve
            pass
    records = timer.finish()
    total = lambda n: sum(s for name, _, s in records if name == n)  # noqa: E731
    assert [n for n, _, _ in records].count("denoise") == 2  # two pieces, around the carved-out region
    assert total("image_encode") >= 0.02 and total("denoise") >= 0.02
    assert total("inner") <= total("image_encode")
    assert total("denoise") + total("image_encode") <= total("total") + SUM_SLACK_S


def test_regions_nest_and_remember_the_step():
    timer = Timer("cpu")
    assert timer.step == -1 and timer.enabled and not timer.cuda
    with timer.region("outer"):
        for step in range(3):
            timer.step = step
            token = timer.start("inner")
            time.sleep(0.002)
            timer.stop(token)
    records = timer.finish()
    # each region keeps the step it was opened at
    assert [(n, s) for n, s, _ in records] == [("inner", 0), ("inner", 1), ("inner", 2), ("outer", -1)]
    inner = sum(sec for n, _, sec in records if n == "inner")
    outer = next(sec for n, _, sec in records if n == "outer")
    assert all(sec >= 0.002 for n, _, sec in records if n == "inner")
    assert inner <= outer + SUM_SLACK_S


def test_disabled_and_null_timers_record_nothing():
    timer = Timer("cpu")
    timer.enabled = False
    with timer.region("warmup"):
        timer.stop(timer.start("x"))
    assert timer.start("y") is None
    timer.stop(None)  # a token of a disabled region is accepted
    assert timer.finish() == []
    null = NullTimer()
    assert not null.enabled and isinstance(null, Timer)
    with null.region("a"):
        pass
    assert null.finish() == []


def _report(records, **kw):
    return TimingReport.from_records(records, "cpu", **kw)


def test_report_adds_regions_and_splits_steps_and_experts():
    records = [("total", -1, 10.0), ("text_encode", -1, 1.0), ("denoise", 0, 6.0), ("denoise", 0, 1.5),
               ("image_encode", 0, 0.5), ("dit", 0, 1.0), ("dit", 0, 1.5), ("dit", 1, 2.0),
               ("dit/transformer", 0, 2.5), ("dit/transformer_2", 1, 2.0), ("attn1", 0, 2.0),
               ("self_attention", 0, 1.0), ("self_attention", 1, 0.5), ("self_attention/coarse", 0, 0.25),
               ("self_attention/fine", 0, 0.75), ("vae_decode", -1, 1.0), ("layout", 0, 0.1)]
    r = _report(records, load_s=3.0, notes=["n"])
    assert (r.total_s, r.text_encode_s, r.denoise_s, r.image_encode_s, r.vae_decode_s) == (10.0, 1.0, 7.5, 0.5, 1.0)
    assert (r.dit_s, r.dit_forwards, r.dit_per_step_s) == (4.5, 3, [2.5, 2.0])
    assert r.dit_by_expert_s == {"transformer": 2.5, "transformer_2": 2.0}
    assert r.dit_forwards_by_expert == {"transformer": 1, "transformer_2": 1}
    assert (r.attn1_s, r.self_attention_s) == (2.0, 1.5)
    assert r.self_attention_stages_s == {"coarse": 0.25, "fine": 0.75}
    assert r.attention_share_of_dit == pytest.approx(1.5 / 4.5)
    assert (r.load_s, r.notes, r.condition_encode_s, r.warmup_s) == (3.0, ["n"], 0.0, 0.0)
    d = r.to_dict()
    assert d["dit_per_step_s"] == [2.5, 2.0] and d["self_attention_stages_s"] == {"coarse": 0.25, "fine": 0.75}


def test_report_of_no_dit_has_a_zero_share_and_untimed_regions_are_none():
    empty = _report([])
    assert empty.dit_s == 0.0 and empty.attention_share_of_dit == 0.0 and empty.dit_per_step_s == []
    records = [("dit", 0, 2.0), ("attn1", 0, 1.0), ("self_attention", 0, 0.5), ("self_attention/fine", 0, 0.5)]
    only_attn1 = _report(records, untimed=("attn1",))
    assert only_attn1.attn1_s is None and only_attn1.self_attention_s == 0.5
    assert only_attn1.attention_share_of_dit == 0.25
    both = _report(records, untimed=("attn1", "self_attention"))
    assert both.self_attention_s is None and both.attention_share_of_dit is None
    assert both.self_attention_stages_s == {}
    with pytest.raises(ValueError, match="untimed regions"):
        _report(records, untimed=("dit",))


def test_rich_table_rows():
    from rich.console import Console

    records = [("total", -1, 8.0), ("denoise", 0, 6.0), ("condition_encode", 0, 0.5), ("dit", 0, 2.0),
               ("dit", 1, 2.0), ("dit/transformer", 0, 2.0), ("dit/transformer_2", 1, 2.0), ("attn1", 0, 1.0),
               ("self_attention", 0, 1.0)]
    console = Console(width=200, record=True)
    console.print(_report(records, warmup_s=1.5).rich_table("t"))
    text = console.export_text()
    for needle in ("condition encode (VAE)", "DiT (2 forwards, 2 steps)", "expert transformer_2 (1 forward)",
                   "(warm-up, not in total)", "4.000", " 50.0"):
        assert needle in text, needle
    assert "image encode (CLIP)" not in text  # zero: not shown
    console = Console(width=200, record=True)
    console.print(_report(records, untimed=("attn1", "self_attention")).rich_table())
    assert console.export_text().count("not timed") == 2


def test_rich_table_shows_the_cache_counts_whenever_a_cache_is_set():
    """A cache that reused nothing still shows computed / reused / share (t2v hid them); no cache: no such rows."""
    from rich.console import Console

    records = [("total", -1, 8.0), ("denoise", 0, 6.0)] + [r for s in range(4) for r in (("dit", s, 1.0),
                                                                                          ("dit_computed", s, 1.0))]
    console = Console(width=200, record=True)
    console.print(_report(records).rich_table("t", cached=True))
    text = console.export_text()
    for needle in ("computed: 4 forwards", "reused (cache): 0 forwards", "reuse share 0%"):
        assert needle in text, needle
    assert text.count("per forward") == 1  # of the computed ones only: no reused forward to average
    console = Console(width=200, record=True)
    console.print(_report(records).rich_table("t"))
    assert "reuse share" not in console.export_text()


def test_rich_table_leaves_out_the_regions_nobody_timed():
    """`vsagen.apply`'s report times the transformers only: no text-encode / denoise / VAE / total rows of 0 s
    (new-user trial), while the DiT and attention rows stay."""
    from rich.console import Console

    records = [("dit", 0, 2.0), ("dit", 1, 2.0), ("attn1", 0, 1.0), ("self_attention", 0, 0.5)]
    console = Console(width=200, record=True)
    console.print(_report(records).rich_table("t"))
    text = console.export_text()
    rows = [line.strip("│ ").split("│")[0].strip() for line in text.splitlines() if line.startswith("│")]
    assert "DiT (2 forwards, 2 steps)" in rows  # the parse finds the rows
    for gone in ("text encode", "denoise loop", "VAE decode", "total"):
        assert gone not in rows, gone
    assert "DiT (2 forwards, 2 steps)" in text and "attention backend" in text


def test_a_report_whose_outer_regions_are_none_renders_and_has_null_json():
    """`vsagen.apply`'s report sets the regions of the pipeline call it does not time to None (new-user trial: 0.0
    read as "took no time"): the table leaves their rows out, the JSON holds null, wait_s and its shares too."""
    from dataclasses import replace

    from rich.console import Console

    outer = ("total_s", "text_encode_s", "denoise_s", "vae_decode_s", "image_encode_s", "condition_encode_s")
    report = replace(_report([("dit", 0, 2.0), ("self_attention", 0, 0.5)]), **dict.fromkeys(outer))
    console = Console(width=200, record=True)
    console.print(report.rich_table("t"))
    rows = [line.strip("│ ").split("│")[0].strip() for line in console.export_text().splitlines()
            if line.startswith("│")]
    assert "DiT (1 forward, 1 step)" in rows and not {"total", "text encode", "VAE decode"} & set(rows)
    data = report.to_dict()
    assert all(data[k] is None for k in (*outer, "wait_s", "decode_share_of_wait", "write_share_of_wait"))
    assert data["dit_s"] == 2.0 and data["overlap_s"] == 0.0


def test_discard_forgets_the_open_regions_of_a_name():
    """A CFG-parallel call served by the exchange (`vsagen.parallel.cfg`) discards its "dit" regions: their stop
    records nothing; other regions, and later ones of the same name, are recorded."""
    timer = Timer("cpu")
    outer = timer.start("denoise")
    dit, expert, other = timer.start("dit"), timer.start("dit/transformer"), timer.start("dither")
    timer.discard("dit")
    for token in (other, expert, dit):
        timer.stop(token)
    timer.stop(timer.start("dit"))
    timer.stop(outer)
    assert [n for n, _, _ in timer.finish()] == ["dither", "dit", "denoise"]
    timer.discard("nothing open")  # nothing to forget


def test_parallel_regions_and_per_rank_rows():
    """A multi-process run: the all-to-all and CFG-exchange totals, each rank's row, their max and mean in the JSON
    and the per-rank table (None in one process)."""
    from rich.console import Console

    records = [("dit", 0, 2.0), ("dit", 1, 2.0), ("self_attention", 0, 1.0), ("all_to_all", 0, 0.25),
               ("all_to_all", 1, 0.25), ("cfg_exchange", 0, 0.125)]
    r = _report(records)
    assert (r.all_to_all_s, r.cfg_exchange_s, r.ranks) == (0.5, 0.125, [])
    assert "ranks_max" not in r.to_dict() and r.ranks_table() is None
    row = r.rank_row(1)
    assert row == {"rank": 1, "dit_forwards": 2, "dit_s": 4.0, "attention_backend_s": 1.0, "self_attention_s": 1.0,
                   "all_to_all_s": 0.5, "cfg_exchange_s": 0.125}
    other = {**row, "rank": 0, "dit_s": 2.0, "attention_backend_s": None, "self_attention_s": None}
    d = _report(records, ranks=[other, row]).to_dict()
    assert d["ranks"] == [other, row]
    assert d["ranks_max"] == {"dit_s": 4.0, "attention_backend_s": 1.0, "self_attention_s": 1.0, "all_to_all_s": 0.5,
                              "cfg_exchange_s": 0.125}
    assert d["ranks_mean"]["dit_s"] == 3.0 and d["ranks_mean"]["attention_backend_s"] == 1.0
    console = Console(width=200, record=True)
    console.print(r.rich_table("t"))
    console.print(_report(records, ranks=[other, row]).ranks_table())
    text = console.export_text()
    for needle in ("all-to-all (Ulysses)", "CFG exchange", "per rank", "max", "mean", "not timed", "3.000"):
        assert needle in text, needle


def test_json_names_say_what_they_time_and_the_old_ones_stay_as_aliases():
    from vsagen.timing import DEPRECATED_ALIASES

    records = [("dit", 0, 4.0), ("attn1", 0, 2.0), ("self_attention", 0, 1.5), ("self_attention/fine", 0, 1.0)]
    r = _report(records)
    assert (r.attn1_module_s, r.attention_backend_s, r.attention_backend_stages_s) == (2.0, 1.5, {"fine": 1.0})
    d = r.to_dict()
    assert (d["attn1_module_s"], d["attention_backend_s"], d["attention_backend_stages_s"]) == (2.0, 1.5,
                                                                                              {"fine": 1.0})
    assert d["deprecated_aliases"] == DEPRECATED_ALIASES == {
        "attn1_s": "attn1_module_s", "self_attention_s": "attention_backend_s",
        "self_attention_stages_s": "attention_backend_stages_s"}
    for old, new in DEPRECATED_ALIASES.items():
        assert d[old] == d[new]
        assert list(d).index(new) == list(d).index(old) - 1  # the new name just before its alias
    untimed = _report(records, untimed=("attn1", "self_attention")).to_dict()
    assert untimed["attn1_module_s"] is None and untimed["attention_backend_s"] is None


# A report of a long run on many ranks: the widest numbers and labels the table shows.
WIDE_RECORDS = [("total", -1, 123456.789), ("text_encode", -1, 12.345), ("image_encode", 0, 3.0),
                ("condition_encode", 0, 4.0), ("denoise", 0, 100000.123), ("dit", 0, 99999.999),
                ("dit/transformer", 0, 50000.0), ("dit/transformer_2", 0, 49999.999), ("attn1", 0, 55555.555),
                ("self_attention", 0, 44444.444), ("self_attention/coarse", 0, 1234.567),
                ("self_attention/fine", 0, 43210.987), ("all_to_all", 0, 1000.0), ("cfg_exchange", 0, 10.0),
                ("vae_decode", -1, 23456.78)]


@pytest.mark.parametrize("width", [80, 60])
def test_tables_at_80_columns_lose_no_digit(width):
    """Every number of the timing table (and the per-rank table) on one line, whole, at 80 columns and below:
    the region labels wrap, the numbers do not."""
    from rich.console import Console

    r = _report(WIDE_RECORDS, load_s=1234.5, warmup_s=999.9)
    row = r.rank_row(1)
    ranks = _report(WIDE_RECORDS, ranks=[{**row, "rank": 0}, row]).ranks_table()
    title = ("wan2.2-t2v-a14b | attn sla-star (auto) (sparsity 0.875) | torch reference (slow: the Triton kernels "
             "run on CUDA) | 81x720x1280 | 40 steps | cpu fp32 | offload group | ulysses 2 | CFG parallel")
    console = Console(width=width, record=True)
    console.print(r.rich_table(title=title))
    if width >= 80:  # six columns of numbers: whole at 80, folded (never cut) below
        console.print(ranks)
    text = console.export_text()
    assert max(len(line) for line in text.splitlines()) <= width and "…" not in text
    cells = {c.strip() for line in text.splitlines() for c in line.split("│") + line.split("┃")}
    for value in ("123456.789", "100000.123", "99999.999", "55555.555", "44444.444", "43210.987", "1234.567",
                  "23456.780", "1234.500", "999.900", "1000.000", "81.0", "100.0", "44.4"):
        assert value in cells, value
    for word in ("self-attention module", "attention backend", "all-to-all", "ulysses 2", "CFG parallel"):
        assert word in " ".join(text.split()), word  # the title and the labels wrap between words
    narrow = Console(width=40, record=True)
    narrow.print(ranks)
    assert "…" not in narrow.export_text()  # folded, not cut


def test_warm_up_parts_in_the_json_and_the_table():
    """The warm-up's split (issue 47: what a second process's warm-up is made of): the decoder's first call is the
    rest of the warm-up after its steps, the compile time a part of the steps; shown where not 0."""
    from rich.console import Console

    from vsagen.timing import WarmUp

    assert WarmUp().parts() == {}  # no warm-up: nothing to split
    warm = WarmUp(seconds=3.0, denoise=2.25, compile=1.5)
    assert warm.parts() == {"denoise": 2.25, "compile": 1.5, "decode": 0.75}
    report = _report([("total", -1, 1.0), ("dit", 0, 1.0)], warmup_s=3.0, warmup_parts_s=warm.parts())
    assert report.to_dict()["warmup_parts_s"] == {"denoise": 2.25, "compile": 1.5, "decode": 0.75}
    console = Console(width=200, record=True)
    console.print(report.rich_table("t"))
    text = console.export_text()
    for label, value in (("(warm-up, not in total)", "3.000"), ("warm-up steps", "2.250"),
                         ("of which torch.compile", "1.500"), ("decoder's first call", "0.750")):
        assert any(label in line and value in line for line in text.splitlines()), label
    console = Console(width=200, record=True)
    console.print(_report([("dit", 0, 1.0)], warmup_s=2.0, warmup_parts_s=WarmUp(2.0, 2.0).parts()).rich_table())
    assert "torch.compile" not in console.export_text() and "decoder" not in console.export_text()


def test_compile_seconds_grows_across_a_compilation():
    """`compile_seconds` reads Dynamo's own cumulative compile time (without importing Dynamo when it is absent)."""
    import torch

    from vsagen.timing import compile_seconds

    before = compile_seconds()
    x = torch.randn(7, 5, dtype=torch.float64)
    fn = torch.compile(lambda t: torch.sin(t) * 2 + t.cos(), backend="eager", fullgraph=True)
    torch.testing.assert_close(fn(x), torch.sin(x) * 2 + x.cos())
    assert compile_seconds() > before
