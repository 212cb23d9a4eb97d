"""Machine translation with the RNN encoder-decoder (zoo.models.seq2seq), with or without
attention.

Everything but the model is the Transformer's translation task (zoo.tasks.translation): the same
data sources, joint SentencePiece vocabulary, teacher-forced loss, and greedy / beam decoding
scored by BLEU, ROUGE and exact match, so the two families' figures compare directly. Only the
seams differ: the model built from config.model, its zoo.decoding.Decoder, and the cost figures.
"""

import jax.numpy as jnp

from zoo import decoding
from zoo.models import seq2seq
from zoo.tasks.translation import TranslationTask


class RNNTranslationTask(TranslationTask):
    def build_model(self):
        model_kw = {k: v for k, v in self.config.model.to_dict().items() if k != "size"}
        model_config = seq2seq.config_for_size(
            self.config.model.size, vocab_size=self.tokenizer.vocab_size,
            pad_id=self.tokenizer.pad_id, bos_id=self.tokenizer.bos_id,
            eos_id=self.tokenizer.eos_id, **model_kw)
        return model_config, seq2seq.Seq2Seq(model_config)

    def decoder(self, params, source_ids, max_len: int) -> decoding.Decoder:
        return seq2seq.seq2seq_decoder(self.model, params, source_ids, max_len=max_len)

    def flops_per_token(self) -> float:
        return seq2seq.flops_per_token(self.model_config, self.config.data.source_len,
                                       self.config.data.target_len)

    def activation_bytes(self, per_device_batch: int, tensor_parallel: int) -> float:
        """A rough count of what the backward pass keeps, per device.

        Each scan keeps, per step and layer, the gate pre-activations and the (c, h) carry
        (G + 2 float32 values per unit; each direction of a bidirectional encoder counts);
        additive attention keeps its tanh hidden layer (B, S, H) per target step and every
        attention its weights (B, S); the logits are kept in float32 with their softmax. Hidden
        units and the vocabulary are split over the tensor axis; embeddings are left out.
        """
        cfg, data = self.model_config, self.config.data
        b, s, t = per_device_batch, data.source_len, data.target_len
        g = {"lstm": 4, "gru": 3, "rnn": 1}[cfg.cell]
        dirs = 2 if cfg.bidirectional else 1
        per_unit = 4 * (g + 2) * cfg.hidden_size * cfg.num_layers
        recurrent = b * (s * dirs + t) * per_unit
        attention = 0
        if cfg.attention != "none":
            width = cfg.hidden_size + 1 if cfg.attention == "additive" else 1
            attention = 4 * b * t * s * width
        logits = 2 * 4 * b * t * cfg.vocab_size
        return (recurrent + attention + logits) / max(tensor_parallel, 1) + (
            b * s * cfg.memory_size * jnp.dtype(cfg.dtype).itemsize)
