"""Instance catalogues and the options (instance type x market) the formulations choose from.

Dissertation ch. 6 sec. 6.2-6.3: reserved, on-demand and spot markets, across clouds and
regions. Bundled catalogues live in ``solvers/cloud/data`` (``ch6-2020``: the chapter's clouds
and GPUs at February 2020 list prices with Table 6.3's spot reductions; ``public-2024``).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from planner.errors import InvalidProblemError
from planner.schema_cloud import MARKETS, Catalogue, InstanceType, Option

DEFAULT_CATALOGUE = "ch6-2020"


def bundled_catalogues() -> tuple[str, ...]:
    """Names of the catalogues shipped with paraplan."""
    folder = resources.files("solvers.cloud").joinpath("data")
    return tuple(sorted(p.name[:-5] for p in folder.iterdir() if p.name.endswith(".json")))


def load_catalogue(spec: str | Path | Catalogue = DEFAULT_CATALOGUE) -> Catalogue:
    """A catalogue by bundled name or JSON path.

    Raises:
        InvalidProblemError: unknown name, unreadable file, or content that fails the schema
            (negative prices, a unit other than dollars per hour, unknown clouds).
    """
    if isinstance(spec, Catalogue):
        return spec
    text = str(spec)
    path = Path(text)
    if path.suffix == ".json" or path.exists():
        from planner.schema_io import load_json

        return Catalogue.from_dict(load_json(path, what="catalogue"))
    if text not in bundled_catalogues():
        raise InvalidProblemError(f"unknown catalogue {text!r}; bundled ones: {list(bundled_catalogues())}, or give a JSON path")
    raw = resources.files("solvers.cloud").joinpath(f"data/{text}.json").read_text()
    return Catalogue.from_dict(json.loads(raw))


def option_key(instance: InstanceType, market: str) -> str:
    return f"{instance.key}:{market}"


def build_options(
    catalogue: Catalogue,
    *,
    markets: tuple[str, ...] = ("on-demand", "spot"),
    clouds: tuple[str, ...] | None = None,
    instances: tuple[str, ...] | None = None,
    spot_prices: dict[str, float] | None = None,
) -> dict[str, Option]:
    """Every (instance type, market) with a price, as the columns j of the allocation.

    Args:
        markets: which of on-demand, reserved, spot to offer.
        clouds: keep only these clouds (all by default).
        instances: keep only these instance types (``cloud/region/name`` or unique names).
        spot_prices: instance key -> spot $/h overriding the catalogue (e.g. a trace's mean).

    Raises:
        InvalidProblemError: an unknown market, cloud or instance type (the valid ones listed).
    """
    for market in markets:
        if market not in MARKETS:
            raise InvalidProblemError(f"unknown market {market!r}; choose from {list(MARKETS)}")
    if clouds is not None:
        for cloud in clouds:
            if cloud not in catalogue.clouds:
                raise InvalidProblemError(f"unknown cloud {cloud!r} in catalogue {catalogue.name!r}; "
                                          f"valid ones: {sorted(catalogue.clouds)}")
    chosen = _instances(catalogue, instances)
    out: dict[str, Option] = {}
    for inst in chosen:
        if clouds is not None and inst.cloud not in clouds:
            continue
        for market in markets:
            price = inst.price_usd_per_h(market)
            if market == "spot" and spot_prices and inst.key in spot_prices:
                price = spot_prices[inst.key]
            if price is None:
                continue
            out[option_key(inst, market)] = Option(
                instance=inst.key, market=market, accelerator=inst.accelerator, num_accelerators=inst.num_accelerators,
                cloud=inst.cloud, region=inst.region, name=inst.instance_type or inst.name, usd_per_h=price,
                preemption_rate_per_h=spot_preemption_rate(inst, catalogue) if market == "spot" else 0.0)
    if not out:
        raise InvalidProblemError(f"no instance type of catalogue {catalogue.name!r} has a price on markets {list(markets)}"
                                  + (f" in clouds {list(clouds)}" if clouds else ""))
    return out


def spot_preemption_rate(inst: InstanceType, catalogue: Catalogue) -> float:
    """Preemptions per hour, at least one per maximum lifetime (GCP: every 24 h, sec. 6.2)."""
    lifetime = catalogue.clouds[inst.cloud].max_lifetime_h
    return max(inst.preemption_rate_per_h, 1.0 / lifetime if lifetime else 0.0)


def _instances(catalogue: Catalogue, names: tuple[str, ...] | None) -> list[InstanceType]:
    if names is None:
        return list(catalogue.instances)
    out = []
    for name in names:
        try:
            out.append(catalogue.instance(name))
        except KeyError as e:
            raise InvalidProblemError(str(e.args[0])) from None
    return out
