"""Random search: a uniform sample without replacement (CLTune's random search)."""


def search(grid, evaluate, rng, batch=16):
    order = rng.permutation(len(grid))
    for s in range(0, len(order), batch):
        evaluate(order[s:s + batch])
