"""The JAX peer of benchmarks.step's GPT: Hugging Face transformers v4's FlaxGPT2LMHeadModel (the
last JAX GPT-2 Hugging Face shipped; v5 is PyTorch only) with the train step a Flax user writes
for it (run_clm_flax's, on one device under jax.jit).

    /tmp/hfflax/bin/python benchmarks/hf_flax_peer.py '{"num_layers": 4, "embed_dim": 256}'

Standalone on purpose: it runs in a venv of its own (transformers 4.57 with flax, jax and optax;
no torch), imports nothing from zoo and reads one JSON object of settings (argv[1]; `DEFAULTS`
for the rest). Alone it times `repeats` steps and prints one JSON object; with "serve": true it
steps on request (`serve`), which is how benchmarks.step times it in turns with ours; with
"hlo_path" it also writes its compiled step's HLO there. benchmarks.step builds the settings
from the job config its own step runs (benchmarks.peers.hf_flax_settings), so both sides match:
* model: GPT2Config with our depth, width, heads, MLP width, vocabulary, positions, dropout
  (residual, embedding, attention) and LayerNorm epsilon; random init, tied output embedding;
  `dtype` the compute dtype over float32 params, as ours.
* data: the same shapes, inputs [B, T] int32 and next-token targets [B, T], all positions real
  (HF builds its causal mask from an all-ones attention_mask).
* loss: mean next-token cross-entropy over every position in float32
  (optax.softmax_cross_entropy_with_integer_labels), dropout on (train=True, a new key a step).
* optimizer: our job's, in optax: clip_by_global_norm, then AdamW with our betas, eps and weight
  decay (not on biases and LayerNorm gains) over linear warmup + cosine decay.
* step: one jax.jit with the params and optimizer state donated, as ours.
Timing mirrors benchmarks.machine.time_call: `warmup` untimed steps, then each step ended by
jax.block_until_ready.
"""

import json
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import transformers
from flax import traverse_util
from transformers import FlaxGPT2LMHeadModel, GPT2Config

DEFAULTS = dict(num_layers=4, num_heads=4, embed_dim=256, mlp_dim=1024, vocab_size=50257,
                max_len=128, dropout_rate=0.1, attention_dropout_rate=0.1,
                layer_norm_epsilon=1e-5, batch=8, seq_len=128, learning_rate=6e-4,
                warmup_steps=2000, total_steps=100_000, b1=0.9, b2=0.95, eps=1e-8,
                weight_decay=0.1, clip_norm=1.0, dtype="float32", warmup=2, repeats=5, seed=0)


def decay_mask(params):
    """True for kernels and embeddings; biases and LayerNorm scales get no weight decay (as
    run_clm_flax's decay_mask_fn and zoo.train.optim.decay_mask)."""
    flat = traverse_util.flatten_dict(params)
    return traverse_util.unflatten_dict(
        {path: path[-1] not in ("bias", "scale") for path in flat})


def make_optimizer(s):
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, s["learning_rate"], max(s["warmup_steps"], 1), s["total_steps"], 0.0)
    adamw = optax.adamw(schedule, b1=s["b1"], b2=s["b2"], eps=s["eps"],
                        weight_decay=s["weight_decay"], mask=decay_mask)
    return optax.chain(optax.clip_by_global_norm(s["clip_norm"]), adamw) if s["clip_norm"] \
        else adamw


