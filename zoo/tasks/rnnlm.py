"""Elman / LSTM / GRU language models on the GPT task's packed documents: same tokenizer, rows,
loss and perplexity, so their perplexities compare with GPT's and the NNLM's on the same split."""

import dataclasses

import jax
import jax.numpy as jnp

from zoo import decoding
from zoo.models import rnnlm
from zoo.tasks.lm import LanguageModelTask


class RNNLanguageModelTask(LanguageModelTask):
    """LanguageModelTask with a recurrent LM in place of GPT: batching, loss, eval summary (loss,
    accuracy, perplexity) and the unigram baseline are inherited unchanged."""

    def build_model(self):
        model_kw = {k: v for k, v in self.config.model.to_dict().items() if k != "size"}
        model_config = rnnlm.config_for_size(
            self.config.model.size, vocab_size=self.tokenizer.vocab_size, **model_kw)
        return model_config, rnnlm.RNNLM(model_config)

    def model_inputs(self, batch) -> dict:
        # Positions are not needed: the state is reset where the segment id changes.
        return dict(tokens=batch["inputs"], segment_ids=batch["segment_ids"])

    def flops_per_token(self) -> float:
        return rnnlm.flops_per_token(self.model_config)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        """A rough count of what the scan keeps for the backward pass, per token: the embedding,
        and per layer the gate pre-activations (G x H, compute dtype), the float32 gates and
        carries the step's backward needs (about 2G + 2 float32 vectors of H: gates, their
        nonlinear outputs, c and h) and the layer output (H); then the float32 logits and their
        softmax. Hidden units and vocab are split by tensor parallelism."""
        cfg = self.model_config
        tokens = per_device_batch * self.config.data.seq_len
        item = jnp.dtype(cfg.dtype).itemsize
        g, h = rnnlm.num_gates(cfg.cell), cfg.hidden_size
        per_layer = (g * h * item + (2 * g + 2) * h * 4 + h * item) / tensor_parallel
        return tokens * (cfg.embed_dim * item + cfg.num_layers * per_layer
                         + 2 * cfg.vocab_size * 4 / tensor_parallel)

    def sample_decoder(self, params, batch: int, max_len: int) -> decoding.Decoder:
        """Sampling's decoding state is each layer's carry (see CarryStep); no length limit."""
        return carry_decoder(self.model, params, batch)


@dataclasses.dataclass(frozen=True)
class CarryStep:
    """decoding step for an RNN LM: the state is every layer's carry, [N, H] leaves; L >= 1 new
    tokens run through the scan from it (dropout off) and the last one's logits come back."""

    model: rnnlm.RNNLM

    def __call__(self, params, tokens, carries):
        logits, carries = self.model.apply({"params": params}, tokens, carries=carries,
                                           return_carries=True)  # (N, L, V)
        return logits[:, -1], carries


def carry_decoder(model: rnnlm.RNNLM, params, batch: int) -> decoding.Decoder:
    """A zoo.decoding Decoder for `batch` sequences of an RNN LM (unbounded length)."""
    state = rnnlm.initial_carries(model.config, batch)
    return decoding.Decoder(step=CarryStep(model), params=params, state=state,
                            batch_axes=(0,) * len(jax.tree.leaves(state)), max_len=None)
