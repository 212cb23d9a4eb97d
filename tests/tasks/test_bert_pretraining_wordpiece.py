"""BERT pretraining on a user's WordPiece vocab.txt (--config.data.tokenizer), from the command
line: the prepared examples speak that vocabulary, the run trains and eval.py reproduces it, and
a broken vocab.txt is one error naming the file."""

import glob
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from configs import bert_pretrain
from tests.process_env import process_env
from zoo.data.pipelines.pretraining import PretrainingSource
from zoo.data.readers import sources
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 4
# A small synthetic world, as in tests/tasks/test_bert_pretraining.py.
SMALL_DATA = ["--config.data.synthetic_entities=200", "--config.data.dupe_factor=1"]
# BERT's layout: [PAD] first, unused slots, then the specials at ids a SentencePiece model
# trained here never gives them (it fixes unk=1, [CLS]=4, [SEP]=5, [MASK]=6).
HEAD = ["[PAD]"] + [f"[unused{i}]" for i in range(10)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]
CLS_ID, SEP_ID, MASK_ID = 12, 13, 14


def _documents(split):
    config = bert_pretrain.get_config("size=tiny")
    config.data.synthetic_entities = 200
    return sources.load_documents(config.data, split)


def _vocabulary() -> list[str]:
    """Every corpus word of up to 6 characters whole; longer words only as their first three
    characters + a '##' rest, so WordPiece must split them; single characters and '##'
    characters as BERT's vocabularies have them (nothing falls back to [UNK])."""
    words = set()
    for split in ("train", "validation"):
        for doc in _documents(split):
            for sentence in doc:
                words.update(re.findall(r"\w+|[^\w\s]", sentence.lower()))
    chars = sorted({c for w in words for c in w})
    long_words = {w for w in words if len(w) > 6}
    pieces = {w[:3] for w in long_words} | {"##" + w[3:] for w in long_words}
    body = chars + ["##" + c for c in chars] + sorted((words - long_words) | pieces)
    return list(dict.fromkeys(HEAD + body))


def _write(path, lines):
    with open(path, "w", encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in lines))
    return str(path)


def _run(script, *args, check=True):
    env = process_env(1)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"{script} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-4000:]}")
    return proc


def _args(root, vocab):
    return ["--config=configs/bert_pretrain.py:size=tiny", f"--workdir={root / 'run'}",
            f"--config.data.cache_dir={root / 'cache'}", f"--config.data.tokenizer={vocab}",
            f"--config.train.steps={STEPS}", "--config.train.log_every=2",
            "--config.train.tensorboard=False", *SMALL_DATA]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("wordpiece")
    vocab = _vocabulary()
    path = _write(root / "vocab.txt", vocab)
    proc = _run("train.py", *_args(root, path))
    return root, path, vocab, proc.stdout


@pytest.mark.slow
def test_the_vocabulary_covers_the_corpus_with_split_words(run):
    _, path, vocab, _ = run
    lines = open(path, encoding="utf-8").read().splitlines()
    assert [lines[i] for i in (CLS_ID, SEP_ID, MASK_ID)] == ["[CLS]", "[SEP]", "[MASK]"]
    tokenizer = WordPieceTokenizer.from_vocab_file(path)
    assert (tokenizer.cls_id, tokenizer.sep_id, tokenizer.mask_id) == (CLS_ID, SEP_ID, MASK_ID)
    ids = [i for doc in _documents("validation") for s in doc for i in tokenizer.encode(s)]
    assert tokenizer.unk_id not in ids  # the checks below see real pieces, never [UNK]
    assert any(vocab[i].startswith("##") for i in ids)


@pytest.mark.slow
def test_prepared_examples_use_the_vocabulary_ids(run):
    root, path, vocab, _ = run
    tokenizer = WordPieceTokenizer.from_vocab_file(path)
    # Every validation document as its WordPiece ids, to find each segment in.
    docs = [" " + " ".join(str(i) for s in doc for i in tokenizer.encode(s)) + " "
            for doc in _documents("validation")]
    (cache,) = glob.glob(str(root / "cache" / "validation-*"))  # statically masked
    source = PretrainingSource(cache)
    assert source.masking.vocab_size == len(vocab) and source.masking.mask_id == MASK_ID
    assert len(source) > 10
    masked_inputs, continuations = [], 0
    for index in range(len(source)):
        row = source[index]
        ids, types = row["input_ids"], row["token_type_ids"]
        n = int(row["attention_mask"].sum())
        b_start = int(np.argmax(types[:n]))  # [CLS] A [SEP] | B [SEP]
        assert ids[0] == CLS_ID and ids[b_start - 1] == SEP_ID and ids[n - 1] == SEP_ID
        assert not np.any(ids[n:])  # [PAD] = 0 after the pair
        weights = row["masked_lm_weights"] > 0
        positions = row["masked_lm_positions"][weights]
        # [MASK]'s id appears exactly at masked positions (80% of them), never elsewhere.
        masked_inputs.extend(ids[positions])
        assert set(np.flatnonzero(ids == MASK_ID)) <= set(positions)
        # The original text restored: each segment is a contiguous run of one document's
        # WordPiece ids (truncation only trims the ends).
        original = ids.copy()
        original[positions] = row["masked_lm_ids"][weights]
        for segment in (original[1:b_start - 1], original[b_start:n - 1]):
            assert segment.size and " " + " ".join(map(str, segment)) + " " in "".join(docs)
            continuations += sum(vocab[i].startswith("##") for i in segment)
    assert continuations > 0  # decoded pieces include WordPiece '##' continuations
    share = np.mean(np.asarray(masked_inputs) == MASK_ID)
    assert len(masked_inputs) > 100 and 0.65 <= share <= 0.92, share


@pytest.mark.slow
def test_training_finishes_and_eval_reproduces_the_summary(run):
    root, path, _, stdout = run
    assert f"step {STEPS:>6}/{STEPS}" in stdout
    summary = json.load(open(root / "run" / "summary.json"))
    proc = _run("eval.py", *_args(root, path))
    result = json.load(open(root / "run" / "eval.json"))
    for key in ("mlm_accuracy", "nsp_accuracy"):
        assert 0.0 <= summary[key] <= 1.0
        assert result[key] == pytest.approx(summary[key], rel=1e-6), key
    assert "mlm_accuracy" in proc.stdout


@pytest.mark.parametrize("lines,message", [
    ([t for t in HEAD if t != "[MASK]"] + ["the", "city"],
     "lacks the special token(s) [MASK]"),
    ([], "is empty"),
    (["[UNK]", "[PAD]", "[CLS]", "[SEP]", "[MASK]", "the"], "[PAD]"),
], ids=["no-mask", "empty", "pad-not-first"])
@pytest.mark.slow
def test_a_broken_vocab_txt_is_one_error_naming_the_file(tmp_path, lines, message):
    path = _write(tmp_path / "vocab.txt", lines)
    proc = _run("train.py", *_args(tmp_path, path), check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and path in error and message in error, error
