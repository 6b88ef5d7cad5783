"""`vsagen t2v --prompts FILE`: several videos from one load. The file holds one video a line: a prompt as text, or
a JSON object with the prompt and the video's own seed, size, frames, steps, guidance and negative prompt
(`read_batch`; a line that parses as other JSON, e.g. `[1,2]`, is refused); blank lines and lines starting with
`#` are skipped. Each line becomes the `t2v` request of the command line's options with its own values in their
groups (`resolve_batch`: every line checked, every target free, before anything loads), and all of them run on one loaded model (`generate_batch`, through
`vsagen.commands.generate.Resident`), each video and its JSON published before the next starts: an interrupt keeps
the finished ones and leaves no partial one. `vsagen search --prompts` reads the same file (`read_batch`), its
prompts only (`vsagen.commands.search.search_prompts`).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import BadInput
from ..request.options import RequestOptions
from .generate_config import VIDEO_VALUES, RunConfig, resolve_run, video_options

# a line's JSON keys: the prompt, then a video's own values (`vsagen.commands.generate_config.VIDEO_VALUES`)
KEYS = ("prompt", *VIDEO_VALUES)


def prompts_text(path: Path) -> str:
    """The text of a `--prompts` file (`vsagen t2v`, `vsagen search`).

    Raises:
        BadInput: a missing, unreadable or non-UTF-8 file, or a folder.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"--prompts {path}: no such file") from None
    except IsADirectoryError:
        raise BadInput(f"--prompts {path} is a directory; give a text file with one prompt a line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BadInput(f"--prompts {path} cannot be read: {e}") from None


@dataclass(frozen=True)
class BatchLine:
    """One line of a `--prompts` file: its number in the file, the prompt and the video's own values (None: the
    command line's)."""

    line: int
    prompt: str
    values: dict[str, Any]


def _typed(key: str, value: Any, where: str) -> Any:
    """A JSON line's value as its option takes it: integers for sizes, frames, steps and seed, a number for the
    guidance, text for the negative prompt (each option group checks the range)."""
    if key == "guidance":
        ok = not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)
        what = "a number"
    elif key == "negative_prompt":
        ok, what = isinstance(value, str), "a string"
    else:
        ok, what = not isinstance(value, bool) and isinstance(value, int), "an integer"
    if not ok:
        raise BadInput(f"{where}: {key} must be {what}, got {json.dumps(value)}")  # (the file's spelling: true)
    return float(value) if key == "guidance" else value


def _not_an_object(where: str, line: str, data: Any) -> str:
    """The refusal of a line that parses as JSON other than an object (`data`, parsed from `line`), in one line:
    what JSON it is and how to write it as a prompt. A JSON string (`"a fox"`) is told to drop its quotes, or to
    become {"prompt": "a fox"} (its text, not the quoted line); other JSON (`[1,2]`, `42`, `true`) becomes the
    object of its text."""
    if isinstance(data, str):
        fix = (f"write the prompt without the quotes, or as {json.dumps({'prompt': data}, ensure_ascii=False)}"
               if data.strip() else "write a prompt")
        return f"{where} is a JSON string, not an object; {fix}"
    kind = {list: "a JSON list", bool: f"JSON {line}", type(None): "JSON null"}.get(type(data), "a JSON number")
    return (f"{where} is {kind}, not an object; a line is a prompt as text or a JSON object (for this text as the "
            f"prompt, write {json.dumps({'prompt': line}, ensure_ascii=False)})")


def read_batch(path: Path) -> list[BatchLine]:
    """The videos of a `--prompts` file (module docstring), in order.

    Raises:
        BadInput: the file cannot be read, holds no video, or a line is not valid JSON where it starts with `{`,
            is JSON other than an object (`[1,2]`, `"a fox"`, `42`: text that is not a prompt), lacks its prompt,
            has an unknown key or a value of the wrong type (naming the file and the line).
    """
    text = prompts_text(path)
    out = []
    for number, raw in enumerate(text.splitlines(), 1):
        line, where = raw.strip(), f"--prompts {path} line {number}"
        if not line or line.startswith("#"):
            continue
        try:
            data = json.loads(line)
        except ValueError as e:
            if line.startswith("{"):
                raise BadInput(f"{where}: not valid JSON ({e})") from None
            out.append(BatchLine(number, line, {}))  # text: the prompt
            continue
        if not isinstance(data, dict):  # other JSON ([1,2], "a fox", 42, true): neither a prompt nor an object
            raise BadInput(_not_an_object(where, line, data))
        unknown = sorted(set(data) - set(KEYS))
        if unknown or "prompt" not in data:
            raise BadInput(f"{where}: " + (f"unknown key {unknown[0]!r}" if unknown else "no prompt")
                           + f"; a JSON line takes {', '.join(KEYS)} (the prompt a string)")
        if not isinstance(data["prompt"], str):  # as `vsagen serve` says it of a request's prompt
            raise BadInput(f"{where}: prompt must be a string, got {type(data['prompt']).__name__}")
        values = {k: _typed(k, v, where) for k, v in data.items() if k != "prompt" and v is not None}
        out.append(BatchLine(number, data["prompt"], values))
    if not out:
        raise BadInput(f"--prompts {path} has no prompt (one a line, or a JSON object; blank lines and # comments "
                       "are skipped)")
    return out


