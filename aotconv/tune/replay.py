"""Strategies against a recorded log, no device: each point's cost is looked up, not measured.

A log is any records file of one layer measured exhaustively (the study writes them); the
space is rebuilt from the log's candidates, so a replay needs neither the variants nor the
device that produced it.
"""
import math

import numpy as np

from ..space import Grid, Candidate
from .records import cfg_from_json, read_log
from .strategies import Evaluator, run as run_strategy


class Recorded:
    """A layer's recorded space: grid, cost per point (inf = failed), the fallback if known."""

    def __init__(self, records):
        last = {}
        for r in records:
            last[Candidate(r["variant"], cfg_from_json(r["cfg"]))] = r
        self.records = last
        self.grid = Grid(list(last))
        self.costs = np.array([last[c]["time_ms"] if last[c].get("status") == "ok"
                               else math.inf for c in self.grid.points], dtype=float)
        fb = [c for c, r in last.items() if r.get("fallback")]
        self.fallback = fb[0] if fb else None

    @classmethod
    def from_file(cls, path):
        return cls(read_log(path))

    @property
    def best(self):
        return float(self.costs.min()) if len(self.costs) else math.inf

    @property
    def valid(self):
        return self.costs[np.isfinite(self.costs)]

    def replay(self, strategy, trials, seed):
        """(best cost found, trace of the best after each trial) of one seeded search."""
        ev = Evaluator(len(self.grid), lambda idx: [self.costs[i] for i in idx], trials=trials)
        run_strategy(strategy, self.grid, ev, np.random.default_rng(seed))
        return ev.best[1], ev.trace


def quality(recorded, strategy, trials, seeds):
    """% of the exhaustive best reached by each seeded run (100 = found the best)."""
    best = recorded.best
    out = []
    for s in seeds:
        found, _ = recorded.replay(strategy, trials, s)
        out.append(100.0 * best / found if math.isfinite(found) and found > 0 else 0.0)
    return out
