"""GPT fine-tuning on classification (Radford et al. 2018, section 3.3): the pretrained decoder,
the task's input written as one token sequence, a linear head on its [extract] state, and the
language-modelling loss kept as an auxiliary objective.

Objective, per batch (config.finetune.lm_weight = lambda, 0.5 as in the paper; 0 disables):

    loss = mean over examples of  CE(label | x)  +  lambda * LM(x)

LM(x) is the example's mean next-token negative log-likelihood over its text tokens: every
position whose NEXT token is a token of the text ([start] predicts the first word, [delim] the
first word of the second text); the special tokens and padding are never targets. Taking the
per-example mean (as OpenAI's finetune-transformer-lm does) keeps lambda's meaning independent
of the text length, and the objective stays a sum over examples divided by their number, so
sharding and gradient accumulation leave it exact. Reported as loss, cls_loss and lm_loss.

Inputs (zoo.models.gpt_classifier): single texts `[start] a [extract]`, pairs
`[start] a [delim] b [extract]`, multiple choice one `[start] context [delim] option [extract]`
row per option with a softmax over the options. Data: the synthetic world's labelled sets (the
same files and splits as zoo.tasks.classification, so accuracies compare with BERT's), the
synthetic multiple-choice set (zoo.data.synthetic.multiple_choice), or a user's GLUE-style
TSV / JSONL.

Initialisation (config.train.init_from): a zoo GPT language-model workdir (its latest
checkpoint fills the `gpt` subtree; the tokenizer is the one that run trained, found in
<init_from>/data or named by config.data.tokenizer), or a Hugging Face GPT-2 directory
(config.json + weights; its vocab.json + merges.txt are the tokenizer). Without init_from the
GPT starts from scratch: the paper's "no pre-training" ablation.
"""

import logging

import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo import paths
from zoo.checkpoints import checkpoint
from zoo.contract.losses import cross_entropy_sums
from zoo.convert import gpt2 as gpt2_convert
from zoo.data.readers import classification, data_source, multiple_choice
from zoo.data.tokenizers import base as tokenizers
from zoo.errors import ConfigError, DataError
from zoo.models import gpt, gpt_classifier
from zoo.models.runtime_fields import run_choices
from zoo.tasks import bert_encoder
from zoo.tasks.base import Batch, FineTuning, Task
from zoo.tasks.classifier_scoring import ClassifierScoring

_MULTIPLE_CHOICE = "multiple_choice"
_log = logging.getLogger(__name__)


def _truncate(parts: list[list[int]], budget: int) -> bool:
    """Shortens the longest of `parts` one token at a time until they fit `budget` tokens
    (BERT's _truncate_seq_pair); returns whether anything was cut."""
    cut = False
    while sum(map(len, parts)) > budget:
        max(parts, key=len).pop()
        cut = True
    return cut


def transform_inputs(texts: list[list[list[int]]], seq_len: int, vocab_size: int,
                     start_id: int, pad_id: int) -> dict[str, np.ndarray]:
    """The paper's input transformations, on token ids.

    Args:
      texts: per row, its one or two token lists (text, or the pair / context and option).
      seq_len: row length T; longer rows are cut longest-part-first.
      vocab_size: V of the GPT: [delim] is id V, [extract] V + 1.
      start_id: the tokenizer's beginning-of-text id.
      pad_id: filler after [extract].

    Returns:
      tokens [R, T] int32; lm_text [R, T] bool: the next token is text, so a language-model
      target; lm_targets [R, T] int32: that next token where lm_text, else pad_id; truncated
      [R] bool.
    """
    rows = len(texts)
    tokens = np.full((rows, seq_len), pad_id, np.int32)
    is_text = np.zeros((rows, seq_len), np.bool_)
    truncated = np.zeros(rows, np.bool_)
    delimiter = gpt_classifier.delimiter_id(vocab_size)
    extract = gpt_classifier.extract_id(vocab_size)
    for r, parts in enumerate(texts):
        parts = [list(p) for p in parts]
        truncated[r] = _truncate(parts, seq_len - len(parts) - 1)
        row, text = [start_id], [False]
        for i, part in enumerate(parts):
            if i:
                row.append(delimiter)
                text.append(False)
            row.extend(part)
            text.extend([True] * len(part))
        row.append(extract)
        text.append(False)
        tokens[r, :len(row)] = row
        is_text[r, :len(row)] = text
    # Position t predicts token t + 1; the last position has no next token. Non-targets read
    # pad_id: [delim] / [extract] lie outside the V logits (a gather there would give NaN).
    lm_text = np.concatenate([is_text[:, 1:], np.zeros((rows, 1), np.bool_)], axis=1)
    lm_targets = np.where(lm_text, np.roll(tokens, -1, axis=1), pad_id).astype(np.int32)
    return {"tokens": tokens, "lm_targets": lm_targets, "lm_text": lm_text,
            "truncated": truncated}


