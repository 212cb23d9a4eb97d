"""The PyTorch side of benchmarks.step (Hugging Face transformers BERT and GPT-2, and
torch.nn.LSTM) and of benchmarks.scaling (torch.nn.LSTM / GRU), built to equal our models and
timed on the same inputs.

Like for like:
* Models come from our configs through zoo.convert.{bert,gpt2}.config_to_hf, so widths, depths,
  vocabularies, dropout and LayerNorm epsilons match, and so do the parameter counts (the
  LSTM excepted: torch keeps two bias vectors per gate, b_ih and b_hh, where ours has one).
* BERT's masked-LM head runs at the masked positions only, as ours does: HF's
  BertForPreTraining.forward would project all T positions onto the vocabulary (about T / P =
  6.4x the head's work), so the loss composes HF's own submodules (`bert`, `cls.predictions`,
  `cls.seq_relationship`) around the same gather. GPT-2 is GPT2LMHeadModel's own forward, with
  next-token cross-entropy over every position as in our LM task.
* The train step is what a PyTorch user writes: zero_grad, loss.backward(), clip the global
  gradient norm, AdamW.step(), with our optimizer config's betas, eps, weight decay (not on
  biases and LayerNorm gains, as zoo.train.optim.decay_mask) and clipping norm. The forward runs
  in eval mode under torch.no_grad(), as our eval step runs without dropout.
* Same compute dtype: float32 plain; bfloat16 through torch.autocast over float32 parameters
  (our param_dtype float32 + dtype bfloat16).
* Same threads on a CPU: torch.set_num_threads(n) with n = the CPUs this process may run on,
  the size of XLA's CPU thread pool.
Timing mirrors benchmarks.machine.time_call: warm-up calls, then the median of `repeats` calls,
each ended by torch.cuda.synchronize() on a GPU (CUDA, like JAX, runs asynchronously).

The JAX peer of our GPT, Hugging Face transformers v4's FlaxGPT2LMHeadModel (v5 dropped its
JAX models), needs transformers 4.x with flax and so a venv of its own: `HFFlaxPeer` runs
benchmarks/hf_flax_peer.py under that venv's python and steps it on request, so that
benchmarks.step can time its step and ours in turns.
"""

import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from zoo.convert import bert as bert_convert
from zoo.convert import gpt2 as gpt2_convert
from zoo.errors import ConfigError
from zoo.models.bert import BertConfig
from zoo.models.gpt import GPTConfig


def unavailable_reason(jax_platform: str = "cpu") -> str | None:
    """Why the peers cannot run here (None when they can): torch or transformers missing (the
    project's 'parity' extra), or a JAX accelerator with a torch that cannot reach one."""
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as error:
        return (f"{error.name or 'torch'} is not installed (pip install -e '.[parity]' brings "
                "torch and transformers)")
    if jax_platform == "gpu" and not torch.cuda.is_available():
        return ("JAX runs on a GPU but this torch has no CUDA device: a GPU step against a CPU "
                "step would compare machines, not frameworks")
    if jax_platform not in ("cpu", "gpu"):
        return f"no PyTorch peer for JAX platform {jax_platform!r}"
    return None


def cpu_threads() -> int:
    """The CPUs this process may run on: the size of XLA's CPU thread pool."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def setup_torch(jax_platform: str) -> dict[str, Any]:
    """Sets torch's intra-op threads to XLA's and returns what the peers run on."""
    import torch
    import transformers

    threads = cpu_threads()
    torch.set_num_threads(threads)
    device = "cuda" if jax_platform == "gpu" else "cpu"
    return {"torch": torch.__version__, "transformers": transformers.__version__,
            "torch_device": device, "torch_threads": torch.get_num_threads()}


def hf_bert(config: BertConfig):
    """transformers.BertForPreTraining with our BERT's architecture (random init)."""
    import transformers

    return transformers.BertForPreTraining(
        transformers.BertConfig(**bert_convert.config_to_hf(config)))


def hf_gpt2(config: GPTConfig):
    """transformers.GPT2LMHeadModel with our GPT's architecture (random init)."""
    import transformers

    # GPT-2's default bos/eos id (50256) lies outside smaller vocabularies.
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **gpt2_convert.config_to_hf(config, bos_token_id=0, eos_token_id=0)))


def torch_lstm(features: int, hidden: int):
    import torch

    return torch.nn.LSTM(features, hidden, batch_first=True)


def num_params(module) -> int:
    """Distinct parameters (a tied weight counted once, as in our params tree)."""
    return sum(p.numel() for p in module.parameters())


def _time(fn: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int
          ) -> dict[str, float]:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return {"median_s": statistics.median(times), "min_s": min(times), "repeats": repeats}


