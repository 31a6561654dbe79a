"""Part A: K. Sargent, "Binomial checkpointing in autograd" (2019), like for like.

Source read (not copied): the public repository ksagit/autograd, commit
fc3440bdcd46bde2e55451f63849311696440d2a, ``examples/checkpointing/``: ``README.md`` (the LSTM
timings), ``normal_lstm.py`` / ``checkpointed_lstm.py`` (the two LSTM scripts),
``checkpointed_rnn_example.ipynb`` (the RNN notebook) and ``checkpointing_poster.pdf``. Exact
file/line citations are in benchmarks/reproduce/README.md and in the tables this module writes.

What is measured, per setting, in one process:

* one differentiated function, written once (a step, an output layer, a loss), evaluated by
  variants that must agree on the gradient (max relative error <= 1e-10, checked before anything
  is timed): store-all (the plain Python loop under autograd) and ``binomial_checkpoint`` at each
  of his ``num_ckpts``, each with three placements of what leaves the loop (``PLACEMENTS``): every
  state's log-probabilities (his primitive's layout and his ``normal_lstm.py`` loop), the hidden
  states (output layer applied once outside), or each step's loss term;
* peak memory (tracemalloc) of one gradient, plain/taped step counts (``loop.stats``) against the
  plan's prediction, and the median wall time of ``repeats`` interleaved gradients.

The mismatch: his two LSTM scripts differentiate different functions. Three plain autograd loops
re-implement the math each script describes and print how far their gradients are apart.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import autograd.numpy as np
import numpy
from autograd import grad
from autograd.tracer import getval

from bincheck import binomial_checkpoint, plan

from .common import (csv_bytes, interleaved_medians, max_rel_err, md_table, peak_mib, png_bytes)

SOURCE = "ksagit/autograd@fc3440b"      # fc3440bdcd46bde2e55451f63849311696440d2a (HEAD)


@dataclass(frozen=True)
class Setting:
    name: str            # "lstm" (his README's LSTM) or "rnn" (his notebook's tanh RNN)
    seq_len: int
    batch: int
    n_in: int
    hidden: int
    n_out: int
    num_ckpts: tuple[int, ...]
    uses_final: bool     # the loss includes the final state's output (notebook) or not (LSTM)


# normal_lstm.py / checkpointed_lstm.py: sequence_length=512, input 128 (one-hot ASCII), state 40,
# output 128; the batch is the number of non-blank lines among the first 60 of the text file (46
# for normal_lstm.py at fc3440b). num_ckpts: 64 in checkpointed_lstm.py at fc3440b (line 63); 128
# in the version that was current when the README's 3.30 s was written (commit 04659f5, line 63).
LSTM = Setting("lstm", 512, 46, 128, 40, 128, (64, 128), uses_final=False)
# checkpointed_rnn_example.ipynb: input = state = output = 64, batch 64, seq_len 512; the notebook
# versions that report a checkpointed run use num_checkpoints = 64 (e.g. commit bdeb062).
RNN = Setting("rnn", 512, 64, 64, 64, 64, (64,), uses_final=True)
SMOKE = {"lstm": replace(LSTM, seq_len=16, batch=3, n_in=12, hidden=6, n_out=12, num_ckpts=(4,)),
         "rnn": replace(RNN, seq_len=16, batch=3, n_in=6, hidden=6, n_out=6, num_ckpts=(4,))}

# His published numbers, quoted. L = line of the file at fc3440b unless a commit is named.
PUBLISHED = {
    "lstm": [
        dict(what="store-all (normal_lstm.py)", time_s=2.05,
             mem="+284 MB RSS (L45) = 362 MB (L34) - the 78 MB baseline of an earlier version "
                 "(0f61417 L2); +241 MB over the 121 MB baseline quoted now (L28)",
             source="examples/checkpointing/README.md L43-45"),
        dict(what="checkpointed_lstm.py", time_s=3.30,
             mem="+30 MB RSS = 151 MB (L40) - 121 MB (L28); the text says 85 MB (L44) = 163 MB "
                 "- 78 MB of 0f61417 (L20, L2)",
             source="README.md L43-44; written when num_checkpoints was 128 (04659f5 "
                    "checkpointed_lstm.py L63), 64 since 5d3fc7a (L63)"),
        dict(what="his ratios", time_s=None,
             mem="slowdown 1.62x, 'memory savings of 9.47x' = 284/30, two baselines; 241/30 = "
                 "8.0x (87.6 % saved) with one",
             source="README.md L45"),
    ],
    "rnn": [
        dict(what="store-all (rnn_predict)", time_s=0.894, mem="+107.13 MiB (%memit increment)",
             source="checkpointed_rnn_example.ipynb @bdeb062 L125-126"),
        dict(what="binomial_checkpoint, num_checkpoints 64", time_s=1.772,
             mem="+4.36 MiB (%memit increment)",
             source="checkpointed_rnn_example.ipynb @bdeb062 L62, L152-153"),
        dict(what="his ratios", time_s=None, mem="slowdown 1.98x, 95.9 % saved",
             source="computed from the two lines above"),
        dict(what="poster", time_s=None, mem="'sometimes on the order of 98%' saved, 'roughly a "
             "1.7x slowdown' for most numbers of checkpoints",
             source="checkpointing_poster.pdf, Results and Benchmarks"),
    ],
}
PUBLISHED_POINTS = {           # (slowdown, % saved) for the plot; his measures, not ours
    "lstm": [(3.30 / 2.05, 100 * (1 - 30 / 241), "Sargent README (RSS, one baseline)")],
    "rnn": [(1.772 / 0.894, 100 * (1 - 4.36 / 107.13), "Sargent notebook @bdeb062 (%memit)"),
            (1.7, 98.0, "Sargent poster (claim)")],
}


# --------------------------------------------------------------------------- the math
def gate(a):
    """His examples' ``sigmoid``: 0.5 (tanh(a) + 1), i.e. the logistic function of 2a."""
    return 0.5 * (np.tanh(a) + 1.0)


