"""Bengio et al.'s NNLM on the GPT task's packed documents: same tokenizer, rows, loss and
perplexity, so the two models' perplexities compare on the same split."""

import dataclasses

import jax.numpy as jnp

from zoo import decoding
from zoo.models import nnlm
from zoo.tasks.lm import LanguageModelTask


class NNLMTask(LanguageModelTask):
    """LanguageModelTask with the NNLM in place of GPT: batching, loss, eval summary (loss,
    accuracy, perplexity) and the unigram baseline are inherited unchanged."""

    def build_model(self):
        model_kw = {k: v for k, v in self.config.model.to_dict().items() if k != "size"}
        model_config = nnlm.config_for_size(
            self.config.model.size, vocab_size=self.tokenizer.vocab_size, **model_kw)
        return model_config, nnlm.NNLM(model_config)

    def model_inputs(self, batch) -> dict:
        # Positions are not needed: segment ids alone bound each window to its document.
        return dict(tokens=batch["inputs"], segment_ids=batch["segment_ids"])

    def flops_per_token(self) -> float:
        return nnlm.flops_per_token(self.model_config)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        return nnlm.activation_bytes(self.model_config, per_device_batch,
                                     self.config.data.seq_len, tensor_parallel)

    def sample_decoder(self, params, batch: int, max_len: int) -> decoding.Decoder:
        """Sampling's decoding state is the window of the last n-1 tokens (see WindowStep); no length limit."""
        return window_decoder(self.model, params, batch)


@dataclasses.dataclass(frozen=True)
class WindowStep:
    """decoding step for an NNLM: the state holds the last n-1 tokens [N, n-1] and which of
    those slots are filled yet (segment 1) or still before the sequence start (segment 0)."""

    model: nnlm.NNLM

    def __call__(self, params, tokens, state):
        seq = jnp.concatenate([state["tokens"], tokens], axis=1)  # (N, n-1 + L)
        seg = jnp.concatenate([state["segment_ids"], jnp.ones_like(tokens)], axis=1)
        logits = self.model.apply({"params": params}, seq, segment_ids=seg)  # (N, n-1 + L, V)
        keep = self.model.config.context
        return logits[:, -1], {"tokens": seq[:, -keep:], "segment_ids": seg[:, -keep:]}


def window_decoder(model: nnlm.NNLM, params, batch: int) -> decoding.Decoder:
    """A zoo.decoding Decoder for `batch` sequences of an NNLM (no KV cache, no length limit)."""
    empty = jnp.zeros((batch, model.config.context), jnp.int32)
    state = {"tokens": empty, "segment_ids": empty}
    return decoding.Decoder(step=WindowStep(model), params=params, state=state,
                            batch_axes=(0, 0), max_len=None)
