"""The HTTP face of `vsagen serve` (FastAPI): OpenAI's videos API shape, so that the `openai` SDK's
`client.videos.create` / `retrieve` / `download_content` / `list` / `delete` work unchanged, plus the run's timing
JSON, `/health` and `/metrics` (Prometheus text).

    POST   /v1/videos               a video request (JSON or multipart form, with the image input_reference for an
                                    image-to-video model, with or without one for a text-image-to-video model;
                                    header Idempotency-Key optional)
    GET    /v1/videos               the jobs, newest first (after, limit, order)
    GET    /v1/videos/{id}          one job: status queued | in_progress | completed | failed, progress (percent)
    GET    /v1/videos/{id}/content  the mp4, once completed
    GET    /v1/videos/{id}/timing   the run's timing JSON, once completed
    DELETE /v1/videos/{id}          a job not in progress, and its files
    GET    /                        a page to make and watch videos (`vsagen.serve.page`; no token needed: it asks)
    GET    /health                  {"status": "ok"} (no token needed)
    GET    /metrics                 queue depth, jobs by state, seconds by stage

Every refusal is one line in OpenAI's error object ({"error": {"message", "type", "param", "code"}}; `param` the
field or query parameter it is about, else null) with a 4xx status, never a traceback: bad fields 400 (in the command line's words where the command line refuses the same
value), a missing or wrong token 401, an unknown id 404, a job in the wrong state 409, a reused idempotency key with
other fields 409, a body over the limit 413, another content type 415, a full queue 429 with Retry-After. With a
token set, every route but / and /health asks for it (`Authorization: Bearer TOKEN`, compared in constant time).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import math
import secrets
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, PlainTextResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from ..errors import BadInput
from .jobs import Served, VideoFields, accepted, field_of, image_suffix, parse_fields, valid_id, video_object
from .page import page_html
from .settings import Settings
from .store import JobStore, KeyReused, QueueFull, STATUSES
from .worker import STAGES, Worker

MAX_LIST = 100  # the most jobs one GET /v1/videos returns


class Refusal(Exception):
    """A request refused: HTTP `status`, one line `message`, OpenAI's error `code`; `headers` to send along; `param`
    the field or query parameter it is about (None: none, or several)."""

    def __init__(self, status: int, message: str, code: str, headers: dict[str, str] | None = None,
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.headers, self.param = status, message, code, headers or {}, param


def error_body(message: str, code: str, status: int, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error object: {"error": {"message", "type", "param", "code"}} (type "invalid_request_error" for a
    4xx, "server_error" for a 5xx; `param` the field the error is about, None where it is about no one field)."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def metrics_text(counts: dict[str, int], worker: Worker) -> str:
    """The Prometheus text exposition of the server: queue depth, jobs by state, jobs this process ended by
    outcome, the finished videos' seconds by stage, the model's load seconds; under `--ray`, the videos each
    replica made."""
    m = worker.metrics
    lines = ["# HELP vsagen_queue_depth Video jobs waiting for the model.", "# TYPE vsagen_queue_depth gauge",
             f"vsagen_queue_depth {counts['queued']}",
             "# HELP vsagen_jobs Video jobs in the store by state.", "# TYPE vsagen_jobs gauge",
             *(f'vsagen_jobs{{state="{s}"}} {counts[s]}' for s in STATUSES),
             "# HELP vsagen_jobs_ended_total Video jobs this process ended, by outcome.",
             "# TYPE vsagen_jobs_ended_total counter",
             *(f'vsagen_jobs_ended_total{{outcome="{k}"}} {v}' for k, v in m.ended.items()),
             "# HELP vsagen_stage_seconds_total Seconds of the finished videos by stage (their timing JSON).",
             "# TYPE vsagen_stage_seconds_total counter",
             *(f'vsagen_stage_seconds_total{{stage="{s.removesuffix("_s")}"}} {m.stage_s[s]:.6f}' for s in STAGES),
             "# HELP vsagen_load_seconds Seconds the model took to load at start.", "# TYPE vsagen_load_seconds gauge",
             f"vsagen_load_seconds {m.load_s:.6f}"]
    if m.by_replica:  # (vsagen serve --ray)
        lines += ["# HELP vsagen_replica_videos_total Videos each Ray Serve replica made for this process.",
                  "# TYPE vsagen_replica_videos_total counter",
                  *(f'vsagen_replica_videos_total{{replica="{r}"}} {n}' for r, n in sorted(m.by_replica.items()))]
    return "\n".join(lines) + "\n"


def refuse(status: int, message: str, code: str, headers: dict[str, str] | None = None,
           param: str | None = None) -> JSONResponse:
    """A refusal as an HTTP answer: `error_body` with `status`, `headers` and `param`."""
    return JSONResponse(error_body(message, code, status, param), status_code=status, headers=headers)


class _Twice(ValueError):
    """A JSON object with a key given twice (`json_object`): the key."""


def json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' object_pairs_hook: an object's pairs as a dict, refusing a key given twice (plain `json.loads`
    keeps the last silently; a user trial: `{"prompt":"x","prompt":"y"}` made "y").

    Raises:
        _Twice: a key given twice (its text)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _Twice(key)
        out[key] = value
    return out


def twice(name: str) -> Refusal:
    """The 400 of a field given twice in a JSON body or a form, alike."""
    return Refusal(400, f"a field is given twice: {name}", "invalid_request", param=name)


def authorized(token: str | None, path: str, header: str) -> bool:
    """Whether a request to `path` with this Authorization `header` may pass: no token set, the page and /health
    (open), or `Bearer TOKEN` with the token (compared in constant time)."""
    if token is None or path in ("/", "/health"):
        return True
    scheme, _, credential = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(credential.strip().encode(), token.encode())


async def read_fields(request: Request, settings: Settings) -> tuple[VideoFields, bytes | None]:
    """A POST's fields, checked (`parse_fields`), and the bytes of its image (`input_reference`, a file part of a
    multipart form; None without one): JSON or a urlencoded form of at most `settings.max_body` bytes, a multipart
    form of at most that plus `settings.max_image`.

    Raises:
        Refusal: 413 over the limit (the image over `max_image`), 400 not a JSON object or a field given twice (in
            a JSON object or a form alike, `twice`), 415 another content type.
        BadInput: a field `parse_fields` refuses.
    """
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    limit = settings.max_body + (settings.max_image if kind == "multipart/form-data" else 0)
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > limit:
        raise Refusal(413, f"the body is {length} bytes; the limit is {limit}", "body_too_large")
    body = await request.body()
    if len(body) > limit:
        raise Refusal(413, f"the body is over the limit of {limit} bytes", "body_too_large")
    if kind == "application/json":
        try:
            data = json.loads(body, object_pairs_hook=json_object)
        except _Twice as e:
            raise twice(str(e)) from None
        except (ValueError, UnicodeDecodeError, RecursionError):  # (nesting past the stack: a 500 before)
            raise Refusal(400, "the body is not valid JSON", "invalid_json") from None
        if not isinstance(data, dict):
            raise Refusal(400, "the body must be a JSON object of the video's fields", "invalid_json")
        return parse_fields(data, form=False), None
    if kind in ("multipart/form-data", "application/x-www-form-urlencoded"):
        form = await request.form()
        names = [name for name, _ in form.multi_items()]
        repeated = next((name for i, name in enumerate(names) if name in names[:i]), None)
        if repeated is not None:
            raise twice(repeated)
        values = dict(form)
        upload = values.get("input_reference")
        if upload is None or isinstance(upload, str):  # (text: `parse_fields` says it must be a file)
            return parse_fields(values, form=True), None
        del values["input_reference"]
        data = await upload.read()
        if len(data) > settings.max_image:
            raise Refusal(413, f"input_reference is {len(data)} bytes; the limit is {settings.max_image}",
                          "body_too_large", param="input_reference")
        return parse_fields(values, form=True, image=image_suffix(data)), data
    raise Refusal(415, "send the video's fields as JSON (application/json) or a multipart form",
                  "unsupported_media_type")


def _guard(app: FastAPI, settings: Settings) -> None:
    """Every failure as one line in OpenAI's error object, and the token asked for (`authorized`)."""

    @app.exception_handler(Refusal)
    async def _refusal(_: Request, e: Refusal) -> JSONResponse:
        return refuse(e.status, e.message, e.code, e.headers, e.param)

    @app.exception_handler(HTTPException)
    async def _http(_: Request, e: HTTPException) -> JSONResponse:
        message = "no such route" if e.status_code == 404 else str(e.detail)
        return refuse(e.status_code, message, "not_found" if e.status_code == 404 else "invalid_request")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body"))
        return refuse(400, f"{where}: {first.get('msg', 'invalid value')}", "invalid_request", param=where or None)

    @app.exception_handler(Exception)
    async def _internal(_: Request, e: Exception) -> JSONResponse:  # one line, never the traceback
        return refuse(500, f"internal error ({type(e).__name__})", "internal_error")

    @app.middleware("http")
    async def _auth(request: Request, call_next: Any) -> Any:
        given = request.headers.get("authorization", "")
        if not authorized(settings.token, request.url.path, given):
            what = "a wrong token" if given else "no token"
            return refuse(401, f"this server needs its token (Authorization: Bearer TOKEN); the request had {what}",
                          "unauthorized", {"WWW-Authenticate": "Bearer"})
        return await call_next(request)


