"""`vsagen serve` end to end: the real server (`python -m vsagen serve`, uvicorn on a free local port, the tiny
model) started as the README's Serving block starts it, talked to over HTTP: the README's curl lines as pasted
(the port aside), create / poll / download / list / delete, the OpenAI SDK's round trip, bad requests (one line,
4xx, never a traceback), the idempotency key, /metrics; then a full queue (429, Retry-After), kill -9 mid-video and
a restart with a token (auth on) that finishes every accepted job. One server for the module (then its restart):
each start costs the imports and the load; the videos are 16x16, 1 frame, 1-2 steps."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from vsagen.serve.routes import authorized, error_body, metrics_text, retry_after_s

pytestmark = pytest.mark.xdist_group("test_serve_routes")

README = Path(__file__).resolve().parents[2] / "README.md"
SMALL = {"size": "16x16", "frames": 1, "steps": 1}
TOKEN = "s3cret-for-the-tests"
QUEUE = ["--queue", "100"]  # added to the README's command: a full queue is 100 jobs waiting
SLOW = 250  # steps of the job killed mid-video (16x16, 1 frame: ~3 s, outlasting 100 POSTs)


def _png(size: tuple[int, int], seed: int, kind: str = "PNG") -> bytes:
    """A random-noise RGB image (width, height) as the bytes of a `kind` file."""
    import io

    import numpy as np
    from PIL import Image

    out = io.BytesIO()
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    Image.fromarray(pixels).save(out, kind)
    return out.getvalue()


PNG = _png((40, 36), seed=1)


def readme_serving_block() -> list[str]:
    """The lines of the README's fenced block that starts `vsagen serve`."""
    blocks = re.findall(r"^```bash\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    block = next(b for b in blocks if "vsagen serve" in b)
    return block.replace("\\\n", " ").splitlines()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A `vsagen serve` subprocess in `folder` on a free port; `start` waits for /health."""

    def __init__(self, folder: Path, cache: Path) -> None:
        self.folder, self.cache = folder, cache
        self.proc: subprocess.Popen | None = None
        self.token: str | None = None
        self.log = folder / "server.log"

    def start(self, argv: list[str], token: str | None = None) -> None:
        self.port, self.token = _free_port(), token
        env = {**os.environ, "VSAGEN_CACHE": str(self.cache), "OMP_NUM_THREADS": "1"}
        env.pop("VSAGEN_SERVE_TOKEN", None)
        if token is not None:
            env["VSAGEN_SERVE_TOKEN"] = token
        with open(self.log, "a") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "vsagen", *argv, "--port", str(self.port),
                                          "--folder", str(self.folder / "serve")], cwd=self.folder, env=env,
                                         stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log.read_text()
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        raise AssertionError("the server did not answer /health in 120 s:\n" + self.log.read_text())

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, token: str | None = "default") -> httpx.Client:
        token = self.token if token == "default" else token
        return httpx.Client(base_url=self.url, timeout=30,
                            headers={"Authorization": f"Bearer {token}"} if token is not None else {})

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def server(tmp_path_factory, vsagen_cache, tiny_dir):
    """The README's `vsagen serve` command (its port and folder ours), started once for the module."""
    line = next(line for line in readme_serving_block() if line.startswith("vsagen serve"))
    words = [w for w in shlex.split(line, comments=True) if w != "&"]
    s = Server(tmp_path_factory.mktemp("serve"), vsagen_cache)
    s.start(words[1:] + QUEUE)
    yield s
    s.stop(signal.SIGKILL)  # (a graceful stop: test_sigterm_stops_the_server_and_every_waiting_job_stays_queued)


def wait_done(client: httpx.Client, video_id: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        video = client.get(f"/v1/videos/{video_id}").json()
        if video["status"] in ("completed", "failed"):
            return video
        time.sleep(0.05)
    raise AssertionError(f"{video_id} not done in {timeout} s: {video}")


def test_readme_serving_block_runs_as_pasted(server):
    """The curl lines after the start, in bash, the port ours: the video is written and the timing printed."""
    lines = [line for line in readme_serving_block() if not line.startswith(("pip ", "vsagen serve"))]
    script = "set -e\n" + "\n".join(lines).replace("127.0.0.1:8000", f"127.0.0.1:{server.port}")
    res = subprocess.run(["bash", "-c", script], cwd=server.folder, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (server.folder / "fox-served.mp4").read_bytes()[4:8] == b"ftyp"
    decoder, objects, at = json.JSONDecoder(), [], 0
    while at < len(res.stdout.rstrip()):  # /health's answer, then the timing JSON
        obj, at = decoder.raw_decode(res.stdout, at)
        objects.append(obj)
    timing = objects[-1]
    assert timing["frames"] == 9 and timing["seed"] == 3 and timing["steps"] == 2  # "seconds": "1" at 8 fps


def test_create_poll_download_list_delete(server):
    with server.client() as c:
        created = c.post("/v1/videos", json={"prompt": "a red fox", "seed": 5, **SMALL, "steps": 2})
        assert created.status_code == 200, created.text
        video = created.json()
        assert (video["object"], video["status"], video["model"], video["size"]) == ("video", "queued", "tiny",
                                                                                      "16x16")
        assert re.fullmatch(r"video_[0-9a-f]{32}", video["id"]) and isinstance(video["created_at"], int)
        done = wait_done(c, video["id"])
        assert (done["status"], done["progress"], done["error"]) == ("completed", 100, None)
        content = c.get(f"/v1/videos/{video['id']}/content")
        assert content.status_code == 200 and content.headers["content-type"] == "video/mp4"
        assert content.content[4:8] == b"ftyp"
        timing = c.get(f"/v1/videos/{video['id']}/timing").json()
        assert (timing["frames"], timing["height"], timing["width"], timing["steps"], timing["seed"]) == \
            (1, 16, 16, 2, 5)
        assert timing["timing"]["denoise_s"] > 0 and any("stays loaded" in n for n in timing["timing"]["notes"])
        # the same request again is the same video, byte for byte; another seed is another
        again = wait_done(c, c.post("/v1/videos", json={"prompt": "a red fox", "seed": 5, **SMALL,
                                                        "steps": 2}).json()["id"])
        other = wait_done(c, c.post("/v1/videos", json={"prompt": "a red fox", "seed": 6, **SMALL,
                                                        "steps": 2}).json()["id"])
        assert c.get(f"/v1/videos/{again['id']}/content").content == content.content
        assert c.get(f"/v1/videos/{other['id']}/content").content != content.content
        listed = c.get("/v1/videos", params={"limit": 2}).json()
        assert [v["id"] for v in listed["data"]] == [other["id"], again["id"]] and listed["has_more"] is True
        after = c.get("/v1/videos", params={"after": again["id"], "limit": 100}).json()
        assert video["id"] in [v["id"] for v in after["data"]]
        deleted = c.delete(f"/v1/videos/{video['id']}")
        assert deleted.json() == {"id": video["id"], "object": "video.deleted", "deleted": True}
        assert c.get(f"/v1/videos/{video['id']}").status_code == 404
        assert c.get(f"/v1/videos/{video['id']}/content").status_code == 404
        assert not (server.folder / "serve" / "videos" / f"{video['id']}.mp4").exists()


@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the SDK's, about OpenAI's own service
def test_the_openai_sdk_round_trip(server, tmp_path):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    video = client.videos.create(model="tiny", prompt="a cat", seconds="1", size="16x16",
                                 extra_body={"steps": 1, "seed": 7})
    assert video.status == "queued" and video.seconds == "1.125" and video.size == "16x16"
    done = wait_done(server.client(), video.id)
    assert client.videos.retrieve(video.id).status == done["status"] == "completed"
    client.videos.download_content(video.id).write_to_file(tmp_path / "cat.mp4")
    assert (tmp_path / "cat.mp4").read_bytes()[4:8] == b"ftyp"
    assert video.id in [v.id for v in client.videos.list(limit=100)]
    assert client.videos.delete(video.id).deleted is True


BAD = [  # (method, path, how, body, status, words of the message)
    ("POST", "/v1/videos", "json", {"prompt": "x", "size": "100x16", "frames": 1}, 400,
     "--width must be a positive multiple of 16 for tiny"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "frames": 2}, 400, "--frames must be 4k+1"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "steps": 0}, 400, "--steps must be in [1, 10000], got 0"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "size": "16x16000"}, 400, "--height too large for tiny"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "guidance": 1000}, 400, "--guidance must be a number in"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "steps": "two"}, 400, "steps must be an integer, got 'two'"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "seed": 1.5}, 400, "seed must be an integer"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "size": "big"}, 400, "size must be WIDTHxHEIGHT"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "seconds": "-1"}, 400, "seconds must be in (0, 600]"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "model": "sora-2"}, 400, "model 'sora-2' is not served here"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "out": "/etc/passwd"}, 400, "unknown field 'out'"),
    ("POST", "/v1/videos", "json", {"seed": 1}, 400, "prompt is missing"),
    ("POST", "/v1/videos", "json", {"prompt": "  "}, 400, "the prompt is empty"),
    ("POST", "/v1/videos", "json", {"prompt": 3}, 400, "prompt must be a string"),
    ("POST", "/v1/videos", "json", ["a", "list"], 400, "must be a JSON object"),
    ("POST", "/v1/videos", "raw", b"{not json", 400, "not valid JSON"),
    ("POST", "/v1/videos", "raw", b"[" * 5000 + b"]" * 5000, 400, "not valid JSON"),  # (was a 500: RecursionError)
    ("POST", "/v1/videos", "json", {"prompt": "a\u0000b"}, 400, "the prompt holds a NUL character"),
    ("POST", "/v1/videos", "form", {"prompt": "x", "input_reference": "img"}, 400,
     "input_reference must be an image file: send it as a file part of a multipart/form-data body"),
    ("POST", "/v1/videos", "file", {"prompt": "x"}, 400, "input_reference: this server runs tiny, which makes videos "
                                                         "from text and takes no image"),
    ("POST", "/v1/videos", "json", {"prompt": "x", "attn": "vsa:sparsity=0.9"}, 400,
     "attn 'vsa:sparsity=0.9' needs the vsa backend; this server was started with --attn auto and runs full"),
    ("POST", "/v1/videos", "form", {"prompt": "x", "steps": "1.5"}, 400, "steps must be an integer, got '1.5'"),
    # a field given twice: the form's refusal, and JSON's alike (a user trial: JSON's last one was taken silently)
    ("POST", "/v1/videos", "pairs", [("prompt", "x"), ("steps", "1"), ("prompt", "y")], 400,
     "a field is given twice: prompt"),
    ("POST", "/v1/videos", "raw", b'{"prompt": "x", "seed": 1, "seed": 2}', 400, "a field is given twice: seed"),
    ("POST", "/v1/videos", "text", "prompt=x", 415, "as JSON (application/json) or a multipart form"),
    ("POST", "/v1/videos", "json", {"prompt": "x" * 300_000}, 413, "the limit is 262144"),
    ("GET", "/v1/videos/video_0123456789abcdef0123456789abcdef", None, None, 404, "no video"),
    ("GET", "/v1/videos/..%2F..%2Fetc%2Fpasswd/content", None, None, 404, "no "),
    ("GET", "/v1/videos?limit=0", None, None, 400, "limit must be in [1, 100]"),
    ("GET", "/v1/videos?limit=many", None, None, 400, "limit"),
    # a cursor naming no video was ignored: the first page again, a paging client's endless loop
    ("GET", "/v1/videos?after=nope", None, None, 400, "after must be a video id"),
    ("GET", "/v1/videos?after=video_0123456789abcdef0123456789abcdef", None, None, 404, "no video"),
    ("DELETE", "/v1/videos/nope", None, None, 404, "no video 'nope' here"),
    ("GET", "/v2/nothing", None, None, 404, "no such route"),
]


