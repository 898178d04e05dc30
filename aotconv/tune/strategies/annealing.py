"""Simulated annealing as in CLTune: random neighbour steps, worse ones accepted with
P = exp(-(t' - t) / T), T falling linearly to zero over the budget.

Times are taken relative to the first finite time seen, so T means the same on a 10 us and a
10 ms layer (CLTune's T=2..6 were tuned on absolute times of one kernel). A failed neighbour is
never accepted; with no neighbour left the walk restarts at a random point.
"""
import math


def search(grid, evaluate, rng, T=4.0):
    n = len(grid)
    cur = int(rng.integers(n))
    t_cur = evaluate([cur])[0]
    scale = t_cur if math.isfinite(t_cur) and t_cur > 0 else None
    step = 0
    while True:
        step += 1
        nb = grid.neighbours(cur)
        if len(nb) == 0:
            nxt = int(rng.integers(n))
        else:
            nxt = int(nb[rng.integers(len(nb))])
        t_new = evaluate([nxt])[0]
        if scale is None and math.isfinite(t_new) and t_new > 0:
            scale = t_new
        temp = T * max(0.0, 1.0 - len(evaluate.visited) / max(evaluate.trials, 1))
        if t_new < t_cur or not math.isfinite(t_cur):
            accept = True
        elif not math.isfinite(t_new) or temp <= 0:
            accept = False
        else:
            accept = rng.random() < math.exp(-(t_new - t_cur) / scale / temp)
        if accept:
            cur, t_cur = nxt, t_new