def retry_after_s(queued: int, job_s: float | None) -> int:
    """A full queue's Retry-After in whole seconds: the `queued` waiting jobs times the seconds a job takes
    (`job_s`: the mean of the last completed jobs, else the running job's pace so far; None before either is
    measured: 1 s a job), at least 1."""
    return max(1, math.ceil(queued * (job_s or 1.0)))


def _create_route(app: FastAPI, settings: Settings, store: JobStore, served: Served, worker: Worker) -> None:
    """POST /v1/videos: checked, its image kept beside the job, resolved as `t2v` / `i2v` resolve it, its backend
    prepared where `attn` changes it, then accepted once written (or the idempotency key's job, or 429 / 409); a
    refused request leaves no image behind."""

    def check(job_id: str, fields: VideoFields, image: bytes | None) -> Any:
        served.check_image(fields)  # (before the image is written)
        if image is not None:
            served.save_image(job_id, fields.image, image)
        cfg = served.config(job_id, fields)
        wrong = worker.resident.differs(cfg)
        if wrong:  # (a server of random weights: the seed drew them)
            raise BadInput(f"this server's model was loaded with its {', '.join(wrong)}; a video may not set it")
        worker.resident.backend_for(cfg)  # the backend this video runs refuses what it cannot serve now
        return cfg

    def forget(job_id: str) -> None:
        for path in served.job_images(job_id):
            path.unlink(missing_ok=True)

    @app.post("/v1/videos")
    async def create_video(request: Request) -> Any:
        key = request.headers.get("idempotency-key")
        if key is not None and not 1 <= len(key) <= 255:
            raise Refusal(400, "Idempotency-Key must be 1 to 255 characters", "invalid_request")  # (a header)
        job_id = f"video_{secrets.token_hex(16)}"
        try:
            fields, image = await read_fields(request, settings)
            cfg = await run_in_threadpool(check, job_id, fields, image)
        except BadInput as e:
            await run_in_threadpool(forget, job_id)
            raise Refusal(400, str(e), "invalid_request", param=field_of(str(e))) from None
        digest = hashlib.sha256(json.dumps(fields.to_json(), sort_keys=True).encode()
                                + (hashlib.sha256(image).digest() if image is not None else b"")).hexdigest()
        try:
            job, created = await run_in_threadpool(lambda: store.add(job_id, accepted(fields, cfg),
                                                                     limit=settings.queue, key=key,
                                                                     body_sha256=digest))
        except QueueFull as e:
            await run_in_threadpool(forget, job_id)
            wait = retry_after_s(e.queued, store.mean_run_s() or worker.job_s_estimate())
            raise Refusal(429, f"{e}; try again in {wait} s", "queue_full", {"Retry-After": str(wait)}) from None
        except KeyReused:
            await run_in_threadpool(forget, job_id)
            raise Refusal(409, "this Idempotency-Key was used with other fields; use a new key for a new video",
                          "idempotency_key_reused") from None
        if created:
            worker.wake()
        else:  # the key's earlier job keeps its own image
            await run_in_threadpool(forget, job_id)
        return JSONResponse(video_object(job, worker.steps_done(job.id)),
                            headers={} if created else {"Idempotent-Replayed": "true"})