# the field or query parameter each refusal of BAD is about, by its words (OpenAI's error `param`: a user trial found
# it null throughout); the others are about no one field: null
PARAMS = {"--width must be a positive multiple of 16 for tiny": "size", "--frames must be 4k+1": "frames",
          "--steps must be in [1, 10000], got 0": "steps", "--height too large for tiny": "size",
          "--guidance must be a number in": "guidance", "steps must be an integer, got 'two'": "steps",
          "seed must be an integer": "seed", "size must be WIDTHxHEIGHT": "size", "seconds must be in (0, 600]": "seconds",
          "model 'sora-2' is not served here": "model", "unknown field 'out'": "out", "prompt is missing": "prompt",
          "the prompt is empty": "prompt", "prompt must be a string": "prompt",
          "the prompt holds a NUL character": "prompt",
          "input_reference must be an image file: send it as a file part of a multipart/form-data body":
              "input_reference",
          "input_reference: this server runs tiny, which makes videos from text and takes no image": "input_reference",
          "attn 'vsa:sparsity=0.9' needs the vsa backend; this server was started with --attn auto and runs full": "attn",
          "steps must be an integer, got '1.5'": "steps", "a field is given twice: prompt": "prompt",
          "a field is given twice: seed": "seed", "limit must be in [1, 100]": "limit", "limit": "limit",
          "after must be a video id": "after"}


