"""Queries and export of a trained word2vec run's vectors: the kept `embedding` table (the
lecture notes from NNLM to BERT: the Context matrix is discarded after training and appears
nowhere here).

    python -m zoo.commands.word2vec_query --config=configs/word2vec.py:size=tiny \\
        --workdir=/tmp/w2v --neighbours=braikousk,vanomese [--k=10]
    python -m zoo.commands.word2vec_query ... --analogy=vanomistan,vanomese,poria   # b - a + c: "?"
    python -m zoo.commands.word2vec_query ... --export=vectors.txt [--binary]

* Nearest neighbours: the k words of highest cosine similarity, the word itself left out.
* Analogy a,b,c ("a is to b as c is to ?", the C tool's word-analogy): the words nearest to
  unit(b) - unit(a) + unit(c), the three inputs left out.
* Export in the word2vec format that gensim's KeyedVectors.load_word2vec_format and the C tool
  read: a header line "V D", then per word, most frequent first, "word v1 ... vD" (text) or
  the word, a space, D little-endian float32 and a newline (--binary).

Words are lower-cased before lookup, as the corpus was; a word not in the vocabulary is an error
naming it.
"""

import io
import sys
from collections.abc import Sequence

import numpy as np

from zoo import errors, paths
from zoo.data.readers.word2vec import Vocabulary
from zoo.errors import ConfigError, DataError, MissingFileError
from zoo.models.word2vec import cosine_neighbours


def _id(vocab: Vocabulary, word: str) -> int:
    try:
        return vocab.id(word)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None


def nearest(vocab: Vocabulary, table: np.ndarray, word: str, k: int = 10
            ) -> list[tuple[str, float]]:
    """The k words most cosine-similar to `word`, with their similarities, best first."""
    i = _id(vocab, word)
    ids, sims = cosine_neighbours(table, table[i], k, exclude=[i])
    return [(vocab.words[j], float(s)) for j, s in zip(ids, sims)]


def analogy(vocab: Vocabulary, table: np.ndarray, a: str, b: str, c: str, k: int = 10
            ) -> list[tuple[str, float]]:
    """"a is to b as c is to ?": the k words nearest unit(b) - unit(a) + unit(c), a, b and c
    excluded (3CosAdd on unit vectors, as the C tool's word-analogy)."""
    ids = [_id(vocab, w) for w in (a, b, c)]
    unit = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-12)
    query = unit[ids[1]] - unit[ids[0]] + unit[ids[2]]
    near, sims = cosine_neighbours(table, query, k, exclude=ids)
    return [(vocab.words[j], float(s)) for j, s in zip(near, sims)]


def write_vectors(path: str, words: Sequence[str], table: np.ndarray, binary: bool = False
                  ) -> str:
    """Writes `table` [V, D] in the word2vec format (text, or binary float32) to `path`, local or
    gs://... (its directory is created); returns path.

    Text values are printed with 9 significant digits, which read back to the same float32.
    """
    table = np.asarray(table, np.float32)
    if table.ndim != 2 or table.shape[0] != len(words):
        raise ValueError(f"write_vectors: table {table.shape} must be [{len(words)}, D]")
    bad = [w for w in words if not w or any(ch.isspace() for ch in w)]
    if bad:
        raise ValueError(f"write_vectors: words must be non-empty without whitespace: {bad[:3]}")
    # Rendered in memory, then written whole (one upload to a gs:// path; temp file + rename
    # locally): a reader never meets half a table.
    f = io.BytesIO()
    f.write(f"{table.shape[0]} {table.shape[1]}\n".encode())
    for word, row in zip(words, table):
        if binary:
            f.write(word.encode("utf-8") + b" " + row.astype("<f4").tobytes() + b"\n")
        else:
            f.write((word + " " + " ".join(f"{x:.9g}" for x in row) + "\n").encode("utf-8"))
    paths.write_atomic(path, f.getvalue())
    return path


def read_vectors(path: str, binary: bool = False) -> tuple[list[str], np.ndarray]:
    """Reads a word2vec-format file (as write_vectors writes it) -> (words, float32 [V, D])."""
    with paths.as_path(path).open("rb") as f:
        try:
            num, dim = (int(x) for x in f.readline().split())
        except ValueError:
            raise DataError(f"{path}: the first line must be 'V D' (word2vec format)") from None
        words, rows = [], []
        for n in range(num):
            if binary:
                word = b""
                while (ch := f.read(1)) != b" ":
                    if not ch:
                        raise DataError(f"{path}: ends inside word {n} of {num}")
                    word += ch
                data = f.read(4 * dim)
                if len(data) != 4 * dim:
                    raise DataError(f"{path}: ends inside the vector of word {n} of {num}")
                rows.append(np.frombuffer(data, "<f4"))
                f.read(1)  # the newline after each vector
                words.append(word.decode("utf-8").lstrip("\n"))
            else:
                parts = f.readline().decode("utf-8").rstrip("\n").split(" ")
                if len(parts) != dim + 1:
                    raise DataError(f"{path}: line {n + 2} has {len(parts) - 1} values, "
                                    f"expected {dim}")
                words.append(parts[0])
                rows.append(np.asarray(parts[1:], np.float32))
    return words, np.stack(rows).astype(np.float32) if rows else np.zeros((0, dim), np.float32)


