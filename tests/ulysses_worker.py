"""The workers of tests/attention/test_ulysses_attention.py, tests/parallel/test_ulysses.py and test_cfg.py, and
`spawn`, which runs one on 2 gloo processes (imported by the spawned processes through PYTHONPATH; not a test)."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEADLINE_S = 240  # a hang fails the test instead of the suite


# backends with a larger VSA cube than the default 4x4x4 (issue 33), beside every registered backend
TILE_CASES = ("vsa:tile=4x4x8", "sla-star:tile=4x8x8")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(worker_name: str, out: Path, prefix: str) -> list[dict]:
    """Run this module's `worker_name` on 2 spawned gloo processes (a hang fails after DEADLINE_S) and return each
    rank's results (out/<prefix><rank>.json)."""
    import sys
    import time

    import pytest
    import torch.multiprocessing as mp

    old = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent)] + ([old] if old else []))
    try:
        ctx = mp.start_processes(getattr(sys.modules[__name__], worker_name), args=(2, _free_port(), str(out)),
                                 nprocs=2, join=False, start_method="spawn")
        deadline = time.monotonic() + DEADLINE_S
        while not ctx.join(timeout=5):  # False until every process has exited (it returns at each exit)
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.terminate()
                pytest.fail(f"the gloo workers did not finish within {DEADLINE_S} s")
    finally:
        if old is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old
    return [json.loads((out / f"{prefix}{r}.json").read_text()) for r in range(2)]


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank `rank` of `world` (gloo): every registered backend (torch implementations) under Ulysses on fresh random
    inputs with partial tiles, against the same backend run on the whole sequence in this process, forward and
    backward; writes {case: max abs difference} to out_dir/rank<r>.json."""
    import torch
    import torch.distributed as dist

    from vsagen.attention import backend_class, backend_names, make_backend
    from vsagen.attention.base import AttnContext
    from vsagen.layout import tile_layout
    from vsagen.attention.ulysses_attention import UlyssesAttention, heads_to_seq, seq_to_heads
    from vsagen.models.presets import load_preset
    from vsagen.timing import NullTimer

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    group = dist.group.WORLD
    res: dict[str, float] = {}
    try:
        g = torch.Generator().manual_seed(5)  # the same inputs on every rank
        x = torch.randn(2, 12, 4, 8, generator=g)
        s = x.shape[1] // world
        h = seq_to_heads(x[:, rank * s:(rank + 1) * s], group)
        hl = x.shape[2] // world
        res["seq_to_heads"] = float((h - x[:, :, rank * hl:(rank + 1) * hl]).abs().max())
        res["round_trip"] = float((heads_to_seq(h, group) - x[:, rank * s:(rank + 1) * s]).abs().max())

        grid = (5, 6, 10)  # partial tiles in t and h; the tiny preset's pattern file's grid (2 heads)
        n_tok = tile_layout(grid).num_tokens
        for case in [*backend_names(), *TILE_CASES]:
            name, _, tile = case.partition(":tile=")  # the TILE_CASES: a larger cube, partial in every dimension
            opts = {}
            if "impl" in backend_class(name).Options.__dataclass_fields__:
                opts["impl"] = "torch"
            if name == "sparse-vdit":
                opts["patterns"] = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
            if tile:
                opts["tile"] = tile
            heads = 2 if name == "sparse-vdit" else 4
            be = make_backend(name, **opts)
            lay = tile_layout(grid, be.tile) if be.tiled else None
            q, k, v, do = (torch.randn(2, n_tok, heads, 8, generator=g) for _ in range(4))
            ctx = AttnContext(layout=lay, layer=0, expert="transformer", timer=NullTimer())
            qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
            ref = be(qf, kf, vf, ctx)
            ref_grads = torch.autograd.grad(ref, (qf, kf, vf), do)
            s = n_tok // world
            chunk = slice(rank * s, (rank + 1) * s)
            ql, kl, vl = (t[:, chunk].clone().requires_grad_() for t in (q, k, v))
            got = UlyssesAttention(be, group)(ql, kl, vl, ctx)
            grads = torch.autograd.grad(got, (ql, kl, vl), do[:, chunk])
            res[f"{case} fwd"] = float((got - ref[:, chunk]).abs().max())
            if name == "full":  # the negative control: each rank attending its own shard only
                with torch.no_grad():
                    res["shard only"] = float((be(ql, kl, vl, ctx) - ref[:, chunk]).abs().max())
            res[f"{case} bwd"] = max(float((a - b[:, chunk]).abs().max()) for a, b in zip(grads, ref_grads))
        from vsagen.timing import Timer

        timer = Timer("cpu")  # the exchanges are timed as "all_to_all" (the disabled timers above recorded nothing)
        with torch.no_grad():
            UlyssesAttention(make_backend("full"), group)(q[:, chunk], k[:, chunk], v[:, chunk],
                                                          AttnContext(layout=None, layer=0, expert=None, timer=timer))
        res["all_to_all regions"] = [n for n, _, _ in timer.finish()]
    finally:  # as the other workers leave: gloo's teardown after destroy_process_group aborted a rank now and then
        # ("terminate called without an active exception", SIGABRT: CI, 2026-12-03)
        _leave(res, os.path.join(out_dir, f"rank{rank}.json"))


def _leave(res: dict, path: str) -> None:
    """Write a worker's results to `path`, wait for the peer, and exit with os._exit (the device mesh's teardown
    aborts under gloo)."""
    import sys

    import torch.distributed as dist

    with open(path, "w") as f:
        json.dump(res, f)
    try:  # neither rank leaves while the other still sets up groups (a peer gone mid-setup resets its sockets)
        dist.barrier()
    except Exception:  # noqa: BLE001 - the results are written; the tests read them
        pass
    sys.stdout.flush()
    os._exit(0)


def cp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank `rank` of `world` (gloo): the tiny Wan transformer patched by `vsagen.apply`, then diffusers'
    `enable_parallelism` with Ulysses and vsagen's plan (`context_parallel_plan`: Wan's without the RoPE split),
    against the same transformer in one process, for every registered backend (torch implementations); and
    vsagen applied after `enable_parallelism` (its processors then lack the parallel config) must be refused.
    Writes {case: max abs difference or message} to out_dir/cp<r>.json and leaves with os._exit (the device mesh's
    teardown aborts under gloo)."""

    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.accelerator.device_count = lambda: 1  # diffusers divides by it; zero on a CPU-only machine
    res: dict = {}
    try:
        from conftest import make_transformer
        from diffusers import ContextParallelConfig

        import vsagen
        from vsagen.attention import backend_class, backend_names
        from vsagen.parallel.ulysses import context_parallel_plan
        from vsagen.models.presets import load_preset

        g = torch.Generator().manual_seed(3)
        x = torch.randn(1, 16, 5, 12, 20, generator=g)  # grid 5x6x10: partial tiles, 300 tokens
        text = torch.randn(1, 8, 32, generator=g)
        args = dict(hidden_states=x, timestep=torch.tensor([700.0]), encoder_hidden_states=text, return_dict=False)
        for case in [*backend_names(), *TILE_CASES]:
            name, _, tile = case.partition(":tile=")
            opts = {"impl": "torch"} if "impl" in backend_class(name).Options.__dataclass_fields__ else {}
            if name == "sparse-vdit":
                opts["patterns"] = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
            if tile:
                opts["tile"] = tile
            t = make_transformer()
            with vsagen.apply(t, name, fused_prologue="off", **opts), torch.no_grad():
                ref = t(**args)[0]
            vsagen.apply(t, name, fused_prologue="off", **opts)
            t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world), cp_plan=context_parallel_plan(t))
            with torch.no_grad():
                got = t(**args)[0]
            res[case] = float((got - ref).abs().max())
        dist.barrier()  # both ranks done with the runs above before new groups are set up
        try:
            t = make_transformer()
            t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world),
                                 cp_plan=context_parallel_plan(t))
        except Exception as e:  # noqa: BLE001 - the test shows what was raised
            res["late apply"] = f"setup failed: {type(e).__name__}: {e}"
        else:
            vsagen.apply(t, "full", fused_prologue="off")
            try:
                with torch.no_grad():
                    t(**args)
                res["late apply"] = "ran"
            except Exception as e:  # noqa: BLE001 - the test reads what was raised
                res["late apply"] = f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - anything else: the tests print it instead of a KeyError
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        _leave(res, os.path.join(out_dir, f"cp{rank}.json"))


