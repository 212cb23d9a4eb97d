"""Sentence(-pair) classification on frozen pretrained token features: ELMo against static
word2vec vectors, under the same trainable head (zoo.models.elmo.FeatureClassifier).

config.features.kind picks the extractor, loaded from config.train.init_from (the pretraining
run's workdir) and kept frozen:

* 'elmo': a biLM trained by zoo.tasks.elmo (its 'bilm' params). Each token's feature is
  gamma * sum_j softmax(s)_j h_j over the biLM's layers; s and gamma train with the head.
* 'word2vec': the 'embedding' table of a zoo.tasks.word2vec run; a token's feature is its row.

The extractor's word vocabulary is rebuilt from its corpus and min_count (config.pretrained,
which must equal the pretraining run's config.data: same source, seed, synthetic_entities,
min_count) exactly as its task built it, so ids agree; a mismatch in size stops the restore
with an error. Words outside it read as <unk> (elmo) or as a zero vector (word2vec).

Data: the synthetic world's labelled sets (zoo.data.synthetic.classification: 'relation' or
'fact_check'), or GLUE-style TSV / JSON Lines files, read as zoo.tasks.classification reads
them. Each text is cut to config.data.seq_len words. Evaluation: loss, accuracy, and F1 / MCC
over the whole eval split; `baselines()` gives the majority class's accuracy.
"""

import ml_collections
import numpy as np

from zoo.contract.losses import cross_entropy_sums
from zoo.data.readers import classification
from zoo.data.readers import word2vec as w2v_data
from zoo.errors import ConfigError, DataError
from zoo.models import elmo
from zoo.models import word2vec as w2v
from zoo.tasks import elmo as elmo_task
from zoo.tasks.base import Batch, FineTuning, Task
from zoo.tasks.classifier_scoring import ClassifierScoring

_SUBTREE = {"elmo": "bilm", "word2vec": "embedding"}


def word2vec_rows(vocab: w2v_data.Vocabulary, texts: list[list[str]], seq_len: int
                  ) -> dict[str, np.ndarray]:
    """{'ids' int32 [N, seq_len], 'lengths' int32 [N]} of word2vec ids; a word outside the
    vocabulary keeps its position with id len(vocab), which reads a zero vector."""
    ids = np.zeros((len(texts), seq_len), np.int32)
    lengths = np.zeros(len(texts), np.int32)
    for i, tokens in enumerate(texts):
        row = [vocab.id(t) if t in vocab else len(vocab) for t in tokens[:seq_len]]
        ids[i, :len(row)] = row
        lengths[i] = len(row)
    return {"ids": ids, "lengths": lengths}


