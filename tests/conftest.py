"""The suite sees 8 fake CPU devices, so sharded paths are testable without accelerators (tests
that are not about sharding pass one of them to the loop)."""

import inspect
import os

# Must be set before jax is imported anywhere: the CPU backend reads it once at start-up.
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent XLA compilation cache for the suite: both xdist workers and every train.py /
# eval.py subprocess a test starts (they inherit this environment) compile the same tiny models
# again and again. Under the checkout, so a fresh clone starts cold; the key covers the HLO, the
# jax version, the devices and XLA_FLAGS, so an entry is only reused for the same program.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".jax_cache"))
# Every program, not only those that took over a second: the tiny ones add up (measured: a
# tenth less CPU time on the fine-tuning modules).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# Imported only now: the environment above must be in place before anything loads jax.
import pytest

from configs import bert_pretrain
from configs import gpt as gpt_config

# The longest modules first, in each tier (measured on the 2-core box; a module with no test of
# the tier at hand is simply not collected). `--dist loadscope` (pyproject addopts) keeps a
# module on one xdist worker, so its module-scoped training fixture runs once; starting these
# first lets the short modules fill the other worker around them instead of trailing behind.
_LONG_MODULES = (
    # acceptance: the main job alone takes one worker for most of the tier
    "tests/end_to_end/test_main_job.py",
    "tests/train/test_multihost.py",
    "tests/train/hosts/test_lost_host.py",
    "tests/tasks/test_elmo_binding.py",
    "tests/tasks/test_rnn_translation.py",
    "tests/tasks/test_translation.py",
    "tests/checkpoints/test_faults.py",
    "tests/end_to_end/test_bucket_training.py",
    "tests/train/test_reshape_resume.py",
    "tests/tasks/test_gpt_finetune.py",
    # slow
    "tests/train/test_loop.py",
    "tests/train/test_resume.py",
    "tests/tasks/test_bert_pretraining.py",
    "tests/train/hosts/test_cluster_join.py",
    "tests/docs/test_docs_build.py",
    "tests/docs/test_adding_a_model_guide.py",
    "tests/checkpoints/test_restore_decisions.py",
    "tests/tasks/test_classification_finetune.py",
    "tests/nn/test_blockwise_sharded.py",
    "tests/benchmarks/test_step.py",
    "tests/commands/test_prepare_command.py",
    "tests/end_to_end/test_bad_inputs.py",
    "tests/train/test_dropout_rng.py",
    "tests/test_retry.py",
    "tests/train/test_grad_reduction.py",
    "tests/benchmarks/test_tune.py",
    "tests/train/test_step.py",
    "tests/commands/test_attention_maps_command.py",
    # fast
    "tests/nn/test_blockwise_attention.py",
    "tests/models/test_transformer_translation.py",
    "tests/eval/test_attention_maps.py",
    "tests/decoding/test_decoding.py",
    "tests/train/test_optim.py",
    "tests/nn/test_attention.py",
    "tests/nn/test_recurrent.py",
    "tests/train/hosts/test_lost_hosts.py",
    "tests/nn/test_transformer.py",
    "tests/models/test_rnnlm.py",
    "tests/nn/test_recurrent_backward.py",
    "tests/models/test_elmo.py",
)


def pytest_configure(config):
    """The fast and slow tiers (the default `-m 'not acceptance and not slow'`, `-m slow`, and
    any selection that leaves the acceptance tier out) generate machine code the cheap way:
    LLVM at -O0, and XLA's older elemental emitters instead of its MLIR fusion emitters.
    XLA's own optimisations (fusion, layouts, SPMD partitioning) are
    unchanged; only code generation is cheaper. Its tests compile many tiny programs and run
    each for a few steps, so compiling dominates. Measured on the 2-core box: the whole tier
    took 10.3 min with -O0, and without it only a third was done after 12 min; turning the
    fusion emitters off as well took a further third off compile-bound modules
    (tests/train/test_loop.py, test_classification_finetune.py, test_gpt_finetune.py,
    tests/nn/test_blockwise_attention.py on 2 workers: 110 s -> 71 s). The acceptance tier
    trains for thousands of steps, where -O0 code runs 2x slower (a 300-step tiny SQuAD run:
    71 s vs 35 s), so it keeps the defaults. The processes tests start (train.py, eval.py,
    commands) inherit these flags through tests/process_env.py. Set here, before any test
    module touches a device: jax reads XLA_FLAGS when its CPU backend starts. (Both are flags
    of the locked jaxlib; XLA rejects an unknown flag at start-up, so a jax upgrade shows at
    once if one goes.)"""
    if not _selects_acceptance(config.option.markexpr):
        for flag in ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false"):
            if flag.split("=")[0] not in os.environ["XLA_FLAGS"]:  # a flag set outside wins
                os.environ["XLA_FLAGS"] += " " + flag


def _selects_acceptance(markexpr: str) -> bool:
    """Whether `-m markexpr` may select acceptance tests: `-m ""` (every tier) and any
    expression naming the marker other than as `not acceptance`."""
    expr = markexpr.replace(" ", "")
    return not expr or ("acceptance" in expr and "notacceptance" not in expr)


