"""requirements/lock.txt installs from the public package index alone: exact public versions,
no local version labels (`torch==2.13.0+cpu` exists only on download mirrors of PyTorch's own,
so pip on an ordinary machine cannot resolve it, and the README's commands fail before a test
runs), and the pins the project states elsewhere agree with it."""

import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
# A PEP 440 public release (with pre-, post- and dev-release parts), no "+local" label.
PUBLIC_VERSION = re.compile(r"^\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?$")


def _pins(text):
    pins = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements/lock.txt:{number}: {line!r} is not an exact pin (NAME==V)"
            pins[name.strip().lower()] = (number, version.strip())
    return pins


def test_every_pin_is_a_public_version_the_package_index_serves():
    pins = _pins((ROOT / "requirements/lock.txt").read_text())
    assert len(pins) > 100  # the whole default install and the test and parity extras
    bad = [f"requirements/lock.txt:{n}: {name}=={v}" for name, (n, v) in pins.items()
           if not PUBLIC_VERSION.match(v)]
    assert not bad, ("pins the public index cannot resolve (a local label such as +cpu; write "
                     "the public version, which matches the local build too):\n" + "\n".join(bad))


def test_the_parity_extra_and_the_lock_pin_the_same_torch():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (torch,) = [r for r in project["optional-dependencies"]["parity"] if r.startswith("torch")]
    _, locked = _pins((ROOT / "requirements/lock.txt").read_text())["torch"]
    assert torch == f"torch=={locked}"


def test_the_check_catches_a_local_label():
    assert not PUBLIC_VERSION.match("2.13.0+cpu")
    assert PUBLIC_VERSION.match("2.13.0") and PUBLIC_VERSION.match("2026.10.19.post1")
