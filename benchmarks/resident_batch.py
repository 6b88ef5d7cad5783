"""Issue 47's targets for a resident model (`vsagen.commands.generate.Resident`, what `vsagen serve` and `vsagen t2v
--prompts` run on): N videos from one load against N times one video's wait, and a video on the loaded model
against a cold `vsagen t2v` process of the same video.

    python benchmarks/resident_batch.py --model tiny --device cpu --steps 2 --cold            # the CPU target
    python benchmarks/resident_batch.py --model fastwan2.1-t2v-1.3b --random-weights --videos 10 --out $OUT/r.json

Prints one table; with --out, the numbers as JSON. Each video's "wait" is its timing JSON's (text encode to the mp4
written); its "wall" the host seconds of `Resident.generate` (the wait plus the notes, the JSON and the
publication). The first video on the model pays the first-step compilation / lazy initialisation; "one video" is
the second. With --random-weights every video keeps the load's seed (the seed drew the weights).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--random-weights", action="store_true")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--frames", type=int, default=None)
    ap.add_argument("--videos", type=int, default=10)
    ap.add_argument("--cold", action="store_true", help="also time a cold `vsagen t2v` process of one video")
    ap.add_argument("--out", type=Path, default=None, help="write the numbers here as JSON")
    args = ap.parse_args()

    from vsagen.commands.generate import Resident
    from vsagen.commands.generate_config import resolve_generate
    from vsagen.models.loading import prepare_model_files

    folder = Path(tempfile.mkdtemp(prefix="resident-"))
    flags = {k: v for k, v in dict(model=args.model, device=args.device, random_weights=args.random_weights or None,
                                    steps=args.steps, height=args.height, width=args.width,
                                    frames=args.frames).items() if v is not None}

    def request(i: int):
        return resolve_generate(f"a red fox running through fresh snow, take {i}", **flags,
                                out=folder / f"v{i}.mp4", overwrite=True)

    first = request(0)
    prepare_model_files(first)
    t0 = time.perf_counter()
    resident = Resident(first)
    load_wall = time.perf_counter() - t0

    def video(i: int) -> tuple[float, float]:
        t = time.perf_counter()
        result = resident.generate(request(i))
        return time.perf_counter() - t, result.report.wait_s

    first_wall, first_wait = video(0)
    one_wall, one_wait = video(1)
    t0 = time.perf_counter()
    runs = [video(2 + i) for i in range(args.videos)]
    batch_wall = time.perf_counter() - t0
    numbers = {
        "model": args.model, "device": first.device, "random_weights": args.random_weights, "steps": first.steps,
        "size": [first.frames, first.height, first.width], "load_s": resident.session.load_s,
        "load_wall_s": load_wall, "first_video_wall_s": first_wall, "first_video_wait_s": first_wait,
        "one_video_wall_s": one_wall, "one_video_wait_s": one_wait, "videos": args.videos,
        "videos_wall_s": batch_wall, "video_waits_s": [w for _, w in runs],
        "ratio_to_n_waits": batch_wall / (args.videos * one_wait),
    }
    if args.cold:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                             os.environ.get("PYTHONPATH", "")])}
        argv = [sys.executable, "-m", "vsagen", "t2v", first.prompt, "--out", str(folder / "cold.mp4"),
                "--overwrite", "--json"] + [a for k, v in flags.items() for a in
                                            ([f"--{k.replace('_', '-')}"] if v is True else
                                             [f"--{k.replace('_', '-')}", str(v)])]
        t0 = time.perf_counter()
        subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        numbers["cold_t2v_wall_s"] = time.perf_counter() - t0
        numbers["one_video_share_of_cold"] = one_wall / numbers["cold_t2v_wall_s"]
    width = max(map(len, numbers))
    for key, value in numbers.items():
        shown = (f"{value:.3f}" if isinstance(value, float) else
                 "[" + ", ".join(f"{v:.3f}" for v in value) + "]" if key == "video_waits_s" else str(value))
        print(f"{key:<{width}}  {shown}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(numbers, indent=1) + "\n")


if __name__ == "__main__":
    main()
