"""Sentence and sentence-pair classification (GLUE-style) with BertForSequenceClassification,
under the three fine-tuning strategies of the lecture notes from NNLM to BERT
(config.finetune.strategy):

* 'full': every parameter trains (the BERT paper's fine-tuning).
* 'frozen': the encoder is fixed (no gradient flows into it, no dropout in it, no optimizer
  state for it) and only the classifier on its pooled [CLS] vector trains.
* 'features': feature extraction. The frozen encoder's pooled vectors are computed once, before
  the first step (Task.prepare), and the classifier trains on them; a step costs only the head.
  Mathematically the same as 'frozen', at a fraction of the compute.

Data: the synthetic world's labelled sets (zoo.data.synthetic.classification), written as TSV
and read back through the same loader as a user's GLUE-style TSV / JSON Lines files.
Evaluation: loss and accuracy, plus accuracy / F1 / Matthews correlation over the whole eval
split, with <workdir>/predictions/predictions.tsv.
"""


import jax
import ml_collections
import numpy as np

from zoo.contract.losses import cross_entropy_sums
from zoo.data.pipelines import batching
from zoo.data.readers import classification
from zoo.errors import ConfigError
from zoo.models import bert
from zoo.tasks import bert_encoder
from zoo.tasks.base import Batch, FineTuning, Measured, Task
from zoo.tasks.classifier_scoring import ClassifierScoring

STRATEGIES = ("full", "frozen", "features")
_INPUTS = ("input_ids", "token_type_ids", "attention_mask")


class ClassificationTask(ClassifierScoring, Task, FineTuning, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        self.strategy = config.finetune.strategy
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"config.finetune.strategy must be one of {STRATEGIES}, got "
                              f"{self.strategy!r}")
        data = config.data
        cache_dir = self.data_cache_dir()
        train_examples = classification.load_split(data, "train", cache_dir)
        self.eval_examples = classification.load_split(data, "validation", cache_dir)
        self.labels = classification.label_vocabulary(train_examples, data.labels)
        texts = [t for ex in train_examples for t in (ex["text_a"], ex["text_b"]) if t]
        self.tokenizer = bert_encoder.tokenizer(config, cache_dir, texts)
        self.train_rows = self._rows(train_examples)
        self.eval_rows = self._rows(self.eval_examples)
        self.model_config = bert_encoder.encoder_config(config, self.tokenizer.vocab_size)
        self.model = bert.BertForSequenceClassification(
            self.model_config, len(self.labels), dropout_rate=config.finetune.classifier_dropout)
        self._features: dict[str, np.ndarray] | None = None  # 'features' strategy, by split

    def _rows(self, examples: list[dict]) -> dict[str, np.ndarray]:
        features = classification.featurize(examples, self.tokenizer, self.config.data.seq_len,
                                             self.labels)
        rows = {k: features[k] for k in _INPUTS + ("label",)}
        rows["example_weight"] = np.ones(len(examples), np.float32)
        rows["row"] = np.arange(len(examples), dtype=np.int32)  # into the extracted features
        return rows

    def pretrained_subtree(self) -> str:
        return "bert"

    def frozen_subtrees(self) -> tuple[str, ...]:
        return () if self.strategy == "full" else ("bert",)

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def model_inputs(self, batch: Batch) -> dict:
        return {k: batch[k] for k in _INPUTS}

    # ---- the three strategies --------------------------------------------------------------

    def prepare(self, params) -> None:
        """'features': runs the frozen encoder once over both splits."""
        if self.strategy != "features":
            return
        encode = jax.jit(lambda p, b: self.model.apply(
            {"params": p}, **self.model_inputs(b), method="encode", deterministic=True))
        batch_size = self.config.data.eval_batch_size
        self._features = {}
        for split, rows in (("train", self.train_rows), ("validation", self.eval_rows)):
            pooled = [np.asarray(encode(params, b), np.float32)
                      for b in batching.eval_batches(rows, batch_size)]
            self._features[split] = np.concatenate(pooled)[: len(rows["row"])]  # (N, H)
        if jax.process_index() == 0:
            print(f"extracted encoder features: {len(self.train_rows['row']):,} train and "
                  f"{len(self.eval_rows['row']):,} eval examples", flush=True)

    def _with_features(self, batch: Batch, split: str) -> Batch:
        if self._features is None:
            raise RuntimeError("the 'features' strategy draws batches only after prepare(params)")
        return {"features": self._features[split][batch["row"]], "label": batch["label"],
                "example_weight": batch["example_weight"]}

    def _logits(self, params, batch, rng, train):
        rngs = {"dropout": rng} if train else {}
        if self.strategy == "full":
            return self.model.apply({"params": params}, **self.model_inputs(batch),
                                    deterministic=not train, rngs=rngs)
        if self.strategy == "frozen":
            # A fixed feature extractor: no gradient into it and no dropout inside it.
            encoder_params = {"bert": jax.lax.stop_gradient(params["bert"])}
            pooled = self.model.apply({"params": encoder_params}, **self.model_inputs(batch),
                                      method="encode", deterministic=True)
        else:
            pooled = batch["features"]
        return self.model.apply({"params": params}, pooled, method="classify",
                                deterministic=not train, rngs=rngs)

    # ---- loss and metrics ------------------------------------------------------------------

    def loss_fn(self, params, batch, rng, train: bool):
        logits = self._logits(params, batch, rng, train)
        sums = cross_entropy_sums(logits, batch["label"], batch["example_weight"],
                                  label_smoothing=self.config.train.label_smoothing if train
                                  else 0.0)
        return {k: sums[k] for k in ("loss_sum", "correct_sum", "weight_sum")}

    def predict(self, params, batch):
        return {"logits": self._logits(params, batch, None, False)}

    # ---- data ------------------------------------------------------------------------------

    def train_batches(self, process_index: int, process_count: int):
        transform = ((lambda b: self._with_features(b, "train"))
                     if self.strategy == "features" else None)
        return batching.train_iterator(self.train_rows, self.config.data.batch_size,
                                       self.config.data.seed, process_index, process_count,
                                       transform=transform)

    def eval_batches(self, process_index: int, process_count: int):
        batches = batching.eval_batches(self.eval_rows, self.config.data.eval_batch_size,
                                        process_index, process_count)
        if self.strategy == "features":
            return [self._with_features(b, "validation") for b in batches]
        return batches

    def tokens_per_batch(self) -> int:
        return self.config.data.batch_size * self.config.data.seq_len

    def flops_per_token(self) -> float:
        full = bert.flops_per_token(self.model_config, self.config.data.seq_len, 0)
        # Frozen: the encoder runs forward only (1 of the 3 units of forward + backward);
        # features: only the head runs, so MFU is not meaningful.
        return {"full": full, "frozen": full / 3, "features": 0.0}[self.strategy]

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        if self.strategy != "full":
            return 0.0  # no backward pass through the encoder
        return bert.activation_bytes(self.model_config, per_device_batch,
                                     self.config.data.seq_len, 0, tensor_parallel)
