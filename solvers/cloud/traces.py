"""Spot prices as time series: the trace CSV format, its validator, and a seeded generator.

Dissertation ch. 6 sec. 6.3.2 (Figs. 6.1-6.4, Table 6.3). The chapter's February 2020 price
logs are not bundled, so ``generate_trace`` draws a trace with the statistics the chapter
states: AWS and Azure spot prices move (GCP's are fixed), at most about once a day; each is
capped at the on-demand price and some zones sit at the cap; the best case over the trace is
on-demand divided by Table 6.3's reduction; zones move independently, so the cheapest zone
changes; multi-GPU types are steadier per GPU and p3.16xlarge does not move at all.

File format (one row per price change; a price holds until the next row of its series)::

    timestamp,cloud,region,zone,instance,usd_per_hour
    2020-02-01T00:00:00Z,aws,us-east-1,us-east-1a,p3.2xlarge,0.9273
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np

from planner.errors import InvalidProblemError
from planner.schema_cloud import PRICE_UNIT, Catalogue, PricePoint, PriceSeries, PriceTrace, unit_error

COLUMNS = ("timestamp", "cloud", "region", "zone", "instance", PRICE_UNIT)


@dataclass(frozen=True, slots=True, kw_only=True)
class GeneratorOptions:
    """Knobs of ``generate_trace``; the defaults are the ones the docs' figures use."""

    days: float = 90.0
    change_rate_per_day: float = 0.5
    """Price changes per series and day ("prices change only daily", sec. 6.3.2)."""
    sigma: float = 0.6
    """Log-spread of a single-GPU level above its floor; n GPUs get sigma / sqrt(n) (Fig. 6.4)."""
    sigma_by_accelerator: tuple[tuple[str, float], ...] = (("v100", 0.1),)
    """Steadier types: V100 prices are stable (ResNet-50's small gains, sec. 6.3.2)."""
    capped_zone_fraction: float = 0.15
    """Share of zones pinned at the on-demand price (p2.xlarge in us-east-1f, Fig. 6.1)."""
    constant: tuple[str, ...] = ("aws/us-east-1/p3.16xlarge",)
    """Instance types without price variation (Fig. 6.1)."""
    start: str = "2020-02-01T00:00:00Z"


def load_trace(path: str | Path) -> PriceTrace:
    """Read a price-trace CSV (or its JSON form).

    Raises:
        InvalidProblemError: missing file, a unit other than dollars per hour, a negative or
            unparsable price, or a series whose timestamps are not increasing (line named).
    """
    from planner.schema_io import read_text

    p = Path(path)
    text = read_text(p, what="price trace")
    if p.suffix == ".json":
        return PriceTrace.from_json(text)
    return parse_trace_csv(text, name=str(path))


def parse_trace_csv(text: str, *, name: str = "<trace>") -> PriceTrace:
    rows = list(csv.reader(io.StringIO(text)))
    if not rows:
        raise InvalidProblemError(f"price trace {name!r} is empty; the first line must be {','.join(COLUMNS)}")
    header = tuple(c.strip() for c in rows[0])
    if len(header) == len(COLUMNS) and header[:-1] == COLUMNS[:-1] and header[-1] != PRICE_UNIT:
        raise InvalidProblemError(f"price trace {name!r}: {unit_error('price column', header[-1], rename=f'rename the column {PRICE_UNIT}')}")
    if header != COLUMNS:
        raise InvalidProblemError(f"price trace {name!r}: header {','.join(header)!r} must be {','.join(COLUMNS)!r}")
    start: datetime | None = None
    series: dict[tuple[str, str], list[PricePoint]] = {}
    for number, row in enumerate(rows[1:], start=2):
        if not row or not "".join(row).strip():
            continue
        when, price, key = _parse_row(row, name=name, number=number)
        start = start or when
        time_h = (when - start).total_seconds() / 3600.0
        points = series.setdefault(key, [])
        if time_h < 0 or (points and time_h <= points[-1].time_h):
            raise InvalidProblemError(
                f"price trace {name!r} line {number}: timestamp {row[0]} is not after the previous one of "
                f"{key[0]} zone {key[1]!r} (or the trace's first timestamp); sort the rows by timestamp")
        points.append(PricePoint(time_h=time_h, usd_per_h=price))
    if not series:
        raise InvalidProblemError(f"price trace {name!r} has no price rows")
    assert start is not None
    return PriceTrace(start=start.strftime("%Y-%m-%dT%H:%M:%SZ"),
                      series=tuple(PriceSeries(instance=k[0], zone=k[1], points=tuple(v)) for k, v in series.items()))