def load_vectors(config, workdir: str) -> tuple[Vocabulary, np.ndarray]:
    """The vocabulary and the latest checkpoint's `embedding` table [V, D] of a trained run."""
    from jax.experimental import multihost_utils

    from zoo.commands import jobs
    from zoo.checkpoints.checkpoint import Checkpointer

    # Checked before building anything: build() and Checkpointer create directories.
    paths.check_remote(workdir, "--workdir")
    directory = paths.join(workdir, "checkpoints")
    if not paths.as_path(directory).is_dir():
        raise MissingFileError(
            f"--workdir={workdir} holds no checkpoint ({directory}); train first with "
            f"`python train.py --config=configs/word2vec.py --workdir={workdir}`")
    if config.task != "word2vec":
        raise ConfigError(f"--config is a {config.task!r} job; give the word2vec config the run "
                          "in --workdir was trained with")
    checkpointer = Checkpointer(workdir)
    try:
        if checkpointer.latest_step() is None:
            raise MissingFileError(f"--workdir={workdir} holds no checkpoint ({directory})")
        setup = jobs.build(config, workdir)
        params = checkpointer.restore_params(setup.state.params)
    finally:
        checkpointer.close()
    table = multihost_utils.process_allgather(params["embedding"], tiled=True)
    return setup.task.vocab, np.asarray(table, np.float32)


def _flags(argv: Sequence[str]):
    """Flags of our own (not absl's global FLAGS), so main can run more than once."""
    from absl import flags
    from ml_collections import config_flags

    from zoo.commands import cli

    fv = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "configs/word2vec.py[:variant] of the run in --workdir, with the same "
        "--config.a.b=value overrides", lock_config=True, flag_values=fv, sys_argv=list(argv))
    flags.DEFINE_string("workdir", None, "The trained run whose latest checkpoint to read.",
                        flag_values=fv)
    flags.DEFINE_list("neighbours", None, "Words whose nearest neighbours to print.",
                      flag_values=fv)
    flags.DEFINE_list("analogy", None, "a,b,c: the words nearest b - a + c.", flag_values=fv)
    flags.DEFINE_integer("k", 10, "Neighbours / analogy answers to print.", flag_values=fv)
    flags.DEFINE_string("export", None, "Write the vectors to this file (word2vec format).",
                        flag_values=fv)
    flags.DEFINE_bool("binary", False, "--export in the binary word2vec format.",
                      flag_values=fv)
    cli.exit_if_help(fv, argv, __doc__)
    cli.parse_flags(fv, argv)  # a mistake is one UserError, not absl's traceback
    return fv


def main(argv: Sequence[str]) -> dict:
    """`python -m zoo.commands.word2vec_query ...`: prints the answers; returns {'neighbours':
    {word: [(word, sim)]}, 'analogy': [(word, sim)], 'export': path} for what was asked."""
    fv = _flags(argv)
    if fv.config is None or not fv.workdir:
        raise ConfigError("give the trained run: --config=configs/word2vec.py[:variant] "
                          "--workdir=DIR")
    if not (fv.neighbours or fv.analogy or fv.export):
        raise ConfigError("nothing to do: give --neighbours=WORD[,WORD...], --analogy=a,b,c "
                          "and/or --export=PATH")
    if fv.analogy is not None and len(fv.analogy) != 3:
        raise ConfigError(f"--analogy={','.join(fv.analogy)} needs exactly three words a,b,c "
                          "(a is to b as c is to ?)")
    if fv.k < 1:
        raise ConfigError(f"--k={fv.k} must be >= 1")
    vocab, table = load_vectors(fv.config, fv.workdir)
    result = {}
    # Every word is checked before any answer is printed.
    for word in (fv.neighbours or []) + (fv.analogy or []):
        _id(vocab, word)
    if fv.neighbours:
        result["neighbours"] = {w: nearest(vocab, table, w, fv.k) for w in fv.neighbours}
        for word, near in result["neighbours"].items():
            print(f"{word}: " + "  ".join(f"{n} {s:.3f}" for n, s in near), flush=True)
    if fv.analogy:
        a, b, c = fv.analogy
        result["analogy"] = analogy(vocab, table, a, b, c, fv.k)
        print(f"{a} : {b} :: {c} : " + "  ".join(f"{n} {s:.3f}" for n, s in result["analogy"]),
              flush=True)
    if fv.export:
        try:
            result["export"] = write_vectors(fv.export, vocab.words, table, binary=fv.binary)
        except OSError as e:  # a directory that is not there, no permission, a full disk
            raise ConfigError(f"--export={fv.export} cannot be written ({e}); give a file in "
                              "a directory you can write") from e
        print(f"wrote {len(vocab)} x {table.shape[1]} vectors to {fv.export}", flush=True)
    return result


if __name__ == "__main__":
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # orbax logs every restore at INFO
    with errors.reported("zoo.commands.word2vec_query"):
        main(sys.argv)
