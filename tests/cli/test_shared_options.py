"""vsagen.cli.shared_options: every shared option is a typed Typer option with a help text, and the commands that take
it show that text."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import vsagen.cli.shared_options as options
from vsagen.cli.app import app

NAMES = [n for n in dir(options) if n[:1].isupper() and typing.get_origin(getattr(options, n)) is typing.Annotated]


def test_every_shared_option_has_a_help_text():
    assert {"Model", "Attn", "Out", "Ulysses", "CfgParallel"} <= set(NAMES)
    for name in NAMES:
        info = typing.get_args(getattr(options, name))[1]
        assert isinstance(info, typer.models.OptionInfo) and info.help and info.help.strip(), name


@pytest.mark.parametrize("command", ["t2v", "i2v", "profile", "compare", "search"])
def test_the_commands_show_the_shared_texts(command):
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200"})
    assert res.exit_code == 0 and "--model" in res.stdout
    flat = " ".join(res.stdout.split())
    model_help = typing.get_args(options.Model)[1].help
    assert " ".join(model_help.split()) in flat


def test_command_line_gives_what_was_typed_so_that_workers_parse_the_same():
    """`command_line`: the running command's given options (each kind: a value, an Enum, a path, a flag, a
    --x/--no-x pair, an alias) and its arguments after `--` (a prompt that starts with '-'), no defaults; parsed
    again, the same values."""
    seen: list[tuple[dict, list[str]]] = []
    demo = typer.Typer()

    @demo.command()
    def run(ctx: typer.Context, prompt: str, image: typing.Annotated[str, typer.Argument()] = "",
            device: options.DeviceOption = options.Device.AUTO, out: options.Out = None,
            gpus: options.Gpus = None, guidance: options.Guidance = None, overwrite: options.Overwrite = False,
            json_out: options.JsonOut = False, stock: bool = True) -> None:
        seen.append((dict(ctx.params), options.command_line()))

    @demo.command()
    def other() -> None:  # (two commands: the name comes first, as `vsagen t2v`)
        pass

    runner = CliRunner()
    given = ["run", "--nproc", "2", "--device", "cpu", "--out", "~/v.mp4", "--guidance", "0.5", "--json",
             "--no-stock", "--overwrite", "--", "-a fox", "img.png"]
    assert runner.invoke(demo, given).exit_code == 0
    params, argv = seen[-1]
    assert argv == ["run", "--device", "cpu", "--out", "~/v.mp4", "--gpus", "2", "--guidance", "0.5", "--overwrite",
                    "--json", "--no-stock", "--", "-a fox", "img.png"]
    assert runner.invoke(demo, argv).exit_code == 0 and seen[-1][0] == params
    assert runner.invoke(demo, ["run", "x"]).exit_code == 0 and seen[-1][1] == ["run", "--", "x"]


def test_t2v_gives_its_workers_its_own_command_line(monkeypatch):
    got = []
    monkeypatch.setattr("vsagen.cli.app._generate_command", lambda *a, **k: got.append(options.command_line()))
    res = CliRunner().invoke(app, ["t2v", "--model", "tiny", "--gpus", "2", "--ulysses", "2", "a fox"])
    assert res.exit_code == 0, res.output
    assert got == [["t2v", "--model", "tiny", "--gpus", "2", "--ulysses", "2", "--", "a fox"]]


def test_an_unknown_option_is_offered_only_close_ones():
    """Issue 29: Click compared `--bogus` with the option names dashes included and offered `--out, --verbose`; the
    command line offers the names close to what was typed, without the dashes, or none."""
    from vsagen.cli.shared_options import close_options

    names = ["--height", "--width", "--steps", "--seed", "--out", "--verbose", "--json", "--dtype", "--fps", "-v"]
    assert close_options("--bogus", names) == []
    assert close_options("--hieght", names) == ["--height"]
    assert close_options("--stpes", names) == ["--steps"]
    assert close_options("--sed", names) == ["--seed"]
    assert close_options("--verbos", names) == ["--verbose"]


def test_an_empty_path_is_refused_in_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    """Typer turned `--out ""` into Path(""), the current folder: compare wrote its files there, t2v said ". is a
    folder", i2v said "image . is not a file". Every path option and argument refuses an empty text, before any
    file is looked at, saying what that option takes (a trial's `t2v --out ""` said "give a file or folder name",
    and t2v's --out takes an mp4 file)."""
    from conftest import assert_one_error_line

    from vsagen.cli.app import main

    parse = options.path_parser("a thing")
    assert parse("a b.mp4") == Path("a b.mp4") and parse(Path("x")) == Path("x")
    monkeypatch.chdir(tmp_path)
    image = "give an image file (PNG, JPEG or WebP)"
    mp4 = "give a video file name (e.g. fox.mp4; .webm, .gif, or .png for PNG frames)"
    for args, flag, takes in (
            (["t2v", "x", "--model", "tiny", "--out", ""], "--out", mp4),
            (["i2v", "--model", "tiny-i2v", "a.png", "x", "--out", ""], "--out", mp4),
            (["i2v", "--model", "tiny-i2v", "", "x"], "IMAGE", image),
            (["i2v", "--model", "tiny-i2v", "a.png", "x", "--last-image", " "], "--last-image", image),
            (["compare", "x", "--model", "tiny", "--out", ""], "--out", "give a folder name (created if missing)"),
            (["profile", "--model", "tiny", "--plot", ""], "--plot", "give a .png, .svg or .pdf file name"),
            (["profile", "--model", "tiny", "--out", ""], "--out", "give a file name for the report (without --out"),
            (["search", "--model", "tiny", "--prompts", ""], "--prompts", "give a text file of prompts"),
            (["search", "--model", "tiny", "--prompt", "p", "--out", ""], "--out", "give a .json file name")):
        monkeypatch.setattr("sys.argv", ["vsagen", *args])
        with pytest.raises(SystemExit) as exit_:
            main()  # the console script: a usage error is one line
        out, err = capsys.readouterr()
        assert exit_.value.code == 2, (args, out, err)
        line = assert_one_error_line(err, out)
        assert f"'{flag}': the path is empty; {takes}" in line, line
        assert "file or folder" not in line, line
    assert list(tmp_path.iterdir()) == []


def test_repeated_option_finds_a_single_valued_option_given_twice():
    """Click keeps the last of a repeated option silently (`--attn vsa --attn full` ran full); `repeated_option`
    finds it, also as `--opt=value` and as the two spellings of a flag, and not in values or after `--`."""
    from typer.main import get_command

    t2v = get_command(app).commands["t2v"]
    find = options.repeated_option
    assert find(t2v, ["--attn", "vsa", "--attn", "full", "x"]) == ["--attn", "--attn"]
    assert find(t2v, ["--tile-fit", "crop", "--tile-fit=partial", "x"]) == ["--tile-fit", "--tile-fit"]
    assert find(t2v, ["--overwrite", "--no-overwrite", "x"]) == ["--overwrite", "--no-overwrite"]
    assert find(t2v, ["--negative-prompt", "--steps", "--steps", "2", "x"]) is None  # the first --steps is a value
    assert find(t2v, ["--attn", "vsa", "--", "--attn"]) is None  # after --: the prompt
    assert find(t2v, ["--attn", "vsa", "--steps", "2", "x"]) is None


def test_an_option_given_twice_is_refused_before_the_command_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["t2v", "--model", "tiny", "--attn", "vsa", "--attn", "full", "x"])
    assert res.exit_code == 2 and "--attn given 2 times; give it once" in res.stderr
    assert list(tmp_path.iterdir()) == []
    for args in (["--help", "--attn", "vsa", "--attn", "full"], ["--attn", "vsa", "--attn", "full", "--help"]):
        res = CliRunner().invoke(app, ["t2v", *args])  # --help wins, as over every other bad value
        assert res.exit_code == 0 and "Usage:" in res.stdout, res.output


