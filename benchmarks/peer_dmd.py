"""vsagen's `dmd` sampler against FastVideo's own DMD arithmetic, run from its PyPI sdist as data (issue 30).

FastVideo's DMD stage (`DmdDenoisingStage`) turns each prediction into x0 with `pred_noise_to_pred_video`
(`fastvideo/models/utils.py`) and re-noises it to the next timestep with its `FlowMatchEulerDiscreteScheduler(shift=8)`'s
`add_noise` (`fastvideo/models/schedulers/scheduling_flow_match_euler_discrete.py`), at the timesteps of its pipeline
config (`FastWan2_1_T2V_480P_Config.dmd_denoising_steps`, `fastvideo/configs/pipelines/wan.py`). This script loads those
three files from the sdist (`pip download --no-deps --no-binary :all: fastvideo`; checked with 0.2.1), with a
stand-in for the one package import they need (`fastvideo.logger`), and runs their update and vsagen's (diffusers'
stochastic FlowMatchEulerDiscreteScheduler installed by `vsagen.samplers`) on the same latents, flow predictions and
noise, step by step. CPU, seconds; FastVideo is never installed nor imported as a package.

    python benchmarks/peer_dmd.py --sdist fastvideo-0.2.1.tar.gz
"""

from __future__ import annotations

import argparse
import ast
import logging
import sys
import tarfile
import tempfile
import types
from pathlib import Path

import torch

from vsagen.samplers import NAMED, renoise_scheduler

FILES = {"scheduler": "fastvideo/models/schedulers/scheduling_flow_match_euler_discrete.py",
         "base": "fastvideo/models/schedulers/base.py", "utils": "fastvideo/models/utils.py",
         "config": "fastvideo/configs/pipelines/wan.py"}


def extract(sdist: Path, into: Path, files: dict[str, str] = FILES) -> dict[str, Path]:
    """The sdist's `files` ({key: path in the sdist, its top folder stripped}), extracted under `into`: {key: the
    extracted file} (also used by benchmarks/sla_equivalence.py)."""
    found = {}
    with tarfile.open(sdist) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/", 1)[-1]
            for key, path in files.items():
                if rel == path:
                    tar.extract(member, into, filter="data")
                    found[key] = into / member.name
    missing = sorted(set(files) - set(found))
    if missing:
        raise SystemExit(f"{sdist}: no {', '.join(files[m] for m in missing)}")
    return found


def peer_file(source: str | None, git_dir: str | None, commit: str, file: str) -> Path:
    """A peer's source file as data: `source` (a path) as given, else `file` at `commit` of the git directory
    `git_dir` (e.g. a snapshot the `fetch` tool brings), written to a temporary folder (also used by
    benchmarks/light_vae_equivalence.py and benchmarks/make_taehv_reference.py)."""
    import subprocess

    if source is not None:
        return Path(source)
    text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{file}"], check=True, capture_output=True,
                          text=True).stdout
    path = Path(tempfile.mkdtemp()) / Path(file).name
    path.write_text(text)
    return path


def load_module(name: str, path: Path) -> types.ModuleType:
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def fastvideo_pieces(files: dict[str, Path]):
    """(their scheduler class, pred_noise_to_pred_video, the FastWan DMD timesteps), from the extracted files."""
    logger = types.ModuleType("fastvideo.logger")
    logger.init_logger = logging.getLogger
    for pkg in ("fastvideo", "fastvideo.models", "fastvideo.models.schedulers"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg)).__path__ = []
    sys.modules["fastvideo.logger"] = logger
    load_module("fastvideo.models.schedulers.base", files["base"])
    scheduler = load_module("fastvideo.models.schedulers.scheduling_flow_match_euler_discrete", files["scheduler"])
    # pred_noise_to_pred_video alone (its module imports the rest of the package): the function's source, compiled
    tree = ast.parse(files["utils"].read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "pred_noise_to_pred_video")
    space: dict = {"torch": torch, "Any": object}
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(files["utils"]), "exec"), space)
    # the FastWan config's dmd_denoising_steps default, read from the source (the module imports the package)
    config = ast.parse(files["config"].read_text())
    cls = next(n for n in config.body if isinstance(n, ast.ClassDef) and n.name == "FastWan2_1_T2V_480P_Config")
    field = next(s for s in cls.body if isinstance(s, ast.AnnAssign) and s.target.id == "dmd_denoising_steps")
    steps = ast.literal_eval(next(k.value.body for k in field.value.keywords if k.arg == "default_factory"))
    return scheduler.FlowMatchEulerDiscreteScheduler, space["pred_noise_to_pred_video"], steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sdist", type=Path, required=True, help="FastVideo's sdist (.tar.gz)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        their_scheduler_cls, pred_video, their_steps = fastvideo_pieces(extract(args.sdist, Path(tmp)))
        theirs = their_scheduler_cls(shift=8.0)
        dmd = NAMED["dmd"]
        print(f"FastWan dmd_denoising_steps {their_steps}; vsagen dmd timesteps {list(dmd.timesteps)}")
        assert [float(t) for t in their_steps] == list(dmd.timesteps)
        ours = renoise_scheduler(dmd, args.seed)
        ours.set_timesteps(len(dmd.sigmas), device="cpu")
        g = torch.Generator().manual_seed(args.seed + 1)
        shape = (1, 16, 5, 6, 10)  # (B, C, F, H, W) latents; FastVideo flattens (B, F) to the scheduler's batch
        x = torch.randn(shape, generator=g)
        worst = 0.0
        for i, t in enumerate(their_steps):
            v = torch.randn(shape, generator=g)
            # vsagen: diffusers' step draws eps from the generator the installed scheduler hands it; draw it again
            state = torch.Generator().manual_seed(args.seed)
            for _ in range(i + 1):
                eps = torch.randn(shape, generator=state)
            mine = ours.step(v, ours.timesteps[i], x, return_dict=False)[0]
            # FastVideo (float64 inputs): x0 from the prediction at t, then add_noise to the next timestep
            per_frame = (lambda a: a.double().permute(0, 2, 1, 3, 4).flatten(0, 1))
            t_in = torch.tensor([t], dtype=torch.long)
            x0 = pred_video(per_frame(v), per_frame(x), t_in, theirs)
            if i + 1 < len(their_steps):
                t_next = torch.tensor([their_steps[i + 1]], dtype=torch.long)
                nxt = theirs.add_noise(x0, per_frame(eps), t_next)
            else:
                nxt = x0
            want = nxt.unflatten(0, (shape[0], shape[2])).permute(0, 2, 1, 3, 4)
            err = float((mine.double() - want).abs().max())
            worst = max(worst, err)
            print(f"step {i} (t={t}): max |vsagen - FastVideo| = {err:.2e}")
            x = mine
        print(f"worst {worst:.2e} (float32 update against FastVideo's float64 run of the same inputs)")
        if worst > 1e-5:
            raise SystemExit("vsagen's dmd update differs from FastVideo's")


if __name__ == "__main__":
    main()
