"""What every benchmark prints and keeps: the load average beside its numbers (these boxes are
shared), and the result as JSON on stdout and, with --out, in a file."""
from __future__ import annotations

import json
import os


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def emit(result: dict, out: str | None) -> None:
    print(json.dumps(result, indent=2))
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=2)
