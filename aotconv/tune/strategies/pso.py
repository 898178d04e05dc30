"""Particle swarm as in CLTune: discrete accelerated PSO.

Each particle moves dimension by dimension: to a random value with probability alpha, to its
own best with beta, to the swarm's best with gamma, else it stays; the result snaps to the
nearest valid point not yet visited, so each step explores new configurations. CLTune's
settings: alpha 0.4, beta 0, gamma 0.4, S = 3 or 6.
"""
import math



def search(grid, evaluate, rng, S=3, alpha=0.4, beta=0.0, gamma=0.4):
    n, d = grid.coords.shape
    pos = [int(i) for i in rng.choice(n, size=min(S, n), replace=False)]
    cost = evaluate(pos)
    own = list(zip(pos, cost))
    while True:
        g = min(evaluate.visited, key=evaluate.visited.get)
        gc = grid.coords[g]
        nxt = []
        for p, (pi, _) in enumerate(own):
            x = grid.coords[pos[p]].copy()
            pb = grid.coords[pi]
            for k in range(d):
                r = rng.random()
                if r < alpha:
                    x[k] = rng.integers(len(grid.values[k]))
                elif r < alpha + beta:
                    x[k] = pb[k]
                elif r < alpha + beta + gamma:
                    x[k] = gc[k]
            # a swarm that lands on known points learns nothing: take the nearest new one
            nxt.append(grid.nearest(x, rng, exclude=list(evaluate.visited) + nxt))
        costs = evaluate(nxt)
        for p, (i, c) in enumerate(zip(nxt, costs)):
            pos[p] = i
            if c < own[p][1] or not math.isfinite(own[p][1]):
                own[p] = (i, c)
