"""The settings of `vsagen serve` that are the server's own (the model's are the command line's request
options): where it listens, its token, its folder, the queue's bound and the body's. Checked once, when built.

Security defaults: the server listens on 127.0.0.1 (this machine only); any other address needs a bearer token
(`--token`, or the environment variable `TOKEN_ENV` the command line reads), so that nothing on the network can
reach the model without one.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput

TOKEN_ENV = "VSAGEN_SERVE_TOKEN"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_FOLDER = Path("vsagen-serve")
DEFAULT_QUEUE = 16
MAX_QUEUE = 100_000
MAX_BODY = 256 * 1024  # bytes: a video request is a few fields of text
MAX_IMAGE = 16 * 1024 * 1024  # bytes: an image to video's input_reference (PNG / JPEG / WebP as sent)


def check_installed() -> None:
    """The server's packages (the `serve` extra: fastapi, uvicorn, python-multipart) can be imported.

    Raises:
        BadInput: one is missing, naming it and the install command.
    """
    import importlib.util

    missing = [name for module, name in (("fastapi", "fastapi"), ("uvicorn", "uvicorn"),
                                         ("multipart", "python-multipart")) if importlib.util.find_spec(module) is None]
    if missing:
        raise BadInput(f"vsagen serve needs {', '.join(missing)}: pip install 'vsagen[serve]'")


def is_loopback(host: str) -> bool:
    """Whether `host` names this machine only: "localhost", or a loopback address (127.0.0.0/8, ::1)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Settings:
    """How one server runs.

    Attributes:
        host, port: where it listens (default 127.0.0.1:8000).
        token: the bearer token every route but / and /health asks for (None: none; required off loopback).
        folder: where the jobs (`jobs.sqlite3`) and the videos (`videos/`) live.
        queue: the most jobs waiting at once (a request past it: 429 with Retry-After).
        max_body: the largest request body in bytes (past it: 413), besides an image.
        max_image: the largest `input_reference` image in bytes (a multipart body may be `max_body` larger).

    Raises:
        BadInput: a port outside [1, 65535], a queue bound outside [1, MAX_QUEUE], an empty or spaced token, an
            address other than loopback without a token.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str | None = None
    folder: Path = DEFAULT_FOLDER
    queue: int = DEFAULT_QUEUE
    max_body: int = MAX_BODY
    max_image: int = MAX_IMAGE

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 1 <= self.port <= 65535:
            raise BadInput(f"--port must be in [1, 65535], got {self.port}")
        if isinstance(self.queue, bool) or not isinstance(self.queue, int) or not 1 <= self.queue <= MAX_QUEUE:
            raise BadInput(f"--queue must be in [1, {MAX_QUEUE}], got {self.queue}")
        if not self.host.strip():
            raise BadInput("--host is empty; give an address such as 127.0.0.1")
        if self.token is not None and (not self.token or self.token != self.token.strip() or " " in self.token):
            raise BadInput(f"--token must be one word without spaces (or {TOKEN_ENV}); got {self.token!r}")
        if self.token is None and not is_loopback(self.host):
            raise BadInput(f"--host {self.host} lets other machines reach the server: give it a token (--token, or "
                           f"the environment variable {TOKEN_ENV}), or keep the default --host {DEFAULT_HOST}")
        object.__setattr__(self, "folder", Path(self.folder).expanduser())

    @property
    def url(self) -> str:
        """The server's base URL."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"
