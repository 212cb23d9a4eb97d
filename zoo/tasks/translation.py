"""Machine translation with the Transformer encoder-decoder (zoo.models.encoder_decoder).

Training: teacher forcing, token cross-entropy with label smoothing (config.train.
label_smoothing, 0.1 as the paper) over one joint SentencePiece vocabulary trained on both
sides. Evaluation: loss, perplexity and token accuracy, then every eval source is decoded
(greedy or beam search, config.eval) and scored against its reference: corpus BLEU with
sacrebleu's defaults and signature (zoo.eval.bleu), ROUGE-1/2/L (zoo.eval.rouge) and the share
of exact translations; the evaluation writes the hypotheses to <workdir>/predictions/hypotheses.txt.

Data: the synthetic arithmetic task (zoo.data.synthetic.translation, written as TSV files and
read back like a user's), parallel text files (zoo.data.readers.parallel), or a TFDS translation
dataset (wmt14_translate/de-en, wmt_t2t_translate/de-en) prepared in a local data_dir.
"""

import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo import decoding
from zoo.contract.losses import cross_entropy_sums
from zoo.data.pipelines import batching
from zoo.data.readers import parallel
from zoo.data.tokenizers import base as tokenizers
from zoo.errors import ConfigError
from zoo.eval import bleu, rouge
from zoo.models import encoder_decoder as transformer
from zoo.tasks.base import Batch, Measured, Predicting, Sampling, Scored, Task

_TRAIN_KEYS = ("source_ids", "target_input_ids", "target_ids", "target_weights")
_DECODE_METHODS = ("greedy", "beam")


