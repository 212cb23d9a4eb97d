"""Elman / LSTM / GRU language models on the GPT task's packed documents: same tokenizer, rows,
loss and perplexity, so their perplexities compare with GPT's and the NNLM's on the same split."""

import dataclasses

import jax

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
        return rnnlm.activation_bytes(self.model_config, per_device_batch,
                                      self.config.data.seq_len, tensor_parallel)

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
