"""The README's shell examples that run on a CPU, run as pasted (issue 29, item 8: "every README sentence checked
against the code; a test runs each README command block that can run on CPU").

Every command in a fenced block of README.md that names `--model tiny` (the embedded model, built offline) is run in
a fresh folder and must exit 0, print no traceback, and write the video it promises. A command after `&&` in a
set-up line counts too (the README's first command ends in a tiny t2v run). The first command, and those that start
processes of their own (`--gpus`, `torchrun`), run as the shell runs them: `python -m vsagen` (or torch's launcher)
in subprocesses, at once (one CPU thread each); the others run meanwhile in this process, through the command line's
Typer app with the same words (each subprocess paid ~7 s of imports; the entry point's own exit codes and signals
are tested in tests/test_cli.py and tests/test_interrupts.py).
Synopsis blocks (`[options]`) and real-size commands (they need a GPU and downloads) are not run; the Python block
runs in tests/test_api.py, the Serving block (a server and the requests to it) in tests/serve/test_routes.py.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
TIMEOUT_S = 240


def fenced_blocks(text: str) -> list[str]:
    """The contents of the README's ``` blocks, in order."""
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def cpu_commands(text: str) -> list[str]:
    """The shell commands of `text`'s fenced blocks that run the tiny model: each line's last `&&` part, its comment
    removed; blocks that are synopses (`[options]`), Python blocks and the Serving block are left out."""
    out = []
    for block in fenced_blocks(text):
        if "[options]" in block or "vsagen serve" in block or re.search(r"^(import|from) ", block, flags=re.M):
            continue  # (the Serving block, a server and requests to it: tests/serve/test_routes.py)
        for line in block.splitlines():
            command = line.split("&&")[-1].strip()
            words = shlex.split(command, comments=True)
            if words and words[0] in ("vsagen", "torchrun") and "--model" in words \
                    and words[words.index("--model") + 1].startswith("tiny"):
                out.append(shlex.join(words))
    return out


def test_cpu_commands_finds_the_tiny_lines_only():
    text = ("```bash\n# 1. install\npython3 -m venv .venv && pip install -e . && vsagen t2v --model tiny \"a b\"\n"
            "vsagen t2v --model wan2.1-t2v-1.3b \"x\"\n"
            "vsagen profile --model tiny --attn full,vsa   # CPU, seconds\n```\n"
            "```\nvsagen t2v PROMPT [options]\nvsagen t2v --model tiny x\n```\n"
            "```python\nimport vsagen\n```\n")
    assert cpu_commands(text) == ["vsagen t2v --model tiny 'a b'", "vsagen profile --model tiny --attn full,vsa"]


def test_cpu_commands_leave_the_serving_block_to_its_own_test():
    text = ("```bash\nvsagen serve --model tiny --steps 2 &\nid=$(curl -s http://127.0.0.1:8000/v1/videos \\\n"
            "  -d '{}')\n```\n```bash\nvsagen t2v --model tiny x\n```\n")
    assert cpu_commands(text) == ["vsagen t2v --model tiny x"]


def written_names(words: list[str]) -> set[str]:
    """The files (or folder) a README command writes under the names it gives: `--out` of a vsagen command (t2v and
    i2v add the JSON, `--sheet`'s contact sheet, `--seeds`' NAME-seedN and .png's NAME-0000), `-o` of curl. Commands
    without a name write fresh default names (`-1`, `-2` suffixes), so they never clash."""
    if words and words[0] == "curl":
        return {words[words.index("-o") + 1]} if "-o" in words else set()
    if len(words) < 2 or words[0] != "vsagen" or "--out" not in words:
        return set()
    out = Path(words[words.index("--out") + 1])
    if words[1] not in ("t2v", "i2v"):
        return {str(out)}
    stems = [f"{out.with_suffix('')}-seed{s}" for s in words[words.index("--seeds") + 1].split(",")] \
        if "--seeds" in words else [str(out.with_suffix(""))]
    names = set()
    for stem in stems:
        names |= {f"{stem}-0000.png" if out.suffix == ".png" else stem + out.suffix, f"{stem}.json"}
        names |= {f"{stem}.sheet.png"} if "--sheet" in words else set()
    return names


def pasted_commands(text: str) -> list[list[str]]:
    """Every shell command line of `text`'s fenced blocks, in order, as words (a `\\`-continued line joined, each `&&`
    part and each `$(...)` opening its own command); Python blocks and synopses left out."""
    out = []
    for block in fenced_blocks(text):
        if "[options]" in block or re.search(r"^(import|from) ", block, flags=re.M):
            continue
        for line in block.replace("\\\n", " ").splitlines():
            for part in re.split(r"&&|\$\(", line):
                try:
                    words = shlex.split(part, comments=True)
                except ValueError:  # (a part cut inside quotes by the split: not a command of ours)
                    continue
                if words:
                    out.append(words)
    return out


