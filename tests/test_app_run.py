"""The emitted library inside an application's own OpenCL (runtime_c/rt_net.c, rt_run.c):
create_with_queue on the application's context and queue, run_buffers between its cl_mem
buffers, run_async and wait, run() staged through pinned memory; every refusal a code and a
message."""
import numpy as np
import pytest

from aotconv.harness import close
from aotconv.runtime import LibraryError, load

from app_helpers import library, reference

cl = pytest.importorskip("pyopencl")
mf = cl.mem_flags


@pytest.fixture(scope="module")
def lenet5(tmp_path_factory):
    return library(tmp_path_factory, "lenet5")


@pytest.fixture(scope="module")
def twoout(tmp_path_factory):
    return library(tmp_path_factory, "twoout")


@pytest.fixture(scope="module")
def device():
    from aotconv.targets import find_device, get_target
    return find_device(get_target("pocl-cpu"))[1]


def _input(seed, shape=(100, 1, 32, 32)):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _queue(device, **props):
    ctx = cl.Context([device])
    return cl.CommandQueue(ctx, device, **props)


def _create_with_queue(lib, ctx, dev, queue, device_name=None):
    """The C create_with_queue with raw (possibly NULL) OpenCL objects: (code, message)."""
    ffi, f = lib.ffi, lib._f
    raw = lambda t, o: ffi.NULL if o is None else ffi.cast(t, o.int_ptr)
    opts = ffi.new(f"aotconv_{lib.name}_options *")
    opts.platform_index, opts.device_index, opts.profile = -1, -1, 1
    keep = ffi.new("char[]", device_name.encode()) if device_name else ffi.NULL
    opts.device_name = keep
    h = ffi.new(f"aotconv_{lib.name} **")
    rc = f("create_with_queue")(h, raw("cl_context", ctx), raw("cl_device_id", dev),
                                raw("cl_command_queue", queue), opts)
    if rc == 0:
        f("destroy")(h[0])
    return rc, ffi.string(f("last_error")(ffi.NULL)).decode()


