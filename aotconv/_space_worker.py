"""A worker of `space.layer_spaces`: reads a pickled target, then pickled layers one at a time,
on stdin; for each writes its pruned space as plain data (`space.enumerate_plain`) and the
seconds it took, on stdout, as soon as it is enumerated. It ends at the end of its input."""
import os
import pickle
import sys
import time

from .space import enumerate_plain


def main():
    inp = sys.stdin.buffer
    # the answers go to a copy of stdout; anything printed on the way goes to stderr instead
    out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    target = pickle.load(inp)
    while True:
        try:
            layer = pickle.load(inp)
        except EOFError:
            return
        t0 = time.perf_counter()
        (plain,) = enumerate_plain([layer], target)
        pickle.dump((plain, time.perf_counter() - t0), out)
        out.flush()


if __name__ == "__main__":
    main()
