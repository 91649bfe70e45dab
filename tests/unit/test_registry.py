"""Unknown names answer with the known ones."""

import pytest

from lowband.catalog import load_all
from lowband.errors import UsageError
from lowband.registry import DATASETS, METHODS, MODELS, Registry

load_all()


@pytest.mark.parametrize("reg, known", [(METHODS, "allreduce"), (MODELS, "resnet20"), (DATASETS, "mnist1d")])
def test_unknown_name_lists_known_names(reg, known):
    with pytest.raises(UsageError) as e:
        reg.get("no-such-thing")
    assert f"unknown {reg.kind} 'no-such-thing'" in str(e.value)
    assert known in str(e.value)


def test_duplicate_registration_is_refused():
    reg = Registry("thing")
    reg.register("a")(object)
    with pytest.raises(ValueError):
        reg.register("a")(object)
