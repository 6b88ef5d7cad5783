"""The page `vsagen serve` answers at `GET /`: a form (prompt, size, seconds, steps, seed, attn; the image of an
image-to-video server, optional on a text-image-to-video one's; the token where the server asks for one) that POSTs
to /v1/videos (as JSON, or with an image as a multipart form, the image its `input_reference`), and the list of jobs,
polled each second, with their status and progress; a finished video plays inline (fetched with the token, so a
server with a token serves the page too) beside its timing table (the timing JSON's stages). Plain HTML and
JavaScript in one string, no external file; every text from a job is set as text, never as markup."""

from __future__ import annotations

import html
import json

# the timing JSON's stages shown under each finished video: (key, label)
TIMING_ROWS = (("text_encode_s", "text encode"), ("denoise_s", "denoise"), ("dit_s", "DiT"),
               ("attention_backend_s", "attention"), ("vae_decode_s", "VAE decode"), ("write_s", "write"),
               ("wait_s", "wait (text encode to mp4 written)"))

_PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>vsagen serve: __MODEL__</title>
<style>
body { font: 15px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 60em; padding: 0 1em; }
form { display: grid; grid-template-columns: 8em 1fr; gap: .4em .8em; align-items: center; }
textarea { height: 4em; }
.job { border-top: 1px solid #ccc; padding: .6em 0; }
.job progress { width: 12em; }
.error { color: #a00; }
video.result { display: block; width: 20em; margin: .4em 0; image-rendering: pixelated; }
table.timing td { padding: 0 .8em 0 0; }
table.timing td:last-child { text-align: right; font-variant-numeric: tabular-nums; }
</style>
</head>
<body>
<h1>vsagen serve: <span id="model">__MODEL__</span></h1>
<form id="create">
  <label for="prompt">prompt</label><textarea id="prompt" name="prompt" required></textarea>
  <label for="size">size</label><input id="size" name="size" placeholder="WIDTHxHEIGHT, e.g. __SIZE__">
  <label for="seconds">seconds</label><input id="seconds" name="seconds" type="number" min="0" step="any">
  <label for="steps">steps</label><input id="steps" name="steps" type="number" min="1" step="1">
  <label for="seed">seed</label><input id="seed" name="seed" type="number" min="0" step="1">
  <label for="attn">attn</label><input id="attn" name="attn" placeholder="e.g. vsa:sparsity=0.9">
__IMAGE__
  <label for="token">token</label><input id="token" name="token" type="password" placeholder="if the server has one">
  <span></span><button id="submit" type="submit">make the video</button>
</form>
<p id="message" class="error" role="alert"></p>
<h2>Videos</h2>
<div id="jobs"></div>
<script>
const ROWS = __ROWS__;
const shown = new Map();
function headers(json) {
  const h = json ? {"Content-Type": "application/json"} : {};
  const token = document.getElementById("token").value || sessionStorage.getItem("vsagen-token");
  if (token) h["Authorization"] = "Bearer " + token;
  return h;
}
async function api(path, options) {
  const res = await fetch(path, options);
  if (!res.ok) {
    let message = res.status + " " + res.statusText;
    try { message = (await res.json()).error.message; } catch (e) {}
    throw new Error(message);
  }
  return res;
}
document.getElementById("create").addEventListener("submit", async (event) => {
  event.preventDefault();
  const body = {prompt: document.getElementById("prompt").value};
  const token = document.getElementById("token").value;
  if (token) sessionStorage.setItem("vsagen-token", token);
  for (const name of ["size", "seconds", "attn"]) {
    const value = document.getElementById(name).value.trim();
    if (value) body[name] = value;
  }
  for (const name of ["steps", "seed"]) {
    const value = document.getElementById(name).value.trim();
    if (value) body[name] = Number(value);
  }
  document.getElementById("message").textContent = "";
  const image = document.getElementById("image");
  let request = {method: "POST", headers: headers(true), body: JSON.stringify(body)};
  if (image && image.files.length) {  // a multipart form: the fields as text, the image as input_reference
    const form = new FormData();
    for (const [name, value] of Object.entries(body)) form.append(name, String(value));
    form.append("input_reference", image.files[0]);
    request = {method: "POST", headers: headers(false), body: form};
  }
  try {
    await api("/v1/videos", request);
    refresh();
  } catch (e) {
    document.getElementById("message").textContent = e.message;
  }
});
function cell(row, text) { const td = row.insertCell(); td.textContent = text; }
async function finish(job, box) {
  const video = document.createElement("video");
  video.controls = true; video.loop = true; video.muted = true; video.className = "result";
  const blob = await (await api("/v1/videos/" + job.id + "/content", {headers: headers(false)})).blob();
  video.src = URL.createObjectURL(blob);
  box.appendChild(video);
  const timing = (await (await api("/v1/videos/" + job.id + "/timing", {headers: headers(false)})).json()).timing;
  const table = document.createElement("table");
  table.className = "timing";
  for (const [key, label] of ROWS) {
    if (timing[key] === null || timing[key] === undefined) continue;
    const row = table.insertRow();
    cell(row, label); cell(row, timing[key].toFixed(3) + " s");
  }
  box.appendChild(table);
}
function render(job) {
  let entry = shown.get(job.id);
  if (!entry) {
    const box = document.createElement("div");
    box.className = "job"; box.id = job.id;
    const title = document.createElement("div");
    const bar = document.createElement("progress"); bar.max = 100;
    const status = document.createElement("span"); status.className = "status";
    box.append(title, bar, " ", status);
    document.getElementById("jobs").prepend(box);
    entry = {box, title, bar, status, done: false};
    shown.set(job.id, entry);
  }
  entry.title.textContent = job.prompt + " (" + job.size + ", " + job.seconds + " s, seed " + job.vsagen.seed + ")";
  entry.bar.value = job.progress;
  entry.status.textContent = job.status + (job.error ? ": " + job.error.message : "");
  entry.status.classList.toggle("error", job.status === "failed");
  if (job.status === "completed" && !entry.done) {
    entry.done = true;
    finish(job, entry.box).catch((e) => { entry.status.textContent = e.message; });
  }
}
async function refresh() {
  try {
    const page = await (await api("/v1/videos?limit=100", {headers: headers(false)})).json();
    for (const job of page.data.slice().reverse()) render(job);
  } catch (e) {
    document.getElementById("message").textContent = e.message;
  }
}
refresh();
setInterval(refresh, 1000);
</script>
</body>
</html>
"""


# the form's image field, on the page of a server whose model takes one: required (image to video) or optional
# (text-image to video: without one the video is made from the text)
_IMAGE = ('  <label for="image">__LABEL__</label><input id="image" name="image" type="file" '
          'accept="image/png,image/jpeg,image/webp"__REQUIRED__>')


def page_html(model: str, size: str, image: bool = False, image_required: bool = True) -> str:
    """The page of a server of `model` (its name set as text), `size` ("WIDTHxHEIGHT") its default video size;
    `image`: the model takes an image (the form has the image field), which each video must bring where
    `image_required` (an image-to-video model), else may (a text-image-to-video one, labelled "image (optional)")."""
    field = (_IMAGE.replace("__LABEL__", "image" if image_required else "image (optional)")
             .replace("__REQUIRED__", " required" if image_required else "")) if image else ""
    return (_PAGE.replace("__MODEL__", html.escape(model)).replace("__SIZE__", html.escape(size))
            .replace("__IMAGE__", field).replace("__ROWS__", json.dumps(TIMING_ROWS)))
