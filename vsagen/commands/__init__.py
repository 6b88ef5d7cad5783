"""The commands: each command's config (its request: `vsagen.request` plus its own part) and its driver on the run
layer (`vsagen.pipeline.Session`), beside the others: `generate` (t2v / i2v: decode, mp4, timing JSON), `profile`
(timing tables of several backends), `compare` (speed and fidelity against a reference), `search` (Sparse-vDiT
patterns), `download` (a preset's hub files into the Hugging Face cache). `vsagen.cli.app` parses the command line into their requests and renders their results."""
