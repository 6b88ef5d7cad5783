"""Package data: the bundled model presets (`<name>.toml`, read by `vsagen.models.presets`) and the Sparse-vDiT
pattern files some presets ship (`patterns/*.json`). No code lives here."""
