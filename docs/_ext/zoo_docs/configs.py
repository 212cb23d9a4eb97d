"""The config reference: every key of every job config in configs/, with its default and its
meaning.

Each `configs/<job>.py` (except common.py) is imported and its `get_config(arg)` called for the
default variant and the variants in VARIANTS, whose keys are the union documented; a key whose
default differs between variants lists each. Meanings come from docs/config_keys.yaml alone
("section.key", or "job:section.key" for a job whose key means something else).
tests/docs/test_config_reference.py holds the two together: a key without a meaning fails it.
"""

import importlib
import inspect
import pathlib
import sys

import ml_collections
import yaml

# Variants read besides each job's default, so keys only some variants have are documented too.
VARIANTS = {
    "bert_pretrain": ["size=base", "size=base,phase=2", "size=base,optimizer=lamb",
                      "corpus=brown"],
    "classify": ["strategy=frozen", "size=base", "corpus=spam_assassin"],
    "elmo": ["size=base"],
    "feature_classify": ["kind=word2vec", "task=binding"],
    "gpt": ["size=124M", "corpus=shakespeare", "corpus=shakespeare,tokenizer=gpt2"],
    "gpt_classify": ["task=multiple_choice", "size=124M"],
    "nnlm": ["size=base"],
    "rnn_translate": ["attention=none", "size=base", "corpus=bible"],
    "rnnlm": ["cell=gru", "size=base", "corpus=brown"],
    "squad": ["version=2.0", "size=base"],
    "translate": ["size=base", "norm=pre,share=none", "corpus=bible"],
    "word2vec": ["mode=cbow", "size=base", "corpus=english"],
}
# Subtrees documented as one value (a table of values, not keys of their own).
LEAF_SUBTREES = ("finetune.recipes",)
# A config of several stages (config.stages) documents its stage-level keys; each stage is a
# whole job config, whose keys its own page lists.
PIPELINE_KEYS = ("stages",)


def _flatten(config, prefix=""):
    for key, value in config.items():
        path = prefix + key
        leaf = any(path == s or path.endswith("." + s) for s in LEAF_SUBTREES)
        if isinstance(value, (ml_collections.ConfigDict, dict)) and value and not leaf:
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def job_names(root: pathlib.Path) -> list[str]:
    return sorted(p.stem for p in (root / "configs").glob("*.py")
                  if p.stem not in ("__init__", "common"))


def _module(root: pathlib.Path, job: str):
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    return importlib.import_module(f"configs.{job}")


def job_keys(root: pathlib.Path, job: str) -> dict[str, dict[str, object]]:
    """{key path: {variant arg ('' = default): default value}} over the default and VARIANTS.

    Stages of a pipeline config are left out (their jobs document them): only its own keys and
    the stage configs' keys that differ from the stage job's defaults are returned, the latter
    under "STAGE.path".
    """
    module = _module(root, job)
    keys: dict[str, dict[str, object]] = {}
    for arg in [""] + VARIANTS.get(job, []):
        config = module.get_config(arg or None)
        for path, value in _flatten(config):
            keys.setdefault(path, {})[arg] = value
    return keys


def stage_keys(keys):
    """A pipeline config's keys split into its own and its stages' ({stage: {path: value}})."""
    if "stages" not in keys:
        return keys, {}
    own = {k: v for k, v in keys.items() if k in PIPELINE_KEYS}
    stages = {}
    for path, values in keys.items():
        if path not in own:
            stage, _, rest = path.partition(".")
            stages.setdefault(stage, {})[rest] = values[""]
    return own, stages


def load_meanings(root: pathlib.Path) -> dict[str, str]:
    return yaml.safe_load((root / "docs" / "config_keys.yaml").read_text(encoding="utf-8"))


def meaning(meanings: dict[str, str], job: str, path: str) -> str | None:
    return meanings.get(f"{job}:{path}") or meanings.get(path)


def missing_meanings(root: pathlib.Path) -> list[str]:
    """'job: key' for every key of every job (and stage) without a meaning."""
    meanings = load_meanings(root)
    missing = []
    for job in job_names(root):
        own, stages = stage_keys(job_keys(root, job))
        for path in own:
            if not meaning(meanings, job, path):
                missing.append(f"{job}: {path}")
        for stage, values in stages.items():
            stage_job = _stage_job(root, job, stage)
            for path in values:
                if not meaning(meanings, stage_job, path):
                    missing.append(f"{job}: {stage}.{path}")
    return missing


