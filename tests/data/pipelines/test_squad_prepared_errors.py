"""Reading prepared SQuAD features: a refusal of the credentials is not called damage, and
nothing advises deleting them; a file that does not parse is (zoo.data.pipelines.squad_prepared)."""

import pytest
from etils import epath

from zoo.data.pipelines import squad_prepared
from zoo.errors import AccessDeniedError, DataError


def test_a_refused_read_asks_for_access_not_deletion(tmp_path, monkeypatch):
    (tmp_path / squad_prepared.SETTINGS).write_text("{}")

    def refuse(self, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(epath.Path, "read_text", refuse)
    with pytest.raises(AccessDeniedError, match="read access") as raised:
        squad_prepared.read(str(tmp_path))
    assert "delete" not in str(raised.value)


def test_a_damaged_file_is_incomplete_or_corrupt(tmp_path):
    (tmp_path / squad_prepared.SETTINGS).write_text("{not json")
    with pytest.raises(DataError, match=r"incomplete or corrupt.*delete"):
        squad_prepared.read(str(tmp_path))
