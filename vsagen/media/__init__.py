"""Files in and out, below everything that runs a model: videos, JSON, text and figures written atomically (`video`),
input images opened and fitted (`image`), contact sheets (`sheet`), fidelity metrics of a video or tensor against a
reference (`metrics`), and output paths checked before a run (`paths`).
"""
