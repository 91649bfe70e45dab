"""Site maps: sites of consecutive ranks, explicit maps, groups inside sites; bad input is one line, exit 2."""

from __future__ import annotations

import pytest

from lowband import config as C
from lowband.cli import main
from lowband.errors import ConfigError
from lowband.net.sites import check_groups, describe, site_map
from lowband.training.runconfig import method_configs
from lowband.training.spec import resolve


def test_equal_sites_of_consecutive_ranks():
    assert site_map(2, [], 4) == [0, 0, 1, 1]
    assert site_map(3, [], 6) == [0, 0, 1, 1, 2, 2]
    assert site_map(1, [], 3) == [0, 0, 0]


def test_no_map_makes_every_worker_its_own_site():
    assert site_map(0, [], 3) == [0, 1, 2]


def test_explicit_uneven_map_is_kept():
    assert site_map(0, [0, 0, 0, 1], 4) == [0, 0, 0, 1]
    assert site_map(2, [0, 1, 1], 3) == [0, 1, 1]  # site_of overrides sites


@pytest.mark.parametrize("sites, site_of, world, fragment", [
    (3, [], 4, "must divide the 4 workers"),
    (0, [0, 1], 4, "for each of the 4 workers"),
    (0, [0, 0, 2, 2], 4, "site 1 has no worker"),
    (0, [0, 1, 0, 1], 4, "consecutive ranks"),
])
def test_bad_maps_name_the_field_and_what_is_allowed(sites, site_of, world, fragment):
    with pytest.raises(ConfigError, match=fragment) as e:
        site_map(sites, site_of, world)
    assert e.value.field in ("link.sites", "link.site_of") and "\n" not in str(e.value)


def test_a_group_across_two_sites_is_refused():
    check_groups([0, 0, 1, 1], [[0, 1], [2, 3]], "method.group_size", 2)
    with pytest.raises(ConfigError, match=r"\[2, 3\] would straddle sites \[1, 2\]"):
        check_groups([0, 0, 1, 2], [[0, 1], [2, 3]], "method.group_size", 2)


def test_describe_names_the_ranks_of_each_site():
    assert describe([0, 0, 1, 1]) == "sites (ranks): 0-1 | 2-3"
    assert describe([0, 0, 0, 1]) == "sites (ranks): 0-2 | 3"


def cfg(raw: dict) -> C.Config:
    return C.from_dict(raw, method_configs())


def test_world_size_checks_the_map_and_method_groups():
    ok = cfg({"method": {"name": "codistill", "group_size": 2}, "train": {"workers": 4}, "link": {"sites": 2}})
    assert resolve(ok).world == 4 and resolve(ok).sites == [0, 0, 1, 1]
    bad = cfg({"method": {"name": "afsd", "group_size": 2}, "train": {"workers": 4}, "link": {"site_of": [0, 1, 1, 1]}})
    with pytest.raises(ConfigError, match="straddle"):
        resolve(bad)
    # without a site map groups are free (every worker is its own site, as before sites existed)
    assert resolve(cfg({"method": {"name": "codistill", "group_size": 2}, "train": {"workers": 4}})).world == 4


@pytest.mark.parametrize("raw, field", [({"sites": -1}, "link.sites"), ({"site_of": [0, "a"]}, "link.site_of"),
                                        ({"intra": "fast"}, "link.intra")])
def test_link_fields_are_checked_when_built(raw, field):
    with pytest.raises(ConfigError) as e:
        cfg({"link": raw})
    assert e.value.field == field


@pytest.mark.parametrize("args", [
    ["--workers", "4", "--sites", "3"],
    ["--workers", "4", "--set", "link.site_of=[0,1]"],
    ["--workers", "4", "--set", "link.site_of=[0,0,2,2]"],
    ["--workers", "4", "--sites", "4", "--method", "codistill", "--set", "method.group_size=2"],
])
def test_cli_refuses_bad_sites_in_one_line_before_any_worker(args, tmp_path, capsys):
    assert main(["train", *args, "--epochs", "1", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ("link." in err or "method.group_size" in err)
    assert not any(tmp_path.iterdir())
