"""Boundary types of the cloud-pricing planner (Narayanan's dissertation, ch. 6).

An instance catalogue (clouds with egress prices and preemption notice; instance types with
their accelerators and on-demand, reserved and spot prices), spot-price traces, the jobs and
problem the three formulations of ch. 6 sec. 6.4 take, the plan they return, and the result of
replaying a strategy over a price trace (sec. 6.3.2). Every price is in US dollars per hour
(``_usd_per_h``), egress in US dollars per GB, sizes in GB; a ``unit`` field other than
``usd_per_hour`` is refused with the conversion to apply.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.schema import DeviceCount, NonNegativeFloat, PositiveFloat, PositiveInt, _at_most, _Frozen

CATALOGUE_FORMAT = "paraplan.cloud-catalogue/v1"
CLOUD_JOBS_FORMAT = "paraplan.cloud-jobs/v1"
CLOUD_PLAN_FORMAT = "paraplan.cloud-plan/v1"
PRICE_UNIT = "usd_per_hour"
# Factors turning a price given in another unit into dollars per hour (for the error message).
UNIT_TO_PER_HOUR = {"usd_per_second": 3600.0, "usd_per_minute": 60.0, "usd_per_day": 1 / 24,
                    "usd_per_month": 1 / 730, "cents_per_hour": 1 / 100}
Market = Literal["on-demand", "reserved", "spot"]
MARKETS: tuple[str, ...] = Market.__args__  # type: ignore[attr-defined]
Objective = Literal["max-throughput", "min-cost", "min-makespan"]


def unit_error(field: str, unit: str, *, rename: str = "") -> str | None:
    """The message for a price unit other than dollars per hour, or None when it is right."""
    if unit == PRICE_UNIT:
        return None
    factor = UNIT_TO_PER_HOUR.get(unit)
    then = rename or f"set {field}={PRICE_UNIT!r}"
    if factor is None:
        fix = f"convert the prices to US dollars per hour and {then}"
    elif factor >= 1:
        fix = f"multiply each price by {factor:g} and {then}"
    else:
        fix = f"divide each price by {1 / factor:g} and {then}"
    return f"{field}={unit!r}: prices must be in US dollars per hour ({PRICE_UNIT!r}); {fix}"


class Source(_Frozen):
    """Where numbers in a catalogue come from."""

    key: str = Field(min_length=1)
    title: str
    url: str = ""
    accessed: str = ""
    """Date the prices were read (YYYY-MM or YYYY-MM-DD)."""


class CloudInfo(_Frozen):
    """One provider: data egress and how it preempts spot instances (sec. 6.3.2)."""

    egress_usd_per_gb: NonNegativeFloat
    """Internet egress from this cloud; ingress is free (Table 6.2's note)."""
    preemption_notice_s: NonNegativeFloat = 120.0
    """Warning before a spot instance is reclaimed (2 minutes in sec. 6.3.2)."""
    spot_pricing: Literal["dynamic", "fixed"] = "dynamic"
    """AWS and Azure spot prices move with demand; GCP preemptibles have a fixed price (sec. 6.2)."""
    max_lifetime_h: PositiveFloat | None = None
    """GCP preemptibles live at most 24 hours (sec. 6.2)."""


class InstanceType(_Frozen):
    """An instance type offered in one region of one cloud."""

    name: str = Field(min_length=1)
    cloud: str = Field(min_length=1)
    region: str = Field(min_length=1)
    zones: tuple[str, ...] = ()
    accelerator: str = Field(min_length=1)
    """Accelerator type, a hardware preset name (``k80``, ``p100``, ``v100``, ...)."""
    num_accelerators: PositiveInt
    instance_type: str | None = None
    """The provider's type to launch when ``name`` adds the accelerator (GCP attaches GPUs to n1 hosts)."""
    on_demand_usd_per_h: PositiveFloat
    reserved_usd_per_h: PositiveFloat | None = None
    spot_usd_per_h: PositiveFloat | None = None
    """Reference spot price (the best case of Table 6.3 in the bundled ch. 6 catalogue)."""
    preemption_rate_per_h: NonNegativeFloat = 0.0
    """Mean spot preemptions per instance-hour (sec. 6.3.2: on the order of hours apart)."""

    @property
    def key(self) -> str:
        """``cloud/region/name``: unique within a catalogue."""
        return f"{self.cloud}/{self.region}/{self.name}"

    def price_usd_per_h(self, market: str) -> float | None:
        return {"on-demand": self.on_demand_usd_per_h, "reserved": self.reserved_usd_per_h,
                "spot": self.spot_usd_per_h}[market]


class Catalogue(_Frozen):
    """Clouds and instance types with prices (``paraplan.cloud-catalogue/v1``)."""

    format: Literal["paraplan.cloud-catalogue/v1"] = CATALOGUE_FORMAT
    name: str
    description: str = ""
    prices_as_of: str
    """Date of the prices (YYYY-MM): cloud list prices change; a catalogue is a snapshot."""
    unit: str = PRICE_UNIT
    sources: tuple[Source, ...] = ()
    clouds: dict[str, CloudInfo]
    instances: tuple[InstanceType, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> Catalogue:
        message = unit_error("unit", self.unit)
        if message:
            raise ValueError(message)
        seen: set[str] = set()
        for inst in self.instances:
            if inst.cloud not in self.clouds:
                raise ValueError(f"instance {inst.key!r}: cloud {inst.cloud!r} is not in 'clouds' {sorted(self.clouds)}")
            if inst.key in seen:
                raise ValueError(f"instance {inst.key!r} is listed twice; give each cloud/region/name once")
            seen.add(inst.key)
        return self

    def instance(self, key: str) -> InstanceType:
        """The instance type by ``cloud/region/name`` or by a name unique in the catalogue."""
        matches = [i for i in self.instances if key in (i.key, i.name)]
        if len(matches) == 1:
            return matches[0]
        if not matches:
            raise KeyError(f"unknown instance type {key!r}; valid ones: {sorted(i.key for i in self.instances)}")
        raise KeyError(f"instance type {key!r} is offered in several regions; name one of {sorted(i.key for i in matches)}")


class PricePoint(_Frozen):
    time_h: NonNegativeFloat
    """Hours since the trace's start."""
    usd_per_h: NonNegativeFloat


class PriceSeries(_Frozen):
    """Spot price of one instance type in one zone; piecewise constant from each point on."""

    instance: str
    """``cloud/region/name`` of a catalogue instance."""
    zone: str = ""
    points: tuple[PricePoint, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _check(self) -> PriceSeries:
        for before, after in zip(self.points, self.points[1:]):
            if after.time_h <= before.time_h:
                raise ValueError(f"series {self.instance!r} zone {self.zone!r}: time {after.time_h:g} h follows "
                                 f"{before.time_h:g} h; sort the points by time, one price per time")
        return self


class PriceTrace(_Frozen):
    """Spot prices over time (``timestamp,cloud,region,zone,instance,usd_per_hour`` CSV on disk)."""

    start: str = ""
    """ISO 8601 time of hour 0."""
    series: tuple[PriceSeries, ...] = Field(min_length=1)


class CloudJob(_Frozen):
    """A training job: its work and, per accelerator type, its speed (or a model to plan).

    Give ``throughputs`` (steps/s on ``num_accelerators`` accelerators of each type) or
    ``model`` + ``batch_size``: paraplan's pipeline planner then derives them, as
    ``paraplan schedule`` does for Gavel jobs.
    """

    id: str = Field(min_length=1)
    throughputs: dict[str, Annotated[float, Field(ge=0), _at_most(1e9, "steps per second, set far above any job")]] | None = None
    model: str | None = None
    batch_size: PositiveInt | None = None
    num_accelerators: DeviceCount = 1
    num_steps: Annotated[float, Field(ge=1), _at_most(1e15, "a year at a million steps per second is 3.2e13")]
    slo_h: Annotated[float, Field(gt=0), _at_most(876_000.0, "a century")] | None = None
    """Deadline: the job must finish within this many hours (sec. 6.4.3)."""
    dataset_gb: Annotated[float, Field(ge=0), _at_most(1e9, "an exabyte")] = 0.0
    dataset_cloud: str | None = None
    """Cloud holding the dataset; running elsewhere pays its egress once (Table 6.2)."""
    checkpoint_gb: Annotated[float, Field(ge=0), _at_most(1e9, "an exabyte")] = 0.0
    checkpoint_s: Annotated[float, Field(ge=0), _at_most(86_400.0, "a day per checkpoint")] = 0.0
    """Time to write a checkpoint; within the preemption notice nothing is lost."""
    checkpoint_interval_s: Annotated[float, Field(gt=0), _at_most(3.2e9, "a century")] = 3600.0
    restart_s: Annotated[float, Field(ge=0), _at_most(86_400.0, "a day per restart")] = 0.0
    """Time from a new instance to training again (boot, load checkpoint)."""

    @model_validator(mode="after")
    def _check(self) -> CloudJob:
        if self.throughputs is None and (self.model is None or self.batch_size is None):
            raise ValueError(f"job {self.id!r} needs 'throughputs' (steps/s per accelerator type) or "
                             "'model' and 'batch_size' (paraplan derives the throughputs)")
        return self


class CloudJobsFile(_Frozen):
    format: Literal["paraplan.cloud-jobs/v1"] = CLOUD_JOBS_FORMAT
    jobs: tuple[CloudJob, ...] = Field(min_length=1)


class CloudProblem(_Frozen):
    """What ``paraplan cloud plan`` solves: jobs, the options to choose from, the objective."""

    jobs: tuple[CloudJob, ...] = Field(min_length=1)
    objective: Objective = "min-cost"
    markets: tuple[Market, ...] = ("on-demand", "spot")
    clouds: tuple[str, ...] | None = None
    instances: tuple[str, ...] | None = None
    """Offer only these instance types (``cloud/region/name`` or unique names)."""
    budget_usd: PositiveFloat | None = None
    """Total dollars (min-makespan; a cap on min-cost)."""
    budget_usd_per_h: PositiveFloat | None = None
    """Spending rate (max-throughput)."""
    quotas: dict[str, NonNegativeFloat] = {}
    """Instance type (``cloud/region/name``) -> instances the account may hold at once."""
    preemption: bool = True
    """Discount spot throughputs by the expected preemption losses."""

    @model_validator(mode="after")
    def _check(self) -> CloudProblem:
        if self.objective == "min-makespan" and self.budget_usd is None:
            raise ValueError("objective 'min-makespan' needs budget_usd (the total dollars to spend)")
        ids = [j.id for j in self.jobs]
        if len(set(ids)) != len(ids):
            raise ValueError(f"job ids must be unique; got {ids}")
        return self


class Option(_Frozen):
    """An instance type bought on one market: one column j of the allocation X."""

    instance: str
    market: Market
    accelerator: str
    num_accelerators: PositiveInt
    cloud: str
    region: str
    name: str
    usd_per_h: NonNegativeFloat
    preemption_rate_per_h: NonNegativeFloat = 0.0


class JobAllocation(_Frozen):
    fractions: dict[str, NonNegativeFloat]
    """Option key (``cloud/region/name:market``) -> fraction of wall-clock time X_mj."""
    throughput_steps_per_s: NonNegativeFloat
    cost_usd_per_h: NonNegativeFloat
    duration_h: NonNegativeFloat | None
    """Time to finish num_steps at this allocation (None at zero throughput)."""
    compute_usd: NonNegativeFloat | None
    egress_usd: NonNegativeFloat = 0.0
    jobs_per_instance: dict[str, PositiveInt] = {}
    """Jobs packed on one instance of each used option (the job pays its share)."""


class CloudPlan(_Frozen):
    """What a cloud formulation returns (``paraplan.cloud-plan/v1``)."""

    format: Literal["paraplan.cloud-plan/v1"] = CLOUD_PLAN_FORMAT
    objective: Objective
    status: Literal["optimal"] = "optimal"
    catalogue: str
    options: dict[str, Option]
    jobs: dict[str, JobAllocation]
    total_usd: NonNegativeFloat | None
    makespan_h: NonNegativeFloat | None
    objective_value: float
    solve_time_s: NonNegativeFloat = 0.0
    notes: tuple[str, ...] = ()

    @model_validator(mode="after")
    def _check(self) -> CloudPlan:
        for job_id, alloc in self.jobs.items():
            for field, keys in (("fractions", alloc.fractions), ("jobs_per_instance", alloc.jobs_per_instance)):
                unknown = sorted(set(keys) - set(self.options))
                if unknown:
                    raise ValueError(f"jobs.{job_id}.{field} names options {unknown} that are not in 'options' "
                                     f"{sorted(self.options)}; give every option a job uses under 'options'")
            if sum(alloc.fractions.values()) > 1 + 1e-6:
                raise ValueError(f"jobs.{job_id}.fractions sum to {sum(alloc.fractions.values()):.6g}: they are shares "
                                 "of wall-clock time, at most 1 together")
        return self


class ReplayStep(_Frozen):
    start_h: NonNegativeFloat
    end_h: NonNegativeFloat
    option: str
    usd: NonNegativeFloat


class ReplayResult(_Frozen):
    """One strategy replayed over a price trace for one job (sec. 6.3.2, Figs. 6.5-6.6)."""

    strategy: str
    job: str
    total_usd: NonNegativeFloat
    compute_usd: NonNegativeFloat
    egress_usd: NonNegativeFloat
    duration_h: NonNegativeFloat
    num_switches: int = Field(ge=0)
    num_preemptions: int = Field(ge=0)
    steps: tuple[ReplayStep, ...]
