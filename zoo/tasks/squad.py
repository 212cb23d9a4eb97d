"""SQuAD-style span extraction (v1.1 and v2.0) with BertForQuestionAnswering.

Training: cross-entropy of the start and of the end position over each window's tokens (the
[CLS] position when the window misses the answer or the question is unanswerable), averaged.
Evaluation: the loop's eval loss plus the official EM/F1 after BERT's post-processing, with
predictions.json / nbest_predictions.json / null_odds.json, which the evaluation writes to
<workdir>/predictions.
"""

import json

import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo import paths
from zoo.contract.losses import cross_entropy_sums
from zoo.data.pipelines import squad_prepared
from zoo.data.readers import data_source, squad
from zoo.data.tokenizers import prepared as saved_tokenizer
from zoo.errors import ConfigError, MissingFileError
from zoo.eval import squad_metrics, squad_postprocess
from zoo.models import bert
from zoo.tasks import bert_encoder
from zoo.tasks.base import (Batch, FineTuning, Measured, Predicting, Scored, Task,
                            data_cache_dir)

_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


# What shapes prepared features, as config.data keys: a prepared directory must match them all.
_PREPARED_KEYS = ("source", "version", "seed", "synthetic_entities", "train_file", "eval_file",
                  "seq_len", "doc_stride", "max_query_length")


def _prepared_settings(data: ml_collections.ConfigDict) -> dict:
    """The _PREPARED_KEYS of config.data, the source checked."""
    return dict({k: data[k] for k in _PREPARED_KEYS}, source=data_source.source_of(data))



def _tokenizer_file(config: ml_collections.ConfigDict, cache_dir: str) -> tuple[str, bytes]:
    """(name, bytes) of the tokenizer file bert_encoder.tokenizer loaded: config.data.tokenizer,
    the pretrained directory's vocab.txt, or the SentencePiece model trained into cache_dir."""
    data = config.data
    directory = bert_encoder.pretrained_directory(config)
    if data.tokenizer:
        path = paths.as_path(data.tokenizer)
    elif directory:
        path = paths.as_path(directory) / "vocab.txt"
    else:
        path = paths.as_path(cache_dir) / f"spm-{data.tokenizer_type}-{data.vocab_size}.model"
    if path.is_dir():
        raise ConfigError(f"config.data.tokenizer={data.tokenizer!r} is a directory; prepared "
                          "features take a tokenizer file (a .model or a vocab.txt)")
    return path.name, path.read_bytes()


def prepare_data(config: ml_collections.ConfigDict, workdir: str, directory: str) -> dict:
    """Featurizes both splits once into `directory` (zoo.data.pipelines.squad_prepared) for
    `python -m zoo.commands.prepare`; returns the saved settings (with the window counts)."""
    data = config.data
    cache_dir = data_cache_dir(config, workdir)
    _, train, eval_features, eval_examples = _featurize(config, cache_dir)
    root = paths.as_path(directory)
    name, content = _tokenizer_file(config, cache_dir)
    saved_tokenizer.save(root / "tokenizer", name, content, data.get("lowercase", True))
    settings = _prepared_settings(data)
    return squad_prepared.write(root, settings, train, eval_features, eval_examples)


def _featurize(config: ml_collections.ConfigDict, cache_dir: str):
    """(tokenizer, train windows, eval windows, eval examples) from the config's data: the
    tokenizer from the train contexts and questions (bert_encoder.tokenizer), both splits
    featurized with labels (the eval windows are identical either way; labels give eval loss)."""
    data = config.data
    train_examples = squad.load_split(data, "train", cache_dir)
    eval_examples = squad.load_split(data, "validation", cache_dir)
    texts = (sorted({ex["context"] for ex in train_examples})
             + [ex["question"] for ex in train_examples])
    tokenizer = bert_encoder.tokenizer(config, cache_dir, texts)
    window = dict(max_seq_length=data.seq_len, doc_stride=data.doc_stride,
                  max_query_length=data.max_query_length, is_training=True)
    return (tokenizer, squad.featurize(train_examples, tokenizer, **window),
            squad.featurize(eval_examples, tokenizer, **window), eval_examples)


def _open_prepared(data: ml_collections.ConfigDict):
    root = paths.as_path(data.prepared_dir)
    if not squad_prepared.finished(root):
        raise MissingFileError(
            f"config.data.prepared_dir={data.prepared_dir!r} holds no finished preparation "
            f"({root / squad_prepared.SETTINGS} is missing); run `python -m "
            "zoo.commands.prepare` with this config first (or set config.data.prepared_dir='')")
    settings, train, validation, examples = squad_prepared.read(root)
    want = _prepared_settings(data)
    differ = [f"config.data.{k}={data[k]!r} (prepared with {settings.get(k)!r})"
              for k in _PREPARED_KEYS if settings.get(k) != want[k]]
    if differ:
        raise ConfigError(
            f"config.data.prepared_dir={data.prepared_dir!r} was prepared with other settings: "
            f"{'; '.join(differ)}. Set those keys as prepared, or prepare again into another "
            "directory with this config")
    saved_tokenizer.check_given(data, root / "tokenizer")
    return saved_tokenizer.load(root / "tokenizer"), train, validation, examples