def _compares_floats(test) -> bool:
    """Whether a test function compares floats through tests/numerics.py: in its own code, or in
    a function of the suite it calls, followed through (a module's helper that compares, a shared
    checker). Marking the tests that do, not every test of a module that imports it, keeps such a
    module's end-to-end and error-message tests (a command trained and run: 20-40 s each) out of
    CI's second, reordered run."""
    todo, seen = [test], set()
    while todo:
        function = inspect.unwrap(todo.pop())
        code = getattr(function, "__code__", None)
        if code is None or code in seen:
            continue
        seen.add(code)
        codes, names = [code], set()
        while codes:  # the function's nested functions, lambdas and comprehensions too
            inner = codes.pop()
            names.update(inner.co_names)
            codes.extend(c for c in inner.co_consts if inspect.iscode(c))
        for name in names:
            value = function.__globals__.get(name)
            origin = getattr(value, "__module__", None) or ""
            if origin == "tests.numerics":
                return True
            if inspect.isfunction(value) and origin.startswith("tests"):
                todo.append(value)
    return False


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    # `numerics`: every test that compares floats through tests/numerics.py (_compares_floats).
    # .ci/run runs them a second time with their float32 rounding changed (docs/development/testing.md).
    for item in items:
        if _compares_floats(getattr(item, "function", None)):
            item.add_marker(pytest.mark.numerics)
        # The acceptance tier trains for minutes, and a module's first test also pays for its
        # module-scoped training fixture (the main job: most of the tier's 10-19 min); the
        # fast tier's 10-minute limit (pyproject) would cut a slow machine's run short.
        if item.get_closest_marker("acceptance") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(1800))
    rank = {path: i for i, path in enumerate(_LONG_MODULES)}
    # A stable sort: within a module, and among the short modules, collection order stays.
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture
def tiny_lm_config():
    """The tiny GPT job shrunk to test size (the real config file, only smaller numbers)."""

    def make(**train):
        config = gpt_config.get_config("size=tiny")
        config.data.update(seq_len=16, batch_size=8, eval_batch_size=8, vocab_size=128)
        config.train.update(dict(dict(log_every=1, eval_every=1000, checkpoint_every=1000,
                                      tensorboard=False), **train))
        config.optim.warmup_steps = 2
        return config

    return make


@pytest.fixture(scope="session")
def tiny_pretrained_bert(tmp_path_factory):
    """A directory with a 4-step tiny BERT pretraining run (`pretrain`) and its data cache
    (`cache`: the tokenizer fine-tuning tests share): the start of every fine-tuning test."""
    import jax  # after XLA_FLAGS

    from zoo.commands import jobs

    root = tmp_path_factory.mktemp("pretrained")
    config = bert_pretrain.get_config("size=tiny")
    config.data.update(synthetic_entities=100, vocab_size=512, seq_len=64,
                       cache_dir=str(root / "cache"), dupe_factor=1)
    config.train.update(steps=4, eval_every=4, log_every=2, tensorboard=False)
    jobs.train(config, str(root / "pretrain"), devices=jax.devices()[:1])  # not about sharding
    return root



@pytest.fixture(scope="session")
def gcs(tmp_path_factory):
    """A GCS-API server on 127.0.0.1 (tests/gcs_server.py) for this worker's session, with the
    environment that points gcsfs / epath, tensorstore / orbax and google-cloud-storage at it
    set here and handed on to the processes tests start (they copy os.environ). `gcs.bucket()`
    makes a fresh bucket."""
    from tests.gcs_server import GcsServer

    server = GcsServer(str(tmp_path_factory.mktemp("gcs")))
    env = server.env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    yield server
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    server.stop()


@pytest.fixture
def gcs_knobs(gcs):
    """The session's server, for a test that turns its knobs (latency, faults: see
    tests/gcs_server.py); they are put back afterwards, so the next test meets a polite
    server."""
    gcs.reset_behaviour()
    yield gcs
    gcs.reset_behaviour()


@pytest.fixture
def fast_retries(monkeypatch):
    """Retries without their waits, for tests that inject more faults than gcsfs absorbs: gcsfs
    sleeps 1, 2, 4, 8, 16 s between its 6 tries of a request (gcsfs/retry.py looks up
    `asyncio.sleep` through its module global at each retry), and zoo.retry.DEFAULT waits
    4 s and 16 s between its 3 tries of an operation."""
    import asyncio
    import types

    from gcsfs import retry as gcsfs_retry

    from zoo import retry

    async def no_wait(_seconds):
        await asyncio.sleep(0)

    monkeypatch.setattr(gcsfs_retry, "asyncio", types.SimpleNamespace(sleep=no_wait))
    monkeypatch.setattr(retry, "DEFAULT", retry.Policy(first_delay_s=0.01, max_delay_s=0.05))


@pytest.fixture
def gcs_bucket(gcs):
    """`gs://<a new, empty bucket>` on the session's server."""
    return f"gs://{gcs.bucket()}"