def affine(W, *parts):
    """[parts..., 1] @ W: W stacks the weights of each part and, in its last row, a bias."""
    x = np.concatenate(parts + (numpy.ones((parts[0].shape[0], 1)),), axis=1)
    return np.dot(x, W)


def lstm_step(params, state, x):
    """One LSTM step on state (cells, hiddens), gates from [x, hiddens, 1]."""
    cells, hiddens = state
    cat = np.concatenate((x, hiddens, numpy.ones((x.shape[0], 1))), axis=1)
    change = np.tanh(np.dot(cat, params["change"]))
    forget = gate(np.dot(cat, params["forget"]))
    ingate = gate(np.dot(cat, params["ingate"]))
    outgate = gate(np.dot(cat, params["outgate"]))
    cells = cells * forget + ingate * change
    return (cells, outgate * np.tanh(cells))


def rnn_step(params, h, x):
    return np.tanh(affine(params["change"], x, h))


def log_softmax(z):
    m = numpy.max(getval(z), axis=-1, keepdims=True)       # a constant shift: exact gradient
    return z - (m + np.log(np.sum(np.exp(z - m), axis=-1, keepdims=True)))


def logprobs(params, h):
    """Output layer on hidden states h of shape (..., H): log-probabilities over n_out."""
    P = params["predict"]
    return log_softmax(np.dot(h, P[:-1]) + P[-1])


@dataclass
class Model:
    setting: Setting
    step: Callable
    hidden: Callable          # state -> hidden state h (the output layer's input)
    params: dict
    state0: Any
    xs: numpy.ndarray         # (T, B, n_in)

    def term(self, lp, x):
        """The loss term of one state's log-probabilities lp (B, n_out) or of a stack of them
        (..., B, n_out); x: the matching inputs, which are the targets in the LSTM setting."""
        if self.setting.name == "lstm":   # -log-likelihood, targets = inputs, as in his scripts
            T, B = self.xs.shape[:2]
            return -np.sum(lp * x) / (T * B)
        return np.sum(lp)                  # the notebook: the sum of every output


def _params(sizes: list[tuple[str, tuple[int, int]]], seed: int) -> dict:
    rs = numpy.random.RandomState(seed)           # drawn in his order, scale 0.01
    return {name: rs.randn(*shape) * 0.01 for name, shape in sizes}


