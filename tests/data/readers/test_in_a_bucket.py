"""Data and tokenizer files a config names read the same from a bucket (a real GCS-API server on
127.0.0.1, the `gcs` fixture) as from a local disk: TFDS array_record datasets, SQuAD JSON,
BERT-format text, WordPiece vocabularies and cached SentencePiece models."""

import json

import fsspec
import pytest

from tests.data.readers.test_sources import ZooTinyText, _cfg, _prepare
from zoo import paths
from zoo.data.readers import squad, text_files, tfds_source
from zoo.data.tokenizers import base as tokenizers


def _upload(local: str, remote: str) -> None:
    fsspec.filesystem("gs").put(local, remote.removeprefix("gs://"), recursive=True)


def test_a_tfds_dataset_in_a_bucket_reads_like_the_local_copy(gcs_bucket, tmp_path):
    local = str(tmp_path / "tfds")
    _prepare(ZooTinyText, local)
    _upload(local, f"{gcs_bucket}/tfds")
    for split in ("train", "test"):
        from_bucket = tfds_source.load_documents(_cfg(tfds_data_dir=f"{gcs_bucket}/tfds"), split)
        assert from_bucket and from_bucket == tfds_source.load_documents(
            _cfg(tfds_data_dir=local), split)
    with pytest.raises(FileNotFoundError, match=r"'zoo_tiny_text' .* is not prepared in "
                                                r"'gs://.*/elsewhere'"):
        tfds_source.load_documents(_cfg(tfds_data_dir=f"{gcs_bucket}/elsewhere"), "train")


def test_squad_json_and_bert_text_in_a_bucket(gcs_bucket, tmp_path):
    dataset = {"version": "v2.0", "data": [{"title": "t", "paragraphs": [{
        "context": "Paris is in France.",
        "qas": [{"id": "q1", "question": "Where is Paris?", "is_impossible": False,
                 "answers": [{"text": "France", "answer_start": 12}]},
                {"id": "q2", "question": "Where is Rome?", "is_impossible": True,
                 "answers": []}]}]}]}
    local = tmp_path / "dev.json"
    local.write_text(json.dumps(dataset))
    remote = f"{gcs_bucket}/squad/dev.json"
    paths.write_atomic(remote, local.read_bytes())
    assert squad.load_squad(remote) == squad.load_squad(str(local))
    assert len(squad.load_squad(remote)) == 2
    with pytest.raises(FileNotFoundError, match=r"SQuAD file gs://.*/squad/nope\.json does not"):
        squad.load_squad(f"{gcs_bucket}/squad/nope.json")

    documents = [["One sentence.", "Two sentences."], ["Another document."]]
    text_files.write_text_corpus(f"{gcs_bucket}/corpus.txt", documents)
    assert text_files.read_text_corpus(f"{gcs_bucket}/corpus.txt") == documents


def test_tokenizers_load_from_and_cache_into_a_bucket(gcs_bucket):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "paris", "is", "in", "france", "."]
    paths.write_atomic(f"{gcs_bucket}/wp/vocab.txt", "\n".join(vocab) + "\n")
    wordpiece = tokenizers.load_tokenizer(f"{gcs_bucket}/wp")  # the directory, found by epath
    assert wordpiece.vocab_size == len(vocab)

    sentences = ["paris is in france .", "rome is in italy .", "the sea is blue ."] * 20
    model = f"{gcs_bucket}/cache/spm.model"
    trained = tokenizers.load_or_train(model, lambda: iter(sentences), vocab_size=40)
    assert paths.as_path(model).exists()

    def no_retraining():
        raise AssertionError("the cached model in the bucket should have been loaded")

    cached = tokenizers.load_or_train(model, no_retraining, vocab_size=40)
    assert cached.vocab_size == trained.vocab_size
    assert cached.encode("paris is in italy .") == trained.encode("paris is in italy .")