# every registered backend on the tiny model (torch impls; sparse-vdit with the tiny preset's pattern file)
CFG_TINY_BACKENDS = ("full", "vsa:impl=torch", "rocm-vsa:impl=torch", "sla-star:impl=torch", "sla:impl=torch",
                     "sparse-vdit:impl=torch")


def cfg_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank `rank` of `world` (gloo) of a CFG-parallel run through vsagen's orchestrator (`Session.run` of a request
    with cfg_parallel): for the tiny model with `full` and `vsa` (torch; its 5x6x10 grid has partial tiles) and the
    two-expert tiny-a14b, the same session first runs in one process (the reference), then CFG parallel; then
    `profile_dit` of the tiny model with `full` and the overhead rows under CFG parallel. Writes {case: max abs
    difference of the final latents, DiT forwards per expert, whether the exchange was timed; "profile": the report
    as JSON on rank 0, None on rank 1} to out_dir/cfg<r>.json."""
    import dataclasses

    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    res: dict = {}
    try:
        from vsagen.commands.generate_config import resolve_generate as resolve
        from vsagen.pipeline import Session
        from vsagen.timing import TimingReport

        for model, attns in (("tiny", CFG_TINY_BACKENDS), ("tiny-a14b", ("full",))):
            cfg = resolve("a fox", model=model, device="cpu", steps=2, cfg_parallel=True,
                          out=Path(out_dir) / f"{rank}.mp4")
            backends = [resolve("a fox", model=model, attn=a, device="cpu").backend.build() for a in attns]
            session = Session.load(dataclasses.replace(cfg, cfg_parallel=False), backends)  # loaded once
            plan = session.plan(cfg.tile_fit)
            for attn, backend in zip(attns, backends):
                session.request = dataclasses.replace(cfg, cfg_parallel=False)
                ref = session.run(backend, plan)
                session.request = cfg
                got = session.run(backend, plan)
                report = TimingReport.from_records(got.records, "cpu")
                res[f"{model} {attn}"] = {"diff": float((got.latents - ref.latents).abs().max()),
                                          "grid": list(plan.denoise_grid),
                                          "forwards": report.dit_forwards_by_expert,
                                          "exchange timed": report.cfg_exchange_s > 0}
        from vsagen.commands.profile import profile_dit
        from vsagen.commands.profile_config import resolve_profile

        # vsagen profile --cfg-parallel, its overhead rows included: rank 0's report, None elsewhere
        report = profile_dit(resolve_profile(model="tiny", attn="full", device="cpu", steps=1, warmup=0,
                                             cfg_parallel=True), writer=rank == 0)
        res["profile"] = None if report is None else report.to_dict()
    except Exception as e:  # noqa: BLE001 - the tests print it instead of a KeyError
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        _leave(res, os.path.join(out_dir, f"cfg{rank}.json"))
