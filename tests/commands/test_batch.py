"""`vsagen t2v --prompts FILE` (`vsagen.commands.batch`): the file's lines (text or JSON) typed and refused in one
line naming the line; each line's request the command line's with its own values (a refusal in the flag's words);
end to end on the tiny model: each video that of a `t2v` run of its line alone, byte for byte, and an interrupt
keeping the finished videos and nothing of the stopped one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import one_error_line
from vsagen.cli.app import app
from vsagen.commands.batch import BatchLine, batch_out, read_batch, resolve_batch
from vsagen.errors import BadInput
from vsagen.request.options import request_options

SMALL = dict(model="tiny", steps=1, height=16, width=16, frames=1, device="cpu", attn="full")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text(text)
    return path


def test_lines_of_text_and_of_json(tmp_path):
    path = write(tmp_path, "  a red fox  \n\n# skipped\n{\"prompt\": \"a cat\", \"seed\": 3, \"height\": 32, "
                           "\"guidance\": 2, \"negative_prompt\": \"rain\", \"steps\": null}\n")
    assert read_batch(path) == [BatchLine(1, "a red fox", {}),
                                BatchLine(4, "a cat", {"seed": 3, "height": 32, "guidance": 2.0,
                                                       "negative_prompt": "rain"})]


@pytest.mark.parametrize("text,words", [
    ("{\"prompt\": \"x\",}\n", "line 1: not valid JSON"),
    ("x\n{\"prompt\": \"x\", \"out\": \"/etc/passwd\"}\n", "line 2: unknown key 'out'; a JSON line takes prompt, "),
    ("{\"seed\": 1}\n", "line 1: no prompt"),
    ("{\"prompt\": 5}\n", "line 1: prompt must be a string, got int"),  # (was "no prompt": a user trial)
    ("{\"prompt\": \"x\", \"seed\": \"1\"}\n", "line 1: seed must be an integer, got \"1\""),
    ("{\"prompt\": \"x\", \"height\": 16.0}\n", "line 1: height must be an integer, got 16.0"),
    ("{\"prompt\": \"x\", \"guidance\": true}\n", "line 1: guidance must be a number, got true"),  # the file's
    ("{\"prompt\": \"a\", \"steps\": true}\n", "line 1: steps must be an integer, got true"),  # spelling
    # JSON that is not an object (new-user trial: [1,2] became the prompt "[1,2]")
    ("a fox\n[1,2]\n", "line 2 is a JSON list, not an object; a line is a prompt as text or a JSON object (for this "
                         "text as the prompt, write {\"prompt\": \"[1,2]\"})"),
    # user trial: a JSON string's fix quoted the quotes ({"prompt": "\"a fox\""}); its text, unquoted
    ("\"a fox\"\n", "line 1 is a JSON string, not an object; write the prompt without the quotes, or as "
                     "{\"prompt\": \"a fox\"}"),
    ("\"\"\n", "line 1 is a JSON string, not an object; write a prompt"),
    ("1984\n", "line 1 is a JSON number, not an object"),
    ("true\n", "line 1 is JSON true, not an object"),
    ("{\"prompt\": \"x\", \"negative_prompt\": 3}\n", "line 1: negative_prompt must be a string, got 3"),
    ("# only a comment\n\n", "has no prompt"),
])
def test_bad_lines_are_one_line_naming_the_line(tmp_path, text, words):
    path = write(tmp_path, text)
    with pytest.raises(BadInput) as e:
        read_batch(path)
    assert words in str(e.value) and str(e.value).startswith(f"--prompts {path}") and "\n" not in str(e.value)


def test_a_prompt_that_is_no_string_is_said_as_the_server_says_it(tmp_path):
    """A user trial: `{"prompt": 5}` got "no prompt" from --prompts, "prompt must be a string, got int" from
    `vsagen serve`: the same words now."""
    from vsagen.serve.jobs import parse_fields

    for value in ("5", "null", "[\"a fox\"]"):
        path = write(tmp_path, f"{{\"prompt\": {value}}}\n")
        with pytest.raises(BadInput) as e:
            read_batch(path)
        with pytest.raises(BadInput) as served:
            parse_fields({"prompt": json.loads(value)}, form=False)
        assert str(e.value) == f"--prompts {path} line 1: {served.value}"


def test_a_missing_file_or_a_folder(tmp_path):
    with pytest.raises(BadInput, match="no such file"):
        read_batch(tmp_path / "none.txt")
    with pytest.raises(BadInput, match="is a directory"):
        read_batch(tmp_path)


def test_each_line_is_the_command_line_request_with_its_own_values(tmp_path, vsagen_cache, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "a fox\n{\"prompt\": \"a cat\", \"seed\": 3, \"height\": 32, \"frames\": 5, "
                           "\"negative_prompt\": \"rain\"}\n")
    first, second = resolve_batch(path, request_options(**SMALL))
    assert (first.prompt, first.seed, first.height, first.frames, first.out) == ("a fox", 0, 16, 1,
                                                                                  Path("vsagen-prompts-0001.mp4"))
    assert (second.prompt, second.seed, second.height, second.width, second.frames, second.negative_prompt) == \
        ("a cat", 3, 32, 16, 5, "rain")
    assert second.out == Path("vsagen-prompts-0002.mp4") and second.json_out == Path("vsagen-prompts-0002.json")
    named = resolve_batch(path, request_options(**SMALL, out=tmp_path / "o" / "fox.webm"))
    assert [c.out for c in named] == [tmp_path / "o" / "fox-0001.webm", tmp_path / "o" / "fox-0002.webm"]
    assert batch_out(Path("a/b.mp4"), 12) == Path("a/b-0012.mp4")


def test_default_names_move_past_earlier_batches(tmp_path, vsagen_cache, monkeypatch):
    """New-user trial: a second `--prompts` run without --out was refused ("line 1: vsagen-prompts-0001.mp4
    exists") where a second `vsagen t2v` takes the next free name; now the batch takes the first base name none of
    whose videos, JSONs or sheets exist; --overwrite keeps the first."""
    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "a fox\na cat\n")
    Path("vsagen-prompts-0002.json").write_text("{}")  # one file of an earlier batch is enough
    assert [c.out for c in resolve_batch(path, request_options(**SMALL))] == \
        [Path("vsagen-prompts-1-0001.mp4"), Path("vsagen-prompts-1-0002.mp4")]
    Path("vsagen-prompts-1-0001.sheet.png").write_text("")
    assert resolve_batch(path, request_options(**SMALL))[0].out == Path("vsagen-prompts-2-0001.mp4")
    assert resolve_batch(path, request_options(**SMALL, overwrite=True))[0].out == Path("vsagen-prompts-0001.mp4")


@pytest.mark.parametrize("text,flags,words", [
    ("x\n{\"prompt\": \"y\", \"frames\": 2}\n", {}, "line 2: --frames must be 4k+1"),
    ("{\"prompt\": \"y\", \"steps\": 0}\n", {}, "line 1: --steps must be in [1, 10000], got 0"),
    ("x\n", {"seeds": "1,2"}, "--seeds and --prompts together"),
    ("x\n", {"random_weights": True}, "--random-weights draws the weights from the seed"),
])
def test_refusals_before_anything_loads(tmp_path, vsagen_cache, text, flags, words):
    with pytest.raises(BadInput) as e:
        resolve_batch(write(tmp_path, text), request_options(**{**SMALL, **flags}))
    assert words in str(e.value)


def test_an_existing_target_is_refused_unless_overwrite(tmp_path, vsagen_cache):
    path = write(tmp_path, "x\ny\n")
    (tmp_path / "v-0002.mp4").write_bytes(b"old")
    with pytest.raises(BadInput, match="line 2: .*v-0002.mp4"):
        resolve_batch(path, request_options(**SMALL, out=tmp_path / "v.mp4"))
    assert len(resolve_batch(path, request_options(**SMALL, out=tmp_path / "v.mp4", overwrite=True))) == 2


def test_the_command_refuses_a_json_string_line_in_one_clear_line(tmp_path):
    """User trial: the line `"a fox"` (JSON, not an object) was answered with a fix that kept its quotes inside the
    prompt. One line, exit 2, no traceback, nothing written."""
    path = write(tmp_path, "a cat\n\"a fox\"\n")
    res = CliRunner().invoke(app, ["t2v", "--model", "tiny", "--prompts", str(path), "--out", str(tmp_path / "v.mp4")])
    assert one_error_line(res) == (f"error: --prompts {path} line 2 is a JSON string, not an object; write the "
                                   "prompt without the quotes, or as {\"prompt\": \"a fox\"}")
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.txt"]


def test_the_command_refuses_a_prompt_with_prompts(tmp_path):
    res = CliRunner().invoke(app, ["t2v", "a fox", "--model", "tiny", "--prompts", str(write(tmp_path, "x\n"))])
    assert res.exit_code == 2 and res.stderr == "error: give PROMPT or --prompts FILE, not both\n"


@pytest.mark.slow
def test_each_video_is_its_line_alone_and_an_interrupt_keeps_the_finished_ones(tmp_path, vsagen_cache, tiny_dir,
                                                                                 monkeypatch):
    from vsagen.commands.batch import generate_batch
    from vsagen.commands.generate import generate
    from vsagen.commands.generate_config import resolve_generate

    monkeypatch.chdir(tmp_path)
    path = write(tmp_path, "a fox\n{\"prompt\": \"a cat\", \"seed\": 3, \"height\": 32, \"frames\": 5}\na dog\n")
    cfgs = resolve_batch(path, request_options(**SMALL))
    seen = []
    with pytest.raises(KeyboardInterrupt):  # an interrupt swallowed on its way, found before the third publishes
        generate_batch(cfgs, cancelled=lambda: len(seen) == 2, published=lambda c, r: seen.append(r))
    assert [r.video_path for r in seen] == [Path("vsagen-prompts-0001.mp4"), Path("vsagen-prompts-0002.mp4")]
    assert not Path("vsagen-prompts-0003.mp4").exists() and not Path("vsagen-prompts-0003.json").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left
    alone = generate(resolve_generate("a cat", **{**SMALL, "seed": 3, "height": 32, "frames": 5},
                                      out=tmp_path / "cat.mp4"),
                     progress=False)
    assert alone.video_path.read_bytes() == Path("vsagen-prompts-0002.mp4").read_bytes()


def test_a_signal_after_the_first_video_stops_the_batch_and_each_video_gets_its_sheet(tmp_path, vsagen_cache,
                                                                                      tiny_dir, monkeypatch):
    """Found on 2026-12-07: a Ctrl-C or SIGTERM once the first video was published was dropped (the interrupt
    guard ended at the first publication): every later video was made and the command exited 0; and with
    `--sheet` the second video was refused ("this request changes sheet_out of the loaded model")."""
    import signal

    from vsagen.commands.batch import generate_batch
    from vsagen.interrupts import SignalInterrupt, as_interrupt

    monkeypatch.chdir(tmp_path)
    cfgs = resolve_batch(write(tmp_path, "a fox\na cat\na dog\n"), request_options(**SMALL, sheet=True))
    with pytest.raises(SignalInterrupt) as info, as_interrupt():  # a real Ctrl-C once video 2 is in place
        generate_batch(cfgs, published=lambda c, r: signal.raise_signal(signal.SIGINT) if c is cfgs[1] else None)
    assert info.value.kept
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("vsagen-")) == [
        f"vsagen-prompts-000{i}.{ext}" for i in (1, 2) for ext in ("json", "mp4", "sheet.png")]
