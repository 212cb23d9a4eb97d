"""The benchmark results pages: every markdown report under benchmarks/results/<machine>/
(what the benchmark scripts write, committed with their runs) becomes a page, with the plots
of its directory; one index per machine."""

import pathlib
import shutil


def _title(text: str, fallback: str) -> tuple[str, str]:
    first = text.lstrip().splitlines()[0] if text.strip() else ""
    if first.startswith("# "):
        return first[2:].strip(), text
    return fallback, f"# {fallback}\n\n{text}"


def write_pages(root: pathlib.Path, out: pathlib.Path) -> None:
    results = root / "benchmarks" / "results"
    machines = sorted(p for p in results.iterdir() if p.is_dir())
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for machine in machines:
        target = out / machine.name
        target.mkdir(parents=True)
        pages = []
        for report in sorted(machine.rglob("*.md")):
            rel = report.relative_to(machine).with_suffix("")
            name = "-".join(rel.parts)
            title, text = _title(report.read_text(encoding="utf-8"),
                                 f"{machine.name}: {'/'.join(rel.parts)}")
            if report.with_suffix(".jsonl").exists():
                text += (f"\n\nEvery measurement behind this report, as JSON lines: "
                         f"`benchmarks/results/{machine.name}/{rel}.jsonl`.\n")
            (target / f"{name}.md").write_text(text, encoding="utf-8")
            pages.append(name)
        plots = sorted(machine.rglob("*.png"))
        lines = [f"# {machine.name}", "",
                 f"Reports committed under `benchmarks/results/{machine.name}/`.", "",
                 "```{toctree}", ":maxdepth: 1", ""] + pages + ["```", ""]
        for plot in plots:
            rel = plot.relative_to(machine)
            name = "-".join(rel.parts)
            shutil.copyfile(plot, target / name)
            lines += [f"## {'/'.join(rel.parts)}", "", f"![{rel}]({name})", ""]
        (target / "index.md").write_text("\n".join(lines), encoding="utf-8")
        entries.append(f"{machine.name}/index")
    index = ["# Results by machine", "",
             "Generated from `benchmarks/results/` when the docs are built: each machine's "
             "reports as the benchmark scripts wrote them.", "",
             "```{toctree}", ":maxdepth: 2", ""] + entries + ["```", ""]
    (out / "index.md").write_text("\n".join(index), encoding="utf-8")
