"""Autoregressive decoding: greedy, sampling and beam search, each one jit-compiled loop.

The algorithms never see a model, only a `Decoder`: a one-step function
`step(params, tokens [N, L], state) -> (logits [N, V], state)` with its parameters (shared by every
sequence) and its per-sequence state (a KV cache, an RNN carry, encoder outputs), plus the batch
axis of each state leaf so beam search can tile and reorder the state. `from_linen` builds one for
a Linen model with a KV cache (GPT); an encoder-decoder or RNN decoder builds its own.

Prompts. A batch of prompts is right-padded, `prompts [B, P]` with `prompt_lengths [B]` (row b's
prompt is prompts[b, :prompt_lengths[b]]). Every row decodes from position 0 and shares one cache
index: at step t the loop feeds token t of each row and, while t + 1 < prompt_lengths[b], forces
the prompt's next token instead of choosing one. Rows with short prompts start generating earlier;
greedy and beam search give each row what decoding that row alone gives (sampling too, but for the
random numbers it draws). Prompt tokens cost one loop step each, except without `prompt_lengths`:
then every prompt fills all P columns and its first P - 1 tokens go through the model as one chunk
(prefill).

Outputs are `[B, max_len]` (beam search: `[B, K, max_len]`) token arrays holding the prompt, the
continuation and then `pad_id`: a row that emits `eos_id` is finished, everything after its EOS is
pad, and the loop stops as soon as every row is finished (or at max_len).
"""

from zoo.decoding.beam import beam_search
from zoo.decoding.decoder import Decoded, Decoder, StepFn, from_linen
from zoo.decoding.generate import greedy, sample

__all__ = ["Decoded", "Decoder", "StepFn", "beam_search", "from_linen", "greedy", "sample"]
