"""`vsagen serve`'s command function (registered on the Typer app by `vsagen.cli.app`): its options, then the
server of `vsagen.serve` (one model held in this process) or, with --ray, of `vsagen.serve.ray_serve` (Ray Serve
replicas holding it)."""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..interrupts import as_interrupt as _sigterm_as_interrupt
from ..request.options import RequestOptions
from .running import run_guarded, single_process
from .shared_options import Verbose, path_parser


def serve(
    host: Annotated[str, typer.Option(help="Address to listen on; any other than loopback (127.0.0.1, ::1, "
                                           "localhost) needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8000,
    token: Annotated[Optional[str], typer.Option(
        help="Bearer token every route but / and /health asks for (Authorization: Bearer TOKEN); default: the "
             "VSAGEN_SERVE_TOKEN environment variable, else none.", envvar="VSAGEN_SERVE_TOKEN",
        show_envvar=False)] = None,
    folder: Annotated[Path, typer.Option(help="Where the jobs (jobs.sqlite3) and the videos (videos/ID.mp4 and "
                                              "ID.json) live; one server per folder.",
                                         parser=path_parser("a folder for the jobs and videos", folder=True))]
    = Path("vsagen-serve"),
    queue: Annotated[int, typer.Option(help="Most jobs waiting at once; past it a request gets 429 with "
                                            "Retry-After.")] = 16,
    ray: Annotated[bool, typer.Option("--ray", help="Make the videos on Ray Serve replicas, each holding the model "
                                                    "(one per GPU; on the CPU, one CPU each), behind the same API; "
                                                    "needs pip install 'vsagen[ray]'.")] = False,
    replicas: Annotated[Optional[int], typer.Option(help="With --ray: how many replicas (default: one per GPU of "
                                                         "the Ray cluster; on the CPU, 1).")] = None,
    ray_address: Annotated[Optional[str], typer.Option(help="With --ray: the Ray cluster to join (ray.init's "
                                                            "address: auto, HOST:PORT, local).")] = None,
    verbose: Verbose = False, *, options: RequestOptions,
) -> None:
    """Keep one t2v (or, for an image-to-video model, i2v) configuration loaded and make videos over HTTP (OpenAI's
    /v1/videos API shape): the model, backend, sampler, cache and decoder options are fixed at start; each request
    sets its prompt, size, seconds, steps, seed, guidance and negative prompt, its image (input_reference) for an
    image-to-video model (optional for a text-image-to-video one, which makes videos from text or from an image on
    one load), and the options of the backend a run can change (attn, e.g. vsa:sparsity=0.9)."""

    def run() -> None:
        from ..errors import BadInput
        from ..serve.settings import Settings, check_installed

        settings = Settings(host=host, port=port, token=token, folder=folder, queue=queue)
        check_installed()
        if not ray and (replicas is not None or ray_address is not None):
            raise BadInput(f"{'--replicas' if replicas is not None else '--ray-address'} takes --ray (the replicas "
                           "of a Ray cluster); without it the server holds one model itself")
        from .terminal import stderr_log

        log = stderr_log("COLUMNS" in os.environ)
        if ray:  # (the module imports ray only once it runs)
            from ..serve.ray_serve import check_ray_installed, serve_ray

            check_ray_installed()
            start = partial(serve_ray, settings, options, replicas=replicas, address=ray_address, log=log)
        else:
            from ..serve.server import serve as serve_forever

            start = partial(serve_forever, settings, options, log=log)
        with _sigterm_as_interrupt():
            start()

    run_guarded(single_process(run), verbose)