def text_batch(T: int, B: int, alphabet: int, seed: int) -> numpy.ndarray:
    """B lines of seeded random printable text, space-padded to T chars, one-hot: (T, B, alphabet).

    Like his ``build_dataset`` (each line of a source file padded with spaces to the sequence
    length); the text itself is ours. Codes are folded into the alphabet when it is small.
    """
    rs = numpy.random.RandomState(seed + 1)
    codes = numpy.full((T, B), 32)
    for b in range(B):
        n = rs.randint(3, min(T, 88) + 1)
        codes[:n, b] = rs.randint(33, 127, size=n)
    codes %= alphabet
    return (codes[:, :, None] == numpy.arange(alphabet)).astype(float)


def make_model(s: Setting, seed: int = 0) -> Model:
    T, B, I, H, O = s.seq_len, s.batch, s.n_in, s.hidden, s.n_out
    const0 = numpy.repeat(numpy.random.RandomState(0).randn(1, H) * 0.01, B, axis=0)
    if s.name == "lstm":
        params = _params([("init cells", (1, H)), ("init hiddens", (1, H))]
                         + [(g, (I + H + 1, H)) for g in ("change", "forget", "ingate", "outgate")]
                         + [("predict", (H + 1, O))], seed)
        # checkpointed_lstm.py: constant initial state, the same values for cells and hiddens
        return Model(s, lstm_step, lambda st: st[1], params, (const0, const0.copy()),
                     text_batch(T, B, I, seed))
    params = _params([("change", (I + H + 1, H)), ("predict", (H + 1, O)),
                      ("init hiddens", (1, H))], seed)
    xs = numpy.random.RandomState(seed).randn(T, B, I)
    return Model(s, rnn_step, lambda h: h, params, const0, xs)


# --------------------------------------------------------------------------- the variants
# What leaves the loop; the differentiated function is the same in all three.
PLACEMENTS = {
    "logprobs": "every state's log-probabilities leave the loop (his primitive's layout)",
    "hiddens": "hidden states leave the loop; output layer once, vectorized",
    "loss terms": "each step adds its own loss term; only T scalars leave the loop",
}


@dataclass
class Variant:
    label: str
    placement: str               # a key of PLACEMENTS
    num_ckpts: int | None        # None: store-all
    loss: Callable
    loop: Any = None


def variants(m: Model) -> list[Variant]:
    """Store-all and bincheck at each of his num_ckpts, for each placement.

    The loss uses the outputs of states 0..T-1 (LSTM) or 0..T (RNN). Step t receives state t and
    input t, so a step emits what belongs to the state it receives; the final state's share, when
    the loss has one, is added outside the loop.
    """
    s, T, xs = m.setting, m.setting.seq_len, m.xs
    h, lp = m.hidden, logprobs

    def final_term(params, final):
        return m.term(lp(params, h(final)), None) if s.uses_final else 0.0

    emit = {"logprobs": lambda p, st, x: lp(p, h(st)),
            "hiddens": lambda p, st, x: h(st),
            "loss terms": lambda p, st, x: m.term(lp(p, h(st)), x)}

    def finish(placement, params, ys, final):
        """The loss from the stacked per-step outputs ys (T, ...) and the final state."""
        if placement == "logprobs":
            return m.term(ys, xs) + final_term(params, final)
        if placement == "hiddens":
            return m.term(lp(params, ys), xs) + final_term(params, final)
        return np.sum(ys) + final_term(params, final)

    def store_all(placement):
        def loss(params):
            st, ys = m.state0, []
            for t in range(T):
                ys.append(emit[placement](params, st, xs[t]))
                st = m.step(params, st, xs[t])
            return finish(placement, params, np.stack(ys), st)
        return loss

    def checkpointed(placement, loop):
        def loss(params):
            final, ys = loop(params, m.state0, xs)
            return finish(placement, params, ys, final)
        return loss

    out = [Variant(f"store-all, {pl}", pl, None, store_all(pl)) for pl in PLACEMENTS]
    for k in s.num_ckpts:
        for pl in PLACEMENTS:
            loop = binomial_checkpoint(
                lambda p, st, x, e=emit[pl]: (m.step(p, st, x), e(p, st, x)), T, k,
                with_outputs=True)
            out.append(Variant(f"bincheck s={k}, {pl}", pl, k, checkpointed(pl, loop), loop))
    return out


