"""BERT pretraining: masked language modelling + next-sentence prediction (the BERT paper, and
the BERT section of the lecture notes from NNLM to BERT).

The objective is BERT's: mean MLM loss over the masked positions + mean NSP loss over the
examples. As a ratio of sums (what the train step divides) it is
    (mlm_sum + nsp_sum * mlm_tokens / examples) / mlm_tokens,
exact for a whole batch; with gradient accumulation the NSP weight uses each micro-batch's
token/example ratio.
"""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo.contract.losses import cross_entropy_sums
from zoo.data.pipelines.pretraining import batches as pretraining_batches
from zoo.data.pipelines.pretraining import job_data as pretraining_data
from zoo.data.pipelines.pretraining import run_order
from zoo.models import bert
from zoo.tasks.base import Baselines, Batch, Measured, Task


class PretrainingTask(Task, Baselines, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        if data.get("prepared_dir", ""):
            # Prepared by `python -m zoo.commands.prepare`: only read, never re-tokenized.
            prepared = pretraining_data.open_prepared(data)
        else:
            # Prepared here, once, keyed under the cache (phases sharing cache_dir share it);
            # every process of a multi-host job makes its share of the shards.
            prepared = pretraining_data.prepare(
                data, self.data_cache_dir(), workers=data.get("prepare_workers", 0),
                process_index=jax.process_index(), process_count=jax.process_count())
        self.tokenizer = prepared.tokenizer
        self.train_source, self.eval_source = prepared.train, prepared.validation
        model_kw = {k: v for k, v in config.model.to_dict().items() if k != "size"}
        self.model_config = bert.config_for_size(
            config.model.size, vocab_size=self.tokenizer.vocab_size,
            max_position_embeddings=max(data.seq_len, model_kw.pop("max_position_embeddings")),
            **model_kw,
        )
        self.model = bert.BertForPreTraining(self.model_config)

    def init_batch(self) -> Batch:
        # The eval source is always statically masked, so its rows carry every feature (a
        # dynamically masked train row gets its masked-LM fields only when batched).
        row = self.eval_source[0]
        return {k: np.zeros((self.config.data.batch_size,) + v.shape, v.dtype)
                for k, v in row.items()}

    def model_inputs(self, batch: Batch) -> dict:
        return dict(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                    attention_mask=batch["attention_mask"],
                    masked_positions=batch["masked_lm_positions"])

    def loss_fn(self, params, batch, rng, train: bool):
        mlm_logits, nsp_logits = self.model.apply(
            {"params": params}, **self.model_inputs(batch), deterministic=not train,
            rngs={"dropout": rng},
        )
        mlm = cross_entropy_sums(mlm_logits, batch["masked_lm_ids"], batch["masked_lm_weights"])
        nsp = cross_entropy_sums(nsp_logits, batch["next_sentence_labels"],
                                 batch["example_weight"])
        tokens_per_example = jax.lax.stop_gradient(
            mlm["weight_sum"] / jnp.maximum(nsp["weight_sum"], 1.0))
        sums = {"loss_sum": mlm["loss_sum"] + nsp["loss_sum"] * tokens_per_example,
                "weight_sum": mlm["weight_sum"]}
        sums.update({f"mlm_{k}": v for k, v in mlm.items() if k != "nll_sum"})
        sums.update({f"nsp_{k}": v for k, v in nsp.items() if k != "nll_sum"})
        return sums

    def summarize(self, sums):
        mlm_w, nsp_w = max(sums["mlm_weight_sum"], 1.0), max(sums["nsp_weight_sum"], 1.0)
        mlm_loss, nsp_loss = sums["mlm_loss_sum"] / mlm_w, sums["nsp_loss_sum"] / nsp_w
        return {
            "loss": mlm_loss + nsp_loss,
            "mlm_loss": mlm_loss,
            "mlm_accuracy": sums["mlm_correct_sum"] / mlm_w,
            "mlm_perplexity": math.exp(min(mlm_loss, 50.0)),
            "nsp_loss": nsp_loss,
            "nsp_accuracy": sums["nsp_correct_sum"] / nsp_w,
            "tokens": sums["mlm_weight_sum"],
        }

    def train_batches(self, process_index: int, process_count: int):
        return pretraining_batches.train_iterator(
            self.train_source, self.config.data.batch_size, self.config.data.seed,
            process_index, process_count, num_workers=self.config.data.num_workers,
            run_rows=run_order.resolve_run_rows(self.config.data.read_run_rows,
                                                self.config.data.batch_size),
            read_ahead_mb=self.config.data.read_ahead_mb)

    def eval_batches(self, process_index: int, process_count: int):
        return pretraining_batches.eval_batches(
            self.eval_source, self.config.data.eval_batch_size, process_index, process_count)

    def flops_per_token(self) -> float:
        return bert.flops_per_token(self.model_config, self.config.data.seq_len,
                                    self.config.data.max_predictions_per_seq)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        return bert.activation_bytes(self.model_config, per_device_batch,
                                     self.config.data.seq_len,
                                     self.config.data.max_predictions_per_seq, tensor_parallel)

    def baselines(self) -> dict[str, float]:
        """Accuracy of always answering the most frequent label of the eval set: what a model
        that learned nothing about context would score."""
        # One read of every row (from a bucket, one ranged GET per shard, not one per row).
        rows = self.eval_source.read(np.arange(len(self.eval_source)))
        nsp = rows["next_sentence_labels"]
        mlm = rows["masked_lm_ids"][rows["masked_lm_weights"] > 0]
        return {
            "nsp_majority_accuracy": float(max(np.mean(nsp == 0), np.mean(nsp == 1))),
            "mlm_majority_accuracy": float(np.bincount(mlm).max() / len(mlm)),
        }