def finetune_loss_sums(logits, lm_logits, batch, lm_weight: float,
                       label_smoothing: float = 0.0) -> dict[str, jnp.ndarray]:
    """The fine-tuning objective as sums over the batch's examples (see the module docstring).

    Args:
      logits: [B, C] class (or option) logits; lm_logits [B, (K,) T, V].
      batch: label [B] int, example_weight [B] (0 for padding rows), lm_targets [B, (K,) T],
        lm_weights [B, (K,) T]: 1 / (the example's text-token count) at its targets, else 0.
      lm_weight: lambda.
      label_smoothing: on the class cross-entropy only.

    Returns:
      loss_sum = cls_loss_sum + lambda * lm_loss_sum, weight_sum (examples), correct_sum.
    """
    cls = cross_entropy_sums(logits, batch["label"], batch["example_weight"],
                             label_smoothing=label_smoothing)
    lm = cross_entropy_sums(lm_logits, batch["lm_targets"], batch["lm_weights"])
    return {"loss_sum": cls["loss_sum"] + lm_weight * lm["loss_sum"],
            "cls_loss_sum": cls["loss_sum"], "lm_loss_sum": lm["loss_sum"],
            "correct_sum": cls["correct_sum"], "weight_sum": cls["weight_sum"]}


def _is_pretrained_directory(path: str) -> bool:
    return bool(path) and (paths.as_path(path) / "config.json").is_file()


def _workdir_tokenizer(workdir: str) -> str:
    """The SentencePiece model a zoo LM run in `workdir` trained (cached in <workdir>/data)."""
    directory = paths.join(workdir, "data")
    found = paths.as_path(directory)
    models = sorted(p.name for p in found.iterdir() if p.name.endswith(".model")) \
        if found.is_dir() else []
    if len(models) != 1:
        raise ConfigError(
            f"config.train.init_from={workdir!r}: found {len(models)} tokenizer models in "
            f"{directory} ({models}); the fine-tuning text must be tokenized as the language "
            "model's was: set config.data.tokenizer to the .model file of that run (in its "
            "config.data.cache_dir, by default <workdir>/data)")
    return paths.join(directory, models[0])


def _checkpoint_shapes(workdir: str) -> dict[str, tuple[int, ...]]:
    """{'wte': (V, D), 'wpe': (P, D)} of a zoo GPT run's latest checkpoint ({} if unreadable:
    the restore itself then reports what does not fit)."""
    saved = checkpoint.latest_param_shapes(workdir)
    keys = {k: f"['{k}']['embedding']" for k in ("wte", "wpe")}
    return {k: saved[key] for k, key in keys.items()} if all(
        key in saved for key in keys.values()) else {}


