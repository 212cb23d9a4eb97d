"""Machine translation with the RNN encoder-decoder (zoo.models.seq2seq), with or without
attention.

Everything but the model is the Transformer's translation task (zoo.tasks.translation): the same
data sources, joint SentencePiece vocabulary, teacher-forced loss, and greedy / beam decoding
scored by BLEU, ROUGE and exact match, so the two families' figures compare directly. Only the
seams differ: the model built from config.model, its zoo.decoding.Decoder, and the cost figures.
"""

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
        return seq2seq.activation_bytes(self.model_config, per_device_batch,
                                        self.config.data.source_len, self.config.data.target_len,
                                        tensor_parallel)