@pytest.mark.parametrize("method,path,how,body,status,words", BAD, ids=[f"{b[4]}-{i}" for i, b in enumerate(BAD)])
def test_bad_requests_get_one_line_and_a_4xx(server, method, path, how, body, status, words):
    kwargs = ({"json": body} if how == "json" else
              {"files": {k: (None, v) for k, v in body.items()}} if how == "form" else
              {"files": [(k, (None, v)) for k, v in body]} if how == "pairs" else
              {"data": body, "files": {"input_reference": ("a.png", PNG, "image/png")}} if how == "file" else
              {"content": body, "headers": {"Content-Type": "application/json" if how == "raw" else "text/plain"}}
              if how in ("raw", "text") else {})
    with server.client() as c:
        res = c.request(method, path, **kwargs)
    assert res.status_code == status, res.text
    error = res.json()["error"]
    assert words in error["message"] and "\n" not in error["message"] and "Traceback" not in res.text, error
    assert error["type"] == "invalid_request_error" and error["param"] == PARAMS.get(words), error


def test_a_retried_post_with_its_idempotency_key_is_one_job(server):
    body = {"prompt": "one job", **SMALL}
    with server.client() as c:
        first = c.post("/v1/videos", json=body, headers={"Idempotency-Key": "k-1"})
        second = c.post("/v1/videos", json=body, headers={"Idempotency-Key": "k-1"})
        assert first.status_code == second.status_code == 200
        assert first.json()["id"] == second.json()["id"] and second.headers["Idempotent-Replayed"] == "true"
        other = c.post("/v1/videos", json={**body, "seed": 9}, headers={"Idempotency-Key": "k-1"})
        assert other.status_code == 409 and "Idempotency-Key was used with other fields" in other.text
        assert wait_done(c, first.json()["id"])["status"] == "completed"
        metrics = c.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    counts = dict(re.findall(r'^vsagen_jobs\{state="(\w+)"\} (\d+)$', metrics.text, flags=re.M))
    assert int(counts["completed"]) >= 1 and counts["failed"] == "0"
    assert float(re.search(r'^vsagen_stage_seconds_total\{stage="denoise"\} ([0-9.]+)$', metrics.text,
                           flags=re.M)[1]) > 0


