"""The config reference covers every key: each key of every job config in configs/ (default
variant and the variants docs/_ext/zoo_docs/configs.py reads) has a meaning written in
docs/config_keys.yaml, and every meaning there belongs to a key some config has."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_ext"))

from zoo_docs import configs  # noqa: E402  (docs/_ext is not a package on the path)


def test_every_config_key_has_a_meaning():
    missing = configs.missing_meanings(ROOT)
    assert not missing, (
        "config keys without a meaning in docs/config_keys.yaml (write what each does, its "
        "units and its special values, as `section.key: ...`, or `job:section.key: ...` where "
        "the key means something else in that job):\n" + "\n".join(missing))


def test_every_meaning_belongs_to_a_key_a_config_has():
    unused = configs.unused_meanings(ROOT)
    assert not unused, ("docs/config_keys.yaml describes keys no config has (renamed or "
                        "removed? update or delete them):\n" + "\n".join(unused))


def test_meanings_are_descriptions_not_placeholders():
    short = {key: text for key, text in configs.load_meanings(ROOT).items()
             if len(str(text).split()) < 4 or any(word in str(text).upper()
                                                  for word in ("TODO", "TBD", "FIXME", "XXX"))}
    assert not short, f"meanings too short to say anything, or placeholders: {short}"


def test_a_key_added_to_a_config_without_a_meaning_fails_the_check(monkeypatch):
    module = configs._module(ROOT, "gpt")
    original = module.get_config

    def with_a_new_key(arg=None):
        config = original(arg)
        config.train.brand_new_knob = 3
        return config

    monkeypatch.setattr(module, "get_config", with_a_new_key)
    assert configs.missing_meanings(ROOT) == ["gpt: train.brand_new_knob"]


def test_each_page_lists_every_key_with_its_default(tmp_path):
    configs.write_pages(ROOT, tmp_path)
    page = (tmp_path / "bert_pretrain.md").read_text()
    # Each key a definition-list entry: the key, then its default(s), then its meaning.
    for path, values in configs.job_keys(ROOT, "bert_pretrain").items():
        assert f"\n`{path}`\n: " in page
    assert "\n`data.seq_len`\n: default `64`; `size=base`: `128`;" in page  # tiny 64, base 128
    quickstart = (tmp_path / "quickstart.md").read_text()
    assert "\n`stages`\n: " in quickstart
    assert "\n`squad.train.eval_every`\n: `250`\n" in quickstart
    index = (tmp_path / "index.md").read_text()
    assert all(job in index for job in configs.job_names(ROOT))


@pytest.mark.parametrize("job", ["squad", "translate"])
def test_a_job_specific_meaning_wins_over_the_general_one(job):
    meanings = configs.load_meanings(ROOT)
    assert configs.meaning(meanings, job, "data.source") == meanings[f"{job}:data.source"]
    assert configs.meaning(meanings, "gpt", "data.source") == meanings["data.source"]