class GPTClassificationTask(ClassifierScoring, Task, FineTuning):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        self.lm_weight = float(config.finetune.lm_weight)
        if self.lm_weight < 0:
            raise ConfigError(f"config.finetune.lm_weight must be >= 0, got {self.lm_weight}")
        synthetic = data_source.source_of(data, data_source.SOURCES[:2]) == data_source.SYNTHETIC
        self.multiple_choice = (data.synthetic_task == _MULTIPLE_CHOICE if synthetic
                                else bool(data.get("choices", "")))
        cache_dir = self.data_cache_dir()
        train_examples = self._load(data, "train", cache_dir)
        self.eval_examples = self._load(data, "validation", cache_dir)
        if self.multiple_choice:
            # The label is the index of the right option; every example has the same count.
            k = len(train_examples[0]["options"])
            odd = next((ex for ex in train_examples + self.eval_examples
                        if len(ex["options"]) != k), None)
            if odd is not None:
                raise DataError(f"example {odd['id']!r} has {len(odd['options'])} options, "
                                f"the first training example {k}; every example needs the same "
                                "number of options")
            self.labels = tuple(str(i) for i in range(k))
        else:
            self.labels = classification.label_vocabulary(train_examples, data.labels)
        self.tokenizer, self.model_config = self._tokenizer_and_model_config(
            cache_dir, train_examples)
        start = getattr(self.tokenizer, "bos_id", None)
        if start is None:
            raise ConfigError(f"config.data.tokenizer: {type(self.tokenizer).__name__} has no "
                              "beginning-of-text id to start GPT's inputs with; use the "
                              "SentencePiece model (or GPT-2 vocabulary) the GPT was trained on")
        self.start_id = start
        self.train_rows = self._rows(train_examples)
        self.eval_rows = self._rows(self.eval_examples)
        self.model = gpt_classifier.GPTForClassification(
            self.model_config, num_labels=len(self.labels),
            multiple_choice=self.multiple_choice,
            dropout_rate=config.finetune.classifier_dropout)

    # ---- data, tokenizer and model config --------------------------------------------------

    def _load(self, data, split: str, cache_dir: str) -> list[dict]:
        """Labelled examples of `split` ('train' | 'validation'), through the reader of the
        job's kind (multiple-choice or classification)."""
        reader = multiple_choice if self.multiple_choice else classification
        return reader.load_split(data, split, cache_dir)

    def _texts(self, examples) -> list[str]:
        if self.multiple_choice:
            return [t for ex in examples for t in (ex["context"], *ex["options"])]
        return [t for ex in examples for t in (ex["text_a"], ex["text_b"]) if t]

    def _tokenizer_and_model_config(self, cache_dir, train_examples):
        config, data = self.config, self.config.data
        init_from = config.train.get("init_from", "")
        model_kw = {k: v for k, v in config.model.to_dict().items() if k != "size"}
        runtime = run_choices(model_kw)
        if init_from and (paths.as_path(init_from) / "bert_config.json").is_file():
            raise ConfigError(
                f"config.train.init_from={init_from!r} is not a checkpoint of this model: it is a "
                "google-research/bert checkpoint (bert_config.json), and this task fine-tunes "
                "GPT; point init_from at a zoo GPT run or a Hugging Face GPT-2 directory "
                "(configs/classify.py fine-tunes BERT)")
        if _is_pretrained_directory(init_from):
            path = paths.join(init_from, "config.json")
            hf_config = bert_encoder.read_pretrained_config(path)
            model_type = hf_config.get("model_type", "gpt2")
            if model_type != "gpt2":
                raise ConfigError(
                    f"config.train.init_from={init_from!r} is not a checkpoint of this model: "
                    f"its config.json says model_type={model_type!r}, and this task fine-tunes "
                    "GPT; point init_from at a zoo GPT run or a Hugging Face GPT-2 directory"
                    + (" (configs/classify.py fine-tunes BERT)" if model_type == "bert" else ""))
            # zoo.convert.hf.load_pretrained (which fills the `gpt` subtree) builds unscanned layers.
            model_config = gpt2_convert.config_from_hf(hf_config, **{**runtime, "scan_layers": False})
            tokenizer = tokenizers.load_tokenizer(data.tokenizer or init_from)
            where = path
        elif init_from:
            tokenizer = tokenizers.load_tokenizer(data.tokenizer or _workdir_tokenizer(init_from))
            shapes = _checkpoint_shapes(init_from)
            vocab, positions = (shapes["wte"][0], shapes["wpe"][0]) if shapes else (None, None)
            if vocab is not None and vocab != tokenizer.vocab_size:
                raise ConfigError(
                    f"config.train.init_from={init_from!r}: its GPT has a vocabulary of {vocab} "
                    f"tokens but the tokenizer has {tokenizer.vocab_size}; set "
                    "config.data.tokenizer to the .model file that language model was trained "
                    "with (leave it empty to use the one in <init_from>/data)")
            model_kw.pop("max_len", None)
            model_config = gpt.config_for_size(
                config.model.size, vocab_size=tokenizer.vocab_size,
                max_len=positions or data.seq_len, **model_kw)
            where = f"config.train.init_from={init_from!r}"
        else:  # from scratch: a tokenizer trained on the task's own training texts
            tokenizer = tokenizers.from_config(data, cache_dir, [self._texts(train_examples)])
            model_config = gpt.config_for_size(
                config.model.size, vocab_size=tokenizer.vocab_size,
                max_len=max(data.seq_len, model_kw.pop("max_len", 0)), **model_kw)
            where = ""
        if where and tokenizer.vocab_size != model_config.vocab_size:
            raise ConfigError(f"{where}: vocab_size {model_config.vocab_size} differs from the "
                              f"tokenizer's {tokenizer.vocab_size}; leave config.data.tokenizer "
                              "empty to use the checkpoint's own")
        if data.seq_len > model_config.max_len:
            raise ConfigError(
                f"config.data.seq_len={data.seq_len} exceeds the {model_config.max_len} "
                f"positions of the GPT ({where or 'config.model.max_len'}); lower "
                "config.data.seq_len (or pretrain with a longer one)")
        return tokenizer, model_config

    def _rows(self, examples: list[dict]) -> dict[str, np.ndarray]:
        tok = self.tokenizer
        index = {label: i for i, label in enumerate(self.labels)}
        unknown = next((ex for ex in examples if ex["label"] not in index), None)
        if unknown is not None:
            raise DataError(f"example {unknown['id']!r} has label {unknown['label']!r}, not "
                            f"among the known labels {list(self.labels)}; list every label in "
                            "config.data.labels")
        if self.multiple_choice:
            texts = []
            for ex in examples:
                context = tok.encode(ex["context"])
                texts.extend([context, tok.encode(o)] for o in ex["options"])
        else:
            texts = [[tok.encode(ex["text_a"])] + ([tok.encode(ex["text_b"])]
                                                  if ex["text_b"] is not None else [])
                     for ex in examples]
        out = transform_inputs(texts, self.config.data.seq_len, self.model_config.vocab_size,
                               self.start_id, tok.pad_id)
        if out["truncated"].any():
            _log.warning("%d of %d input rows were longer than config.data.seq_len=%d tokens "
                         "and were truncated", int(out["truncated"].sum()), len(texts),
                         self.config.data.seq_len)
        n = len(examples)
        shape = (n, len(self.labels), -1) if self.multiple_choice else (n, -1)
        tokens, targets = out["tokens"].reshape(shape), out["lm_targets"].reshape(shape)
        lm_text = out["lm_text"].reshape(shape).astype(np.float32)
        # Each example's LM loss is its mean over its text tokens (see the module docstring);
        # a multiple-choice example's tokens are those of all its option rows.
        count = lm_text.reshape(n, -1).sum(axis=1).reshape((n,) + (1,) * (lm_text.ndim - 1))
        lm_weights = lm_text / np.maximum(count, 1.0)
        labels = np.array([index[ex["label"]] for ex in examples], np.int32)
        return {"tokens": tokens, "lm_targets": targets, "lm_weights": lm_weights,
                "label": labels, "example_weight": np.ones(n, np.float32)}

    # ---- the Task contract -----------------------------------------------------------------

    def pretrained_subtree(self) -> str:
        return "gpt"

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def model_inputs(self, batch: Batch) -> dict:
        return {"tokens": batch["tokens"]}

    def loss_fn(self, params, batch, rng, train: bool):
        logits, lm_logits = self.model.apply(
            {"params": params}, batch["tokens"], deterministic=not train,
            rngs={"dropout": rng} if train else {})
        return finetune_loss_sums(
            logits, lm_logits, batch, self.lm_weight,
            label_smoothing=self.config.train.label_smoothing if train else 0.0)

    def predict(self, params, batch):
        logits, _ = self.model.apply({"params": params}, batch["tokens"], deterministic=True)
        return {"logits": logits}

    def summarize(self, sums):
        n = max(sums["weight_sum"], 1.0)
        return {**super().summarize(sums), "cls_loss": sums["cls_loss_sum"] / n,
                "lm_loss": sums["lm_loss_sum"] / n}

    def tokens_per_batch(self) -> int:
        options = len(self.labels) if self.multiple_choice else 1
        return self.config.data.batch_size * options * self.config.data.seq_len