class FeatureClassificationTask(ClassifierScoring, Task, FineTuning):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        self.kind = config.features.kind
        if self.kind not in elmo.FEATURE_KINDS:
            raise ConfigError(f"config.features.kind must be one of {elmo.FEATURE_KINDS}, got "
                              f"{self.kind!r}")
        if not config.train.init_from:
            raise ConfigError(
                f"config.train.init_from is empty: set it to the workdir of a finished "
                f"{'configs/elmo.py' if self.kind == 'elmo' else 'configs/word2vec.py'} run, "
                "whose frozen features this task classifies")
        data, pretrained = config.data, config.pretrained
        cache_dir = self.data_cache_dir()
        train_examples = classification.load_split(data, "train", cache_dir)
        # From the whole training set, so a subset below still has every class's index.
        self.labels = classification.label_vocabulary(train_examples, data.labels)
        if data.train_examples:
            if data.train_examples < data.batch_size:
                raise ConfigError(f"config.data.train_examples={data.train_examples} must be 0 "
                                  f"(all) or at least config.data.batch_size={data.batch_size}")
            # A seeded random N (files list examples in document order): a learning-curve point.
            keep = np.random.default_rng(data.seed).permutation(len(train_examples))
            train_examples = [train_examples[i] for i in np.sort(keep[:data.train_examples])]
        self.eval_examples = classification.load_split(data, "validation", cache_dir)
        self.pair = train_examples[0]["text_b"] is not None

        documents = elmo_task.load_documents(pretrained, "train")
        model_kw = {k: v for k, v in pretrained.model.to_dict().items() if k != "size"}
        if self.kind == "elmo":
            self.vocab = elmo_task.build_vocabulary(documents, pretrained.min_count)
            bilm = elmo.config_for_size(pretrained.model.size, vocab_size=len(self.vocab),
                                        **model_kw)
            shape = {"bilm": bilm}
        else:
            self.vocab = w2v_data.build_vocabulary((s for d in documents for s in d),
                                                   pretrained.min_count)
            table = w2v.config_for_size(pretrained.model.size, vocab_size=len(self.vocab),
                                        **model_kw)
            shape = {"vocab_size": table.vocab_size, "embed_dim": table.embed_dim}
        self.train_rows = self._rows(train_examples)
        self.eval_rows = self._rows(self.eval_examples)
        head = config.head
        self.model_config = elmo.FeatureClassifierConfig(
            num_classes=len(self.labels), kind=self.kind, pair=self.pair,
            head=head.kind, hidden_size=head.hidden_size, dropout_rate=head.dropout_rate,
            layer_norm=config.features.layer_norm, **shape)
        self.model = elmo.FeatureClassifier(self.model_config)

    def _text_rows(self, texts: list[str], side: str) -> dict[str, np.ndarray]:
        """Rows of one side: at most config.data.seq_len words per text for both kinds; the
        biLM's rows add <s> / </s> around each sentence and are as wide as the longest."""
        seq_len = self.config.data.seq_len
        if self.kind == "elmo":
            rows = [elmo_task.text_row(self.vocab, t, seq_len) for t in texts]
            rows = elmo_task.pad_rows(rows, max(len(r) for r in rows))
        else:
            rows = word2vec_rows(self.vocab, [w2v_data.tokenize(t) for t in texts], seq_len)
        return {f"ids_{side}": rows["ids"], f"lengths_{side}": rows["lengths"]}

    def _rows(self, examples: list[dict]) -> dict[str, np.ndarray]:
        rows = self._text_rows([ex["text_a"] for ex in examples], "a")
        if self.pair:
            rows.update(self._text_rows([ex["text_b"] or "" for ex in examples], "b"))
        index = {label: i for i, label in enumerate(self.labels)}
        unknown = sorted({ex["label"] for ex in examples} - set(index))
        if unknown:
            raise DataError(f"labels {unknown[:5]} are not in the label list {self.labels}; "
                            "add them to config.data.labels")
        rows["label"] = np.asarray([index[ex["label"]] for ex in examples], np.int32)
        rows["example_weight"] = np.ones(len(examples), np.float32)
        return rows

    def pretrained_subtree(self) -> str:
        return _SUBTREE[self.kind]

    def frozen_subtrees(self) -> tuple[str, ...]:
        return (_SUBTREE[self.kind],)

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def model_inputs(self, batch: Batch) -> dict:
        return {k: batch[k] for k in ("ids_a", "lengths_a", "ids_b", "lengths_b") if k in batch}

    def loss_fn(self, params, batch, rng, train: bool):
        logits = self.model.apply({"params": params}, **self.model_inputs(batch),
                                  deterministic=not train,
                                  rngs={"dropout": rng} if train else {})
        sums = cross_entropy_sums(logits, batch["label"], batch["example_weight"])
        return {k: sums[k] for k in ("loss_sum", "correct_sum", "weight_sum")}

    def predict(self, params, batch):
        return {"logits": self.model.apply({"params": params}, **self.model_inputs(batch))}

    def tokens_per_batch(self) -> int:
        return self.config.data.batch_size * self.config.data.seq_len * (1 + self.pair)