def test_completion_of_model_attn_and_vae_values():
    from vsagen.attention.registry import backend_names
    from vsagen.models.presets import preset_names

    assert options.complete_model("") == preset_names()
    assert options.complete_model("tiny-t") == ["tiny-ti2v"] and options.complete_model("./my") == []
    assert options.complete_attn("") == ["auto", *backend_names()]
    assert options.complete_attn("sparse") == ["sparse-vdit"]
    assert options.complete_attn("full,") == [f"full,{n}" for n in backend_names() if n != "full"]  # auto only alone
    assert "vsa:sparsity=0.5,vsa" in options.complete_attn("vsa:sparsity=0.5,v")  # a name with options again
    assert options.complete_attn("full,vsa:sp") == []  # options: typed by hand (`vsagen backends` lists them)
    assert options.complete_vae("") == ["auto", "light", "stock", "tiny", "tiny:name=taew2_1", "tiny:name=taew2_2",
                                        "tiny:name=lighttaew2_1", "tiny:name=lighttaew2_2"]
    assert options.complete_vae("stock,") == ["stock,light", "stock,tiny", "stock,tiny:name=taew2_1",
                                              "stock,tiny:name=taew2_2", "stock,tiny:name=lighttaew2_1",
                                              "stock,tiny:name=lighttaew2_2"]  # auto only alone
    assert options.complete_vae("tiny:weights=") == [] and options.complete_vae("tiny:name=t") == [
        "tiny:name=taew2_1", "tiny:name=taew2_2"]


