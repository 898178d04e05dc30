"""`with x:` for the objects that hold something until closed (a loaded library's handle, the
tuner's worker processes and devices): the block gets `x` and closes it on the way out, an
exception included."""


class Closeable:
    """A base for objects with close() (by default nothing to release): `with x:` returns `x`
    and calls x.close() when the block ends."""

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
