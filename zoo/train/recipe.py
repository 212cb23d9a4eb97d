"""A fine-tuning job's recipe (learning rate, warmup, dropout), settled when the run starts.

The configs that fine-tune a pretrained encoder carry two recipes (configs/common.py
finetune_recipes): 'tiny', tuned on zoo's tiny pretraining run, and 'pretrained', BERT's for a
real checkpoint. Which applies depends on config.train.init_from, known only once the flags
are parsed; a field the user set explicitly wins over either.
"""

import jax
import ml_collections

from zoo import paths
from zoo.errors import ConfigError


def is_pretrained_directory(path: str) -> bool:
    """A Hugging Face / google-research/bert checkpoint directory, not a zoo workdir."""
    return bool(path) and any((paths.as_path(path) / name).is_file()
                              for name in ("config.json", "bert_config.json"))


def _recipe_choice(config: ml_collections.ConfigDict) -> tuple[str, str]:
    """(recipe name, why) for config.finetune.recipe (configs/common.py finetune_recipes)."""
    name, known = config.finetune.recipe, sorted(config.finetune.recipes)
    init_from, size = config.train.init_from, config.model.get("size", "")
    if name != "auto":
        if name not in known:
            raise ConfigError(f"config.finetune.recipe={name!r} must be 'auto' or one of "
                              f"{known}")
        return name, f"config.finetune.recipe={name!r}"
    if is_pretrained_directory(init_from):
        return "pretrained", (f"config.train.init_from={init_from!r} is a pretrained "
                              "checkpoint directory")
    if size != "tiny":
        return "pretrained", f"config.model.size={size!r}"
    why = "config.model.size='tiny'"
    if init_from:
        why += f", config.train.init_from={init_from!r} is a zoo run"
    return "tiny", why


def resolve(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """`config` with config.finetune.recipe settled ('auto' -> 'tiny' | 'pretrained') and every
    field left None taken from that recipe; prints one line saying which recipe, why, and the
    values. Configs without recipes come back unchanged; so does a resolved one (silently)."""
    if "recipes" not in config.get("finetune", {}):
        return config
    name, why = _recipe_choice(config)
    recipe = config.finetune.recipes[name]
    if config.finetune.recipe == name and all(
            config[section][key] is not None for section, values in recipe.items()
            for key in values):
        return config  # settled already (e.g. by loop.run before it calls loop.build)
    config = config.copy_and_resolve_references()  # the caller's config stays as given
    shown = []
    # The optimizer's fields first: the learning rate is what the line is mostly about.
    for section, values in sorted(config.finetune.recipes[name].items(),
                                  key=lambda item: item[0] != "optim"):
        for key, value in values.items():
            explicit = config[section][key] is not None
            if not explicit:
                config[section][key] = value
            item = f"{section}.{key}={config[section][key]:g}"
            if key == "warmup_steps":
                item += f" of {config.train.steps} steps"
            shown.append(item + (" (set explicitly)" if explicit else ""))
    config.finetune.recipe = name
    if jax.process_index() == 0:
        print(f"fine-tuning recipe {name!r} ({why}): {', '.join(shown)}; set one with "
              "--config.<key>=..., the recipe with --config.finetune.recipe=tiny|pretrained",
              flush=True)
    return config
