"""What both attention-map test modules use (test_attention_maps.py: the sow passthrough,
extraction against float64 references and drawing; test_attention_maps_command.py: the command
on trained workdirs and pretrained directories): a tiny BERT and GPT over a 21-piece WordPiece
vocabulary and the batch they are initialised on, a SentencePiece model of the synthetic
translation world, perturbed parameters and the PNG reader."""

import os

import flax.linen as nn
import jax
import numpy as np
from PIL import Image

from zoo.data.synthetic import translation as synthetic_translation
from zoo.data.tokenizers import base as tokenizers
from zoo.data.tokenizers.wordpiece import WordPieceTokenizer
from zoo.models import bert, gpt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "animal", "didn", "'", "t",
         "cross", "street", "because", "it", "was", "too", "tire", "##d", "tired", "cat", "sat"]
BERT_CONFIG = bert.BertConfig(vocab_size=len(VOCAB), hidden_size=8, num_layers=3, num_heads=2,
                              intermediate_size=16, max_position_embeddings=24)
GPT_CONFIG = gpt.GPTConfig(vocab_size=len(VOCAB), max_len=16, num_layers=2, num_heads=2,
                           embed_dim=8, mlp_dim=16)
IDS = np.array([[2, 5, 6, 13, 3, 14, 3], [2, 19, 20, 3, 0, 0, 0]], np.int32)  # row 1: 3 pads
TYPES = np.array([[0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 0, 0]], np.int32)
MASK = (IDS != 0).astype(np.int32)
# The RNN seq2seq scoring functions that have alignments.
ATTENTIONS = ("additive", "dot", "general")


def perturbed(params, seed=0):
    """params + N(0, 0.3^2): init's zero biases and unit LayerNorm gains would hide a wrongly used
    bias or gain, and larger weights give peaked, distinguishable attention rows."""
    leaves, treedef = jax.tree.flatten(nn.unbox(params))
    rng = np.random.default_rng(seed)
    return jax.tree.unflatten(treedef, [np.asarray(x) + rng.normal(0, 0.3, x.shape).astype(
        np.float32) for x in leaves])


def wordpiece() -> WordPieceTokenizer:
    return WordPieceTokenizer(VOCAB)


def bert_params():
    init = bert.BertModel(BERT_CONFIG).init(jax.random.key(0), IDS)
    return perturbed(init["params"])


def spm():
    """A SentencePiece model trained on synthetic translation pairs (both languages)."""
    pairs = synthetic_translation.translation_pairs(seed=0, num_pairs=200)
    return tokenizers.train_sentencepiece([s for pair in pairs for s in pair], 80)


def png(path):
    image = Image.open(path)
    image.load()
    return image