@contextlib.contextmanager
def _browser_page(url: str):
    """A page of headless Chromium through Playwright at `url` (skipped where either is missing): the system's
    Chromium (Debian's `chromium`), else Playwright's own."""
    import shutil

    sync_api = pytest.importorskip("playwright.sync_api")
    executable = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
    with sync_api.sync_playwright() as p:
        try:
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        except Exception as e:  # noqa: BLE001 - no browser here
            pytest.skip(f"no Chromium for Playwright here ({type(e).__name__})")
        page = browser.new_page()
        page.goto(url)
        try:
            yield page
        finally:
            browser.close()


def _listed(server: Server, prompt: str, page: Any) -> dict:
    """The video of `prompt` once the server lists it (the page's form sent it); the page's message if not."""
    deadline = time.monotonic() + 30
    while True:
        mine = [v for v in server.client().get("/v1/videos").json()["data"] if v["prompt"] == prompt]
        if mine:
            return mine[0]
        assert time.monotonic() < deadline, page.inner_text("#message")
        time.sleep(0.05)


@pytest.mark.slow
def test_the_page_makes_a_video_in_a_real_browser_and_it_plays(server):
    """Headless Chromium through Playwright (skipped where either is missing): the page's form submits a job, the
    list shows it finish, the video element plays the mp4 (frames decoded, time advancing) beside its timing."""
    with _browser_page(server.url + "/") as page:
        assert page.title() == "vsagen serve: tiny"
        page.fill("#prompt", "a fox <b>in markup</b>")
        page.fill("#size", "32x16")
        page.fill("#seconds", "1")
        page.fill("#steps", "1")
        page.click("#submit")
        box = f"#{_listed(server, 'a fox <b>in markup</b>', page)['id']}"
        page.wait_for_selector(f"{box} video.result", timeout=60_000)
        played = page.evaluate("""async (box) => {
            const v = document.querySelector(box + ' video.result');
            if (v.readyState < 2) await new Promise(ok => v.addEventListener('loadeddata', ok, {once: true}));
            await v.play();
            const t0 = v.currentTime;
            await new Promise(ok => setTimeout(ok, 400));
            return {width: v.videoWidth, height: v.videoHeight, duration: v.duration, advanced: v.currentTime > t0,
                    error: v.error && v.error.code};
        }""", box)
        text = page.inner_text(box)
        bold = page.locator("#jobs b").count()
    assert played == {"width": 32, "height": 16, "duration": 1.125, "advanced": True, "error": None}
    assert "a fox <b>in markup</b> (32x16, 1.125 s, seed 0)" in text and "completed" in text and bold == 0
    assert "denoise" in text and "wait (text encode to mp4 written)" in text


