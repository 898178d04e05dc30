"""The library's end of a budgeted build: its joined programs built in the measurer's builder
processes, which the build's searches started (aotconv.binaries._built_elsewhere), and the
measuring processes closed while the library is compiled and run (compiler._Closing), the
rest of the build's end timed as its "end" phase (aotconv.buildtime).

Before, each joined program was built in a new process (its start and device context paid
again: on an H100 ResNet-50 b1's 8 programs took 7.0 s, about 3.4 s of it compiling), and the
runner and builders were closed after the build, one after another, outside any phase ("other
9.5 s" of a 94.5-s build).
"""
import queue
import threading
import time
import types

import pytest

from aotconv import binaries, compiler, passes, spec
from aotconv.harness import BUILD_OPTIONS
from aotconv.targets import get_target
from aotconv.tune import measure
from aotconv.tune.measure import MeasurerBase, Outcome, Status, Worker, build_binary

from devices import pocl_present

POCL = get_target("pocl-cpu")
needs_pocl = pytest.mark.skipif(not pocl_present(), reason="PoCL is not installed")

NET = {"name": "t", "input": [2, 3, 9, 9], "layers": [
    {"name": "c1", "op": "conv", "out": 4, "kernel": 3, "act": "relu"},
    {"name": "mp", "op": "maxpool", "kernel": 2},
    {"name": "fc", "op": "dense", "out": 5}]}


class SlowBuilder:
    """A builder process whose build takes `seconds`, as a device's compiler would."""

    def __init__(self, seconds):
        self.seconds, self.calls = seconds, 0

    def call(self, fn, args, timeout):
        self.calls += 1
        time.sleep(self.seconds)
        return "ok", b"binary of " + args[1].encode(), self.seconds


def test_n_programs_take_about_the_time_of_one(monkeypatch):
    """Four programs, each a build of 0.5 s, in the four builders given: about 0.5 s in all,
    and no new process started."""
    def no_new_process():
        raise AssertionError("a new builder process was started")
    monkeypatch.setattr(measure, "Worker", no_new_process)
    texts = [f"program {k}" for k in range(4)]
    given = [SlowBuilder(0.5) for _ in texts]
    t0 = time.monotonic()
    data, why = binaries._built_elsewhere(POCL, texts, builders=given)
    took = time.monotonic() - t0
    assert why is None and data == [b"binary of " + t.encode() for t in texts]
    assert [b.calls for b in given] == [1, 1, 1, 1]
    assert took < 0.9, took


def test_programs_beyond_the_builders_get_processes_of_their_own(monkeypatch):
    started = []

    class New(SlowBuilder):
        def __init__(self):
            super().__init__(0.3)
            started.append(self)

        def kill(self):
            self.killed = True
    monkeypatch.setattr(measure, "Worker", New)
    given = [SlowBuilder(0.3)]
    t0 = time.monotonic()
    data, why = binaries._built_elsewhere(POCL, ["a", "b", "c"], builders=given)
    assert why is None and len(data) == 3 and time.monotonic() - t0 < 0.55
    assert given[0].calls == 1 and len(started) == 2 and all(n.killed for n in started)


@pytest.fixture(scope="module")
def programs():
    from aotconv.choose import choose
    from aotconv.context import BuildContext
    from aotconv.schedule import build_schedule
    if not pocl_present():
        pytest.skip("PoCL is not installed")
    net = passes.optimise(spec.network_from_dict(NET))
    ctx = BuildContext.make("pocl-cpu", mode="fallback", quiet=True)
    return build_schedule(net, choose(net, ctx)).programs, ctx


@needs_pocl
def test_the_measurers_builders_make_the_same_binaries(monkeypatch, programs):
    """Two joined programs (a group size that splits the network, a device that compiles
    nothing at launch, as a GPU): built in a measurer's started builders, the binaries are
    byte for byte those of new processes, no process is started, and the builders go back to
    the measurer, alive."""
    progs, ctx = programs
    monkeypatch.setitem(binaries.GROUP_BYTES, "cpu", 1)
    monkeypatch.setattr(binaries.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(binaries, "compiles_at_launch", lambda device: False)
    fresh = binaries.plan(progs, ctx)
    assert fresh.joined_count == 2 and all(fresh.blobs)
    ws = [Worker(), Worker()]
    try:
        for w in ws:             # started, with their device context, as a search leaves them
            w.call(build_binary, (ctx.target, "__kernel void k() {}", BUILD_OPTIONS, False), 60)
        m = types.SimpleNamespace(builders=queue.Queue())
        for w in ws:
            m.builders.put(w)
        starts = []
        real_start = Worker.start
        monkeypatch.setattr(Worker, "start", lambda self: starts.append(self) or real_start(self))
        got = binaries.plan(progs, ctx, measurer=m)
        assert got.blobs == fresh.blobs and got.group_of == fresh.group_of
        assert starts == []
        assert m.builders.qsize() == 2 and all(w.proc.is_alive() for w in ws)
    finally:
        for w in ws:
            w.kill()


class Instant(MeasurerBase):
    """Every candidate measures at once (the fallback fastest); close() takes `close_s`."""
    slots = capacity = lanes = 1

    def __init__(self, *a, close_s=1.0, **k):
        self.close_s, self.closed = close_s, None
        self.builders = queue.Queue()

    def measure(self, layer, candidates, variants=None, on_outcome=None):
        out = []
        for k, c in enumerate(candidates):
            o = Outcome(Status.OK, time_ms=1.0 + k, times=(1.0 + k,), build_s=0.01)
            out.append(o)
            if on_outcome is not None:
                on_outcome(c, o)
        return out

    def close(self):
        self.closed = (time.monotonic(), threading.current_thread().name)
        time.sleep(self.close_s)


@needs_pocl
def test_the_measuring_processes_close_while_the_library_is_built(tmp_path, monkeypatch):
    """A tuning build closes its measurer (1 s here) once the library's programs are built,
    beside the library's compile and link, not after the build; the rest of the build's end is
    the "end" phase of its time line, not "other"."""
    made = []
    monkeypatch.setattr(measure, "Measurer",
                        lambda *a, **k: made.append(Instant(*a, **k)) or made[-1])
    linked = []
    real = compiler.ninja_build
    monkeypatch.setattr(compiler, "ninja_build",
                        lambda stage: (real(stage), linked.append(time.monotonic())))
    monkeypatch.setenv("AOTCONV_CACHE_DIR", str(tmp_path / "cache"))
    (tmp_path / "t.yaml").write_text(
        "name: t\ninput: [2, 3, 9, 9]\nlayers:\n"
        "  - {name: c1, op: conv, out: 4, kernel: 3, act: relu}\n"
        "  - {name: mp, op: maxpool, kernel: 2}\n"
        "  - {name: fc, op: dense, out: 5}\n")
    res = compiler.compile_network(tmp_path / "t.yaml", target="pocl-cpu",
                                   outdir=tmp_path / "out", budget="6", measure=False,
                                   quiet=True, fuse_pool="never")
    assert len(made) == 1 and made[0].closed is not None
    at, thread = made[0].closed
    assert thread == "aotconv-close-measurer" and at < linked[0]
    line = res.times.line()
    assert " end " in line and "other" not in line, line
    assert (tmp_path / "out" / "libt.so").is_file()