def test_completion_of_sampler_values():
    """New-user trial: --sampler had no shell completion where --attn, --model, --vae and --quant have it: the named
    samplers, a list's next entry for `vsagen compare`, none inside an entry's options; and the shell asks for them
    through the options of t2v / i2v, profile, compare and search (Typer's completion protocol)."""
    from vsagen.samplers import sampler_names

    assert options.complete_sampler("") == sampler_names() and sampler_names()[0] == "default"
    assert options.complete_sampler("dmd") == ["dmd", "dmd-hummingbird"]
    assert options.complete_sampler("l") == ["lightx2v-4step"]
    assert options.complete_sampler("dmd,r") == ["dmd,rcm"] and options.complete_sampler("dmd:sig") == []
    for command in ("t2v", "i2v", "profile", "compare", "search"):
        words = f"vsagen {command} --sampler r"
        res = CliRunner().invoke(app, [], prog_name="vsagen",
                                 env={"_VSAGEN_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": "3"})
        assert res.stdout.split() == ["rcm"], (command, res.output)


def _main_line(monkeypatch, capsys, args: list[str]) -> str:
    """The console script's one error line for `args` (exit 2)."""
    from conftest import assert_one_error_line

    from vsagen.cli import main

    monkeypatch.setattr("sys.argv", ["vsagen", *args])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    assert exit_.value.code == 2, (args, out, err)
    return assert_one_error_line(err, out)


def test_an_unquoted_prompt_is_told_to_be_quoted(tmp_path, monkeypatch, capsys):
    """New-user trial (issue 44): `vsagen t2v --model tiny a red fox` answered click's "Got unexpected extra
    argument(s) (red fox)"; the line now says to quote the prompt, showing it whole, for every command that takes
    one (an argument, or profile's and search's --prompt); nothing is written."""
    monkeypatch.chdir(tmp_path)
    for args, want in (
            (["t2v", "--model", "tiny", "a", "red", "fox"], "vsagen t2v ... 'a red fox'"),
            (["i2v", "--model", "tiny-i2v", "a.png", "a", "red", "fox"], "vsagen i2v ... 'a red fox'"),
            (["compare", "a", "fox's", "tail", "--model", "tiny"], "vsagen compare ... 'a fox'\"'\"'s tail'"),
            (["profile", "--model", "tiny", "--prompt", "a", "red", "fox"], "--prompt 'a red fox'")):
        line = _main_line(monkeypatch, capsys, args)
        assert "quote" in line and line.split(" (see `")[0].endswith(want), line
        assert "unexpected extra" not in line, line
    line = _main_line(monkeypatch, capsys, ["presets", "x"])  # no prompt: click's own words
    assert "unexpected extra argument" in line
    assert list(tmp_path.iterdir()) == []


def test_an_out_that_ends_in_a_separator_names_a_folder(tmp_path, monkeypatch, capsys):
    """New-user trial (issue 44): `--out newdir/` (Path drops the slash) was told "the video is written as mp4";
    a file option given a text ending in / says it names a folder (a folder that exists or not, or a file's name),
    and writes nothing; compare's --out, a folder, takes it."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "there").mkdir()
    (tmp_path / "notes.txt").write_text("")
    for out in ("newdir/", "there/", "notes.txt/", "a.mp4/"):
        line = _main_line(monkeypatch, capsys, ["t2v", "x", "--model", "tiny", "--out", out])
        want = f"'--out': {out} names a folder (it ends in /); give a video file name (e.g. fox.mp4; .webm"
        assert want in line, line
    line = _main_line(monkeypatch, capsys, ["search", "--model", "tiny", "--prompt", "p", "--out", "p/"])
    assert "p/ names a folder (it ends in /); give a .json file name" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "there"]
    assert not any((tmp_path / "there").iterdir())
    assert options.path_parser("a folder name", folder=True)("newdir/") == Path("newdir")


def test_swapped_i2v_arguments_are_told_their_order(tmp_path):
    """New-user trial: `vsagen i2v "a fox" fox.png` said "image a fox does not exist"."""
    from vsagen.cli.shared_options import swapped_image_prompt

    (tmp_path / "fox.png").write_bytes(b"x")  # (by name: the image's own checks read it later, in order)
    assert swapped_image_prompt(Path("a fox"), str(tmp_path / "fox.png")) == (
        f"the arguments are IMAGE PROMPT, and {tmp_path / 'fox.png'} is an image while 'a fox' is no file: "
        f"vsagen i2v ... {tmp_path / 'fox.png'} 'a fox' (your options where the ... is)")
    assert swapped_image_prompt(tmp_path / "fox.png", "a fox") is None  # the right order
    assert swapped_image_prompt(Path("a fox"), str(tmp_path / "gone.png")) is None  # no image there either
    assert swapped_image_prompt(Path("a fox"), "") is None and swapped_image_prompt(Path("a fox"), "fox") is None
