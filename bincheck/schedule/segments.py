"""One-level checkpointing in equal segments (Chen et al. 2016's sqrt(T) scheme).

The forward stores the state at each segment boundary; the reverse tapes one whole segment at a
time from its boundary state. This is what ``torch.utils.checkpoint.checkpoint_sequential`` does;
bincheck ships it as a baseline for the benchmarks and as a second planner for the executor.
"""

from __future__ import annotations

from collections.abc import Iterator

from .actions import Action, Advance, Free, Restore, Reverse, Snapshot
from .validate import check_positive_int


class EqualSegments:
    """``num_segments`` (near-)equal segments; the first ``seq_len % num_segments`` are one longer."""

    def __init__(self, seq_len: int, num_segments: int) -> None:
        self.seq_len = check_positive_int("seq_len", seq_len)
        check_positive_int("num_segments", num_segments)
        self.num_segments = min(num_segments, seq_len)
        q, r = divmod(self.seq_len, self.num_segments)
        self.bounds = [i * q + min(i, r) for i in range(self.num_segments + 1)]

    def __iter__(self) -> Iterator[Action]:
        b = self.bounds
        yield Snapshot(0)
        for i in range(1, len(b) - 1):
            yield Advance(b[i - 1], b[i])
            yield Snapshot(b[i])
        for i in range(len(b) - 2, -1, -1):
            if i != len(b) - 2:
                yield Restore(b[i])
            yield Reverse(b[i], b[i + 1])
            yield Free(b[i])

    @property
    def plain_steps(self) -> int:
        return self.bounds[-2]

    @property
    def first_reverse_start(self) -> int:
        return self.bounds[-2]

    @property
    def taped_steps(self) -> int:
        return self.seq_len

    @property
    def peak_checkpoints(self) -> int:
        return self.num_segments

    peak_slots = peak_checkpoints           # the name before 0.2

    def __repr__(self) -> str:
        return f"EqualSegments({self.seq_len}, {self.num_segments})"

    def __str__(self) -> str:
        return (f"equal segments: {self.seq_len} steps in {self.num_segments} segments, "
                f"{self.plain_steps} plain + {self.taped_steps} taped evaluations, "
                f"{self.peak_checkpoints} checkpoints, longest tape {self.bounds[1]} steps")