@pytest.mark.slow  # a second server start and a job of 250 steps run twice: ~10 s
def test_a_full_queue_then_kill_9_mid_video_then_a_restart_with_a_token_loses_nothing(server):
    """The slow job runs (progress reported) while 100 wait (`--queue 100`); the 101st gets 429 with Retry-After.
    kill -9 mid-video, restart with VSAGEN_SERVE_TOKEN: every accepted job is there, none failed, the slow one
    queued again and finished on its second attempt, the next ones finished with both files; requests without
    the token or with another get 401, the page and /health still answer."""
    from concurrent.futures import ThreadPoolExecutor

    with server.client() as c:
        slow = c.post("/v1/videos", json={"prompt": "slow", "size": "16x16", "frames": 1, "steps": SLOW}).json()
        deadline = time.monotonic() + 60
        while (v := c.get(f"/v1/videos/{slow['id']}").json())["vsagen"]["steps_done"] in (None, 0):
            assert time.monotonic() < deadline and v["status"] != "failed", v
            time.sleep(0.02)
        assert v["status"] == "in_progress" and 0 <= v["progress"] < 90
        with ThreadPoolExecutor(8) as pool:
            waiting = list(pool.map(lambda i: c.post("/v1/videos", json={"prompt": f"job {i}", **SMALL}),
                                    range(100)))
        assert all(r.status_code == 200 for r in waiting), [r.text for r in waiting if r.status_code != 200]
        full = c.post("/v1/videos", json={"prompt": "one too many", **SMALL})
        assert full.status_code == 429 and int(full.headers["Retry-After"]) >= 1
        assert "the queue is full (100 jobs waiting)" in full.json()["error"]["message"]
        assert c.get(f"/v1/videos/{slow['id']}").json()["status"] == "in_progress"
    server.stop(signal.SIGKILL)
    accepted = [slow["id"]] + [r.json()["id"] for r in waiting]
    server.start(["serve", "--model", "tiny", "--steps", "2", *QUEUE], token=TOKEN)
    assert "1 queued" in server.log.read_text()  # the slow job, left in progress, queued again
    with server.client(token=None) as anonymous:
        refused = anonymous.get("/v1/videos")
        assert refused.status_code == 401 and refused.headers["WWW-Authenticate"] == "Bearer"
        assert "needs its token" in refused.json()["error"]["message"]
        assert anonymous.get("/health").status_code == 200
        assert anonymous.get("/").status_code == 200  # the page asks for the token itself
    with server.client(token="wrong") as wrong:
        assert wrong.get(f"/v1/videos/{slow['id']}").status_code == 401
    with server.client() as c:
        ended = [wait_done(c, i, timeout=120) for i in accepted[:4]]  # the slow one first, then in order
        statuses = [c.get(f"/v1/videos/{i}").json()["status"] for i in accepted]
    assert [v["status"] for v in ended] == ["completed"] * 4 and "failed" not in statuses
    assert ended[0]["vsagen"]["attempts"] == 2 and ended[0]["vsagen"]["steps"] == SLOW
    videos = server.folder / "serve" / "videos"
    assert all((videos / f"{i}.mp4").is_file() and (videos / f"{i}.json").is_file() for i in accepted[:4])
    server.accepted = accepted


@pytest.mark.slow  # the interpreter's exit after a torch session takes seconds on a loaded machine
def test_sigterm_stops_the_server_and_every_waiting_job_stays_queued(server):
    """After the restart above: SIGTERM mid-queue stops the server (exit 0, its line), the job it was making
    queued again; every accepted job is completed or queued in the store, none lost, none failed."""
    from vsagen.serve.store import JobStore

    if not hasattr(server, "accepted"):
        pytest.skip("it stops the server the kill -9 test restarted, with its jobs")
    server.stop(signal.SIGTERM)
    assert server.proc.returncode == 0, server.log.read_text()
    last = server.log.read_text().rstrip().splitlines()[-1]
    assert re.fullmatch(r"stopped by SIGTERM(; \d+ waiting jobs? stays? queued for the next start)?", last), last
    store = JobStore(server.folder / "serve" / "jobs.sqlite3")
    jobs = [store.get(i) for i in server.accepted]
    assert len(jobs) == 101 and {j.status for j in jobs} <= {"completed", "queued"}, {j.status for j in jobs}
    videos = server.folder / "serve" / "videos"
    assert all((videos / f"{j.id}.mp4").is_file() == (j.status == "completed") for j in jobs)
    assert not list(videos.glob(".*"))  # the stopped job's temporaries gone with it


# the image server: a text-image-to-video model (tiny-ti2v), so that one start serves image requests and text ones
# (a pure image-to-video model's jobs, CLIP branch included, through the same application: tests/serve/
# test_server.py, in this process)
IMAGE_SERVER = ["serve", "--model", "tiny-ti2v", "--attn", "vsa", "--steps", "1", "--height", "32", "--width", "32",
                "--frames", "1"]


