"""Sites: which workers share a fast network, and which sit behind the slow link.

`link.sites = S` puts the K workers into S equal sites of consecutive ranks (S must divide K);
`link.site_of = [0, 0, 0, 1]` names each rank's site for uneven ones (sites numbered 0..S-1 in rank
order, none empty, each site's ranks consecutive, so that a ring over the ranks in rank order is a
ring ordered by site). With neither, every worker is its own site: every byte crosses `--link`,
as before sites existed.

A site map is a list: `site_of[rank]` is the rank's site. Everything here runs before any worker
starts; bad input raises ConfigError (one line, exit code 2).
"""

from __future__ import annotations

from lowband.errors import ConfigError, require


def site_map(sites: int, site_of: list, world: int) -> list[int]:
    """Each rank's site, checked against `world` workers (no map configured: each rank its own site)."""
    if site_of:
        return _explicit(site_of, world)
    if sites:
        require(world % sites == 0, "link.sites", sites, f"must divide the {world} workers into equal sites")
        return [rank * sites // world for rank in range(world)]
    return list(range(world))


def _explicit(site_of: list, world: int) -> list[int]:
    require(len(site_of) == world, "link.site_of", site_of, f"must name a site for each of the {world} workers")
    count = max(site_of) + 1
    empty = sorted(set(range(count)) - set(site_of))
    require(not empty, "link.site_of", site_of, f"sites must be numbered 0..{count - 1} with none empty "
                                                f"(site {empty[0] if empty else ''} has no worker)")
    require(site_of == sorted(site_of), "link.site_of", site_of,
            "each site's workers must be consecutive ranks, sites in rank order (e.g. [0, 0, 1])")
    return list(site_of)


def configured(sites: int, site_of: list) -> bool:
    """True when the config names a site map (else every worker is its own site)."""
    return bool(sites or site_of)


def count(site_of: list[int]) -> int:
    return len(set(site_of))


def check_groups(site_of: list[int], groups: list[list[int]] | None, field: str, value) -> None:
    """Every group of ranks (a model's data-parallel replicas) lies inside one site."""
    for ranks in groups or []:
        where = sorted({site_of[r] for r in ranks})
        if len(where) > 1:
            raise ConfigError(field, value, f"the group of ranks {ranks} would straddle sites {where} "
                                           f"(link site map {site_of}); make each group fit in one site")


def describe(site_of: list[int]) -> str:
    """'sites: 0-1 | 2-3' — which ranks share a site."""
    spans = []
    for site in sorted(set(site_of)):
        ranks = [r for r, s in enumerate(site_of) if s == site]
        spans.append(str(ranks[0]) if len(ranks) == 1 else f"{ranks[0]}-{ranks[-1]}")
    return "sites (ranks): " + " | ".join(spans)
