"""The request layer: what a command asks for as typed option groups (`options`: no heavy import, the command line
builds them before torch loads; `--attn`, `--sampler` and `--cache` are parsed there, once, into typed values),
ONE resolution of them against the model's preset into a validated `Request` (`resolve`), and its parts: the
attention (`backends`: the parsed `--attn` entries as `BackendSpec`s, `--attn auto`), the sampler (`sampling`), the
step cache (`caching`), the crop plans (`plans`), the processes (`processes`), and the shared checks of
comma-separated lists (`lists`) and of absurd values (`bounds`), and the closed sets of option values (`choices`). Commands extend `Request` with their own part
(`vsagen.commands`)."""