@pytest.fixture(scope="module")
def image_server(tmp_path_factory, vsagen_cache, ti2v_dir):
    """The image server (tiny-ti2v, `--attn vsa`: a video may change its sparsity), started once. (An i2v job a
    crash left in progress, made again from its kept image: tests/serve/test_server.py, in this process; the crash
    and restart of a real server: the kill -9 test above.)"""
    s = Server(tmp_path_factory.mktemp("serve-i2v"), vsagen_cache)
    s.start(IMAGE_SERVER)
    yield s
    s.stop(signal.SIGKILL)


def _upload(client: httpx.Client, image: bytes, name: str = "a.png", kind: str = "image/png",
            **fields: str) -> httpx.Response:
    """POST /v1/videos as a multipart form: `fields`, and `image` as the file part input_reference."""
    return client.post("/v1/videos", data={"prompt": "a fox", **fields}, files={"input_reference": (name, image, kind)})


@pytest.mark.filterwarnings("ignore:The Sora API:DeprecationWarning")  # the SDK's, about OpenAI's own service
def test_image_to_video_over_http(image_server, tmp_path):
    """A real multipart upload: the job queued with its image kept under its id, the video made from it; a second
    image makes another video; a video's attn changes the loaded vsa's sparsity and its JSON records what ran; the
    openai SDK's videos.create(input_reference=...) works unchanged."""
    images = image_server.folder / "serve" / "images"
    with image_server.client() as c:
        first = _upload(c, PNG)
        assert first.status_code == 200, first.text
        video = first.json()
        assert video["status"] == "queued" and video["vsagen"]["input_reference"] is True
        assert (images / f"{video['id']}.png").read_bytes() == PNG
        other = _upload(c, _png((48, 32), seed=2, kind="JPEG"), "b.jpg", "image/jpeg", fit="resize",
                        attn="vsa:sparsity=0.5", seed="0")
        assert other.status_code == 200, other.text
        assert other.json()["vsagen"]["attn"].startswith("vsa:sparsity=0.5:")
        done = [wait_done(c, v["id"]) for v in (video, other.json())]
        assert [d["status"] for d in done] == ["completed"] * 2, done
        contents = [c.get(f"/v1/videos/{d['id']}/content").content for d in done]
        assert all(x[4:8] == b"ftyp" for x in contents) and contents[0] != contents[1]
        timing = [c.get(f"/v1/videos/{d['id']}/timing").json() for d in done]
        key = {"Idempotency-Key": "i2v-1"}  # the image counts as a field of the request
        again = [c.post("/v1/videos", data={"prompt": "a fox"}, headers=key,
                        files={"input_reference": ("a.png", image, "image/png")})
                 for image in (PNG, PNG, _png((40, 36), seed=9))]
        assert [r.status_code for r in again] == [200, 200, 409] and again[0].json()["id"] == again[1].json()["id"]
        assert sorted(p.name for p in images.iterdir()) == sorted(f"{v['id']}.{x}" for v, x in (
            (video, "png"), (other.json(), "jpg"), (again[0].json(), "png")))  # nothing of the replay nor the 409
        assert c.delete(f"/v1/videos/{video['id']}").json()["deleted"] is True
        assert not (images / f"{video['id']}.png").exists()  # deleted with its job
    assert timing[0]["image"] == str(images / f"{video['id']}.png") and timing[0]["fit"] == "crop"
    assert timing[1]["image"].endswith(".jpg") and timing[1]["fit"] == "resize"
    assert [t["backend"]["sparsity"] for t in timing] == [0.875, 0.5] and timing[1]["attn_requested"] == \
        "vsa:sparsity=0.5"
    assert any(n.startswith("attn 'vsa:sparsity=0.5': this video ran") for n in timing[1]["timing"]["notes"])
    openai = pytest.importorskip("openai")
    (tmp_path / "c.png").write_bytes(PNG)
    client = openai.OpenAI(base_url=f"{image_server.url}/v1", api_key="unused", max_retries=0)
    with open(tmp_path / "c.png", "rb") as f:
        sdk = client.videos.create(model="tiny-ti2v", prompt="a cat", input_reference=f, extra_body={"seed": 3})
    assert wait_done(image_server.client(), sdk.id)["status"] == "completed"