class TranslationTask(Task, Predicting, Sampling, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        if config.eval.decode not in _DECODE_METHODS:
            raise ConfigError(f"config.eval.decode must be one of {_DECODE_METHODS}, got "
                              f"{config.eval.decode!r}")
        cache_dir = self.data_cache_dir()
        train_pairs = parallel.load_split(data, "train", cache_dir)
        self.eval_pairs = parallel.load_split(data, "validation", cache_dir)
        # One joint vocabulary for both languages (the paper's shared BPE).
        self.tokenizer = tokenizers.from_config(
            data, cache_dir, [list(parallel.joint_tokenizer_texts(train_pairs))])
        self.train_rows = self._rows(train_pairs)
        self.eval_rows = self._rows(self.eval_pairs)
        self.model_config, self.model = self.build_model()

    def build_model(self):
        """(model config, model) from config.model, for the tokenizer's vocabulary and ids.

        The seam a translation task with another model family overrides (with `decoder`).
        """
        data = self.config.data
        model_kw = {k: v for k, v in self.config.model.to_dict().items() if k != "size"}
        model_config = transformer.config_for_size(
            self.config.model.size, vocab_size=self.tokenizer.vocab_size,
            max_len=max(data.source_len, data.target_len + 1, model_kw.pop("max_len")),
            pad_id=self.tokenizer.pad_id, bos_id=self.tokenizer.bos_id,
            eos_id=self.tokenizer.eos_id, **model_kw)
        return model_config, transformer.EncoderDecoder(model_config)

    def decoder(self, params, source_ids, max_len: int) -> decoding.Decoder:
        """A zoo.decoding.Decoder that translates right-padded `source_ids` [B, S]."""
        return transformer.translation_decoder(self.model, params, source_ids, max_len=max_len)

    def _rows(self, pairs: list[tuple[str, str]]) -> dict[str, np.ndarray]:
        encoded = parallel.encode_pairs(pairs, self.tokenizer, self.config.data.source_len,
                                        self.config.data.target_len)
        rows = {k: encoded[k] for k in _TRAIN_KEYS}
        rows["source_lengths"] = encoded["source_lengths"]
        return rows

    def init_batch(self) -> Batch:
        return {k: np.zeros((self.config.data.batch_size,) + v.shape[1:], v.dtype)
                for k, v in self.train_rows.items()}

    def model_inputs(self, batch: Batch) -> dict:
        return {"source_ids": batch["source_ids"], "target_input_ids": batch["target_input_ids"]}

    def loss_fn(self, params, batch, rng, train: bool):
        logits = self.model.apply({"params": params}, **self.model_inputs(batch),
                                  deterministic=not train,
                                  rngs={"dropout": rng} if train else {})  # (B, T, V)
        smoothing = self.config.train.label_smoothing if train else 0.0
        return cross_entropy_sums(logits, batch["target_ids"], batch["target_weights"],
                                  label_smoothing=smoothing)

    def summarize(self, sums):
        n = max(sums["weight_sum"], 1.0)
        nll = sums["nll_sum"] / n
        return {"loss": sums["loss_sum"] / n, "perplexity": float(np.exp(min(nll, 50.0))),
                "accuracy": sums["correct_sum"] / n}

    # ---- decoding and translation metrics --------------------------------------------------

    def _decode(self, params, source_ids):
        """Translations [B, target_len] (no BOS; EOS then pad) of right-padded sources."""
        cfg, ev = self.model_config, self.config.eval
        max_len = self.config.data.target_len + 1  # BOS + the longest target row
        decoder = self.decoder(params, source_ids, max_len)
        prompts = jnp.full((source_ids.shape[0], 1), cfg.bos_id, jnp.int32)
        ends = dict(eos_id=cfg.eos_id, pad_id=cfg.pad_id)
        if ev.decode == "greedy":
            tokens = decoding.greedy(decoder, prompts, max_len=max_len, **ends).tokens
        else:
            tokens = decoding.beam_search(decoder, prompts, beam_size=ev.beam_size,
                                          max_len=max_len, alpha=ev.alpha, **ends).tokens[:, 0]
        return tokens[:, 1:]

    def predict(self, params, batch):
        return {"tokens": self._decode(params, batch["source_ids"])}

    def _texts(self, tokens: np.ndarray, source_lengths: np.ndarray) -> list[str]:
        """Detokenized hypotheses, each cut at EOS and at a * |x| + b tokens (config.eval:
        the output limit relative to the source; |x| counts the source's EOS too)."""
        ev, eos = self.config.eval, self.model_config.eos_id
        texts = []
        for row, n in zip(tokens, source_lengths):
            row = list(row)
            row = row[: row.index(eos)] if eos in row else row
            limit = max(int(ev.max_len_a * int(n) + ev.max_len_b), 0)
            texts.append(self.tokenizer.decode(row[:limit]))
        return texts

    def score_predictions(self, outputs: dict[str, np.ndarray]) -> Scored:
        n = len(self.eval_pairs)
        hypotheses = self._texts(outputs["tokens"][:n], self.eval_rows["source_lengths"])
        references = [target for _, target in self.eval_pairs]
        score = bleu.corpus_bleu(hypotheses, [references])
        rouge_scores = [(rouge.rouge_n(h, r, 1).fmeasure, rouge.rouge_n(h, r, 2).fmeasure,
                         rouge.rouge_l(h, r).fmeasure) for h, r in zip(hypotheses, references)]
        r1, r2, rl = (100.0 * float(np.mean(x)) for x in zip(*rouge_scores))
        metrics = {"bleu": score.score, "bleu_bp": score.bp,
                   **{f"bleu_p{i}": p for i, p in enumerate(score.precisions, 1)},
                   "rouge1": r1, "rouge2": r2, "rougeL": rl,
                   "exact": 100.0 * float(np.mean([h == r for h, r in
                                                   zip(hypotheses, references)]))}
        if jax.process_index() == 0:
            print(f"{score} {score.signature}", flush=True)
        return Scored(metrics, {
            "hypotheses.txt": "".join(h + "\n" for h in hypotheses),
            "bleu.json": json.dumps({"bleu": score.score, "signature": score.signature,
                                     "summary": str(score), **metrics}, indent=2)})

    def samples(self, params) -> list[str]:
        """A few eval sources with their translation and reference."""
        count = min(self.config.eval.num_samples, len(self.eval_pairs))
        if not count:
            return []
        tokens = jax.jit(self._decode)(params, jnp.asarray(self.eval_rows["source_ids"][:count]))
        hypotheses = self._texts(np.asarray(tokens), self.eval_rows["source_lengths"][:count])
        return [f"{src} -> {hyp}   (reference: {ref})"
                for (src, ref), hyp in zip(self.eval_pairs, hypotheses)]

    # ---- data ------------------------------------------------------------------------------

    def train_batches(self, process_index: int, process_count: int):
        data = self.config.data
        rows = {k: self.train_rows[k] for k in _TRAIN_KEYS}
        if not data.length_buckets:
            return batching.train_iterator(rows, data.batch_size, data.seed, process_index,
                                           process_count)
        # Each batch padded only to its bucket: the longer side of each pair decides.
        lengths = np.maximum(self.train_rows["source_lengths"],
                             self.train_rows["target_weights"].sum(axis=1).astype(np.int64))
        boundaries = sorted(set(data.length_buckets) | {max(data.source_len, data.target_len)})
        return batching.bucketed_train_iterator(rows, lengths, boundaries, data.batch_size,
                                                data.seed, process_index, process_count)

    def eval_batches(self, process_index: int, process_count: int):
        rows = {k: self.eval_rows[k] for k in _TRAIN_KEYS}
        return batching.eval_batches(rows, self.config.data.eval_batch_size, process_index,
                                     process_count)

    def tokens_per_batch(self) -> int:
        return self.config.data.batch_size * (self.config.data.source_len +
                                              self.config.data.target_len)

    def flops_per_token(self) -> float:
        return transformer.flops_per_token(self.model_config, self.config.data.source_len,
                                           self.config.data.target_len)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        return transformer.activation_bytes(self.model_config, per_device_batch,
                                            self.config.data.source_len,
                                            self.config.data.target_len, tensor_parallel)
