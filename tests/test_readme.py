"""The README's Python examples run as written (docs that match behaviour)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_readme_examples_run():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 3
    namespace: dict = {}
    for block in blocks:                         # later blocks use names from earlier ones
        exec(compile(block, "README.md", "exec"), namespace)
    assert namespace["dparams"][0].shape == (64, 64)
    assert namespace["Hv"].shape == (64, 64)
    assert namespace["run"].num_steps > 100