def measure(setting: Setting, repeats: int, seed: int = 0, log=print) -> list[dict]:
    """All variants of one setting, measured in this process; rows for the CSV."""
    m = make_model(setting, seed)
    vs = variants(m)
    grads = [grad(v.loss) for v in vs]
    rows, ref = [], None
    for v, g in zip(vs, grads):
        row = dict(setting=setting.name, seq_len=setting.seq_len, batch=setting.batch,
                   n_in=setting.n_in, hidden=setting.hidden, n_out=setting.n_out,
                   variant=v.label, placement=v.placement, num_ckpts=v.num_ckpts, status="ok")
        value = g(m.params)                                   # also warms caches up
        if ref is None:
            ref = value
        row["grad_max_rel_err"] = max_rel_err(value, ref)
        if row["grad_max_rel_err"] > 1e-10:
            row["status"] = "FAILED: gradient differs from store-all"
        if v.loop is not None:
            st = v.loop.stats
            row.update(plain_evals=st.plain_steps, taped_evals=st.taped_steps,
                       peak_snapshots=st.peak_snapshots,
                       predicted_plain=plan(setting.seq_len, v.num_ckpts).plain_steps)
        else:
            row.update(plain_evals=0, taped_evals=setting.seq_len)
        row["peak_mib"] = peak_mib(lambda: g(m.params))[0]
        rows.append(row)
        log(f"  {setting.name}: {v.label}: peak {row['peak_mib']:.2f} MiB, "
            f"gradient max rel err {row['grad_max_rel_err']:.1e}")
    live = [i for i, r in enumerate(rows) if r["status"] == "ok"]
    times = interleaved_medians([lambda g=grads[i]: g(m.params) for i in live], repeats)
    for i, ts in zip(live, times):
        rows[i]["time_s"] = float(numpy.median(ts))
        rows[i]["times_s"] = " ".join(f"{t:.4f}" for t in ts)
    pair = {r["placement"]: r for r in rows if r["num_ckpts"] is None}
    for i in live:
        r, p = rows[i], pair[rows[i]["placement"]]
        if "time_s" in p:
            r["slowdown_vs_pair"] = r["time_s"] / p["time_s"]
            r["saved_pct_vs_pair"] = 100.0 * (1.0 - r["peak_mib"] / p["peak_mib"])
            r["slowdown_vs_his_loop"] = r["time_s"] / rows[0]["time_s"]
            r["saved_pct_vs_his_loop"] = 100.0 * (1.0 - r["peak_mib"] / rows[0]["peak_mib"])
    return rows


COLUMNS = ["setting", "seq_len", "batch", "n_in", "hidden", "n_out", "variant", "placement",
           "num_ckpts", "status", "time_s", "slowdown_vs_pair", "slowdown_vs_his_loop", "peak_mib",
           "saved_pct_vs_pair", "saved_pct_vs_his_loop", "plain_evals", "predicted_plain",
           "taped_evals", "peak_snapshots", "grad_max_rel_err", "times_s"]


# --------------------------------------------------------------------------- the mismatch
def mismatch(setting: Setting = LSTM, seed: int = 0) -> list[dict]:
    """His two LSTM scripts' functions, re-implemented as plain autograd loops, and a third that
    separates the two differences. Returns one row per comparison."""
    m = make_model(setting, seed)
    T, B = setting.seq_len, setting.batch

    def run(params, learned_init: bool, swap: bool):
        if learned_init:       # normal_lstm.py: the initial state is a learned parameter
            h = np.repeat(params["init hiddens"], B, axis=0)
            c = np.repeat(params["init cells"], B, axis=0)
        else:                  # checkpointed_lstm.py: a constant initial state
            c, h = m.state0
        lps = [logprobs(params, h)]
        for t in range(T):
            # normal_lstm.py passes (hiddens, cells) to a step that reads (cells, hiddens):
            # every step the previous hidden state is used as the cell and vice versa
            c, h = lstm_step(params, (h, c) if swap else (c, h), m.xs[t])
            if len(lps) < T:
                lps.append(logprobs(params, h))
        return m.term(np.stack(lps), m.xs)

    fns = {"normal_lstm.py (learned initial state, swapped state)": (True, True),
           "learned initial state, no swap": (True, False),
           "checkpointed_lstm.py (constant initial state, no swap)": (False, False)}
    res = {k: (run(m.params, *a), grad(lambda p, a=a: run(p, *a))(m.params))
           for k, a in fns.items()}
    names = list(fns)
    shared = ["change", "forget", "ingate", "outgate", "predict"]
    rows = []
    for a, b, what in [(names[0], names[2], "the two scripts"),
                       (names[0], names[1], "the swap alone"),
                       (names[1], names[2], "the initial state alone")]:
        ga, gb = res[a][1], res[b][1]
        d = {k: float(numpy.max(numpy.abs(ga[k] - gb[k]))) for k in shared}
        worst = max(d, key=d.get)
        rows.append(dict(
            comparison=what, a=a, b=b, loss_a=float(res[a][0]), loss_b=float(res[b][0]),
            max_abs_diff_shared=d[worst], worst_param=worst,
            rel_diff_shared=d[worst] / float(numpy.max(numpy.abs(gb[worst]))),
            init_grad_norm_a=float(numpy.linalg.norm(ga["init cells"])
                                   + numpy.linalg.norm(ga["init hiddens"])),
            init_grad_norm_b=float(numpy.linalg.norm(gb["init cells"])
                                   + numpy.linalg.norm(gb["init hiddens"]))))
    return rows


