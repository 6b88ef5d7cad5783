"""vsagen.commands.download: `vsagen download PRESET` against a fake Hugging Face hub (an HTTP server on 127.0.0.1 in
the test, serving the endpoints huggingface_hub calls: /api/models/{repo}[/revision/{rev}] and
/{repo}/resolve/{rev}/{file} with X-Repo-Commit and ETag): the files land in a temporary HF_HOME cache and are
exactly the files the preset's run reads; --dry-run lists them and fetches none; gated, unreachable and offline
hubs are one line, exit 2."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from vsagen.commands.download import size_text

REPO = "Wan-AI/Wan2.1-T2V-1.3B-Diffusers"  # wan2.1-t2v-1.3b's hub_id
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SERVER_LIFETIME_S = 120  # the fake hub stops itself after this, whatever the test does
INDEX = {"_class_name": "WanPipeline", "_diffusers_version": "0.35.0",
         "scheduler": ["diffusers", "UniPCMultistepScheduler"], "text_encoder": ["transformers", "UMT5EncoderModel"],
         "tokenizer": ["transformers", "T5TokenizerFast"], "transformer": ["diffusers", "WanTransformer3DModel"],
         "transformer_2": [None, None], "vae": ["diffusers", "AutoencoderKLWan"]}
# the repository's files: what the run reads, and what it does not (README, assets, other weight formats beside
# safetensors, a folder below a component's)
NEEDED = ["model_index.json", "scheduler/scheduler_config.json", "text_encoder/config.json",
          "text_encoder/model-00001-of-00002.safetensors", "text_encoder/model-00002-of-00002.safetensors",
          "text_encoder/model.safetensors.index.json", "tokenizer/special_tokens_map.json", "tokenizer/spiece.model",
          "tokenizer/tokenizer.json", "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors",
          "vae/config.json", "vae/diffusion_pytorch_model.safetensors"]
NOT_NEEDED = ["README.md", ".gitattributes", "assets/fox.png", "transformer/diffusion_pytorch_model.bin",
              "vae/extra/diffusion_pytorch_model.safetensors"]


def repo_files() -> dict[str, bytes]:
    files = {p: hashlib.sha256(p.encode()).digest() * (1 + i % 5) for i, p in enumerate(NEEDED + NOT_NEEDED)}
    files["model_index.json"] = json.dumps(INDEX).encode()
    return files


class FakeHub:
    """A loopback HTTP server holding `repos` ({repo: {path: bytes}}) at COMMIT; `gated` repos answer 403 as the hub
    does for a gated repository; `requests` records (method, path) of each request."""

    def __init__(self, repos: dict[str, dict[str, bytes]], gated: tuple[str, ...] = ()) -> None:
        self.repos, self.gated, self.requests = repos, gated, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub.answer(self, body=False)

            def do_GET(self):
                hub.answer(self, body=True)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.stopper = threading.Timer(SERVER_LIFETIME_S, self.server.shutdown)

    def answer(self, handler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.requests.append((handler.command, path))
        status, headers, data = self.route(path)
        handler.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(data))}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if body:
            handler.wfile.write(data)

    def route(self, path: str) -> tuple[int, dict, bytes]:
        parts = path.strip("/").split("/")
        api = parts[:2] == ["api", "models"]
        repo = "/".join(parts[2:4] if api else parts[0:2])
        if repo in self.gated:
            return 403, {"X-Error-Code": "GatedRepo", "X-Error-Message": "Access to this repo is restricted"}, b"{}"
        if repo not in self.repos:
            return 404, {"X-Error-Code": "RepoNotFound", "X-Error-Message": "Repository not found"}, b"{}"
        files = self.repos[repo]
        if api:
            info = {"id": repo, "sha": COMMIT, "private": False,
                    "siblings": [{"rfilename": p, "size": len(d)} for p, d in files.items()]}
            return 200, {"Content-Type": "application/json"}, json.dumps(info).encode()
        if parts[2:3] == ["resolve"] and "/".join(parts[4:]) in files:
            data = files["/".join(parts[4:])]
            return 200, {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}, data
        return 404, {"X-Error-Code": "EntryNotFound", "X-Error-Message": "Entry not found"}, b""

    def __enter__(self) -> "FakeHub":
        self.thread.start()
        self.stopper.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopper.cancel()
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def vsagen_download(args: list[str], hf_home: Path, endpoint: str, **env: str) -> subprocess.CompletedProcess:
    environ = {**os.environ, "HF_HOME": str(hf_home), "HF_ENDPOINT": endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
               **env}
    for key in ("HF_HUB_OFFLINE", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN"):
        if key not in env:
            environ.pop(key, None)
    return subprocess.run([sys.executable, "-m", "vsagen", "download", *args], capture_output=True, text=True,
                          env=environ, timeout=90)


def test_dry_run_lists_the_files_and_sizes_and_fetches_none(tmp_path):
    files = repo_files()
    with FakeHub({REPO: files}) as hub:
        res = vsagen_download(["wan2.1-t2v-1.3b", "--dry-run"], tmp_path / "hf", hub.url)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    total = sum(len(files[p]) for p in NEEDED)
    assert lines[0] == f"wan2.1-t2v-1.3b: {len(NEEDED)} files, {size_text(total)} from {REPO}"
    assert [line.strip().split("  ") for line in lines[1:]] == [[size_text(len(files[p])), f"{REPO}/{p}"]
                                                                 for p in NEEDED]
    assert not any(p.is_file() for p in (tmp_path / "hf").rglob("*"))  # nothing downloaded
    assert not any("/resolve/" in path and not path.endswith("model_index.json") for _, path in hub.requests)


def test_download_fetches_exactly_the_presets_files_into_the_cache(tmp_path):
    files = repo_files()
    with FakeHub({REPO: files}) as hub:
        res = vsagen_download(["wan2.1-t2v-1.3b"], tmp_path / "hf", hub.url)
        assert res.returncode == 0, res.stderr
        again = vsagen_download(["wan2.1-t2v-1.3b", "--dry-run"], tmp_path / "hf", hub.url)
    cache = tmp_path / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    snapshot = cache / "snapshots" / COMMIT
    got = sorted(str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file())
    assert got == sorted(NEEDED)
    assert all((snapshot / p).read_bytes() == files[p] for p in NEEDED)
    assert (cache / "refs" / "main").read_text() == COMMIT  # runs find them offline
    fetched = sorted(path.split("/resolve/")[1].split("/", 1)[1] for method, path in hub.requests
                     if method == "GET" and "/resolve/" in path)
    assert set(fetched) == set(NEEDED)  # nothing else crossed the wire
    assert res.stdout.splitlines()[-1] == f"wan2.1-t2v-1.3b: {len(NEEDED)} files in the Hugging Face cache " \
                                          f"({size_text(sum(len(files[p]) for p in NEEDED))})"
    assert again.stdout.splitlines()[0].endswith("(0 B not in the cache yet)")
    assert all(line.endswith("(cached)") for line in again.stdout.splitlines()[1:])


@pytest.mark.parametrize("case", ["gated", "unreachable", "offline", "missing"])
def test_a_hub_that_cannot_serve_is_one_line_exit_2(tmp_path, case):
    repos = {} if case == "missing" else {REPO: repo_files()}
    if case == "unreachable":  # a loopback port nothing listens on
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            url = f"http://127.0.0.1:{s.getsockname()[1]}"
        res = vsagen_download(["wan2.1-t2v-1.3b"], tmp_path / "hf", url)
    else:
        with FakeHub(repos, gated=(REPO,) if case == "gated" else ()) as hub:
            res = vsagen_download(["wan2.1-t2v-1.3b"], tmp_path / "hf", hub.url,
                                  **({"HF_HUB_OFFLINE": "1"} if case == "offline" else {}))
    assert res.returncode == 2 and res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: cannot download {REPO}: "), res.stderr
    assert {"gated": "gated", "unreachable": "cannot be reached", "offline": "HF_HUB_OFFLINE",
            "missing": "no such repository"}[case] in lines[0]
    assert not any(p.is_file() for p in (tmp_path / "hf").rglob("*"))


def test_a_tiny_preset_needs_no_download(tmp_path):
    res = vsagen_download(["tiny"], tmp_path / "hf", "http://127.0.0.1:9")
    assert res.returncode == 0 and res.stdout.strip() == ("tiny: built offline by vsagen (random weights, in its own "
                                                          "cache): nothing to download")


def test_a_mistyped_preset_gets_a_did_you_mean():
    """A new user's finding: `vsagen download wan2.1-t2v-1.3` listed all 25 presets where `t2v --model` suggests."""
    from typer.testing import CliRunner

    from conftest import one_error_line
    from vsagen.cli.app import app

    line = one_error_line(CliRunner().invoke(app, ["download", "wan2.1-t2v-1.3", "--dry-run"]))
    assert line == ("error: unknown preset 'wan2.1-t2v-1.3'; did you mean wan2.1-t2v-1.3b or wan2.1-t2v-14b or "
                    "fastwan2.1-t2v-1.3b? (`vsagen presets` lists them all)")
    assert "presets: fastwan2.1-t2v-1.3b, " in one_error_line(CliRunner().invoke(app, ["download", "zzz"]))
