"""The configs that ship inside the package: ``recipes/``, ``model/``, ``data/``, ``strategy/``, ``study/``.

Each names only what differs from the default run (the signature defaults and ``trainer.yaml``). A ``--config``
that is no file as given but names one of these resolves here, so that an installed asr runs them from any folder:
``configs/recipes/real-1h-cpu.yaml`` (as the docs write it, from a checkout) or ``recipes/real-1h-cpu.yaml``.
"""

from __future__ import annotations

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent


def resolve(path: str) -> str:
    """``path`` if it exists, else the shipped config it names, else ``path`` (for the caller to refuse)."""
    given = Path(path)
    if given.exists():
        return path
    parts = given.parts[1:] if given.parts[:1] == ("configs",) else given.parts
    shipped = CONFIGS.joinpath(*parts) if parts else None
    return str(shipped) if shipped is not None and shipped.is_file() else path


def map_configs(args: list[str], change) -> list[str]:
    """Command-line ``args`` with each ``--config``/``-c`` value (``--config=V`` too) replaced by ``change(value)``."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg in ("-c", "--config") and i + 1 < len(out):
            out[i + 1] = change(out[i + 1])
        elif arg.startswith("--config="):
            out[i] = "--config=" + change(arg.split("=", 1)[1])
    return out
