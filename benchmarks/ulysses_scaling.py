"""Sequence-parallel scaling on several GPUs (issue 16; not a test): `vsagen t2v` under torchrun with `--ulysses N`
(and `--cfg-parallel`) against the one-GPU run of the same model, backend, size, seed and steps.

For every (model, backend, layout) it runs, one after the other:
    python -m vsagen t2v ... --json                                  (layout "1": one GPU, the reference)
    torchrun --nproc_per_node P -m vsagen t2v ... --ulysses N [--cfg-parallel] --json
with random weights at the preset's size (or --height/--width/--frames), then reads each run's JSON (rank 0's, with
every rank's timing) and prints one markdown table: DiT seconds per step (the slowest rank: what the user waits
for), the all-to-all and CFG-exchange seconds per step (the slowest rank), the all-to-all as a share of the DiT, the
speed-up over one GPU and the scaling efficiency (time on 1 GPU / (GPUs x time on them)), and how far the video is
from the one-GPU video (PSNR of the decoded frames, bf16: a parallel run reorders sums, so it is not bit-exact).

Layouts are "1", "uN" (Ulysses N on N GPUs), "cfg" (CFG parallel on 2 GPUs) and "cfg-uN" (2 x N GPUs); those
needing more GPUs than visible are skipped with a line. Needs CUDA and diffusers (see shared/gpu/README.md).

    python benchmarks/ulysses_scaling.py --models wan2.1-t2v-14b,wan2.2-ti2v-5b --attn full,vsa \\
        --layouts 1,u2,u4,u8,cfg-u4 --steps 3 --warmup 1 --out-dir /tmp/scaling
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path


def gpus_of(layout: str) -> tuple[int, int, bool]:
    """(processes, ulysses degree, cfg parallel) of a layout name ("1", "u4", "cfg", "cfg-u4").

    Raises:
        ValueError: another name."""
    cfg = layout.startswith("cfg")
    rest = layout[3:].lstrip("-") if cfg else layout
    if rest in ("", "1"):
        degree = 1
    elif rest.startswith("u") and rest[1:].isdigit() and int(rest[1:]) >= 1:
        degree = int(rest[1:])
    else:
        raise ValueError(f"layout {layout!r}: use 1, uN, cfg or cfg-uN")
    return degree * (2 if cfg else 1), degree, cfg


def command(model: str, attn: str, layout: str, out: Path, a: argparse.Namespace) -> list[str]:
    """The command line of one run (a plain process for layout "1", torchrun otherwise)."""
    procs, degree, cfg = gpus_of(layout)
    args = ["t2v", a.prompt, "--model", model, "--random-weights", "--attn", attn, "--steps", str(a.steps),
            "--warmup", str(a.warmup), "--seed", str(a.seed), "--out", str(out), "--overwrite", "--json"]
    for flag in ("height", "width", "frames"):
        if getattr(a, flag) is not None:
            args += [f"--{flag}", str(getattr(a, flag))]
    if procs == 1:
        return [sys.executable, "-m", "vsagen", *args]
    extra = (["--ulysses", str(degree)] if degree > 1 else []) + (["--cfg-parallel"] if cfg else [])
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(procs), "--master_port",
            str(29500 + procs), "-m", "vsagen", *args, *extra]


def per_step(timing: dict, key: str, steps: int) -> float:
    """Seconds per step of `key` (dit_s, all_to_all_s, cfg_exchange_s) on the slowest rank (the run's own value in
    a one-process run)."""
    source = timing.get("ranks_max") or timing
    return float(source.get(key) or 0.0) / steps


def psnr(a, b) -> float:
    """PSNR (dB) of two uint8 videos of one shape; inf when equal."""
    import numpy as np

    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="wan2.1-t2v-14b,wan2.2-ti2v-5b")
    ap.add_argument("--attn", default="full,vsa")
    ap.add_argument("--layouts", default="1,u2,u4,u8")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--height", type=int, default=None)
    ap.add_argument("--width", type=int, default=None)
    ap.add_argument("--frames", type=int, default=None)
    ap.add_argument("--prompt", default="a red fox running through fresh snow")
    ap.add_argument("--out-dir", type=Path, default=Path("scaling"))
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    a = ap.parse_args()
    try:
        layouts = [(name, *gpus_of(name)) for name in a.layouts.split(",")]
    except ValueError as e:
        ap.error(str(e))
    if "1" not in [n for n, *_ in layouts]:
        layouts.insert(0, ("1", 1, 1, False))  # the reference
    import torch

    visible = torch.cuda.device_count()
    a.out_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in a.models.split(","):
        for attn in a.attn.split(","):
            ref_frames, ref_step = None, None
            for name, procs, degree, cfg in layouts:
                if procs > max(visible, 1) and not a.dry_run:
                    print(f"skipped {model} {attn} {name}: needs {procs} GPUs, {visible} visible", flush=True)
                    continue
                out = a.out_dir / f"{model}-{attn.replace(':', '_')}-{name}.mp4"
                cmd = command(model, attn, name, out, a)
                print("$ " + " ".join(cmd), flush=True)
                if a.dry_run:
                    continue
                res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
                if res.returncode != 0:
                    tail = (res.stderr.strip().splitlines() or ["(no output)"])[-1]
                    print(f"failed ({res.returncode}): {tail}", flush=True)
                    continue
                data = json.loads(res.stdout.strip().splitlines()[-1])
                timing = data["timing"]
                dit = per_step(timing, "dit_s", a.steps)
                a2a = per_step(timing, "all_to_all_s", a.steps)
                exch = per_step(timing, "cfg_exchange_s", a.steps)
                from vsagen.media.video import read_mp4

                frames = read_mp4(out)
                if name == "1":
                    ref_frames, ref_step = frames, dit
                rows.append({"model": model, "attn": attn, "layout": name, "gpus": procs, "dit_s_per_step": dit,
                             "all_to_all_s_per_step": a2a, "cfg_exchange_s_per_step": exch,
                             "speedup": (ref_step / dit) if ref_step else None,
                             "efficiency": (ref_step / (procs * dit)) if ref_step else None,
                             "psnr_vs_1gpu_db": psnr(frames, ref_frames) if ref_frames is not None else None})
                print(json.dumps(rows[-1]), flush=True)
    if a.dry_run:
        return
    (a.out_dir / "scaling.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n| model | attn | layout | GPUs | DiT s/step | all-to-all s/step (% DiT) | CFG exchange s/step | speed-up "
          "| efficiency | PSNR vs 1 GPU |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    fmt = lambda v, f: "-" if v is None else f.format(v)  # noqa: E731
    for r in rows:
        share = 100 * r["all_to_all_s_per_step"] / r["dit_s_per_step"] if r["dit_s_per_step"] else 0.0
        print(f"| {r['model']} | {r['attn']} | {r['layout']} | {r['gpus']} | {r['dit_s_per_step']:.3f} | "
              f"{r['all_to_all_s_per_step']:.3f} ({share:.1f}%) | {r['cfg_exchange_s_per_step']:.3f} | "
              f"{fmt(r['speedup'], '{:.2f}x')} | {fmt(r['efficiency'], '{:.0%}')} | "
              f"{fmt(r['psnr_vs_1gpu_db'], '{:.1f}')} |")


if __name__ == "__main__":
    main()
