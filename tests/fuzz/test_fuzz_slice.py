"""A fixed-seed slice of the fuzz targets (tools/fuzz.py runs them at volume, `make fuzz`):
every generated net.yaml, net dict, weights file, records file and parameter file either loads
or raises an AotconvError with a one-line message; hostile layer names build and come back
exact. A few hundred inputs, derandomized, so a failure here replays the same way."""
import pytest

import fuzz_targets as ft

# inputs per target; about 20 s in all on 2 busy cores, most of it the PoCL library and emit
SLICE = {"netyaml": 80, "netyaml_raw": 80, "netdict": 80, "weights": 60, "records": 25,
         "params_bin": 40, "params_c": 15, "emit": 4, "paths": 30}


@pytest.mark.parametrize("name", list(SLICE))
def test_every_input_loads_or_gives_a_one_line_error(name):
    target = ft.TARGETS[name]
    why = ft.available(target)
    if why:
        pytest.skip(why)
    stats = ft.run(target, SLICE[name], derandomize=True, max_failures=1)
    for f in stats.found:
        pytest.fail(f"{name}: {f.sig[0]} at {f.sig[1]}\n{f.error}\ninput: {ft.describe(f, 600)}"
                    f"\n{f.traceback}")
    assert stats.inputs >= SLICE[name] // 2


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
