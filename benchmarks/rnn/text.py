"""Text for the character-level language model, generated here: no download, same text every run.

A word-level Markov chain (order 1) over the paragraphs below, sampled with a seeded
``numpy.random.RandomState``, turns ~400 words into as much text as a run needs. The words and
punctuation come from the paragraphs, so the text is English-like at the character level (spaces,
capitals, digits, punctuation, paragraph breaks), which is all a benchmark of the gradient needs;
nobody is meant to learn anything from it.

Vocabulary: the 95 printable ASCII characters (space to ``~``) and the newline, 96 in all.
"""

from __future__ import annotations

import numpy

VOCAB = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(VOCAB)                     # 96
_CODE = {ch: k for k, ch in enumerate(VOCAB)}

CORPUS = """\
The lighthouse on the north cape was built in 1871 and kept by one family for 93 years. Every \
evening the keeper climbed 114 steps, trimmed the wick, wound the clockwork and wrote the weather \
in a ledger: wind, sea, visibility, and the ships that passed.

Some nights the fog came in so thick that the beam lit nothing but itself. Then the keeper rang \
the bell by hand, once every 20 seconds, until the morning (or until his arms gave out, whichever \
came first). His daughter kept the count on a slate; she said later that she learned arithmetic \
from the fog.

Ships' masters trusted the light more than their charts. "If you can see the cape, you are too \
close," the old saying went, "and if you can hear the bell, you are closer still!" Nobody on the \
cape ever asked what happened to the ships that could do neither.

In the winter of 1903 the supply boat could not land for six weeks. The family lived on salted \
fish, potatoes and tea without sugar; the lamp oil ran low, so the keeper cut the wick by half a \
turn and the light, he wrote, "looked thin but honest." When the boat finally came, its crew \
found the ledger complete to the day, every page signed.

Why keep a record nobody reads? Because the sea does not care whether you remember it, and a \
keeper must. The ledger was the light's memory; without it, each night would be the first.

The cape has an automatic lamp now, checked twice a year by a technician from the mainland. The \
old ledgers sit in a museum case, open at a page from March: "Wind NW 6, sea rough, 3 ships; \
glass falling; all well at 04:00 #" and a small drawing of a gull, in pencil, at the margin.

Visitors ask the same questions: how high is the tower (31 m), how far does the light reach \
(about 18 nautical miles), and was it lonely? The guide's answer to the last one never changes: \
"Ask the gulls; they were there first, and they are still arguing about it."
"""


def _chain(corpus: str) -> tuple[list[str], dict[int, list[int]]]:
    """Tokens (words with their punctuation, and "\\n" between paragraphs) and, for each token,
    the indices of the tokens that follow it somewhere in the corpus."""
    tokens: list[str] = []
    for paragraph in corpus.split("\n\n"):
        tokens += paragraph.split() + ["\n"]
    vocab = sorted(set(tokens))
    index = {tok: k for k, tok in enumerate(vocab)}
    follows: dict[int, list[int]] = {k: [] for k in range(len(vocab))}
    for a, b in zip(tokens, tokens[1:] + tokens[:1]):       # wrap: every token has a successor
        follows[index[a]].append(index[b])
    return vocab, follows


def generate_text(num_chars: int, seed: int = 0) -> str:
    """At least ``num_chars`` characters of Markov text, the same for the same seed."""
    vocab, follows = _chain(CORPUS)
    rng = numpy.random.RandomState(seed)
    k = vocab.index("The")
    parts, length = [], 0
    while length < num_chars:
        word = vocab[k]
        piece = word if word == "\n" or not parts or parts[-1] == "\n" else " " + word
        parts.append(piece)
        length += len(piece)
        nxt = follows[k]
        k = nxt[rng.randint(len(nxt))]
    return "".join(parts)


def encode(text: str) -> numpy.ndarray:
    """Integer codes in [0, 96); raises on a character outside the vocabulary."""
    try:
        return numpy.array([_CODE[ch] for ch in text], dtype=numpy.int64)
    except KeyError as err:
        raise ValueError(f"character {err.args[0]!r} is not in the 96-character vocabulary") \
            from None


def char_batches(seq_len: int, batch: int, seed: int = 0) -> tuple[numpy.ndarray, numpy.ndarray]:
    """``(chars, targets)``, both ``(seq_len, batch)`` integer codes: column b is a run of
    ``seq_len + 1`` consecutive characters of the generated text (column b starts where column
    b - 1 ends), ``chars`` its first ``seq_len``, ``targets`` the next character at each step."""
    codes = encode(generate_text(batch * (seq_len + 1), seed))[:batch * (seq_len + 1)]
    runs = codes.reshape(batch, seq_len + 1).T                 # (seq_len + 1, batch)
    return numpy.ascontiguousarray(runs[:-1]), numpy.ascontiguousarray(runs[1:])