def test_readme_commands_pasted_in_order_write_distinct_files():
    """Pasted in order into one folder, no README command finds a file an earlier one wrote (it would be refused
    without --overwrite, or overwritten by curl); the run test above gives each command a fresh folder."""
    seen: dict[str, str] = {}
    for words in pasted_commands(README.read_text()):
        for name in written_names(words):
            assert name not in seen, f"{shlex.join(words)} writes {name}, already written by: {seen[name]}"
            seen[name] = shlex.join(words)
    assert {"fox.mp4", "fox.json", "fox.sheet.png"} <= set(seen), sorted(seen)


def test_written_names_catches_the_json_two_videos_share():
    first = written_names(shlex.split("vsagen t2v --model tiny --sheet --out fox.mp4 x"))
    assert first == {"fox.mp4", "fox.json", "fox.sheet.png"}
    assert first & written_names(shlex.split("vsagen t2v --model tiny --out fox.gif x")) == {"fox.json"}
    assert written_names(shlex.split("vsagen t2v --model tiny --seeds 1,2 --out fox.mp4 x")) == {
        "fox-seed1.mp4", "fox-seed1.json", "fox-seed2.mp4", "fox-seed2.json"}
    assert written_names(shlex.split("vsagen t2v --model tiny --out f.png x")) == {"f-0000.png", "f.json"}
    assert written_names(shlex.split("curl -s -o fox.mp4 http://h/x")) == {"fox.mp4"}
    assert written_names(shlex.split("vsagen t2v --model tiny x")) == set()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _argv(command: str) -> list[str]:
    """The command's argv in this interpreter: `vsagen` as `python -m vsagen`, `torchrun` as torch's launcher on a
    free port (the README's default port may be taken on a shared machine)."""
    words = shlex.split(command)
    if words[0] == "vsagen":
        return [sys.executable, "-m", "vsagen", *words[1:]]
    return [sys.executable, "-m", "torch.distributed.run", "--master_addr", "127.0.0.1", "--master_port",
            str(_free_port()), *words[1:]]


def in_a_subprocess(index: int, command: str) -> bool:
    """Whether the command runs as the shell runs it: the README's first, and those that start processes."""
    words = shlex.split(command)
    return index == 0 or words[0] == "torchrun" or any(w == "--gpus" or w.startswith("--gpus=") for w in words)


def test_the_first_and_the_multi_process_commands_run_in_subprocesses():
    commands = ["vsagen t2v --model tiny x", "vsagen compare --model tiny x", "vsagen t2v --model tiny --gpus 2 x",
                "torchrun --nproc_per_node 2 -m vsagen t2v --model tiny x", "vsagen t2v --model tiny --gpus=2 x"]
    assert [in_a_subprocess(i, c) for i, c in enumerate(commands)] == [True, False, True, True, True]


@pytest.mark.slow
def test_readme_cpu_commands_run_as_pasted(tmp_path, vsagen_cache, tiny_dir, monkeypatch):
    from typer.testing import CliRunner

    from vsagen.cli.app import app

    commands = cpu_commands(README.read_text())
    assert len(commands) >= 3, commands  # t2v (set-up line), compare and profile at least
    env = {**os.environ, "VSAGEN_CACHE": str(vsagen_cache), "OMP_NUM_THREADS": "1", "HF_HOME": str(tmp_path / "hf")}
    env = {k: v for k, v in env.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    folders = []
    for i, command in enumerate(commands):
        folders.append(tmp_path / f"run{i}")
        folders[-1].mkdir()
    started = {i: subprocess.Popen(_argv(command), cwd=folders[i], env=env, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE)  # bytes: text mode would make a bar's \r a newline
               for i, command in enumerate(commands) if in_a_subprocess(i, command)}
    results = {}
    for i, command in enumerate(commands):
        if i not in started:
            monkeypatch.chdir(folders[i])
            res = CliRunner().invoke(app, shlex.split(command)[1:])
            raised = res.exception is not None and not isinstance(res.exception, SystemExit)
            results[i] = (res.exit_code, res.stdout, res.stderr + (repr(res.exception) if raised else ""))
    for i, proc in started.items():
        out, err = proc.communicate(timeout=TIMEOUT_S)
        results[i] = (proc.returncode, out.decode(), err.decode())
    for i, command in enumerate(commands):
        code, out, err = results[i]
        where = folders[i]
        assert code == 0, f"{command}\n{err[-3000:]}"
        assert "Traceback" not in out + err, f"{command}\n{err}"
        words = shlex.split(command)
        if any(w in words for w in ("t2v", "i2v", "compare")):  # the video --out's extension names (t2v / i2v)
            ext = Path(words[words.index("--out") + 1]).suffix if "--out" in words and "compare" not in words \
                else ".mp4"
            assert list(where.rglob("*-0000.png" if ext == ".png" else f"*{ext}")), f"{command} wrote no {ext}"
        if "profile" in words:
            assert "attention" in out, f"{command}\n{out}"
        if i == 0:  # piped, the cleared denoising bar left an unended line and "decoding the video" was appended to
            # it; outside a terminal the bar is left as a line of its own
            assert any(line.startswith("decoding the video") for line in err.split("\n")), err
        if "--cache" in words:  # the cache examples reuse on the tiny model (else a note says what to raise)
            assert "reused no forward" not in out + err, f"{command}\n{out}\n{err}"
