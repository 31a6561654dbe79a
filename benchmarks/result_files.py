"""Writing a small benchmark's results: ``<name>.json`` (metadata and rows) and ``<name>.md``
(a markdown report), in the results folder, the report echoed to stdout."""

from __future__ import annotations

import json
import os


def write_results(out: str, name: str, meta: dict, rows: list, lines: list[str]) -> None:
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, f"{name}.md"), "w") as fh:
        fh.write(text)
    print(text, end="")