class SquadTask(Task, Predicting, FineTuning, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        if data.get("prepared_dir", ""):
            # Prepared by `python -m zoo.commands.prepare`: read, never featurized again.
            self.tokenizer, train, self.eval_features, self.eval_examples = \
                _open_prepared(data)
        else:
            self.tokenizer, train, self.eval_features, self.eval_examples = _featurize(
                config, self.data_cache_dir())
        self.train_rows = self._rows(train)
        self.eval_rows = self._rows(self.eval_features)
        self.model_config = bert_encoder.encoder_config(config, self.tokenizer.vocab_size)
        self.model = bert.BertForQuestionAnswering(self.model_config)

    @staticmethod
    def _rows(features: dict) -> dict[str, np.ndarray]:
        rows = {k: features[k] for k in _INPUTS + ("start_positions", "end_positions")}
        rows["example_weight"] = np.ones(len(features["input_ids"]), np.float32)
        return rows

    def pretrained_subtree(self) -> str:
        return "bert"  # a pretraining checkpoint's encoder; the span head starts fresh

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def model_inputs(self, batch: Batch) -> dict:
        return {k: batch[k] for k in _INPUTS}

    def _logits(self, params, batch, rng, train):
        start, end = self.model.apply({"params": params}, **self.model_inputs(batch),
                                      deterministic=not train,
                                      rngs={"dropout": rng} if train else {})
        # Padding positions are never answers.
        valid = batch["attention_mask"] > 0
        return jnp.where(valid, start, -1e9), jnp.where(valid, end, -1e9)

    def loss_fn(self, params, batch, rng, train: bool):
        start, end = self._logits(params, batch, rng, train)
        s = cross_entropy_sums(start, batch["start_positions"], batch["example_weight"])
        e = cross_entropy_sums(end, batch["end_positions"], batch["example_weight"])
        return {"loss_sum": (s["loss_sum"] + e["loss_sum"]) / 2, "weight_sum": s["weight_sum"],
                "start_correct_sum": s["correct_sum"], "end_correct_sum": e["correct_sum"]}

    def predict(self, params, batch):
        start, end = self._logits(params, batch, None, False)
        return {"start_logits": start, "end_logits": end}

    def summarize(self, sums):
        n = max(sums["weight_sum"], 1.0)
        return {"loss": sums["loss_sum"] / n, "start_accuracy": sums["start_correct_sum"] / n,
                "end_accuracy": sums["end_correct_sum"] / n}

    def score_predictions(self, outputs: dict[str, np.ndarray]) -> Scored:
        """Official EM/F1 of the eval split from the window logits, and the official files
        (predictions.json, nbest_predictions.json, null_odds.json for v2.0, metrics.json)."""
        n = len(self.eval_features["input_ids"])
        version_2 = self.config.data.version == "2.0"
        predictions, nbest, null_odds = squad_postprocess.postprocess(
            self.eval_examples, self.eval_features, outputs["start_logits"][:n],
            outputs["end_logits"][:n], n_best_size=self.config.eval.n_best_size,
            max_answer_length=self.config.eval.max_answer_length, version_2=version_2,
            null_score_diff_threshold=self.config.eval.null_score_diff_threshold)
        dataset = _as_dataset(self.eval_examples)
        metrics = squad_metrics.evaluate(dataset, predictions, na_probs=null_odds if version_2
                                      else None, version="2.0" if version_2 else "1.1")
        files = dict(squad_postprocess.prediction_files(
            predictions, nbest, null_odds if version_2 else None).values())
        files["metrics.json"] = json.dumps(metrics, indent=2)
        return Scored({k: float(v) for k, v in metrics.items()}, files)

    def tokens_per_batch(self) -> int:
        return self.config.data.batch_size * self.config.data.seq_len

    def flops_per_token(self) -> float:
        return bert.flops_per_token(self.model_config, self.config.data.seq_len, 0)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        return bert.activation_bytes(self.model_config, per_device_batch,
                                     self.config.data.seq_len, 0, tensor_parallel)


def _as_dataset(examples: list[dict]) -> list[dict]:
    """The official `data` list rebuilt from loaded examples (those the loader kept)."""
    return [{"title": "", "paragraphs": [{"context": ex["context"], "qas": [{
        "id": ex["id"], "question": ex["question"], "answers": ex["answers"],
        "is_impossible": ex["is_impossible"]}]}]} for ex in examples]
