"""A worker of `space.layer_spaces`: reads pickled (layers, target) on stdin, writes the
pruned spaces of the layers as plain data (`space.enumerate_plain`) on stdout."""
import pickle
import sys

from .space import enumerate_plain


def main():
    layers, target = pickle.load(sys.stdin.buffer)
    sys.stdout.buffer.write(pickle.dumps(enumerate_plain(layers, target)))


if __name__ == "__main__":
    main()
