"""The request layer: what a command asks for as typed option groups (`options`: no heavy import, the command line
builds them before torch loads), ONE resolution of them against the model's preset into a validated `Request`
(`resolve`), and the attention part of it (`backends`: `--attn` entries as `BackendSpec`s, `--attn auto`).
Commands extend `Request` with their own part (`vsagen.commands`)."""