BAD_IMAGES = [  # (the file part, or None: none; more fields; words of the message)
    ((b"not an image at all", "a.png", "image/png"), {}, "cannot read image input_reference: UnidentifiedImageError"),
    ((b"", "empty.png", "image/png"), {}, "cannot read image input_reference: UnidentifiedImageError"),
    ((_png((40, 36), 3, "GIF"), "a.gif", "image/gif"), {},
     "image input_reference: format GIF is not supported; use PNG, JPEG or WebP"),
    ((_png((40, 36), 3, "BMP"), "a.png", "image/png"), {}, "image input_reference: format BMP is not supported"),
    ((_png((8, 8), 4), "s.png", "image/png"), {}, "image input_reference is 8x8 pixels (height x width): too small"),
    (None, {"input_reference": "https://example.com/a.png"}, "input_reference must be an image file"),
    ((PNG, "a.png", "image/png"), {"fit": "stretch"}, "fit must be one of crop, resize"),
    ((PNG, "a.png", "image/png"), {"attn": "sla"}, "attn 'sla' needs the sla backend; this server was started with "
                                                   "--attn vsa and runs vsa:sparsity=0.875"),
    ((PNG, "a.png", "image/png"), {"attn": "vsa:tile=4x4x8"}, "attn 'vsa:tile=4x4x8': tile is fixed when the model "
                                                              "loads"),
    ((PNG, "a.png", "image/png"), {"attn": "vsa:sparsity=1"}, "attn 'vsa:sparsity=1': sparsity must be in [0, 1)"),
    ((PNG, "a.png", "image/png"), {"size": "20x32"}, "--width must be a positive multiple of 32 for tiny-ti2v"),
]


def test_bad_images_and_attn_are_one_line_and_nothing_is_queued_nor_kept(image_server):
    images = image_server.folder / "serve" / "images"
    with image_server.client() as c:
        before = c.get("/v1/videos", params={"limit": 100}).json()["data"]
        kept = sorted(images.iterdir()) if images.exists() else []
        for part, fields, words in BAD_IMAGES:
            res = c.post("/v1/videos", data={"prompt": "a fox", **fields},  # (no file: a urlencoded form)
                         files={"input_reference": (part[1], part[0], part[2])} if part is not None else None)
            assert res.status_code == 400, (words, res.text)
            message = res.json()["error"]["message"]
            assert message.startswith(words) and "\n" not in message and str(image_server.folder) not in message, \
                message
        big = c.post("/v1/videos", data={"prompt": "a fox"},
                     files={"input_reference": ("big.png", b"\x89PNG" + bytes(16 * 1024 * 1024), "image/png")})
        assert big.status_code == 413 and "the limit is" in big.json()["error"]["message"]
        assert c.get("/v1/videos", params={"limit": 100}).json()["data"] == before
    assert (sorted(images.iterdir()) if images.exists() else []) == kept


@pytest.mark.slow
def test_the_page_of_an_image_to_video_server_uploads_the_image(image_server, tmp_path):
    """Headless Chromium (skipped where Playwright or a browser is missing): the page's image field sends the file
    as input_reference with the form's fields, attn among them; the finished video shows on the page."""
    (tmp_path / "fox.png").write_bytes(PNG)
    with _browser_page(image_server.url + "/") as page:
        page.fill("#prompt", "a fox from the page")
        page.fill("#attn", "vsa:sparsity=0.25")
        page.set_input_files("#image", str(tmp_path / "fox.png"))
        page.click("#submit")
        video = _listed(image_server, "a fox from the page", page)
        page.wait_for_selector(f"#{video['id']} video.result", timeout=60_000)
    assert video["vsagen"]["input_reference"] is True and video["vsagen"]["attn"].startswith("vsa:sparsity=0.25:")
    assert (image_server.folder / "serve" / "images" / f"{video['id']}.png").read_bytes() == PNG


