"""The README's Python examples run as written, each on its own in a fresh interpreter, as a
reader pastes it (docs that match behaviour)."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BLOCKS = re.findall(r"```python\n(.*?)```",
                    open(os.path.join(ROOT, "README.md"), encoding="utf-8").read(), flags=re.S)

# What each block must leave behind, checked in the same interpreter after it ran.
CHECKS = {
    "dparams, dh0, dxs = grad": "assert dparams[0].shape == (64, 64) and dxs.shape == xs.shape",
    "hessian_vector_product(loss_W)": "assert Hv.shape == (64, 64)",
    "checkpointed_while_loop(cond_fn": "assert run.num_steps > 100 and dy0.shape == (2,)",
    "bj.scan(f, h0, xs": "assert dW.shape == (64, 64) and float(abs(dU).min()) > 0 and "
                         "float(abs(dW).max()) > 0 and int(val[1]) == 50",
    "checkpoint_program(f, num_ckpts=8)": "ref = grad(f, (0, 1))(numpy.linspace(0.5, 1.5, 1000), "
                                           "1.01)\nassert numpy.allclose(dy, ref[0], rtol=1e-12) "
                                           "and g.stats.snapshots <= 8",
    'memory="4MB"': "assert loop.stats.peak_bytes <= 4 * 10**6 and g[0].shape == (128, 128)",
    # the per-step loss against the same loss written as a plain loop (every step taped)
    "output_fn=readout": "\n".join([
        "def plain(params):",
        "    h, total = numpy.zeros((B, H)), 0.0",
        "    for t in range(T):",
        "        x = {'chars': inputs['chars'][t], 'targets': inputs['targets'][t]}",
        "        h = step(params, h, x)",
        "        total = total + readout(params, h, x)",
        "    return total / T",
        "ref = grad(plain)(params)",
        "assert all(numpy.allclose(g[k], ref[k], rtol=1e-9, atol=0) for k in params)",
        "assert loop.stats.plain_steps > 0 and ref['W'].any()"]),
}


def test_readme_has_the_examples():
    assert len(BLOCKS) >= 4
    for marker in CHECKS:
        assert any(marker in b for b in BLOCKS), marker


def block_with_checks(out, index):
    block = BLOCKS[index]
    return ["-c", block + "\n" + "\n".join(c for m, c in CHECKS.items() if m in block)]


@pytest.mark.background("block_with_checks")
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_block_runs_alone(index, background):
    out, _ = background
    assert out.returncode == 0, out.stderr[-2000:]