def bert_loss(model, b):
    """Our mlm_nsp objective (mean MLM loss over masked positions + mean NSP loss) from HF's
    BERT submodules, on a torch batch of our task's keys (`to_torch`)."""
    import torch
    import torch.nn.functional as F

    out = model.bert(input_ids=b["input_ids"], token_type_ids=b["token_type_ids"],
                     attention_mask=b["attention_mask"])
    seq, pooled = out.last_hidden_state, out.pooler_output  # (B, T, H), (B, H)
    index = b["masked_lm_positions"][..., None].expand(-1, -1, seq.shape[-1])  # (B, P, H)
    mlm = model.cls.predictions(torch.gather(seq, 1, index)).float()  # (B, P, V)
    nsp = model.cls.seq_relationship(pooled).float()  # (B, 2)
    weights = b["masked_lm_weights"].flatten()
    mlm_nll = F.cross_entropy(mlm.flatten(0, 1), b["masked_lm_ids"].flatten(), reduction="none")
    mlm_loss = (mlm_nll * weights).sum() / weights.sum().clamp(min=1.0)
    return mlm_loss + F.cross_entropy(nsp, b["next_sentence_labels"])


def gpt2_loss(model, b):
    """Mean next-token cross-entropy over every position (our LM task's, weights all 1)."""
    import torch.nn.functional as F

    logits = model(input_ids=b["inputs"]).logits.float()  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1), b["targets"].flatten())


def to_torch(batch: dict[str, np.ndarray], device: str = "cpu") -> dict[str, Any]:
    """Our numpy batch as torch tensors (integer arrays as int64, what torch indexes with)."""
    import torch

    tensors = {k: torch.as_tensor(np.asarray(v)).to(device) for k, v in batch.items()}
    return {k: v if v.is_floating_point() else v.long() for k, v in tensors.items()}


_PEERS = {"bert": (hf_bert, bert_loss, "transformers.BertForPreTraining"),
          "gpt": (hf_gpt2, gpt2_loss, "transformers.GPT2LMHeadModel")}


def time_transformer(family: str, config: BertConfig | GPTConfig, batch: dict[str, np.ndarray],
                     optim: Any, *, device: str = "cpu", dtype: str = "float32",
                     warmup: int = 1, repeats: int = 5) -> dict[str, Any]:
    """Forward (eval, no_grad) and train-step (AdamW) times of the HF peer of our `family`
    model ('bert' | 'gpt') on `batch` (our task's numpy batch).

    Args:
      optim: our optimizer config (b1, b2, eps, weight_decay, learning_rate, clip_norm).
    """
    import torch

    if family not in _PEERS:
        raise ValueError(f"time_transformer: family={family!r} must be one of {list(_PEERS)}")
    build, loss_fn, name = _PEERS[family]
    torch.manual_seed(0)
    model = build(config).to(device)
    b = to_torch(batch, device)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]  # biases and LayerNorm gains
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": optim.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=optim.learning_rate, betas=(optim.b1, optim.b2), eps=optim.eps)
    autocast = dict(device_type=device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def forward():
        with torch.no_grad(), torch.autocast(**autocast):
            return loss_fn(model, b)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(**autocast):
            loss = loss_fn(model, b)
        loss.backward()
        if optim.clip_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), optim.clip_norm)
        optimizer.step()
        return loss

    model.eval()
    forward_t = _time(forward, sync, warmup, repeats)
    model.train()
    step_t = _time(train_step, sync, warmup, repeats)
    return {"name": name, "params": num_params(model), "forward": forward_t, "step": step_t,
            "attention": model.config._attn_implementation}