def _parse_row(row: list[str], *, name: str, number: int) -> tuple[datetime, float, tuple[str, str]]:
    if len(row) != len(COLUMNS):
        raise InvalidProblemError(f"price trace {name!r} line {number} has {len(row)} columns, need {len(COLUMNS)}: {','.join(COLUMNS)}")
    stamp, cloud, region, zone, instance, price_text = (c.strip() for c in row)
    try:
        when = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidProblemError(f"price trace {name!r} line {number}: timestamp {stamp!r} is not ISO 8601 "
                                  "(e.g. 2020-02-01T00:00:00Z)") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    try:
        price = float(price_text)
    except ValueError:
        raise InvalidProblemError(f"price trace {name!r} line {number}: {PRICE_UNIT}={price_text!r} is not a number") from None
    if not math.isfinite(price) or price < 0:
        raise InvalidProblemError(f"price trace {name!r} line {number}: {PRICE_UNIT}={price_text} is negative or not finite; "
                                  "prices are dollars per hour, at least 0")
    return when, price, (f"{cloud}/{region}/{instance}", zone)


def trace_to_csv(trace: PriceTrace) -> str:
    """The CSV text of a trace, rows in time order."""
    start = datetime.fromisoformat((trace.start or "2020-01-01T00:00:00Z").replace("Z", "+00:00"))
    rows = []
    for s in trace.series:
        cloud, region, instance = s.instance.split("/", 2)
        for p in s.points:
            rows.append((p.time_h, cloud, region, s.zone, instance, p.usd_per_h))
    rows.sort(key=lambda r: r[0])
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(COLUMNS)
    for time_h, cloud, region, zone, instance, price in rows:
        stamp = (start + timedelta(hours=time_h)).strftime("%Y-%m-%dT%H:%M:%SZ")
        writer.writerow((stamp, cloud, region, zone, instance, f"{price:.4f}"))
    return out.getvalue()


def check_trace(trace: PriceTrace, catalogue: Catalogue) -> None:
    """Every series names an instance type of the catalogue.

    Raises:
        InvalidProblemError: an unknown instance type (the valid ones listed).
    """
    known = {i.key for i in catalogue.instances}
    for s in trace.series:
        if s.instance not in known:
            raise InvalidProblemError(f"price trace series {s.instance!r} is not an instance type of catalogue "
                                      f"{catalogue.name!r}; valid ones: {sorted(known)}")


def generate_trace(catalogue: Catalogue, *, seed: int = 0, options: GeneratorOptions = GeneratorOptions()) -> PriceTrace:
    """A spot-price trace with the chapter's stated statistics (module docstring)."""
    rng = np.random.default_rng(seed)
    hours = options.days * 24.0
    series: list[PriceSeries] = []
    for inst in catalogue.instances:
        floor = inst.spot_usd_per_h
        if floor is None:
            continue
        zones = inst.zones or ("",)
        fixed = catalogue.clouds[inst.cloud].spot_pricing == "fixed" or inst.key in options.constant
        capped = [not fixed and rng.random() < options.capped_zone_fraction for _ in zones]
        if not fixed and all(capped):
            capped[int(rng.integers(len(zones)))] = False
        floor_zone = int(rng.choice([i for i, c in enumerate(capped) if not c])) if not fixed else -1
        for index, zone in enumerate(zones):
            if fixed or capped[index]:
                points = [PricePoint(time_h=0.0, usd_per_h=floor if fixed else inst.on_demand_usd_per_h)]
            else:
                sigma = dict(options.sigma_by_accelerator).get(inst.accelerator, options.sigma)
                sigma /= math.sqrt(inst.num_accelerators)
                points = _walk(rng, hours, floor, inst.on_demand_usd_per_h, sigma, options.change_rate_per_day,
                               reach_floor=index == floor_zone)
            series.append(PriceSeries(instance=inst.key, zone=zone, points=tuple(points)))
    return PriceTrace(start=options.start, series=tuple(series))


