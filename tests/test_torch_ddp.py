"""DistributedDataParallel through bincheck.torch: two gloo processes on CPU."""

import os
import signal
import subprocess
import sys
import time

import pytest

torch = pytest.importorskip("torch")

HERE = os.path.dirname(os.path.abspath(__file__))
TIMEOUT = 120


def run_ranks(tmp_path, find_unused):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.path.dirname(HERE),
                                                      os.environ.get("PYTHONPATH", "")]),
               OMP_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_worker.py"), str(r),
                               str(tmp_path), "1" if find_unused else "0"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              start_new_session=True) for r in (0, 1)]
    deadline = time.monotonic() + TIMEOUT
    logs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            logs.append(out.decode(errors="replace"))
    except subprocess.TimeoutExpired:
        pass
    finally:
        for p in procs:                      # never leave a rank behind, hung or not
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    codes = [p.returncode for p in procs]
    assert codes == [0, 0], f"ranks exited with {codes} (timeout {TIMEOUT} s):\n" + \
        "\n".join(logs)
    return [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]


@pytest.mark.parametrize("find_unused", [False, True])
def test_ddp_gradients_equal_the_single_process_gradient(tmp_path, find_unused):
    r0, r1 = run_ranks(tmp_path, find_unused)
    for name, ref in r0["reference"].items():
        torch.testing.assert_close(r0["grads"][name], ref, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(r1["grads"][name], ref, rtol=1e-10, atol=1e-12)
    # one gradient per parameter per backward (two iterations)
    assert set(r0["fired"].values()) == {2} and set(r1["fired"].values()) == {2}
