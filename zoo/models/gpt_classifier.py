"""GPT fine-tuned on a downstream task (Radford et al. 2018, section 3.3; "GPT's second stage"
in the lecture notes from NNLM to BERT): the pretrained decoder unchanged, the task's input
written as one token sequence, and a linear head on the final hidden state of its last token.

Input transformations (the paper's Figure 1), built on the host by zoo.tasks.gpt_classification:

  single text       [start] text [extract]
  text pair         [start] a [delim] b [extract]
  multiple choice   [start] context [delim] option_k [extract]   one row per option k

[start] is the tokenizer's beginning-of-text id (GPT-2's <|endoftext|>), a token the language
model was trained with. [delim] and [extract] are new: "randomly initialized" rows of the
`special_tokens` parameter [2, D], fed in as ids V (DELIMITER) and V + 1 (EXTRACT) through
GPT's `extra_embeddings`. They live outside the `gpt` subtree, which therefore has exactly a
plain GPT's structure: config.train.init_from fills it from a language-model run or a GPT-2
checkpoint and nothing else changes.

Rows are left-aligned and padded after [extract]. The causal model lets the extract position
attend to every token before it and to nothing after it, so its final hidden state (after ln_f)
summarises the whole input and padding never reaches it. The head reads that position, found
as the row's [extract] token, never the last column.

The model also returns the language-model logits of the same rows: fine-tuning adds lambda
times their next-token loss (the paper's L3 = L2 + lambda * L1) in the task's loss.
"""

import flax.linen as nn
import jax.numpy as jnp

from zoo.models.gpt import GPT, GPTConfig
from zoo.nn.embeddings import default_embed_init
from zoo.nn.linear import Dense

# Rows of `special_tokens`; a token's id is vocab_size + its row.
DELIMITER, EXTRACT = 0, 1
NUM_SPECIAL_TOKENS = 2


def delimiter_id(vocab_size: int) -> int:
    """The input id of [delim] for a GPT over `vocab_size` tokens."""
    return vocab_size + DELIMITER


def extract_id(vocab_size: int) -> int:
    """The input id of [extract] for a GPT over `vocab_size` tokens."""
    return vocab_size + EXTRACT


class GPTForClassification(nn.Module):
    """GPT + [delim]/[extract] embeddings + a linear head on the extract position's state.

    Attributes:
      config: the pretrained GPT's config (its vocab_size excludes the two new tokens).
      num_labels: classes of a single-text or text-pair task; ignored for multiple choice.
      multiple_choice: inputs are [B, K, T] (K options per example) and the head gives ONE
        score per option, so the logits [B, K] are a softmax over the options.
      dropout_rate: dropout on the extract state before the head (the paper: 0.1).
    """

    config: GPTConfig
    num_labels: int = 2
    multiple_choice: bool = False
    dropout_rate: float = 0.1

    @nn.compact
    def __call__(self, tokens, *, deterministic=True):
        """Class (or option) logits and the language-model logits of the same rows.

        Args:
          tokens: [B, T] int, or [B, K, T] for multiple choice: transformed inputs, each row
            holding exactly one extract_id(V) with padding only after it.
          deterministic: no dropout when True (otherwise needs a 'dropout' rng).

        Returns:
          (logits [B, num_labels] or [B, K], lm_logits [B, T, V] or [B, K, T, V]), float32.
        """
        cfg = self.config
        if self.multiple_choice != (tokens.ndim == 3):
            raise ValueError(
                f"GPTForClassification: tokens must be [batch, {'choices, ' * self.multiple_choice}"
                f"length] with multiple_choice={self.multiple_choice}, got shape {tokens.shape}")
        if not self.multiple_choice and self.num_labels < 1:
            raise ValueError(f"GPTForClassification: num_labels must be >= 1, got "
                             f"{self.num_labels}")
        lead = tokens.shape[:-1]  # (B,) or (B, K)
        rows = tokens.reshape(-1, tokens.shape[-1])  # (R, T), R = B or B * K
        special = self.param(
            "special_tokens", nn.with_logical_partitioning(default_embed_init, (None, "embed")),
            (NUM_SPECIAL_TOKENS, cfg.embed_dim), jnp.dtype(cfg.param_dtype))
        lm_logits, hidden = GPT(cfg, name="gpt")(
            rows, deterministic=deterministic, extra_embeddings=special, return_hidden=True)
        # The row's [extract] position: argmax of a one-hot row is its index. (R,)
        position = jnp.argmax(rows == extract_id(cfg.vocab_size), axis=-1)
        extract = jnp.take_along_axis(hidden, position[:, None, None], axis=1)[:, 0]  # (R, D)
        extract = nn.Dropout(self.dropout_rate)(extract, deterministic=deterministic)
        outputs = 1 if self.multiple_choice else self.num_labels
        logits = Dense(outputs, ("embed", None), dtype=jnp.dtype(cfg.dtype),
                       param_dtype=jnp.dtype(cfg.param_dtype),
                       kernel_init=nn.initializers.normal(stddev=0.02),
                       name="classifier")(extract)  # (R, outputs)
        # Multiple choice: one score per option row, (B * K, 1) -> (B, K).
        logits = logits.reshape(*lead[:1], -1).astype(jnp.float32)
        return logits, lm_logits.reshape(*lead, *lm_logits.shape[1:])
