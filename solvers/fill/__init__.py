"""PipeFill: fill pipeline bubbles with other jobs (Arfeen et al., seed 000; reading
shared/design/pipefill.md).

Modules: ``bubbles`` (bubble cycles from the simulator, Sec. 1.2), ``models`` (fill-model and
job presets), ``jobs`` (``--fill-jobs`` specs, configurations, the job stream), ``executor``
(Algorithm 1 and the configuration choice, Sec. 2), ``scheduler`` (SJF / makespan / FIFO list
scheduling, Sec. 3), ``simulate`` (one plan filled) and ``scale`` (the paper's 1K-16K sweep).
"""

from __future__ import annotations