MISMATCH_COLUMNS = ["comparison", "a", "b", "loss_a", "loss_b", "max_abs_diff_shared",
                    "worst_param", "rel_diff_shared", "init_grad_norm_a", "init_grad_norm_b"]


# --------------------------------------------------------------------------- report
def _f(v, spec):
    return "–" if v is None else format(v, spec)


def markdown(rows: list[dict], mism: list[dict], settings: list[Setting], repeats: int,
             env: str) -> str:
    out = ["# Sargent, \"Binomial checkpointing in autograd\": measured like for like\n",
           f"{env}. Gradient w.r.t. all parameters; every variant's gradient equals store-all's "
           f"(max relative error in the last column) before it is timed; time = median of "
           f"{repeats} interleaved gradients; memory = tracemalloc peak of one gradient. "
           f"\"pair\" = the store-all with the same placement; \"his loop\" = store-all with the "
           f"log-probabilities layout (his normal_lstm.py). Placements (what leaves the loop): "
           + "; ".join(f"**{k}**: {v}" for k, v in PLACEMENTS.items()) + ".\n"]
    for s in settings:
        rs = [r for r in rows if r["setting"] == s.name]
        title = {"lstm": "LSTM (his README: normal_lstm.py vs checkpointed_lstm.py)",
                 "rnn": "tanh RNN (his notebook checkpointed_rnn_example.ipynb)"}[s.name]
        out.append(f"## {title}: T={s.seq_len}, batch {s.batch}, input {s.n_in}, "
                   f"hidden {s.hidden}, output {s.n_out}\n")
        out.append(md_table(
            ["variant", "time (s)", "slowdown vs pair", "slowdown vs his loop", "peak MiB",
             "saved vs pair", "saved vs his loop", "plain evals (predicted)", "taped evals",
             "grad max rel err"],
            [[r["variant"] if r["status"] == "ok" else f"{r['variant']} — {r['status']}",
              _f(r.get("time_s"), ".3f"), _f(r.get("slowdown_vs_pair"), ".2f") + "×",
              _f(r.get("slowdown_vs_his_loop"), ".2f") + "×", _f(r.get("peak_mib"), ".2f"),
              _f(r.get("saved_pct_vs_pair"), ".1f") + " %",
              _f(r.get("saved_pct_vs_his_loop"), ".1f") + " %",
              f"{r['plain_evals']}" + (f" ({r['predicted_plain']})"
                                       if r.get("predicted_plain") else ""),
              r["taped_evals"], f"{r['grad_max_rel_err']:.1e}"] for r in rs]))
        out.append(f"\nHis published numbers ({SOURCE}, examples/checkpointing/; his memory is "
                   f"process RSS or %memit, ours tracemalloc):\n")
        out.append(md_table(["what", "time (s)", "memory / ratio", "where"],
                            [[p["what"], _f(p["time_s"], ".3f"), p["mem"], p["source"]]
                             for p in PUBLISHED[s.name]], "lrll"))
        out.append("")
    if mism:
        out.append("## The two LSTM scripts differentiate different functions\n")
        out.append("Plain autograd loops written from each script's description (same parameters, "
                   "same data); gradient differences over the weights both share (change, forget, "
                   "ingate, outgate, predict); `init` = norm of the gradient w.r.t. the initial-"
                   "state parameters ('init cells' + 'init hiddens').\n")
        out.append(md_table(
            ["comparison", "function a", "function b", "loss a", "loss b",
             "max abs grad diff", "relative", "worst weight", "init grad a", "init grad b"],
            [[r["comparison"], r["a"], r["b"], f"{r['loss_a']:.6f}", f"{r['loss_b']:.6f}",
              f"{r['max_abs_diff_shared']:.2e}", f"{r['rel_diff_shared']:.2e}", r["worst_param"],
              f"{r['init_grad_norm_a']:.2e}", f"{r['init_grad_norm_b']:.2e}"] for r in mism],
            "lllrrrrlrr"))
    return "\n".join(out)


