"""benchmarks.step's outputs: step.jsonl, step_summary.json, step.md and step.png."""

import json
import os
from typing import Any

from benchmarks import machine
from zoo.errors import ConfigError


def _num(value: float | None, fmt: str = ".3g") -> str:
    return "–" if value is None else format(value, fmt)


def _ms(seconds: float | None) -> str:
    return _num(seconds and seconds * 1e3, ".2f")


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}%"


def _gib(n_bytes: float | None) -> str:
    return _num(n_bytes and n_bytes / 2**30, ".3g")


_INTERVAL_NOTE = ("A ratio in turns is followed, in parentheses, by the interval of the median of "
                  "its per-turn ratios (90% where the turns allow: benchmarks.machine."
                  "ratio_interval); one that holds 1.0 is parity within the machine's noise.")


def _with_interval(ratio: float | None, interval: dict[str, float] | None) -> str:
    """A ratio, and after it the interval of its per-turn ratios (machine.ratio_interval) where
    the run measured one: '1.05 (0.98-1.12)'."""
    text = _num(ratio, ".3g")
    if interval is not None:
        text += f" ({interval['low']:.2f}-{interval['high']:.2f})"
    return text


def _hf_flax_timing(configs: list[dict[str, Any]]) -> str:
    """What the report's HF Flax paragraph adds on how its turns were timed, from the rows timed
    beside HF Flax (the others, BERT's, have none): idle starts if every such row had them
    (older runs' did not), and the note on intervals if any row has one."""
    timed = [r["hf_flax"] for r in configs if "step_ratio" in r.get("hf_flax", {})]
    text = ""
    if timed and all(f.get("steps_start_idle") for f in timed):
        text += " Each step started with both processes idle (machine.wait_until_idle)."
    if any("step_ratio_interval" in f for f in timed):
        text += f" {_INTERVAL_NOTE}"
    return text


def row_line(row: dict[str, Any]) -> str:
    """One console line for a summary row."""
    line = (f"{row['tokens_per_s']:,.0f} tok/s, step {row['step_s'] * 1e3:.1f} ms, compile "
            f"{row['compile_s']:.1f} s, MFU vs matmul {_pct(row['mfu_vs_matmul'])}")
    if row["mfu_spec"] is not None:
        line += f", MFU vs spec {_pct(row['mfu_spec'])}"
    line += (f"; memory: dry run {_gib(row.get('dry_run_bytes'))} GiB, XLA "
             f"{_gib(row['program_bytes'])} GiB")
    if row.get("process_peak_memory_bytes"):
        line += f", allocator peak {_gib(row['process_peak_memory_bytes'])} GiB"
    peer = row.get("peer", {})
    if "step_ratio" in peer:
        line += f"; ours/HF step {peer['step_ratio']:.2f}, forward {peer['forward_ratio']:.2f}"
    flax = row.get("hf_flax", {})
    if "step_ratio" in flax:
        line += (f"; in turns with HF Flax: ours {flax['ours_step_s'] * 1e3:.1f} ms, theirs "
                 f"{flax['step_s'] * 1e3:.1f} ms, ours/theirs {flax['step_ratio']:.2f} (best "
                 f"{flax['step_ratio_min']:.2f}, CPU s {flax['cpu_ratio']:.2f})")
        if "step_ratio_interval" in flax:
            line += f"; per turn {_interval_text(flax['step_ratio_interval'])}"
    return line


def _interval_text(interval: dict[str, float]) -> str:
    """'1.05, 90% interval 0.98-1.12 (20 turns)': machine.ratio_interval's result in words."""
    return (f"{interval['ratio']:.2f}, {100 * interval['coverage']:.0f}% interval "
            f"{interval['low']:.2f}-{interval['high']:.2f} ({interval['turns']} turns)")


def lstm_line(row: dict[str, Any]) -> str:
    """One console line for an LSTM row."""
    line = (f"{row.get('backend', 'scan')}: fwd {_ms(row['forward_s'])} ms, "
            f"fwd+bwd {_ms(row['train_s'])} ms "
            f"(load {row['load_avg_1m']:.2f})")
    peer = row.get("peer", {})
    if "train_ratio" in peer:
        line += (f"; torch fwd {_ms(peer['forward_s'])} ms, fwd+bwd {_ms(peer['train_s'])} ms; "
                 f"ours/torch fwd {peer['forward_ratio']:.2f}, fwd+bwd {peer['train_ratio']:.2f} "
                 f"(best vs best {peer['train_ratio_min']:.2f})")
        if "train_ratio_interval" in peer:
            line += f"; fwd+bwd per turn {_interval_text(peer['train_ratio_interval'])}"
    return line