def unused_meanings(root: pathlib.Path) -> list[str]:
    """Entries of config_keys.yaml that name a key (or a job's key) no config has."""
    seen, seen_job = set(), set()
    for job in job_names(root):
        own, stages = stage_keys(job_keys(root, job))
        for path in own:
            seen.add(path)
            seen_job.add(f"{job}:{path}")
    return sorted(k for k in load_meanings(root)
                  if k not in (seen_job if ":" in k else seen))


def _stage_job(root, job, stage):
    """The job config a pipeline's stage comes from (its module imports it by name)."""
    module = _module(root, job)
    source = inspect.getsource(module.get_config)
    for name in job_names(root):
        if f"config.{stage} = {name}.get_config" in source:
            return name
    return stage


def _value(value) -> str:
    """A config value as inline code, long ones cut at 60 characters."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return "`" + text.replace("`", "'") + "`"


def _text(value: str) -> str:
    """A meaning as one paragraph: `<` escaped so <workdir> is not read as HTML."""
    return value.replace("\n", " ").replace("<", "&lt;")


def _entry(key: str, value: str, meaning: str) -> list[str]:
    """One key as a definition-list entry (it wraps at the content column, where a three-column
    table of long meanings was cut off): the key, then its value and its meaning."""
    return [f"`{key}`", f": {value}", "", f"  {_text(meaning)}" if meaning else "", ""]


def _variants(module) -> str:
    """The variant keys get_config accepts and their defaults (from its parse_arg call)."""
    source = inspect.getsource(module.get_config)
    start = source.find("parse_arg(arg")
    if start < 0:
        return ""
    end = source.find(")", start)
    # One line: a call wrapped over source lines keeps its indentation inside the inline code.
    return " ".join(source[start + len("parse_arg(arg"):end].strip(", \n").split())


def _page(root, job, meanings) -> str:
    module = _module(root, job)
    keys = job_keys(root, job)
    own, stages = stage_keys(keys)
    doc = inspect.cleandoc(module.__doc__ or "")
    lines = [f"# configs/{job}.py", "", "```{code-block} text", ":class: zoo-docstring", "", doc,
             "```", ""]
    variants = _variants(module)
    if variants:
        lines += [f"Variants (`--config=configs/{job}.py:key=value,...`) and their defaults: "
                  f"`{variants}`. Defaults below are the default variant's; where another "
                  f"variant changes one, it is listed after it.", ""]
    for path, values in own.items():
        default = ("default " + _value(values[""])) if "" in values else "(variant only)"
        others = [f"`{arg}`: {_value(v)}" for arg, v in values.items()
                  if arg and ("" not in values or repr(v) != repr(values[""]))]
        if others:
            default += "; " + "; ".join(others)
        lines += _entry(path, default, meaning(meanings, job, path) or "")
    for stage, values in stages.items():
        stage_job = _stage_job(root, job, stage)
        base = dict(_flatten(_module(root, stage_job).get_config(
            _stage_arg(module, stage))))
        changed = {p: v for p, v in values.items() if repr(base.get(p)) != repr(v)}
        lines += ["", f"## Stage `{stage}`", "",
                  f"A whole [configs/{stage_job}.py]({stage_job}.md) config; override its keys "
                  f"as `--config.{stage}.KEY=VALUE`."]
        if changed:
            lines += ["Keys this pipeline sets differently from that job's defaults:", ""]
            for p, v in changed.items():
                lines += _entry(f"{stage}.{p}", _value(v), meaning(meanings, stage_job, p) or "")
    return "\n".join(lines) + "\n"


def _stage_arg(module, stage):
    source = inspect.getsource(module.get_config)
    marker = f"config.{stage} = "
    line = source[source.find(marker):].splitlines()[0]
    start = line.find('get_config(')
    inner = line[start + len("get_config("):line.rfind(")")].strip()
    return inner.strip("\"'") or None


def write_pages(root: pathlib.Path, out: pathlib.Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    meanings = load_meanings(root)
    jobs = job_names(root)
    for job in jobs:
        (out / f"{job}.md").write_text(_page(root, job, meanings), encoding="utf-8")
    index = ["# Config keys", "",
             "Every key of every job config, its default and what it means, generated from "
             "`configs/` and `docs/config_keys.yaml` when the docs are built. Override any key "
             "with `--config.SECTION.KEY=VALUE`; an unknown key is an error naming it.", "",
             "```{toctree}", ":maxdepth: 1", ""] + jobs + ["```", ""]
    (out / "index.md").write_text("\n".join(index), encoding="utf-8")
