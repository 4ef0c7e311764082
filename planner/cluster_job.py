"""One lease of a real training job for the round-based engine (``planner.cluster_run``).

A job is a small linear-regression model trained by minibatch SGD in numpy: real steps whose
loss falls, with all of its state (weights, step count, loss) in a checkpoint file. A lease
loads the checkpoint (or starts fresh), runs up to ``max_steps`` steps paced to the
accelerator's throughput (``steps_per_s``: the engine emulates the speed of a V100, P100 or
K80 on CPUs by pacing, since the training itself costs microseconds a step), saves the
checkpoint atomically and returns. Preemption at a round boundary is this return: the next
round resumes from the checkpoint, in whichever worker process the engine then uses.

No Ray import here: the engine ships this function to its workers, and tests call it directly.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np

NUM_FEATURES = 32
BATCH_SIZE = 64
LEARNING_RATE = 0.05
PACE_SLACK_S = 0.005
"""Steps run ahead of their paced time by up to this much before the lease sleeps (fewer wake-ups)."""


NUM_SAMPLES = 4096


def dataset(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The job's training set: y = x . w* + noise, NUM_SAMPLES rows, a function of the seed."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(NUM_SAMPLES, NUM_FEATURES))
    return x, x @ rng.normal(size=NUM_FEATURES) + 0.01 * rng.normal(size=NUM_SAMPLES)


def _load(path: Path, seed: int) -> tuple[np.ndarray, int, float]:
    if path.exists():
        with np.load(path) as ckpt:
            return ckpt["weights"].copy(), int(ckpt["step"]), float(ckpt["loss"])
    return np.zeros(NUM_FEATURES), 0, float("nan")


def _save(path: Path, weights: np.ndarray, step: int, loss: float) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, weights=weights, step=step, loss=loss)
    os.replace(tmp, path)


def sgd_step(weights: np.ndarray, step: int, data: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, float]:
    """One minibatch SGD step; batch ``step`` is rows step x B ... (mod the set): a function of the step."""
    lo = (step * BATCH_SIZE) % NUM_SAMPLES
    x, y = data[0][lo:lo + BATCH_SIZE], data[1][lo:lo + BATCH_SIZE]
    err = x @ weights - y
    grad = x.T @ err / BATCH_SIZE
    return weights - LEARNING_RATE * grad, float(np.mean(err**2))


def train_lease(checkpoint: str, *, seed: int, max_steps: int, steps_per_s: float) -> dict[str, Any]:
    """Resume from ``checkpoint``, run up to ``max_steps`` paced steps, checkpoint, report.

    Returns start/end wall-clock times (time.time()), steps run, the step count after the
    lease, the last loss and the process id (which shows resumption across processes).
    """
    path = Path(checkpoint)
    weights, step, loss = _load(path, seed)
    data = dataset(seed)
    start = time.time()
    for k in range(max_steps):
        weights, loss = sgd_step(weights, step, data)
        step += 1
        wait_s = start + (k + 1) / steps_per_s - time.time()
        if wait_s > PACE_SLACK_S or (wait_s > 0 and k == max_steps - 1):
            time.sleep(wait_s)
    _save(path, weights, step, loss)
    return {"start": start, "end": time.time(), "steps": max_steps, "step": step, "loss": loss, "pid": os.getpid()}