def main(settings: dict) -> dict | None:
    """Builds and compiles the peer's step, then times it alone (returns the times), or serves
    steps on request (`serve`, when settings['serve']; returns None)."""
    s = dict(DEFAULTS, **settings)
    config = GPT2Config(
        vocab_size=s["vocab_size"], n_positions=max(s["max_len"], s["seq_len"]),
        n_embd=s["embed_dim"], n_layer=s["num_layers"], n_head=s["num_heads"],
        n_inner=s["mlp_dim"], resid_pdrop=s["dropout_rate"], embd_pdrop=s["dropout_rate"],
        attn_pdrop=s["attention_dropout_rate"], layer_norm_epsilon=s["layer_norm_epsilon"],
        activation_function="gelu_new", bos_token_id=0, eos_token_id=0)
    dtype = jnp.dtype(s["dtype"])
    model = FlaxGPT2LMHeadModel(config, input_shape=(1, s["seq_len"]), seed=s["seed"],
                                dtype=dtype)
    params = model.params
    optimizer = make_optimizer(s)
    opt_state = optimizer.init(params)
    rng = np.random.default_rng(s["seed"])
    tokens = rng.integers(0, s["vocab_size"], (s["batch"], s["seq_len"] + 1), dtype=np.int32)
    inputs, targets = jnp.asarray(tokens[:, :-1]), jnp.asarray(tokens[:, 1:])
    attention_mask = jnp.ones_like(inputs)

    def loss_fn(p, dropout_rng):
        logits = model(inputs, attention_mask=attention_mask, params=p, dropout_rng=dropout_rng,
                       train=True).logits  # (B, T, V)
        return optax.softmax_cross_entropy_with_integer_labels(
            logits.astype(jnp.float32), targets).mean()

    def train_step(p, state, key, count):
        dropout_rng = jax.random.fold_in(key, count)
        loss, grads = jax.value_and_grad(loss_fn)(p, dropout_rng)
        updates, state = optimizer.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    step = jax.jit(train_step, donate_argnums=(0, 1))
    key = jax.random.key(s["seed"])
    start = time.perf_counter()
    compiled = step.lower(params, opt_state, key, jnp.int32(0)).compile()
    compile_s = time.perf_counter() - start
    if s.get("hlo_path"):  # the compiled program, to compare with ours op by op
        with open(s["hlo_path"], "w") as f:
            f.write(compiled.as_text())
    cost = compiled.cost_analysis() or {}
    if isinstance(cost, (list, tuple)):
        cost = cost[0] if cost else {}

    count = 0

    def one_step():
        nonlocal params, opt_state, count
        params, opt_state, loss = compiled(params, opt_state, key, jnp.int32(count))
        count += 1
        return jax.block_until_ready(loss)

    for _ in range(s["warmup"]):
        one_step()
    info = {"name": "transformers.FlaxGPT2LMHeadModel", "transformers": transformers.__version__,
            "jax": jax.__version__, "platform": jax.devices()[0].platform,
            "params": int(sum(x.size for x in jax.tree.leaves(params))),
            "compile_s": compile_s, "xla_flops": cost.get("flops")}
    if s.get("serve"):
        serve(one_step, info)
        return None
    times = [timed(one_step) for _ in range(s["repeats"])]
    return dict(info, step={"median_s": statistics.median(times), "min_s": min(times),
                            "repeats": s["repeats"]})


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def cpu_timed(fn) -> dict[str, float]:
    """Wall seconds of fn() and the CPU seconds this process spent in them (all threads): on a
    machine shared with other jobs the CPU seconds move less than the wall time."""
    cpu, wall = time.process_time(), time.perf_counter()
    fn()
    return {"wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu}


def serve(one_step, info: dict) -> None:
    """Step on request, so a caller in another process can time its own step and this one in
    turns: prints `info` as a JSON line once warm, then reads lines from stdin; each 'step'
    runs one step and answers with its wall and CPU seconds (`cpu_timed`, a JSON object); EOF
    or 'quit' ends."""
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        command = line.strip()
        if command == "quit":
            break
        if command != "step":
            raise SystemExit(f"hf_flax_peer: unknown command {command!r} (step | quit)")
        print(json.dumps(cpu_timed(one_step)), flush=True)


if __name__ == "__main__":
    result = main(json.loads(sys.argv[1]) if len(sys.argv) > 1 else {})
    if result is not None:
        print(json.dumps(result))
