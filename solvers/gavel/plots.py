"""The CDF of job completion times (dissertation ch. 5 Fig. 5.9b/5.10b style)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from planner.schema_gavel import ClusterSimResult
from solvers.gavel.simulator import cdf_points


def draw_jct_cdf(results: Mapping[str, ClusterSimResult], path: str | Path, *, title: str | None = None) -> Path:
    """Plot the completion-time CDF of the measured jobs of each result, one line per label.

    Raises:
        InvalidProblemError: the file suffix is not .png or .svg.
    """
    from planner.errors import InvalidProblemError

    out = Path(path)
    if out.suffix not in (".png", ".svg"):
        raise InvalidProblemError(f"CDF file {str(path)!r} must end in .png or .svg")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, result in results.items():
        measured = set(result.measured_jobs)
        xs, ys = cdf_points([j.jct_s / 3600 for j in result.jobs if j.id in measured])
        ax.step(xs, ys, where="post", label=f"{label} (avg {result.avg_jct_s / 3600:.1f} h)")
    ax.set_xscale("log")
    ax.set_xlabel("job completion time (hours)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title or "Job completion times")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
