"""vsagen.cli.listing: `vsagen presets` and `vsagen backends` through the CLI: exactly the registry and the bundled
presets, the default backend marked, each backend's implementations and options, and every value whole at 80 and 60
columns."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import vsagen.cli.listing  # noqa: F401 - the module under test (the commands call it)
from vsagen.cli.app import app
from vsagen.models.presets import preset_names

runner = CliRunner()


def test_backends_lists_exactly_the_registry_with_the_default_implementations_and_options():
    from vsagen.attention import backend_class, backend_names
    from vsagen.attention.auto import FALLBACK, candidates
    from vsagen.attention.spec import impls_of, option_help

    res = runner.invoke(app, ["backends"], env={"COLUMNS": "80"})
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    blocks = res.stdout.split("\n\n")[1:]  # a paragraph about --attn, then one block per backend
    heads = [block.splitlines()[0] for block in blocks]
    names = backend_names()  # the registry's, in its order (the shipped five among them)
    assert [h.split()[0] for h in heads] == names
    assert {"full", "vsa", "rocm-vsa", "sla-star", "sparse-vdit"} <= set(names)
    flat = " ".join(res.stdout.split())  # the paragraphs wrap between words
    assert "Default: --attn auto (t2v, i2v) = the backend the checkpoint was trained for" in flat
    assert "else full" in flat
    marked = [h.split()[0] for h in heads if "default: --attn auto runs it" in h]
    # auto's choices: dense checkpoints (full), and each backend with an auto priority (vsa's gates, sla-star's branch)
    assert marked == [n for n in names if n == FALLBACK or n in candidates()]
    assert {"full", "vsa", "sla-star"} <= set(marked) and "rocm-vsa" not in marked
    assert "full (dense) - default: --attn auto runs it for a checkpoint without sparse-attention weights" in flat
    assert "sla (sparse, takes topk) - default" in flat and "(dense)" not in flat.replace("full (dense)", "")
    by_name = dict(zip(names, blocks))
    for name, block in by_name.items():
        text = " ".join(block.split())
        assert text.startswith(name)
        impls = [i for i in impls_of(name) if i != "auto"]  # the shipped sparse backends: triton, torch
        assert (f"implementations: {', '.join(impls)}; impl=auto runs triton on CUDA" if impls else
                "implementations: one (no impl option)") in text
        if name in {"vsa", "rocm-vsa", "sla-star", "sparse-vdit"}:  # vsa's fine stage also on FlashAttention-4
            assert impls == ["triton", "torch"] + (["fa4"] if name in {"vsa", "rocm-vsa"} else []), name
            fa4_auto = "a grid of whole 128 / 256-token cubes runs the fine stage on fa4" in text
            assert fa4_auto is (name == "vsa"), name  # rocm-vsa and sla-star keep impl auto on Triton
            # every condition of VSAAttention.auto_engine said (a reviewer found four missing)
            assert fa4_auto is ("in the release of the fa4 extra" in text and "when the run is eager, bf16 / fp16, "
                                "query_rows 64" in text), name
        for key, default, values in option_help(backend_class(name).Options):
            assert f"{key}={default} {values}" in text, (name, key)
    assert "options: none" in by_name["full"] and "implementations: one (no impl option)" in by_name["full"]
    assert "sparsity=0.875 a number (or --sparsity)" in " ".join(by_name["vsa"].split())
    # issue 29: the tiny presets' bundled pattern files are sparse-vdit's default for them (plain --attn
    # sparse-vdit on --model tiny runs patterns/tiny.json), and vsa's `tuning` is named, as Python-only
    assert ("patterns=none a file, or none; default from the model's preset for tiny (patterns/tiny.json), "
            "tiny-a14b (patterns/tiny-a14b.json)") in " ".join(by_name["sparse-vdit"].split())
    for name in ("vsa", "rocm-vsa", "sla-star"):  # issue 33: the VSA cube, and vsa's 128-row programs and FA4
        text = " ".join(by_name[name].split())
        assert ("tile=4x4x4 TxHxW, power-of-two sides, 64 / 128 / 256 tokens, e.g. 4x4x4 | 4x4x8 | 4x8x8"
                in text), name
        vsa_only = ("query_rows=64 64 | 128 (128: a 128 / 256-token tile)", "impl=auto auto | triton | torch | fa4")
        assert all((phrase in text) == (name != "sla-star") for phrase in vsa_only), name
        assert f"from Python only (vsagen.apply(pipe, '{name}', KEY=...)): tuning" in " ".join(by_name[name].split())
    assert "from Python only" not in by_name["full"]


def _preset_cells(name: str) -> list[str]:
    from vsagen.models.presets import load_preset

    from vsagen.samplers import NAMED

    p = load_preset(name)
    d = p.defaults
    sampler = NAMED[d.sampler.split(":")[0]]  # the bundled presets name their sampler without options
    steps, guidance, shift = ((str(len(sampler.sigmas)), "off", "-") if sampler.renoise else
                              (str(d.steps), f"{d.guidance:g}", f"{d.flow_shift:g}"))
    return [name, f"{d.height}x{d.width}", str(d.frames), steps, guidance, shift,
            str(d.fps), d.sampler, d.attn or "auto", p.hub_id if p.source == "hub" else "built offline (random)"]


def test_presets_lists_bundled_presets():
    res = runner.invoke(app, ["presets"], env={"COLUMNS": "210"})  # wide enough for one table
    assert res.exit_code == 0
    rows = [line.strip("│ ").split("│") for line in res.stdout.splitlines() if line.startswith("│")]
    names = [r[0].strip() for r in rows]
    assert names == preset_names() and "wan2.2-ti2v-5b" in names and "wan2.2-i2v-a14b" in names
    assert {"wan2.1-flf2v-14b-720p", "tiny-flf2v", "tiny-i2v-a14b"} <= set(names)
    wan = [c.strip() for c in rows[names.index("wan2.1-t2v-1.3b")]]
    assert wan[1:8] == ["t2v", "480x832", "81", "50", "5", "3", "16"]
    assert [c.strip() for c in rows[names.index("wan2.2-ti2v-5b")]][1] == "t2v, i2v"
    assert [c.strip() for c in rows[names.index("wan2.2-i2v-a14b")]][1:6] == ["i2v [--last-image]", "720x1280",
                                                                             "81", "40", "3.5 / 3.5"]
    assert [c.strip() for c in rows[names.index("wan2.1-flf2v-14b-720p")]][1:8] == [
        "i2v --last-image", "720x1280", "81", "50", "5", "16", "16"]
    assert [c.strip() for c in rows[names.index("wan2.1-i2v-14b-720p")]][1] == "i2v"
    assert [c.strip() for c in rows[names.index("tiny-flf2v")]][1] == "i2v --last-image"
    tail = res.stdout[res.stdout.index("negative prompt of "):]
    assert tail.startswith("negative prompt of wan2.1-flf2v-14b-720p, ") and "色调艳丽" in tail
    assert "fastwan" not in tail.split("vsagen t2v PROMPT")[0]  # few-step presets run without CFG: none
    assert "Wan-AI/Wan2.1-T2V-1.3B-Diffusers" in res.stdout
    # a transformer published alone names its own repository (a trial read Wan-AI's as the TurboWan weights)
    turbo = [c.strip() for c in rows[names.index("turbowan2.1-t2v-1.3b")]]
    assert turbo[10] == "TurboDiffusion/TurboWan2.1-T2V-1.3B-480P"
    legend = "attn: the backend the checkpoint was trained with, its sparsity and VSA cube"
    assert legend in " ".join(res.stdout.split())
    # issue 30: the published sparse / distilled checkpoints with how their authors run them
    fastwan = [c.strip() for c in rows[names.index("fastwan2.1-t2v-1.3b")]]
    assert fastwan[1:11] == ["t2v", "480x832", "81", "3", "off", "-", "16", "dmd", "vsa 0.8 4x4x4",
                             "FastVideo/FastWan2.1-T2V-1.3B-Diffusers"]
    assert [c.strip() for c in rows[names.index("hummingbird-xt")]][4:10] == ["3", "off", "-", "24",
                                                                            "dmd-hummingbird", "full"]
    assert [c.strip() for c in rows[names.index("wan2.1-vsa-t2v-14b-720p")]][4:10] == ["50", "5", "5", "16",
                                                                                     "default", "vsa 0.9 4x4x4"]
    assert "FastWan2.1 T2V 1.3B (FastVideo/FastWan2.1-T2V-1.3B-Diffusers): VSA 0.8, 3-step DMD" in res.stdout
    # issue 29: height x width, as run titles (frames x height x width) order them, and the header says so
    assert "HxW" in res.stdout and "WxH" not in res.stdout


@pytest.mark.parametrize("columns", [80, 60])
def test_presets_fit_the_terminal_and_cut_nothing(columns):
    """At 80 columns three tables (the defaults; the commands, sampler and attention; the weights), narrower a
    paragraph per preset: every line fits, every value is there whole."""
    res = runner.invoke(app, ["presets"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= columns and "…" not in res.stdout
    words = set(res.stdout.replace(",", " ").replace(";", " ").replace(": ", " ").split())
    flat = " ".join(res.stdout.split())
    for name in preset_names():
        *cells, weights = _preset_cells(name)
        assert set(cells) <= words, (name, cells)
        assert weights in flat, weights
    if columns == 80:
        row = next(line.split() for line in lines if line.startswith("wan2.1-t2v-1.3b ") and "x" in line)
        assert row == ["wan2.1-t2v-1.3b", "480x832", "81", "50", "5", "3", "16"]
        assert "commands, sampler and attention" in res.stdout and "\nweights" in res.stdout


def _commands_cell(name: str) -> str:
    from vsagen.models.presets import LAST_IMAGE_OPTIONAL, LAST_IMAGE_REQUIRED, load_preset

    p = load_preset(name)
    i2v = {LAST_IMAGE_REQUIRED: "i2v --last-image", LAST_IMAGE_OPTIONAL: "i2v [--last-image]"}.get(p.last_image, "i2v")
    return i2v if p.image_to_video else (f"t2v, {i2v}" if p.takes_image else "t2v")


def test_presets_to_a_pipe_split_no_word(capsys, monkeypatch):
    """New-user trial: `vsagen presets | cat` (no terminal, so Rich's 80 columns) split `[--last-image]` inside the
    word. To a pipe or a file (captured here: not a terminal, COLUMNS unset) the one table, each preset's row whole on
    one line, and every line of text whole."""
    from vsagen.cli.listing import print_presets

    monkeypatch.delenv("COLUMNS", raising=False)
    print_presets()
    out = capsys.readouterr().out
    lines = out.splitlines()
    for name in preset_names():
        row = next(line for line in lines if line.startswith(f"│ {name} "))
        cells = [c.strip() for c in row.strip("│").split("│")]
        values = _preset_cells(name)[:-1]  # (the weights: a transformer published alone shows its own)
        assert cells[1] == _commands_cell(name) and all(v in row for v in values) and cells[10], (name, row)
    assert any(line.startswith("negative prompt of ") and line.endswith("倒着走") for line in lines)
    assert any(line.startswith("vsagen t2v PROMPT") and line.endswith("Wan-AI repository.") for line in lines)


@pytest.mark.parametrize("columns", [None, 210, 80, 60, 40])
def test_presets_to_a_pipe_end_no_line_in_spaces(columns):
    """User trial: `vsagen presets | cat -A` showed the title line padded with spaces to the table's width (Rich pads
    where it is not a terminal). Captured (not a terminal), COLUMNS unset (the one table) or set (one table, three,
    or a paragraph per preset): no line ends in a space, and the title is there alone."""
    res = runner.invoke(app, ["presets"], env={"COLUMNS": None if columns is None else str(columns)})
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    assert [line for line in lines if line.endswith(" ")] == []
    assert columns in (60, 40) or "presets" in lines  # (narrower: a paragraph per preset, no title)


@pytest.mark.parametrize("columns", [80, 60, 40])
def test_presets_on_a_narrow_terminal_split_no_word(columns):
    """On a terminal of 80 columns and narrower: every word of the commands column (`[--last-image]`) and of the
    legend is on one line, never folded inside it."""
    res = runner.invoke(app, ["presets"], env={"COLUMNS": str(columns)})
    assert res.exit_code == 0
    words = set(res.stdout.replace(",", " ").replace(";", " ").split())
    for name in preset_names():
        assert set(_commands_cell(name).replace(",", " ").split()) <= words, name
    assert {"--last-image:", "[--last-image]:", "Wan-AI"} <= words


# A generous bound for an answer that imports neither torch nor diffusers (~0.4 s on an idle 2-core machine).
LISTING_WALL_S = 3.0


def test_presets_and_backends_import_neither_torch_nor_diffusers():
    """Issue 29: `vsagen presets` took 5.0 s and `vsagen backends` 4.8 s, importing every backend (torch) through
    the registry. Each command runs in a fresh interpreter (both at once), through `main()` as the console script
    does, and reports what it imported: no torch, no diffusers (the backend modules it reads import torch only
    inside the methods that compute); its listing printed, in time."""
    import json
    import os
    import subprocess
    import sys
    import time

    probe = ("import sys, json\nfrom vsagen.cli.app import main\nsys.argv = ['vsagen', sys.argv[1]]\n"
             "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
             "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'diffusers', 'transformers', "
             "'triton'))\n"
             "sys.stderr.write(json.dumps([code, heavy]))\n")
    t0 = time.perf_counter()
    procs = {c: subprocess.Popen([sys.executable, "-c", probe, c], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env={**os.environ, "COLUMNS": "100"})
             for c in ("presets", "backends")}
    for command, proc in procs.items():
        out, err = proc.communicate(timeout=60)
        wall = time.perf_counter() - t0
        code, heavy = json.loads(err)
        assert (code, heavy) == (0, []), (command, err)
        assert ("tiny" if command == "presets" else "sparse-vdit") in out
        assert wall < LISTING_WALL_S, f"`vsagen {command}` took {wall:.2f} s"