def lstm_calls(batch: int, steps: int, features: int, *, device: str = "cpu"
               ) -> dict[str, Any]:
    """A one-layer torch.nn.LSTM on (batch, steps, features) float32 inputs, hidden = features,
    as calls to time: forward (no_grad) and forward + backward (d sum(outputs) / d params,
    inputs), each ending with a device sync. benchmarks.step times them call by call,
    alternating with ours (`time_lstm` times them alone)."""
    import torch

    torch.manual_seed(0)
    lstm = torch_lstm(features, features).to(device)
    x = torch.randn(batch, steps, features, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def forward():
        with torch.no_grad():
            lstm(x)[0]
        sync()

    def forward_backward():
        lstm.zero_grad(set_to_none=True)
        xg = x.detach().requires_grad_()
        lstm(xg)[0].sum().backward()
        sync()

    return {"name": "torch.nn.LSTM", "params": num_params(lstm), "forward": forward,
            "train": forward_backward}


def time_lstm(batch: int, steps: int, features: int, *, device: str = "cpu",
              warmup: int = 1, repeats: int = 5) -> dict[str, Any]:
    """Forward and forward + backward times of `lstm_calls`, timed alone."""
    calls = lstm_calls(batch, steps, features, device=device)

    def no_sync():
        return None

    return {"name": calls["name"], "params": calls["params"],
            "forward": _time(calls["forward"], no_sync, warmup, repeats),
            "train": _time(calls["train"], no_sync, warmup, repeats)}


def time_recurrent(kind: str, pass_: str, batch: int, steps: int, features: int, *,
                   device: str = "cpu", warmup: int = 1, repeats: int = 5) -> dict[str, float]:
    """One of benchmarks.scaling's passes for a one-layer torch.nn.LSTM or GRU (`kind` 'lstm' /
    'gru', hidden = features) on (batch, steps, features) float32 inputs: 'forward' (no_grad)
    or 'forward_backward' (0.5 * sum(outputs^2) differentiated w.r.t. the parameters and the
    inputs, as the scaling benchmark differentiates zoo's layers)."""
    import torch

    torch.manual_seed(0)
    layer = {"lstm": torch.nn.LSTM, "gru": torch.nn.GRU}[kind](features, features,
                                                             batch_first=True).to(device)
    x = torch.randn(batch, steps, features, device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def forward():
        with torch.no_grad():
            return layer(x)[0]

    def forward_backward():
        layer.zero_grad(set_to_none=True)
        xg = x.detach().requires_grad_()
        (0.5 * layer(xg)[0].square().sum()).backward()

    return _time(forward if pass_ == "forward" else forward_backward, sync, warmup, repeats)


HF_FLAX_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hf_flax_peer.py")
HF_FLAX_VENV = ("python3 -m venv /tmp/hfflax && /tmp/hfflax/bin/pip install "
                "'transformers==4.57.6' flax==0.12.8 jax==0.10.2 optax==0.2.8")


def hf_flax_settings(config: GPTConfig, optim: Any, batch: int, seq_len: int, *,
                     dtype: str = "float32", warmup: int = 1, seed: int = 0) -> dict[str, Any]:
    """The settings benchmarks/hf_flax_peer.py builds its GPT-2 and step from: our model's
    shape, dropout and epsilon, our optimizer config's AdamW, clipping and schedule, our batch
    shape and compute dtype."""
    return dict(
        num_layers=config.num_layers, num_heads=config.num_heads, embed_dim=config.embed_dim,
        mlp_dim=config.mlp_dim, vocab_size=config.vocab_size, max_len=config.max_len,
        dropout_rate=config.dropout_rate, attention_dropout_rate=config.attention_dropout_rate,
        layer_norm_epsilon=config.layer_norm_epsilon, batch=batch, seq_len=seq_len,
        learning_rate=optim.learning_rate, warmup_steps=int(optim.warmup_steps),
        total_steps=int(optim.total_steps), b1=optim.b1, b2=optim.b2, eps=optim.eps,
        weight_decay=optim.weight_decay, clip_norm=optim.clip_norm, dtype=dtype, warmup=warmup,
        seed=seed)


class HFFlaxPeer:
    """FlaxGPT2LMHeadModel's train step in another venv's process (benchmarks/hf_flax_peer.py
    in its serve mode), built, compiled and warmed up on construction; `step()` runs one step
    there and returns its wall and CPU seconds as timed in that process ({'wall_s', 'cpu_s'}).
    Use as a context manager."""

    def __init__(self, python: str, settings: dict[str, Any]):
        # The peer's stderr, kept for the error message should it fail; closed in close().
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115
        # On a GPU our process holds JAX's preallocated share; the peer allocates as it goes.
        env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
        try:
            self._process = subprocess.Popen(
                [python, HF_FLAX_SCRIPT, json.dumps(dict(settings, serve=True))],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                env=env)
        except OSError as error:
            self._stderr.close()
            raise ConfigError(f"--hf-flax-python {python}: cannot run it ({error}); make the "
                              f"venv with: {HF_FLAX_VENV}") from None
        self.info = self._answer()

    def _answer(self) -> Any:
        # The libraries may print to stdout first; the peer's answers are its JSON lines.
        for line in self._process.stdout:
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
        self._process.wait()
        self._stderr.seek(0)
        tail = self._stderr.read()[-2000:]
        raise ConfigError(f"the HF Flax peer ({HF_FLAX_SCRIPT}) exited with status "
                          f"{self._process.returncode}; a venv for it: {HF_FLAX_VENV}\n{tail}")

    @property
    def pid(self) -> int:
        """The peer's process id (benchmarks.machine.wait_until_idle waits for it too)."""
        return self._process.pid

    def step(self) -> dict[str, float]:
        self._process.stdin.write("step\n")
        self._process.stdin.flush()
        return self._answer()

    def close(self) -> None:
        if self._process.poll() is None:
            self._process.stdin.write("quit\n")
            self._process.stdin.close()
            self._process.wait(timeout=60)
        self._stderr.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
