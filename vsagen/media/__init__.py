"""Files in and out, below everything that runs a model: videos, JSON, text and figures written atomically (`video`),
input images opened and fitted (`image`), contact sheets (`sheet`), fidelity metrics of a video or tensor against a
reference (`metrics`), output paths checked before a run (`paths`), and the video's format as `--out`'s extension
names it, with the prompt and settings as its metadata (`formats`: mp4, WebM, GIF, PNG frames); the ffmpeg commands
and the pipe that feeds one (`ffmpeg_pipe`), the `--codec` settings and their probe (`encoding`), and an mp4 encoded in parts at once, joined without re-encoding
(`segments`).
"""