def test_text_and_image_requests_on_one_load_are_the_videos_of_t2v_and_i2v(image_server, tmp_path):
    """The image server (tiny-ti2v, a text-image-to-video model): a JSON request (text only) and a multipart one
    (input_reference) both complete; each mp4 is byte for byte, and frame for frame, what `vsagen t2v` / `vsagen
    i2v` of the same options write (the image: the file the server kept, so the container's metadata names the same
    one); the model loaded once (one load's seconds in both videos' JSON and in /metrics, its note saying both kinds
    run on it); the page's image field is optional."""
    import torch
    from typer.testing import CliRunner

    from vsagen.cli.app import app
    from vsagen.media.video import read_mp4

    with image_server.client() as c:
        text = c.post("/v1/videos", json={"prompt": "a fox", "seed": 4})
        image = _upload(c, PNG, seed="4")
        assert text.status_code == image.status_code == 200, (text.text, image.text)
        assert [r.json()["vsagen"]["input_reference"] for r in (text, image)] == [False, True]
        done = [wait_done(c, r.json()["id"]) for r in (text, image)]
        assert [d["status"] for d in done] == ["completed"] * 2, done
        served = [c.get(f"/v1/videos/{d['id']}/content").content for d in done]
        timing = [c.get(f"/v1/videos/{d['id']}/timing").json() for d in done]
        metrics = c.get("/metrics").text
        page = c.get("/").text
    kept = image_server.folder / "serve" / "images" / f"{done[1]['id']}.png"
    flags = IMAGE_SERVER[1:] + ["--seed", "4"]
    threads = torch.get_num_threads()
    for cli, video, args in ((tmp_path / "t2v.mp4", served[0], ["t2v", "a fox"]),
                             (tmp_path / "i2v.mp4", served[1], ["i2v", str(kept), "a fox"])):
        torch.set_num_threads(1)  # as the server's OMP_NUM_THREADS=1: the same CPU kernels' reduction order
        try:
            res = CliRunner().invoke(app, [*args, *flags, "--out", str(cli)])
        finally:
            torch.set_num_threads(threads)
        assert res.exit_code == 0, res.output
        (tmp_path / f"served-{cli.name}").write_bytes(video)
        assert np.array_equal(read_mp4(tmp_path / f"served-{cli.name}"), read_mp4(cli)) and video == cli.read_bytes()
    assert [t["image"] for t in timing] == [None, str(kept)] and served[0] != served[1]
    load_s = float(re.search(r"^vsagen_load_seconds ([0-9.]+)$", metrics, flags=re.M)[1])
    assert timing[0]["timing"]["load_s"] == timing[1]["timing"]["load_s"] == pytest.approx(load_s, abs=1e-6)
    assert all(any("takes text and image requests on this one load" in n for n in t["timing"]["notes"])
               for t in timing)
    assert image_server.log.read_text().count("serving tiny-ti2v") == 1
    assert '<label for="image">image (optional)</label>' in page


def test_error_body_and_metrics_text_shapes():
    assert error_body("bad", "invalid_request", 400) == {"error": {"message": "bad", "type": "invalid_request_error",
                                                                   "param": None, "code": "invalid_request"}}
    assert error_body("seed must be an integer", "invalid_request", 400, "seed")["error"]["param"] == "seed"
    assert error_body("boom", "internal_error", 500)["error"]["type"] == "server_error"

    class W:
        class metrics:
            ended = {"completed": 2, "failed": 1}
            stage_s = {s: 0.5 for s in ("text_encode_s", "denoise_s", "dit_s", "attention_backend_s",
                                        "vae_decode_s", "write_s", "total_s", "wait_s")}
            load_s = 1.25
            by_replica: dict = {}  # (vsagen serve --ray's: below)

    text = metrics_text({"queued": 3, "in_progress": 1, "completed": 2, "failed": 1}, W)
    assert "replica" not in text
    assert "vsagen_queue_depth 3\n" in text and 'vsagen_jobs{state="in_progress"} 1\n' in text
    assert 'vsagen_jobs_ended_total{outcome="failed"} 1\n' in text and "vsagen_load_seconds 1.250000\n" in text
    assert 'vsagen_stage_seconds_total{stage="denoise"} 0.500000\n' in text and text.endswith("\n")
    samples = [line for line in text.splitlines() if not line.startswith("#")]
    assert all(re.fullmatch(r'[a-z_]+(\{[a-z]+="[a-z_]+"\})? [0-9.]+', line) for line in samples), samples
    W.metrics.by_replica = {"node-b/x2": 1, "node-a/k9": 2}
    ray = metrics_text({"queued": 0, "in_progress": 0, "completed": 3, "failed": 0}, W)
    assert ray.endswith('vsagen_replica_videos_total{replica="node-a/k9"} 2\n'
                        'vsagen_replica_videos_total{replica="node-b/x2"} 1\n')


def test_retry_after_is_the_waiting_jobs_times_a_job_s_seconds():
    """New-user trial: Retry-After 1 while a job took 4-6 s (no job had completed: no mean yet)."""
    assert retry_after_s(1, 4.2) == 5 and retry_after_s(3, 2.0) == 6  # the measured seconds, rounded up
    assert retry_after_s(1, 0.1) == 1 and retry_after_s(2, None) == 2  # at least 1; nothing measured: 1 s a job


def test_who_may_pass():
    assert authorized(None, "/v1/videos", "")  # no token set: everyone (loopback only)
    assert authorized("t0k", "/v1/videos", "Bearer t0k") and authorized("t0k", "/metrics", "bearer  t0k ")
    for header in ("", "Bearer", "Bearer t0", "Bearer t0kk", "Basic t0k", "t0k"):
        assert not authorized("t0k", "/v1/videos", header), header
    assert authorized("t0k", "/", "") and authorized("t0k", "/health", "")
    assert not authorized("t0k", "/health/x", "") and not authorized("t0k", "//", "")
