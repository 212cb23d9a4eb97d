"""Causal language modelling (GPT) on packed documents; eval reports perplexity."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from zoo import decoding
from zoo.contract.losses import cross_entropy_sums
from zoo.data.pipelines import lm_pipeline
from zoo.data.tokenizers import base as tokenizers
from zoo.errors import ConfigError
from zoo.models import gpt
from zoo.tasks.base import Baselines, Batch, Measured, Sampling, Task


class LanguageModelTask(Task, Sampling, Baselines, Measured):
    def __init__(self, config: ml_collections.ConfigDict, workdir: str):
        super().__init__(config, workdir)
        data = config.data
        train_docs, eval_docs = lm_pipeline.load_splits(data)
        self.tokenizer = tokenizers.from_config(data, self.data_cache_dir(), train_docs)
        unknown = lm_pipeline.unknown_characters(self.tokenizer, eval_docs)
        if unknown:  # counted, never dropped: each is the unknown id in the eval rows
            shown = ", ".join(f"{c!r} x{n}" for c, n in unknown.most_common(10))
            print(f"data: the validation text holds {sum(unknown.values())} characters the "
                  f"training text never has ({shown}); each is the unknown id", flush=True)
        self.train_rows = lm_pipeline.packed_rows(self.tokenizer, train_docs, data.seq_len)
        self.eval_rows = lm_pipeline.packed_rows(self.tokenizer, eval_docs, data.seq_len)
        self.model_config, self.model = self.build_model()

    def build_model(self):
        """(config, module) of the model over the tokenizer's vocabulary; language models of
        other families (zoo.tasks.nnlm) override only this."""
        model_kw = {k: v for k, v in self.config.model.to_dict().items() if k != "size"}
        model_config = gpt.config_for_size(
            self.config.model.size,
            vocab_size=self.tokenizer.vocab_size,
            max_len=max(self.config.data.seq_len, model_kw.pop("max_len", 0)),
            **model_kw,
        )
        return model_config, gpt.GPT(model_config)

    def init_batch(self) -> Batch:
        shape = (self.config.data.batch_size, self.config.data.seq_len)
        return {k: np.zeros(shape, np.float32 if k == "weights" else np.int32)
                for k in self.train_rows}

    def model_inputs(self, batch: Batch) -> dict:
        return dict(tokens=batch["inputs"], positions=batch["positions"],
                    segment_ids=batch["segment_ids"])

    def loss_fn(self, params, batch, rng, train: bool):
        logits = self.model.apply(
            {"params": params}, **self.model_inputs(batch), deterministic=not train,
            rngs={"dropout": rng},
        )
        return cross_entropy_sums(
            logits, batch["targets"], batch["weights"],
            label_smoothing=self.config.train.label_smoothing if train else 0.0,
        )

    def summarize(self, sums):
        weight = max(sums["weight_sum"], 1.0)
        nll = sums["nll_sum"] / weight
        return {
            "loss": sums["loss_sum"] / weight,
            "accuracy": sums["correct_sum"] / weight,
            # Perplexity as the course slides on sequence generation define it: exp of the mean
            # per-token negative log-likelihood.
            "perplexity": math.exp(min(nll, 50.0)),
            "tokens": sums["weight_sum"],
        }

    def flops_per_token(self) -> float:
        return gpt.flops_per_token(self.model_config, self.config.data.seq_len)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        return gpt.activation_bytes(self.model_config, per_device_batch,
                                    self.config.data.seq_len, tensor_parallel)

    def sample_decoder(self, params, batch: int, max_len: int) -> decoding.Decoder:
        """The zoo.decoding.Decoder `samples` draws from, for `batch` sequences of up to
        `max_len` tokens: GPT's KV cache (at most the model's max_len long). Language models
        of other families (zoo.tasks.nnlm, zoo.tasks.rnnlm) override only this."""
        max_len = min(max_len, self.model_config.max_len)
        model = gpt.GPT(dataclasses.replace(self.model_config, dropout_rate=0.0,
                                            attention_dropout_rate=0.0), decode=True)
        shapes = jax.eval_shape(model.init, jax.random.key(0),
                                jnp.zeros((batch, max_len), jnp.int32))["cache"]
        cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
        return decoding.from_linen(model, params, cache)

    def samples(self, params) -> list[str]:
        """config.sample.num continuations of config.sample.prompt (`sample_decoder`)."""
        cfg = self.config.sample
        if cfg.num <= 0:
            return []
        decoder = self.sample_decoder(params, cfg.num, cfg.max_len)
        max_len = min(cfg.max_len, decoder.max_len or cfg.max_len)
        bos, eos = lm_pipeline.document_ids(self.tokenizer)
        prompt = [bos] + self.tokenizer.encode(cfg.prompt)
        if len(prompt) >= max_len:
            raise ConfigError(f"config.sample.prompt is {len(prompt)} tokens; it must be shorter "
                              f"than config.sample.max_len={max_len}")
        out = decoding.sample(
            decoder, np.tile(np.asarray(prompt, np.int32), (cfg.num, 1)),
            rng=jax.random.key(cfg.seed), max_len=max_len, temperature=cfg.temperature,
            top_k=cfg.top_k, top_p=cfg.top_p, eos_id=eos,
            pad_id=self.tokenizer.pad_id,
        )
        tokens, lengths = jax.device_get((out.tokens, out.lengths))
        return [self.tokenizer.decode(row[:n]) for row, n in zip(tokens, lengths)]

    def baselines(self) -> dict[str, float]:
        nll = lm_pipeline.unigram_nll_per_token(
            self.train_rows, self.eval_rows, self.tokenizer.vocab_size
        )
        return {"unigram_perplexity": math.exp(nll)}

