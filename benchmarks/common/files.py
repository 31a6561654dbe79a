"""Result files: atomic writes, JSON and CSV of dataclass rows, and reading rows back."""

from __future__ import annotations

import csv
import io
import json
import os
import tempfile
from dataclasses import asdict, fields
from typing import Any


def write_atomic(path: str, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename: never a half-written file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)                 # mkstemp makes 0600 files: give the usual mode
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_results(out: str, name: str, meta: dict, rows: list, lines: list[str]) -> None:
    """A small benchmark's ``<name>.json`` (metadata and rows, dicts) and ``<name>.md`` (the
    report), in ``out``; the report echoed to stdout."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, f"{name}.md"), "w") as fh:
        fh.write(text)
    print(text, end="")


def json_bytes(meta: dict, rows: list, **more: list | None) -> bytes:
    """``{"meta": ..., "rows": [...]}`` and any further lists of rows (None: left out)."""
    data: dict[str, Any] = {"meta": meta, "rows": [asdict(r) for r in rows]}
    data.update({k: [asdict(r) for r in v] for k, v in more.items() if v is not None})
    return json.dumps(data, indent=1).encode()


def rows_of(cls: type, records: list[dict]) -> list:
    """Dataclass rows from their records; fields of another version are dropped."""
    names = {f.name for f in fields(cls)}
    return [cls(**{k: v for k, v in rec.items() if k in names}) for rec in records]


def csv_bytes(rows: list, cls: type) -> bytes:
    """One line a row, the columns ``cls``'s fields; floats to 6 digits, lists of seconds
    space-separated to 0.1 ms."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=[f.name for f in fields(cls)], lineterminator="\n")
    w.writeheader()
    for r in rows:
        rec = asdict(r)
        for k, v in rec.items():
            if isinstance(v, list):
                rec[k] = " ".join(f"{t:.4f}" for t in v)
        w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in rec.items()})
    return buf.getvalue().encode()


def write_files(out: str, name: str, files: dict[str, bytes | None]) -> None:
    """``<out>/<name>.<ext>`` for each ``ext: bytes`` (None: not written), each atomically."""
    for ext, data in files.items():
        if data is not None:
            write_atomic(os.path.join(out, f"{name}.{ext}"), data)