def test_the_applications_queue_and_buffers(lenet5, device):
    q = _queue(device, properties=cl.command_queue_properties.PROFILING_ENABLE)
    x = _input(1)
    with load(lenet5.dir) as own, load(lenet5.dir, queue=q, profile=True) as net:
        want = own(x)
        assert net.program_source()[0]
        din = cl.Buffer(q.context, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        dout = cl.Buffer(q.context, mf.READ_WRITE, want.nbytes + 64)   # larger is fine
        net.run_buffers(din, dout)
        got = np.empty_like(want)
        cl.enqueue_copy(q, got, dout)       # the same in-order queue: after the network
        assert np.array_equal(got, want)
        assert close(got.ravel(), reference(lenet5, x))[0]
        assert net.wait() is None
        assert len(net.profile()) == lenet5.res.schedule.run_launches.__len__()
        # the handle's own run() on the application's queue
        assert np.array_equal(net(x), want)


def test_create_with_queue_refusals(lenet5, device, tmp_path_factory):
    ctx = cl.Context([device])
    q = cl.CommandQueue(ctx, device)
    other = cl.CommandQueue(cl.Context([device]), device)
    with load(lenet5.dir) as lib:
        for args, want in (
                ((ctx, device, None), r"create_with_queue: queue is NULL"),
                ((None, device, q), r"create_with_queue: context is NULL"),
                ((ctx, None, q), r"create_with_queue: device is NULL"),
                ((ctx, device, other), r"queue belongs to another context than context")):
            rc, msg = _create_with_queue(lib, *args)
            assert rc == -1 and want in msg, (args, msg)
        ooo = cl.CommandQueue(ctx, device, properties=cl.command_queue_properties
                              .OUT_OF_ORDER_EXEC_MODE_ENABLE)
        rc, msg = _create_with_queue(lib, ctx, device, ooo)
        assert rc == -1 and "out-of-order; the network's kernels need an in-order queue" in msg
        rc, msg = _create_with_queue(lib, ctx, device, q, device_name="no-such-gpu")
        assert rc == -2 and "does not match 'no-such-gpu' (from options.device_name)" in msg
        try:
            subs = device.create_sub_devices([cl.device_partition_property.EQUALLY, 1])
        except cl.Error:
            subs = []
        if subs:       # a device that is not the queue's
            sctx = cl.Context(subs)
            rc, msg = _create_with_queue(lib, sctx, subs[1], cl.CommandQueue(sctx, subs[0]))
            assert rc == -1 and "create_with_queue: queue is on device" in msg
        assert _create_with_queue(lib, ctx, device, q)[0] == 0
    # a library built for another target: the device is not the one its kernels were made for
    h100 = library(tmp_path_factory, "lenet5-h100")
    from aotconv.runtime import Network
    with pytest.raises(LibraryError, match=r"\[-2\].*the device '.*' is not target 'h100'"):
        Network(h100.dir, queue=q)
    # a queue without profiling: runs, and profile() says why it has no times
    with load(lenet5.dir, queue=q, profile=True) as net:
        net(_input(2))
        with pytest.raises(LibraryError, match=r"\[-7\].*without CL_QUEUE_PROFILING_ENABLE"):
            net.profile()


def test_run_buffers_refusals(lenet5, device):
    q = _queue(device)
    ctx = q.context
    x = _input(3)
    with load(lenet5.dir, queue=q, params=False) as net:
        din = cl.Buffer(ctx, mf.READ_ONLY | mf.COPY_HOST_PTR, hostbuf=x)
        dout = cl.Buffer(ctx, mf.READ_WRITE, 4 * 1000)
        with pytest.raises(LibraryError, match=r"\[-7\].*run_buffers: parameters are not set"):
            net.run_buffers(din, dout)
        net.load_params(lenet5.dir / "lenet5.params.bin")
        small = cl.Buffer(ctx, mf.READ_WRITE, 4 * 999)
        with pytest.raises(LibraryError, match=r"\[-1\].*output holds 3996 bytes, the network's "
                                               r"output needs 4000 \(1000 floats\)"):
            net.run_buffers(din, small)
        with pytest.raises(LibraryError, match=r"\[-1\].*input holds 3996 bytes"):
            net.run_buffers(small, dout)
        with pytest.raises(LibraryError, match=r"\[-1\].*run_buffers: input is NULL"):
            net.run_buffers(None, dout)
        foreign = cl.Buffer(cl.Context([device]), mf.READ_WRITE, 4 * 1000)
        with pytest.raises(LibraryError, match=r"\[-1\].*output belongs to another OpenCL "
                                               r"context"):
            net.run_buffers(din, foreign)
        with pytest.raises(LibraryError, match=r"\[-7\].*wait: no run in flight"):
            net.wait()       # nothing was enqueued by the refused calls
        net.run_buffers(din, dout)
        net.wait()


def test_run_async_then_wait(lenet5):
    xs = [_input(10 + i) for i in range(3)]
    with load(lenet5.dir, profile=True) as net:
        want = [net(x) for x in xs]
        with pytest.raises(LibraryError, match=r"\[-7\].*wait: no run in flight; call "
                                               r"run_async or run_buffers first"):
            net.wait()
        # the host prepares the next input while the device runs the last one
        net.run_async(xs[0])
        nxt = xs[1].copy()
        with pytest.raises(LibraryError, match=r"\[-7\].*still in flight; call wait first"):
            net.profile()
        assert np.array_equal(net.wait(), want[0])
        assert len(net.profile()) > 0
        net.run_async(nxt)
        assert np.array_equal(net.wait(), want[1])
        # two in flight: they end in order, wait() waits for the later one
        net.run_async(xs[2])
        first_out = net._pending[-1][1]
        net.run_async(xs[0])
        assert np.array_equal(net.wait(), want[0])
        assert np.array_equal(first_out.reshape(want[2].shape), want[2])
        # run() ends a run in flight: nothing is left to wait for
        net.run_async(xs[1])
        net(xs[2])
        with pytest.raises(LibraryError, match=r"\[-7\].*no run in flight"):
            net.wait()
        with pytest.raises(LibraryError, match=r"\[-1\].*run_async: input has 5 floats"):
            net.run_async(np.ones(5, np.float32))


@pytest.mark.parametrize("stage", [0, -1, 4, 100, 1000, 7])
def test_staged_run_gives_the_same_output(twoout, stage):
    """Pieces of 4, 7 (not whole floats), 100 and 1000 bytes across both outputs (1568 and 40
    bytes), the default, and no staging."""
    x = np.random.default_rng(4).standard_normal((2, 3, 9, 9)).astype(np.float32)
    want = reference(twoout, x)
    with load(twoout.dir, stage_bytes=stage) as net:
        for _ in range(2):
            got = np.concatenate([o.ravel() for o in net(x)])
            assert close(got, want)[0]
        with load(twoout.dir, stage_bytes=-1) as plain:
            assert np.array_equal(got, np.concatenate([o.ravel() for o in plain(x)]))
        most = 4 * max(x.size, want.size)
        slot = {0: most, -1: 0}.get(stage, min(stage, most))
        slots = 0 if slot == 0 else min(4, -(-most // slot))
        assert net.memory()["pinned_bytes"] == slot * slots
        # from the handle's pinned buffers run() copies directly
        xin, xout = net.host_buffers()
        xin[...] = x
        assert np.array_equal(net.run_host(), got)


def test_new_calls_refuse_a_null_handle(lenet5):
    with load(lenet5.dir) as lib:
        ffi, f = lib.ffi, lib._f
        x = np.zeros(4, np.float32)
        p = ffi.from_buffer("float[]", x)
        info = ffi.new(f"aotconv_{lib.name}_memory_info *")
        why = ffi.new("const char **")
        for call, args in (("run_async", (p, 4, p, 4)), ("run_buffers", (ffi.NULL, ffi.NULL)),
                           ("wait", ()), ("memory", (info,)), ("program_source", (why,))):
            assert f(call)(ffi.NULL, *args) == -1, call
            assert "net is NULL" in ffi.string(f("last_error")(ffi.NULL)).decode()
        assert f("memory")(lib.handle, ffi.NULL) == -1
        assert f("program_source")(lib.handle, ffi.NULL) == 1
