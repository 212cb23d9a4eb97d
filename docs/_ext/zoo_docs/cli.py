"""The command-line programs' page: each program's docstring and its flags, read from its
source with `ast` (never imported or run, so the build stays fast): absl `flags.DEFINE_*` calls
and argparse `add_argument` calls."""

import ast
import pathlib

# train.py and eval.py share the flags of zoo/commands/cli.py.
ENTRY_POINTS = ("train.py", "eval.py")


def _const(node):
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        return ast.unparse(node)


def flags(source: str) -> list[tuple[str, str, str]]:
    """[(flag, default, help)] of every absl DEFINE_* and argparse add_argument call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
            continue
        name = node.func.attr
        kw = {k.arg: k.value for k in node.keywords if k.arg}
        if name.startswith("DEFINE_") and node.args:
            flag = "--" + str(_const(node.args[0]))
            default = _const(node.args[1]) if len(node.args) > 1 else _const(kw.get("default"))
            text = node.args[2] if len(node.args) > 2 else kw.get("help_string", kw.get("help"))
        elif name == "add_argument" and node.args:
            flag = ", ".join(str(_const(a)) for a in node.args)
            default = _const(kw["default"]) if "default" in kw else (
                False if "store_true" == _const(kw.get("action", ast.Constant(""))) else "")
            text = kw.get("help")
        else:
            continue
        help_text = _const(text) if text is not None else ""
        found.append((flag, repr(default), str(help_text)))
    return found


def _table(rows) -> list[str]:
    if not rows:
        return ["(no flags of its own)", ""]
    lines = ["| flag | default | meaning |", "|---|---|---|"]
    for flag, default, text in rows:
        text = " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")
        default = default.replace("|", "\\|").replace("`", "'")
        lines.append(f"| `{flag}` | `{default}` | {text} |")
    return lines + [""]


def programs(root: pathlib.Path) -> list[tuple[str, pathlib.Path]]:
    """(how it is run, its file) for train.py, eval.py and every module with a __main__ block
    under zoo/commands and benchmarks."""
    found = [(f"python {name}", root / name) for name in ENTRY_POINTS]
    for folder in ("zoo/commands", "benchmarks"):
        for path in sorted((root / folder).glob("*.py")):
            if '__name__ == "__main__"' in path.read_text(encoding="utf-8"):
                module = ".".join(path.relative_to(root).with_suffix("").parts)
                found.append((f"python -m {module}", path))
    return found


def write_pages(root: pathlib.Path, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    shared = flags((root / "zoo/commands/cli.py").read_text(encoding="utf-8"))
    lines = ["# Command-line programs", "",
             "Every program, its docstring and its flags, read from the source when the docs "
             "are built. Programs that take `--config` also take any config key as "
             "`--config.SECTION.KEY=VALUE` (the [config reference](../configs/index.md)); a "
             "user error prints one line and exits 1 (`ZOO_DEBUG=1` shows the traceback).", "",
             "## Flags shared through `zoo/commands/cli.py`", "",
             "`train.py`, `eval.py` and the `zoo.commands` programs built on `cli.py` take "
             "these:", ""] + _table(shared)
    for command, path in programs(root):
        source = path.read_text(encoding="utf-8")
        doc = ast.get_docstring(ast.parse(source)) or ""
        own = flags(source) if path.name != "cli.py" else []
        lines += [f"## `{command}`", "", "```text", doc.strip() or "(no docstring)", "```", ""]
        lines += _table(own)
    (out / "index.md").write_text("\n".join(lines), encoding="utf-8")
