"""`python -m vsagen ...`: the `vsagen` command (for launchers that take a module, e.g. `torchrun -m vsagen`)."""

from vsagen.cli import main

if __name__ == "__main__":
    main()