def batch_out(path: Path, index: int) -> Path:
    """Where video `index` (1-based) of `--prompts` goes: `NAME-0001.ext` beside `--out NAME.ext`."""
    return path.with_name(f"{path.stem}-{index:04d}{path.suffix}")


def default_batch_out(count: int, overwrite: bool) -> Path:
    """`--prompts` without `--out`: `vsagen-prompts.mp4` (videos `vsagen-prompts-0001.mp4`, ...) in the current
    folder; without --overwrite, where any of the `count` videos (or their JSON or contact sheet) exists, the first
    of `vsagen-prompts-1.mp4`, `-2`, ... whose videos are all new (as `vsagen t2v` names a single video,
    `vsagen.media.paths.default_out`).

    Raises:
        BadInput: ten thousand earlier batches in the folder."""
    from ..media.paths import sheet_path

    for i in range(1 if overwrite else 10_000):
        base = Path(f"vsagen-prompts{'' if i == 0 else f'-{i}'}.mp4")
        videos = [batch_out(base, j) for j in range(1, count + 1)]
        if overwrite or not any(os.path.lexists(p) for v in videos for p in (v, v.with_suffix(".json"),
                                                                               sheet_path(v))):
            return base
    raise BadInput("too many earlier outputs in this folder; pass --out")


def resolve_batch(path: Path, options: RequestOptions) -> list[RunConfig]:
    """The `t2v` request of each line of `path` (`read_batch`): the command line's options with the line's own
    values in their groups, resolved as `vsagen t2v` resolves one (the line named in a refusal); video i goes to
    `batch_out(--out, i)` (default `default_batch_out`: `vsagen-prompts.mp4`, or `vsagen-prompts-1.mp4`, ... where
    earlier videos have those names).

    Raises:
        BadInput: see `read_batch` and `resolve_run`; also `--seeds` (a line gives its seed), several processes,
            `--random-weights` (the weights come from the seed) and a MagCache calibration (one ratios file).
    """
    if options.sampling.seeds is not None:
        raise BadInput("--seeds and --prompts together: give each line its seed ({\"prompt\": ..., \"seed\": N})")
    lines = read_batch(path)
    base = options.output.out if options.output.out is not None else \
        default_batch_out(len(lines), options.output.overwrite)
    cfgs = []
    for index, line in enumerate(lines, 1):
        try:
            mine = video_options(options, **line.values)
            cfgs.append(resolve_run(line.prompt, replace(mine, output=replace(mine.output,
                                                                               out=batch_out(base, index)))))
        except BadInput as e:
            raise BadInput(f"--prompts {path} line {line.line}: {e}") from None
    first = cfgs[0]
    if first.processes > 1:
        raise BadInput("--prompts runs its videos in one process; leave out --gpus / --ulysses / --cfg-parallel")
    if first.random_weights:
        raise BadInput("--random-weights draws the weights from the seed, so each video would need its own model; "
                       "run one t2v per video")
    if first.cache.name == "mag" and first.cache.options.calibrate:
        raise BadInput("--cache mag:calibrate=true writes one ratios file; calibrate with one t2v run")
    return cfgs


def generate_batch(cfgs: Sequence[RunConfig], *, log: Callable[[str], None] = lambda m: None,
                   cancelled: Callable[[], bool] = lambda: False,
                   published: Callable[[RunConfig, Any], None] = lambda c, r: None) -> list[Any]:
    """Make every video of `cfgs` (`resolve_batch`) on one model loaded from the first (`Resident`), in order;
    each video's files are published, and handed to `published` with its request, before the next starts.

    Returns:
        The `RunResult` of each video.

    Raises:
        BadInput, ModelNotFound, RunFailure: as `vsagen t2v`; KeyboardInterrupt: the videos already published
            stay on disk, the one being made leaves nothing.
    """
    from .generate import Resident

    resident = Resident(cfgs[0], log=log)
    results = []
    for i, cfg in enumerate(cfgs):
        log(f"video {i + 1} of {len(cfgs)}: {cfg.prompt[:60]!r}, seed {cfg.seed}")
        results.append(resident.generate(cfg, log=log, cancelled=cancelled, final=i == len(cfgs) - 1))
        published(cfg, results[-1])
    return results
