"""A fixed-seed slice of the fuzz targets (tools/fuzz.py runs them at volume, `make fuzz`):
every generated net.yaml, net dict, weights file, records file and parameter file either loads
or raises an AotconvError with a one-line message; hostile layer names build and come back
exact. A few hundred inputs, derandomized, so a failure here replays the same way."""
from pathlib import Path

import pytest

import fuzz_targets as ft

# Inputs that broke a reader once, or that every reader must survive (billion laughs, deep
# nesting, huge ints, NUL bytes, newlines in names and keys, .npy and pickles for .npz, ...),
# each saved as its target writes a reproducer: <target>-<what>.<suffix>. `make fuzz` writes
# new ones to build/fuzz; the ones worth keeping are copied here.
FOUND = Path(__file__).parent / "found"
# the ones whose fix is still to come: name -> where the fix belongs (none open)
OPEN = {}
# the same open failures as the slice meets them, per target: (kind, file, function), see
# fuzz_targets.place; met, they make the test an expected failure instead of hiding it
OPEN_PLACES = {}

# inputs per target; about 20 s in all on 2 busy cores, most of it the PoCL library and emit
SLICE = {"netyaml": 80, "netyaml_raw": 80, "netdict": 80, "weights": 60, "records": 25,
         "params_bin": 40, "params_c": 15, "emit": 6, "paths": 30}


@pytest.mark.parametrize("name", list(SLICE))
def test_every_input_loads_or_gives_a_one_line_error(name):
    target = ft.TARGETS[name]
    why = ft.available(target)
    if why:
        pytest.skip(why)
    stats = ft.run(target, SLICE[name], derandomize=True, max_failures=1,
                   ignore=OPEN_PLACES.get(name, ()))
    for f in stats.found:
        pytest.fail(f"{name}: {f.sig[0]} at {f.sig[1]}\n{f.error}\ninput: {ft.describe(f, 600)}"
                    f"\n{f.traceback}")
    assert stats.inputs >= SLICE[name] // 2
    open_hits = sorted({ft.place(sig) for sig in stats.hits})
    if open_hits:
        pytest.xfail(f"open: {open_hits}")


def test_the_oracle_refuses_what_it_must():
    """The oracle itself: a multi-line or empty AotconvError, another exception type and a
    hang are failures; a one-line AotconvError and a clean load are not."""
    from aotconv.errors import AotconvError

    def raises(e):
        def f():
            raise e
        return f

    assert ft.expect_clean(lambda: 3) == 3
    assert ft.expect_clean(raises(AotconvError("net.yaml:3: layer 'c1': bad"))) is None
    for bad in (AotconvError("two\nlines"), AotconvError(""), AotconvError("a\rb")):
        with pytest.raises(ft.Failure):
            ft.expect_clean(raises(bad))
    with pytest.raises(KeyError):
        ft.expect_clean(raises(KeyError("k")))
    slow = ft.Target("slow", "", None, lambda x: __import__("time").sleep(5), timeout=0.2)
    with pytest.raises(ft.Hang):
        ft.guarded(slow, None)
    noisy = ft.Target("noisy", "", None, lambda x: print("x\ny", file=__import__("sys").stderr))
    with pytest.raises(ft.Failure, match="stderr"):
        ft.guarded(noisy, None)


@pytest.mark.parametrize("path", sorted(FOUND.iterdir()), ids=lambda p: p.stem)
def test_found_input_loads_or_gives_a_one_line_error(path):
    if path.stem in OPEN:
        pytest.xfail(f"open: {OPEN[path.stem]}")
    target = ft.TARGETS[path.name.split("-")[0]]
    why = ft.available(target)
    if why:
        pytest.skip(why)
    e = ft.replay(target, path)
    assert e is None, f"{path.name}: {ft.signature(e)}: {ft.last_line(e)}"
