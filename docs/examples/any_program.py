"""checkpoint_program: Siskind and Pearlmutter's nested loop, with no annotation.

The inner loop's length differs per outer step (most are short, a few long), so checkpointing
the outer loop would tape a whole long inner loop at once. checkpoint_program records the
primitive ops as they run, plans over them, and replays: the gradient is plain autograd's.
"""
import autograd.numpy as np
import numpy
from autograd import grad

from bincheck import checkpoint_program

lengths = [1, 1, 1, 40, 1, 2, 1, 1, 60, 1]               # data-dependent in real programs


def f(y, w):
    for n in lengths:
        for _ in range(n):
            y = np.sqrt(y * y + 0.1)                     # the inner loop
        y = y * w                                       # the outer step
    return np.sum(y)


y0, w = numpy.linspace(0.5, 1.5, 1000), 1.01
g = checkpoint_program(f, num_ckpts=8)                   # at most 8 snapshots of live values
dy, dw = grad(g, (0, 1))(y0, w)
ref_dy, ref_dw = grad(f, (0, 1))(y0, w)
assert numpy.allclose(dy, ref_dy, rtol=1e-12) and numpy.isclose(dw, ref_dw, rtol=1e-12)

st = g.stats                                             # of the last gradient
print(f"{st.ops} ops recorded ({st.trace_bytes / st.ops:.0f} B/op), {st.plain_ops} plain "
      f"and {st.taped_ops} taped evaluations, at most {st.snapshots} snapshots "
      f"({st.snapshot_bytes} bytes)")
assert st.snapshots <= 8 and st.taped_ops == st.ops

budget = checkpoint_program(f, memory="600KB")           # bytes, the trace included
dy2, _ = grad(budget, (0, 1))(y0, w)
assert numpy.allclose(dy2, ref_dy, rtol=1e-12) and budget.stats.peak_bytes <= 600_000
