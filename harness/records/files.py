"""The files a run writes, as it goes: JSON Lines appended and flushed row by row (a crash loses
nothing already measured), JSON written whole by a rename (never half a file), and the reading of
either, gzipped copies included (committed results keep their records compressed)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path


class JsonlWriter:
    def __init__(self, path: Path):
        self.path = path
        self._f = open(path, "a", buffering=1)  # noqa: SIM115 - open for the whole run, closed by close()

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> JsonlWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path: Path) -> list[dict]:
    """The rows of a JSONL file, or of its gzipped copy beside it (`<name>.gz`: large committed
    results are kept compressed); none if neither exists."""
    path = Path(path)
    zipped = path.with_name(path.name + ".gz")
    if path.exists():
        text = path.read_text()
    elif zipped.exists():
        text = gzip.decompress(zipped.read_bytes()).decode()
    else:
        return []
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def write_json(path: Path, obj) -> None:
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str))
    tmp.replace(path)
