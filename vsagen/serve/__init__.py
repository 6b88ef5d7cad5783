"""`vsagen serve`: one process keeping one `vsagen t2v` configuration loaded and answering HTTP (interface layer,
beside `vsagen.cli` and above `vsagen.commands`). What belongs here: the settings of the server (`settings`), the
job store in SQLite (`store`), a video request's HTTP fields turned into the command line's request (`jobs`), the
thread that runs the jobs on the loaded model (`worker`) and the FastAPI application (`routes`: OpenAI's videos API
shape, health, metrics). Generation itself is `vsagen.commands.generate.Resident`'s; nothing here re-implements it.
"""