def _walk(rng: np.random.Generator, hours: float, floor: float, cap: float, sigma: float, rate_per_day: float,
          *, reach_floor: bool) -> list[PricePoint]:
    num_changes = int(rng.poisson(rate_per_day * hours / 24.0))
    times = np.unique(np.concatenate([[0.0], np.floor(rng.uniform(1.0, hours, num_changes))]))
    levels = np.minimum(floor * np.exp(sigma * np.abs(rng.standard_normal(len(times)))), cap)
    if reach_floor:
        levels[int(rng.integers(len(times)))] = floor
    points: list[PricePoint] = []
    for t, level in zip(times, levels):
        if points and abs(points[-1].usd_per_h - level) < 1e-9:
            continue
        points.append(PricePoint(time_h=float(t), usd_per_h=round(float(level), 4)))
    return points


@dataclass(frozen=True)
class Curve:
    """A piecewise-constant price series as arrays, for fast look-ups."""

    times_h: np.ndarray
    prices: np.ndarray

    @classmethod
    def of(cls, series: PriceSeries) -> Curve:
        return cls(np.array([p.time_h for p in series.points]), np.array([p.usd_per_h for p in series.points]))

    def at(self, time_h: float) -> float:
        index = int(np.searchsorted(self.times_h, time_h, side="right")) - 1
        return float(self.prices[max(index, 0)])

    def sample(self, times_h: np.ndarray) -> np.ndarray:
        """Prices at many times at once."""
        return self.prices[np.maximum(np.searchsorted(self.times_h, times_h, side="right") - 1, 0)]

    def next_change_h(self, time_h: float) -> float:
        index = int(np.searchsorted(self.times_h, time_h, side="right"))
        return float(self.times_h[index]) if index < len(self.times_h) else math.inf

    def cost_usd(self, start_h: float, end_h: float) -> float:
        """Dollars of running from start_h to end_h (hours)."""
        total, t = 0.0, start_h
        while t < end_h:
            nxt = min(self.next_change_h(t), end_h)
            total += self.at(t) * (nxt - t)
            t = nxt
        return total


def trace_stats(trace: PriceTrace, catalogue: Catalogue) -> dict[str, dict[str, float]]:
    """Per instance type: min, mean (time-weighted over zones), on-demand/min, changes per day,
    per-GPU coefficient of variation, and how often the cheapest zone changes."""
    out: dict[str, dict[str, float]] = {}
    by_instance: dict[str, list[PriceSeries]] = {}
    for s in trace.series:
        by_instance.setdefault(s.instance, []).append(s)
    end_h = max(s.points[-1].time_h for s in trace.series) + 24.0
    grid = np.arange(0.0, end_h, 1.0)
    for key, group in by_instance.items():
        inst = catalogue.instance(key)
        curves = [Curve.of(s) for s in group]
        hourly = np.array([c.sample(grid) for c in curves])
        changes = sum(len(s.points) - 1 for s in group) / len(group) / (end_h / 24.0)
        cheapest = np.argmin(hourly, axis=0)
        out[key] = {
            "min_usd_per_h": float(hourly.min()), "mean_usd_per_h": float(hourly.mean()),
            "max_usd_per_h": float(hourly.max()), "best_reduction": inst.on_demand_usd_per_h / float(hourly.min()),
            "changes_per_day": float(changes), "cv": float(hourly.std() / hourly.mean()),
            "cheapest_zone_changes": float(np.count_nonzero(np.diff(cheapest))),
        }
    return out