def plot(rows: list[dict], settings: list[Setting]) -> bytes:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(settings), figsize=(6.2 * len(settings), 5.2), squeeze=False)
    for ax, s in zip(axes[0], settings):
        rs = [r for r in rows if r["setting"] == s.name and r["num_ckpts"] is not None
              and r.get("slowdown_vs_his_loop") is not None]
        marks = {"logprobs": "o", "hiddens": "s", "loss terms": "*"}
        colors = {k: f"C{i}" for i, k in enumerate(s.num_ckpts)}
        for r in rs:
            ax.plot(r["slowdown_vs_his_loop"], r["saved_pct_vs_his_loop"],
                    marks[r["placement"]], color=colors[r["num_ckpts"]],
                    ms=13 if r["placement"] == "loss terms" else 8, alpha=0.85,
                    label=f"bincheck s={r['num_ckpts']}, {r['placement']} out of the loop")
        for x, y, label in PUBLISHED_POINTS.get(s.name, []):
            ax.plot(x, y, "D", ms=9, mfc="none", mew=2, color="C3" if "poster" not in label
                    else "C4", label=label)
        ax.set_title(f"{s.name.upper()} T={s.seq_len}, B={s.batch}, H={s.hidden}: "
                     "memory saved vs slowdown", fontsize=10)
        ax.set_xlabel("slowdown vs store-all with his loop's layout (×)")
        ax.set_ylabel("peak memory saved vs that store-all (%)")
        ax.set_xlim(0.5, max([2.3] + [r["slowdown_vs_his_loop"] * 1.1 for r in rs]))
        lo = min([50.0] + [r["saved_pct_vs_his_loop"] - 5 for r in rs])
        ax.set_ylim(lo, 100.5)
        ax.axvline(1.0, color="gray", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Sargent's settings: bincheck measured here (filled) vs his published numbers "
                 "(hollow; his memory is RSS / %memit, ours tracemalloc)", fontsize=10)
    fig.tight_layout()
    return png_bytes(fig)


def run(out_files: dict, quick: bool, smoke: bool, repeats: int, seed: int, env: str,
        log=print) -> list[dict]:
    """Measure part A; put sargent.{csv,md,png} and sargent_mismatch.csv into ``out_files``."""
    settings = [SMOKE["lstm"], SMOKE["rnn"]] if smoke else [LSTM, RNN]
    rows = []
    for s in settings:
        log(f"Sargent {s.name}: T={s.seq_len}, B={s.batch}, H={s.hidden}, "
            f"num_ckpts {list(s.num_ckpts)}")
        rows += measure(s, repeats, seed, log)
    log("Sargent mismatch: three plain LSTM loops")
    mism = mismatch(settings[0], seed)
    for r in mism:
        log(f"  {r['comparison']}: max |grad diff| {r['max_abs_diff_shared']:.2e} "
            f"({r['worst_param']}), init grads {r['init_grad_norm_a']:.2e} vs "
            f"{r['init_grad_norm_b']:.2e}")
    out_files["sargent.csv"] = csv_bytes(rows, COLUMNS)
    out_files["sargent_mismatch.csv"] = csv_bytes(mism, MISMATCH_COLUMNS)
    out_files["sargent.md"] = markdown(rows, mism, settings, repeats, env).encode()
    out_files["sargent.png"] = plot(rows, settings)
    return rows