_CONFIG_HEADER = (
    "| model | size | seq | batch | params | tokens/s | step ms | compile s | fwd ms | MFU spec "
    "| MFU vs matmul | dry run GiB | XLA GiB | peak GiB | HF tokens/s | step ours/HF "
    "| best step ours/HF | fwd ours/HF | HF Flax step ms | step ours/HF Flax "
    "| best ours/HF Flax | CPU s ours/HF Flax |\n"
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:"
    "|---:|---:|---:|---:|"
)
_LSTM_HEADER = (
    "| batch | steps n | width d | backend | fwd ms | fwd+bwd ms | torch fwd ms "
    "| torch fwd+bwd ms | fwd ours/torch | fwd+bwd ours/torch | best fwd+bwd ours/torch "
    "| load (1 min) |\n"
    "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def markdown(summary: dict[str, Any]) -> str:
    s = summary
    spec = s["peak_flops_spec"]
    lines = [
        f"# Training-step benchmark on {s['machine']} ({s['device_kind']})",
        "",
        (f"jax {s['jax']}, preset `{s['preset']}`, compute dtype {s['dtype']}, median of "
         f"{s['steps']} timed steps after {s['warmup']} warm-up; one device."),
        (f"Measured matmul ({s['matmul']}): {s['matmul_flops'] / 1e9:,.1f} GFLOP/s; "
         f"spec peak: {_num(spec and spec / 1e12, '.0f')} TFLOP/s."),
        "",
        "FLOPs per token (forward + backward, the tasks' own formulas):",
        "",
    ]
    lines += [f"* {model}: {formula}" for model, formula in s["flops_formulas"].items()]
    lines += ["", f"MFU = {s['mfu']}.", "",
              ("Memory per device: the dry run's estimate (zoo.train.compilation.dry_run: "
               "parameters, gradients, update, optimizer state, activations), XLA's compiled step "
               "(arguments + outputs + temporaries) and the allocator's peak since the process "
               "started (GPU/TPU only; run one configuration per process to compare it)."), ""]
    peers = s["peers"]
    if "skipped" in peers:
        lines += [f"PyTorch peers skipped: {peers['skipped']}.", ""]
    else:
        lines += [
            (f"Peers: torch {peers['torch']}, transformers {peers['transformers']} on "
             f"{peers['torch_device']}, {peers['torch_threads']} threads (XLA CPU threads: "
             f"{s['xla_cpu_threads']}). Ratios are {s['ratios']}; 'best' divides the fastest "
             "steps, steadier than the medians when other work shares the CPU (on a busy "
             "2-core machine torch with 2 threads ran its steps up to 10x slower than with 1, "
             "XLA far less: time the peers on a quiet machine)."),
            "",
        ]
    flax = s.get("hf_flax", {})
    if "skipped" in flax:
        lines += [f"HF Flax peer (GPT) absent: {flax['skipped']}.", ""]
    elif flax:
        lines += [
            ("HF Flax peer (GPT): transformers v4's FlaxGPT2LMHeadModel in its own venv "
             f"({flax['python']}), the last JAX GPT-2 Hugging Face shipped, built and trained "
             "as benchmarks/hf_flax_peer.py says (our shape, dropout, loss and optimizer), and "
             "timed one step each in turns with ours, so a load change hits both; its columns "
             "are from those turns (ours re-timed beside it), the CPU-seconds ratio being the "
             "steadiest on a shared machine." + _hf_flax_timing(s["configs"])),
            "",
        ]
    lines.append(_CONFIG_HEADER)
    for r in s["configs"]:
        p, f = r.get("peer", {}), r.get("hf_flax", {})
        lines.append(
            f"| {r['model']} | {r['size']} | {r['seq_len']} | {r['batch']} | "
            f"{r['params'] / 1e6:.2f}M | {r['tokens_per_s']:,.0f} | {r['step_s'] * 1e3:.1f} | "
            f"{r['compile_s']:.1f} | {r['forward_s'] * 1e3:.1f} | {_pct(r['mfu_spec'])} | "
            f"{_pct(r['mfu_vs_matmul'])} | {_gib(r.get('dry_run_bytes'))} | "
            f"{_gib(r['program_bytes'])} | {_gib(r.get('process_peak_memory_bytes'))} | "
            f"{_num(p.get('tokens_per_s'), ',.0f')} | "
            f"{_num(p.get('step_ratio'), '.3g')} | {_num(p.get('step_ratio_min'), '.3g')} | "
            f"{_num(p.get('forward_ratio'), '.3g')} | {_ms(f.get('step_s'))} | "
            f"{_with_interval(f.get('step_ratio'), f.get('step_ratio_interval'))} | "
            f"{_num(f.get('step_ratio_min'), '.3g')} | "
            f"{_num(f.get('cpu_ratio'), '.3g')} |")
    if s["lstm"]:
        timing = ("" if s.get("lstm_repeats") is None else
                  f", median of {s['lstm_repeats']} calls per side, ours and torch's in turns")
        if all(r.get("calls_start_idle") for r in s["lstm"]):  # older rows were not
            timing += ", each call started with the process idle (machine.wait_until_idle)"
        lines += ["", ("LSTM, one layer, float32, hidden = width (ours: zoo.nn.recurrent.RNN "
                       "with each backend: 'scan' = lax.scan, 'cpu_fused' = zoo's C++ kernel, "
                       f"'cudnn'; torch.nn.LSTM batch_first){timing}:"), "", _LSTM_HEADER]
        for r in s["lstm"]:
            p = r.get("peer", {})
            lines.append(
                f"| {r['batch']} | {r['n']} | {r['d']} | {r.get('backend', 'scan')} | "
                f"{_ms(r['forward_s'])} | "
                f"{_ms(r['train_s'])} | {_ms(p.get('forward_s'))} | {_ms(p.get('train_s'))} | "
                f"{_with_interval(p.get('forward_ratio'), p.get('forward_ratio_interval'))} | "
                f"{_with_interval(p.get('train_ratio'), p.get('train_ratio_interval'))} | "
                f"{_num(p.get('train_ratio_min'), '.3g')} | {_num(r.get('load_avg_1m'), '.2f')} |")
        if any("train_ratio_interval" in r.get("peer", {}) for r in s["lstm"]):
            lines += ["", _INTERVAL_NOTE]
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], path: str) -> None:
    """Tokens/s of every config, ours beside the HF peer's (train step), log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["configs"]
    labels = [f"{r['model']} {r['size']}\nT={r['seq_len']}" for r in rows]
    ours = [r["tokens_per_s"] for r in rows]
    theirs = [r.get("peer", {}).get("tokens_per_s") or 0.0 for r in rows]
    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(rows) + 2), 4.0))
    width = 0.4
    ax.bar([i - width / 2 for i in x], ours, width, label="zoo (JAX)")
    if any(theirs):
        ax.bar([i + width / 2 for i in x], theirs, width, label="HF transformers (PyTorch)")
    ax.set_xticks(list(x), labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_ylabel("training tokens / s")
    ax.set_title(f"Train step throughput, {summary['machine']}, {summary['dtype']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def merge(out: str, summary: dict[str, Any], records: list[dict]
          ) -> tuple[dict[str, Any], list[dict]]:
    """This run's summary and records merged into those already in `out`: a row of this run
    replaces the earlier row of the same config. The runs must share machine, preset and dtype."""
    path = os.path.join(out, "step_summary.json")
    if not os.path.exists(path):
        return summary, records
    with open(path) as f:
        old = json.load(f)
    for key in ("machine", "preset", "dtype"):
        if old.get(key) != summary[key]:
            raise ConfigError(f"--append: {path} has {key}={old.get(key)!r}, this run "
                             f"{summary[key]!r}; write to another --out")

    def rows(name, key):
        new = {key(r) for r in summary[name]}
        return [r for r in old[name] if key(r) not in new] + summary[name]

    # A run that timed no transformer config (--models none) keeps the earlier header: the
    # matmul rate and the peers' versions are what the kept configs were measured with.
    header = old if old["configs"] and not summary["configs"] else summary
    merged = dict(header,
                  configs=rows("configs", lambda r: (r["model"], r["size"], r["seq_len"])),
                  lstm=rows("lstm", lambda r: (r["batch"], r["n"], r["d"],
                                               r.get("backend", "scan"))),
                  flops_formulas={**old["flops_formulas"], **summary["flops_formulas"]},
                  lstm_repeats=summary.get("lstm_repeats"),
                  wall_s=old["wall_s"] + summary["wall_s"])
    with open(os.path.join(out, "step.jsonl")) as f:
        earlier = [json.loads(line) for line in f if line.strip()]
    return merged, earlier + [r for r in records if r["kind"] != "machine"]


def write_all(out: str, summary: dict[str, Any], records: list[dict]) -> None:
    """step.jsonl (records), step_summary.json, step.md and step.png in `out`."""
    machine.write_jsonl(os.path.join(out, "step.jsonl"), records)
    with open(os.path.join(out, "step_summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    with open(os.path.join(out, "step.md"), "w") as f:
        f.write(markdown(summary))
    plot(summary, os.path.join(out, "step.png"))