def _video_routes(app: FastAPI, store: JobStore, served: Served, worker: Worker) -> None:
    """GET /v1/videos, GET / DELETE /v1/videos/{id}, its content and its timing."""

    def job_of(video_id: str) -> Any:
        job = store.get(video_id) if valid_id(video_id) else None
        if job is None:
            raise Refusal(404, f"no video {video_id!r} here", "not_found")
        return job

    def completed_file(video_id: str, which: int) -> Path:
        job = job_of(video_id)
        if job.status != "completed":
            raise Refusal(409, f"video {video_id} is {job.status.replace('_', ' ')}; its files come once it is "
                               "completed", "video_not_ready")
        path = served.paths(job.id)[which]
        if not path.is_file():
            raise Refusal(404, f"the files of video {video_id} are gone", "not_found")
        return path

    @app.get("/v1/videos")
    def list_videos(after: str | None = None, limit: int = 20, order: str = "desc") -> Any:
        if not 1 <= limit <= MAX_LIST:
            raise Refusal(400, f"limit must be in [1, {MAX_LIST}], got {limit}", "invalid_request", param="limit")
        if order not in ("asc", "desc"):
            raise Refusal(400, f"order must be asc or desc, got {order!r}", "invalid_request", param="order")
        if after is not None:  # a cursor that names no video: 400 / 404, not the first page again (a loop)
            if not valid_id(after):
                raise Refusal(400, f"after must be a video id (video_ and 32 hex digits), got {after!r}",
                              "invalid_request", param="after")
            job_of(after)
        jobs, more = store.page(after=after, limit=limit, order=order)
        data = [video_object(j, worker.steps_done(j.id)) for j in jobs]
        return {"object": "list", "data": data, "has_more": more,
                "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}

    @app.get("/v1/videos/{video_id}")
    def retrieve_video(video_id: str) -> Any:
        job = job_of(video_id)
        return video_object(job, worker.steps_done(job.id))

    @app.get("/v1/videos/{video_id}/content")
    def video_content(video_id: str, variant: str = "video") -> Any:
        if variant != "video":
            raise Refusal(400, f"variant {variant!r} is not made here; variant=video (the mp4)", "invalid_request",
                          param="variant")
        return FileResponse(completed_file(video_id, 0), media_type="video/mp4", filename=f"{video_id}.mp4")

    @app.get("/v1/videos/{video_id}/timing")
    def video_timing(video_id: str) -> Any:
        return FileResponse(completed_file(video_id, 1), media_type="application/json")

    @app.delete("/v1/videos/{video_id}")
    def delete_video(video_id: str) -> Any:
        job = job_of(video_id)
        gone = store.delete(job.id)
        if gone is not None and gone.status == "in_progress":
            raise Refusal(409, f"video {video_id} is being made; delete it once it is completed or failed",
                          "video_in_progress")
        for path in (*served.paths(job.id), *served.job_images(job.id)):
            path.unlink(missing_ok=True)
        return {"id": job.id, "object": "video.deleted", "deleted": True}


def create_app(settings: Settings, store: JobStore, served: Served, worker: Worker) -> FastAPI:
    """The FastAPI application of one server (routes: module docstring). The worker starts and stops with it.

    Args:
        settings: host, token, queue bound, body limit (`vsagen.serve.settings.Settings`).
        store: the job store; served: the loaded configuration and the videos' folder; worker: the job thread.
    """

    @contextlib.asynccontextmanager
    async def lifespan(_: Any):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(title="vsagen serve", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    _guard(app, settings)
    _create_route(app, settings, store, served, worker)
    _video_routes(app, store, served, worker)

    @app.get("/")
    def page() -> Any:
        request = served.request  # the image field: required for an image-to-video model, optional for a ti2v one
        return HTMLResponse(page_html(request.model, f"{request.width}x{request.height}",
                                      image=request.source.takes_image, image_required=request.images_per_video))

    @app.get("/health")
    def health() -> Any:
        return {"status": "ok"}

    @app.get("/metrics")
    def metrics() -> Any:
        return PlainTextResponse(metrics_text(store.counts(), worker), media_type="text/plain; version=0.0.4")

    return app
