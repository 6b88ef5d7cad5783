"""The worker of tests/parallel/test_ulysses.py (imported by the spawned processes through PYTHONPATH; not a test)."""

from __future__ import annotations

import json
import os


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank `rank` of `world` (gloo): every registered backend (torch implementations) under Ulysses on fresh random
    inputs with partial tiles, against the same backend run on the whole sequence in this process, forward and
    backward; writes {case: max abs difference} to out_dir/rank<r>.json."""
    import torch
    import torch.distributed as dist

    from vsagen.attention import backend_class, backend_names, make_backend
    from vsagen.attention.base import AttnContext
    from vsagen.layout import tile_layout
    from vsagen.parallel.ulysses import UlyssesAttention, heads_to_seq, seq_to_heads
    from vsagen.presets import load_preset
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
        lay = tile_layout(grid)
        n_tok = lay.num_tokens
        for name in backend_names():
            opts = {}
            if "impl" in backend_class(name).Options.__dataclass_fields__:
                opts["impl"] = "torch"
            if name == "sparse-vdit":
                opts["patterns"] = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
            heads = 2 if name == "sparse-vdit" else 4
            be = make_backend(name, **opts)
            q, k, v, do = (torch.randn(2, n_tok, heads, 8, generator=g) for _ in range(4))
            ctx = AttnContext(layout=lay if be.tiled else None, layer=0, expert="transformer", timer=NullTimer())
            qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
            ref = be(qf, kf, vf, ctx)
            ref_grads = torch.autograd.grad(ref, (qf, kf, vf), do)
            s = n_tok // world
            chunk = slice(rank * s, (rank + 1) * s)
            ql, kl, vl = (t[:, chunk].clone().requires_grad_() for t in (q, k, v))
            got = UlyssesAttention(be, group)(ql, kl, vl, ctx)
            grads = torch.autograd.grad(got, (ql, kl, vl), do[:, chunk])
            res[f"{name} fwd"] = float((got - ref[:, chunk]).abs().max())
            if name == "full":  # the negative control: each rank attending its own shard only
                with torch.no_grad():
                    res["shard only"] = float((be(ql, kl, vl, ctx) - ref[:, chunk]).abs().max())
            res[f"{name} bwd"] = max(float((a - b[:, chunk]).abs().max()) for a, b in zip(grads, ref_grads))
    finally:
        with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
            json.dump(res, f)
        dist.destroy_process_group()


def cp_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """Rank `rank` of `world` (gloo): the tiny Wan transformer patched by `vsagen.apply`, then diffusers'
    `enable_parallelism` with Ulysses and vsagen's plan (`context_parallel_plan`: Wan's without the RoPE split),
    against the same transformer in one process, for every registered backend (torch implementations); and
    vsagen applied after `enable_parallelism` (its processors then lack the parallel config) must be refused.
    Writes {case: max abs difference or message} to out_dir/cp<r>.json and leaves with os._exit (the device mesh's
    teardown aborts under gloo)."""
    import sys

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
        from vsagen.presets import load_preset

        g = torch.Generator().manual_seed(3)
        x = torch.randn(1, 16, 5, 12, 20, generator=g)  # grid 5x6x10: partial tiles, 300 tokens
        text = torch.randn(1, 8, 32, generator=g)
        args = dict(hidden_states=x, timestep=torch.tensor([700.0]), encoder_hidden_states=text, return_dict=False)
        for name in backend_names():
            opts = {"impl": "torch"} if "impl" in backend_class(name).Options.__dataclass_fields__ else {}
            if name == "sparse-vdit":
                opts["patterns"] = load_preset("tiny").defaults.attention["sparse-vdit"]["patterns"]
            t = make_transformer()
            with vsagen.apply(t, name, fused_prologue="off", **opts), torch.no_grad():
                ref = t(**args)[0]
            vsagen.apply(t, name, fused_prologue="off", **opts)
            t.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world), cp_plan=context_parallel_plan(t))
            with torch.no_grad():
                got = t(**args)[0]
            res[name] = float((got - ref).abs().max())
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
        with open(os.path.join(out_dir, f"cp{rank}.json"), "w") as f:
            json.dump(res, f)
        try:  # neither rank leaves while the other still sets up groups (a peer gone mid-setup resets its sockets)
            dist.barrier()
        except Exception:  # noqa: BLE001 - the results are written; the tests read them
            pass
        sys.stdout.flush()
        os._exit(0)
