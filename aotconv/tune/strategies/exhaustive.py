"""Full search: every point, in order (CLTune's full search, Kernel Tuner's brute force)."""


def search(grid, evaluate, rng, batch=16):
    for s in range(0, len(grid), batch):
        evaluate(range(s, min(s + batch, len(grid))))
