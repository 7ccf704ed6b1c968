"""What a benchmark run costs: hourly prices, the estimate printed before anything starts, and the bill after.

Approximate on-demand list prices in USD per hour (SageMaker real-time hosting; the same figures as the smoke
test's table where both list an item). Check the AWS pricing pages for current figures; regions not listed fall
back to us-east-1's, and the printout says so.
"""

from __future__ import annotations

from dataclasses import dataclass

PRICES: dict[str, dict[str, float]] = {
    "us-east-1": {"ml.g5.2xlarge": 1.515, "ml.g5.12xlarge": 7.09, "ml.g5.24xlarge": 10.18, "ml.g5.48xlarge": 20.36,
                  "nat-gateway": 0.045, "interface-endpoint": 0.01},
    "us-west-2": {"ml.g5.2xlarge": 1.515, "ml.g5.12xlarge": 7.09, "ml.g5.24xlarge": 10.18, "ml.g5.48xlarge": 20.36,
                  "nat-gateway": 0.045, "interface-endpoint": 0.01},
    "eu-west-1": {"ml.g5.2xlarge": 1.691, "ml.g5.12xlarge": 7.91, "ml.g5.24xlarge": 11.36, "ml.g5.48xlarge": 22.72,
                  "nat-gateway": 0.048, "interface-endpoint": 0.011},
}
# Wall time of one mode outside the load steps: deploy or update until InService (a 40B model loads for
# 15-25 min), warm-up, and for the last one the teardown. Used only for the estimate.
DEPLOY_MINUTES = 25
STEP_OVERHEAD_S = 30  # per load step: warm-up requests and requests still in flight at the step's end


@dataclass(frozen=True)
class Rate:
    per_hour: float
    lines: tuple[str, ...]  # "2 x ml.g5.48xlarge at $20.360/h" and notes


def hourly(region: str, items: list[tuple[str, int]]) -> Rate:
    """The hourly cost of `items` ((price key, count)); unknown items are named, not guessed."""
    prices = PRICES.get(region)
    lines = [] if prices else [f"no price table for {region}; using us-east-1 prices"]
    prices = prices or PRICES["us-east-1"]
    total = 0.0
    for item, count in items:
        if count <= 0:
            continue
        if item not in prices:
            lines.append(f"no price for {item}: not counted")
            continue
        total += prices[item] * count
        lines.append(f"{count} x {item} at ${prices[item]:.3f}/h")
    return Rate(total, tuple(lines))


def estimate_hours(modes: int, steps_per_mode: int, step_seconds: float) -> float:
    """Rough wall time of a run: each mode's deploy plus its load steps."""
    per_mode_s = DEPLOY_MINUTES * 60 + steps_per_mode * (step_seconds + STEP_OVERHEAD_S)
    return modes * per_mode_s / 3600
