"""benchmarks.quality_bert: the WordPiece vocabulary both sides read, the same-batches pair's
parts, and (acceptance) a test-sized run of the pair: zoo's tiny BERT and Hugging Face's
BertForPreTraining fed the same prepared batches must end within noise of each other."""

import pytest

from benchmarks import quality_bert
from configs import bert_pretrain
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TEXT = ("The jury said the election was conducted well .\n"
        "It was a hard-fought primary , won by the mayor .\n\n"
        "To be , or not to be : that is the question .\n") * 20


def test_wordpiece_vocabulary_is_bert_shaped_and_read_by_zoo(tmp_path):
    corpus = tmp_path / "train.txt"
    corpus.write_text(TEXT)
    vocab = quality_bert.train_wordpiece([str(corpus)], str(tmp_path), 120)
    lines = open(vocab).read().split("\n")
    assert lines[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = WordPieceTokenizer.from_vocab_file(vocab, lowercase=True)
    ids = tokenizer.encode("The jury said")
    assert tokenizer.unk_id not in ids and tokenizer.decode(ids) == "the jury said"
    # Trained once: a second call with the same size reads what is there.
    assert quality_bert.train_wordpiece([str(corpus)], str(tmp_path), 120) == vocab


def test_brown_config_reads_the_vocabulary_and_runs_the_recipe_for_the_steps_given(tmp_path):
    config = quality_bert.bert_config("corpora", str(tmp_path), "v/vocab.txt", steps=700, seed=3)
    assert config.data.train_files.endswith("brown/train.txt")
    assert config.data.tokenizer == "v/vocab.txt"
    assert config.train.steps == config.optim.total_steps == 700  # decay ends with the run
    assert config.train.seed == 3


@pytest.mark.acceptance
def test_same_batches_pair_ends_within_noise(tmp_path):
    """Tiny BERT on the embedded corpus, 300 steps, zoo and the peer in turns on the same
    batches. With zoo's old lecun_normal kernels the two started apart (the fast-tier init
    test); here the whole training must agree: zoo's MLM loss within 0.1 of the peer's after
    both moved well away from the first evaluation's (ln 512 = 6.24)."""
    config = bert_pretrain.get_config("size=tiny")
    config.data.synthetic_entities = 300
    config.data.vocab_size = 512
    config.data.cache_dir = str(tmp_path / "data")
    config.train.steps = 300
    out = quality_bert.run_pair(config, str(tmp_path), eval_every=100, curve_batches=4,
                                log=lambda line: None)
    zoo, peer = out["zoo"], out["peer"]
    finals = {"zoo": zoo["final"], "peer": peer["final"]}
    assert zoo["params"] == peer["params"]
    for side in (zoo, peer):  # ln(512) = 6.24 at the start; ~5.3 after 300 steps
        assert side["curve"][0][1]["mlm_loss"] - side["final"]["mlm_loss"] > 0.6, finals
    assert zoo["final"]["mlm_loss"] < peer["final"]["mlm_loss"] + 0.1, finals
    assert zoo["final"]["mlm_accuracy"] > peer["final"]["mlm_accuracy"] - 0.02, finals
