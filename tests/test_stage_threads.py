"""run()'s staging threads (runtime_c/rt_pool.c, rt_run.c): the copy into and out of the pinned
staging ring split among the calling thread and a pool that create() makes and destroy()
joins (options.stage_threads).

Device-free: the pool compiled on its own with ThreadSanitizer, copying like memcpy over
lengths that are no multiple of a piece or of the thread count, with threads that cannot be
made. PoCL: a network of two inputs and two outputs of 1.4 and 2.3 MB at batch sizes 3 and 7,
whose outputs through 2 to 9 threads are the bytes of one thread's, for run() and run_n."""
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from aotconv.compiler import compile_network
from aotconv.errors import AotconvError
from aotconv.harness import close
from aotconv.runtime import LibraryError, load

RUNTIME = Path(__file__).resolve().parent.parent / "runtime_c"
PART = 256 << 10          # AOTRT_STAGE_PART
DEFAULT_MAX = 8           # AOTRT_STAGE_THREADS_DEFAULT

# argv: threads, the least piece in bytes, copies, threads pthread_create makes before it fails
# (-1: all), the longest copy. Copies of random lengths (and the edges: 0, 1, a piece, a piece
# +- 1, primes) between random offsets; every byte of the destination and the guard bytes
# around it checked; now and then a pause longer than the pool's spin, so its threads sleep
# and are woken. Prints the threads the pool has.
POOL_DRIVER = r"""
#include "aotconv_rt.h"
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int allowed = -1;
int __real_pthread_create(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);
int __wrap_pthread_create(pthread_t *t, const pthread_attr_t *a, void *(*f)(void *), void *arg)
{
    if (allowed == 0)
        return EAGAIN;
    if (allowed > 0)
        --allowed;
    return __real_pthread_create(t, a, f, arg);
}

static unsigned long long rng = 88172645463325252ULL;
static unsigned long long next(void)
{
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return rng;
}

int main(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    int threads = atoi(argv[1]);
    size_t part = (size_t)atol(argv[2]);
    int copies = atoi(argv[3]);
    allowed = atoi(argv[4]);
    const size_t most = (size_t)atol(argv[5]), guard = 64;
    unsigned char *src = malloc(most + 2 * guard), *dst = malloc(most + 2 * guard);
    if (!src || !dst)
        return 2;
    aotrt_pool *p = aotrt_pool_new(threads, part);
    printf("threads %d\n", aotrt_pool_threads(p));
    size_t edges[] = {0, 1, 63, 64, 65, part - 1, part, part + 1, 2 * part + 7, 3 * part, 7919,
                      5 * part + 13, most};
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; ++i)
        edges[i] = edges[i] < most ? edges[i] : most;
    const size_t nedges = sizeof edges / sizeof edges[0];
    for (int c = 0; c < copies; ++c) {
        size_t len = c < (int)nedges ? edges[c] : next() % (most + 1);
        size_t so = next() % (most + 1 - len), d = next() % (most + 1 - len);
        for (size_t i = 0; i < most + 2 * guard; ++i) {
            src[i] = (unsigned char)next();
            dst[i] = 0xA5;
        }
        aotrt_pool_copy(p, dst + guard + d, src + guard + so, len);
        for (size_t i = 0; i < most + 2 * guard; ++i) {
            int in = i >= guard + d && i < guard + d + len;
            unsigned char want = in ? src[guard + so + (i - guard - d)] : 0xA5;
            if (dst[i] != want) {
                printf("copy %d (%zu bytes): byte %zu is %d, expected %d\n", c, len, i,
                       dst[i], want);
                return 1;
            }
        }
        if (c % 16 == 5) {
            struct timespec t = {0, 3000000};    /* past the spin: the threads sleep */
            nanosleep(&t, NULL);
        }
    }
    aotrt_pool_free(p);
    aotrt_pool_free(NULL);
    free(src);
    free(dst);
    printf("ok\n");
    return 0;
}
"""


@pytest.fixture(scope="module")
def pool_driver(tmp_path_factory):
    """The pool and POOL_DRIVER as one program built with ThreadSanitizer."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None or not Path("/usr/include/CL/cl.h").exists():
        pytest.skip("no C compiler or OpenCL headers")
    d = tmp_path_factory.mktemp("pool")
    (d / "driver.c").write_text(POOL_DRIVER)
    exe = d / "driver"
    r = subprocess.run([cc, "-std=c11", "-g", "-O1", "-Wall", "-Werror", "-fsanitize=thread",
                        "-DAOTRT_NS=t", f"-I{RUNTIME}", str(RUNTIME / "rt_pool.c"),
                        str(d / "driver.c"), "-Wl,--wrap=pthread_create", "-pthread",
                        "-o", str(exe)], capture_output=True, text=True)
    if r.returncode and "tsan" in r.stderr.lower():
        pytest.skip(f"no ThreadSanitizer here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr
    return exe


def _drive(exe, threads, part, copies, allowed=-1, most=None):
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1:exitcode=66")
    most = 9 * part + 4099 if most is None else most
    r = subprocess.run([str(exe), str(threads), str(part), str(copies), str(allowed), str(most)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert "ThreadSanitizer" not in r.stderr, r.stderr
    assert r.returncode == 0 and r.stdout.endswith("ok\n"), r.stdout + r.stderr
    return int(r.stdout.split()[1])


@pytest.mark.parametrize("threads, part", [
    (4, 4096),
    (2, 4096),
    (9, 1000),               # more threads than cores; pieces rounded up to cache lines
])
def test_pool_copies_like_memcpy_without_races(pool_driver, threads, part):
    assert _drive(pool_driver, threads, part, 200) == threads - 1


def test_pool_copies_of_many_pieces(pool_driver):
    """Copies of up to 600000 bytes with pieces of 16 bytes at least: more than the 4095 a
    copy is cut into at most, so the pieces grow."""
    assert _drive(pool_driver, 3, 16, 30, most=600_000) == 2


@pytest.mark.parametrize("allowed, made", [(2, 2), (0, 0)])
def test_pool_without_threads_copies_with_fewer(pool_driver, allowed, made):
    """pthread_create failing after `allowed` threads: a pool of those (none: the caller
    alone), the same bytes."""
    assert _drive(pool_driver, 6, 4096, 60, allowed) == made


def test_pool_of_one_thread_is_none(pool_driver):
    assert _drive(pool_driver, 1, 4096, 20) == 0


# -- PoCL: the emitted library -----------------------------------------------------------------

BIG = """\
name: stagebig
inputs:
  a: [7, 3, 128, 131]
  b: [7, 3, 128, 131]
outputs: [sum, c]
layers:
  - {name: sum, op: add, inputs: [a, b], act: relu}
  - {name: c, op: conv, out: 2, kernel: 3}
"""
IN_BYTES = 7 * 3 * 128 * 131 * 4                       # 1408512 per input
OUT_BYTES = IN_BYTES + 7 * 2 * 126 * 129 * 4           # 2318736, the largest transfer


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    d = tmp_path_factory.mktemp("stagebig")
    (d / "big.yaml").write_text(BIG)
    res = compile_network(str(d / "big.yaml"), target="pocl-cpu", outdir=d / "out",
                          batch=[3, 7], tune_mode="fallback", measure=False, quiet=True)
    return res.outdir


def _inputs(n, seed=3):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, 3, 128, 131)).astype(np.float32) for _ in range(2)]


def _same(got, want):
    return len(got) == len(want) and all(g.shape == w.shape and np.array_equal(g, w)
                                         for g, w in zip(got, want))


def stage_threads_alive():
    """The staging threads of this process (rt_pool.c names them)."""
    count = 0
    for t in os.listdir("/proc/self/task"):
        try:
            count += Path(f"/proc/self/task/{t}/comm").read_text().strip() == "aotconv-stage"
        except OSError:
            pass
    return count


@pytest.fixture(scope="module")
def one_thread(big):
    """The outputs of one thread's staging, for the whole batch and for n = 1 .. 6."""
    xs = _inputs(7)
    with load(big, stage_threads=1) as net:
        runs = {None: net(xs)}
        for n in (1, 2, 3, 4, 6):
            runs[n] = net([x[:n] for x in xs])
    return xs, runs


@pytest.mark.parametrize("threads, stage", [
    (3, 333_333),            # 2 pieces of every 333333-byte chunk: 5 chunks an input
    (0, 0),                  # the defaults: one chunk of 9 pieces
    (8, 1_000_003),          # 4 pieces, the last chunk of each input shorter
    (5, 0),
])
def test_threads_give_the_bytes_of_one(big, one_thread, threads, stage):
    """run() and run_n (partial batches of both sizes), two inputs and two outputs, each call
    three times: the bytes of one thread's staging, and of no staging."""
    xs, want = one_thread
    with load(big, stage_threads=threads, stage_bytes=stage) as net:
        for _ in range(3):
            assert _same(net(xs), want[None])
        for n in (1, 2, 3, 4, 6):
            assert _same(net([x[:n] for x in xs]), want[n]), n
        assert _same(net(xs), want[None])
    with load(big, stage_bytes=-1) as plain:
        assert _same(plain(xs), want[None])
    a, b = (x.astype(np.float64) for x in xs)
    assert close(want[None][0].ravel(), np.maximum(a + b, 0).ravel())[0]


def _pieces(stage):
    slot = min(stage or 4 << 20, OUT_BYTES)
    return -(-slot // PART)


@pytest.mark.parametrize("threads, stage, made", [
    (4, 0, 3),               # the caller and 3 threads
    (1, 0, 0),               # the caller alone
    (4, -1, 0),              # no staging, no threads
    (4, 300_000, 1),         # a slot of two pieces: one thread beside the caller
    (4, 200_000, 0),         # a slot of one piece: none
    (1000, 0, _pieces(0) - 1),  # clamped to 64, and to the pieces of a slot
])
def test_create_makes_the_threads_and_destroy_joins_them(big, threads, stage, made):
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc/self/task")
    before = stage_threads_alive()
    net = load(big, stage_threads=threads, stage_bytes=stage)
    try:
        assert stage_threads_alive() - before == made
    finally:
        net.close()
    assert stage_threads_alive() == before


def test_default_is_one_thread_per_cpu_up_to_8(big):
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc/self/task")
    want = min(len(os.sched_getaffinity(0)), DEFAULT_MAX, _pieces(0)) - 1
    before = stage_threads_alive()
    with load(big) as net:
        assert stage_threads_alive() - before == want
        assert net.memory()["pinned_bytes"] == OUT_BYTES    # one slot: the largest transfer


def test_negative_thread_count_is_refused(big):
    with pytest.raises(LibraryError, match=r"\[-1\] stagebig: options.stage_threads is -2; "
                                           r"give 0 \(the default: one per CPU, at most 8\)"):
        load(big, stage_threads=-2)
    with pytest.raises(AotconvError, match="stage_threads is 4294967296; give 0"):
        load(big, stage_threads=1 << 32)


# argv: params.bin, stage_threads, stage_bytes. run_inputs three times (the pool hands over
# chunks of both inputs and both outputs), the outputs of the first and the last compared.
LIBRARY_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "stagebig.h"

int main(int argc, char **argv)
{
    aotconv_stagebig *net = NULL;
    aotconv_stagebig_options o;
    memset(&o, 0, sizeof o);
    o.platform_index = o.device_index = -1;
    o.stage_threads = atoi(argv[2]);
    o.stage_bytes = atol(argv[3]);
    if (argc != 4 || aotconv_stagebig_create(&net, &o) ||
        aotconv_stagebig_load_params(net, argv[1])) {
        fprintf(stderr, "%s\n", aotconv_stagebig_last_error(net));
        return 1;
    }
    size_t in = AOTCONV_STAGEBIG_INPUT_COUNT, out = AOTCONV_STAGEBIG_OUTPUT_COUNT;
    float *x = malloc(in * sizeof *x), *y = malloc(out * sizeof *y), *y0 = malloc(out * sizeof *y);
    for (size_t i = 0; i < in; ++i)
        x[i] = (float)((i * 2654435761u) % 1000u) / 500.0f - 1.0f;
    const float *ins[2] = {x, x + AOTCONV_STAGEBIG_INPUT_0_COUNT};
    size_t counts[2] = {AOTCONV_STAGEBIG_INPUT_0_COUNT, AOTCONV_STAGEBIG_INPUT_1_COUNT};
    for (int k = 0; k < 3; ++k)
        if (aotconv_stagebig_run_inputs(net, ins, counts, 2, k ? y : y0, out)) {
            fprintf(stderr, "%s\n", aotconv_stagebig_last_error(net));
            return 1;
        }
    printf("%s\n", memcmp(y, y0, out * sizeof *y) ? "differ" : "same");
    aotconv_stagebig_destroy(net);
    free(x);
    free(y);
    free(y0);
    return 0;
}
"""


def test_library_under_thread_sanitizer(big, tmp_path):
    """The library's sources and a program of run_inputs calls built with ThreadSanitizer: no
    race between run()'s staging, its threads and destroy()."""
    cc = shutil.which(os.environ.get("CC", "cc"))
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "main.c").write_text(LIBRARY_DRIVER)
    exe = tmp_path / "main"
    r = subprocess.run([cc, "-std=c11", "-g", "-O1", "-fsanitize=thread",
                        "-DAOTRT_NS=stagebig", f"-I{big}", f"-I{big / 'runtime'}",
                        str(big / "stagebig.c"), *map(str, sorted((big / "runtime").glob("*.c"))),
                        str(tmp_path / "main.c"), "-o", str(exe), "-lOpenCL", "-pthread", "-lm"],
                       capture_output=True, text=True)
    if r.returncode and "tsan" in r.stderr.lower():
        pytest.skip(f"no ThreadSanitizer here: {r.stderr.strip()[-200:]}")
    assert r.returncode == 0, r.stderr
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1:exitcode=66")
    for threads, stage in [(4, 0), (3, 333_333)]:
        run = subprocess.run([str(exe), str(big / "stagebig.params.bin"), str(threads),
                              str(stage)], capture_output=True, text=True, env=env, timeout=300)
        assert "ThreadSanitizer" not in run.stderr, run.stderr
        assert run.returncode == 0 and run.stdout == "same\n", run.stdout + run.stderr


def test_header_declares_the_option_last(big):
    """A member added at the end: an application's zeroed options mean the defaults."""
    text = (big / "stagebig.h").read_text()
    body = text[text.index("    int platform_index;"):text.index("} aotconv_stagebig_options;")]
    members = [ln.split("/*")[0].strip() for ln in body.splitlines()]
    members = [m for m in members if m.endswith(";")]
    assert members[-3:] == ["long stage_bytes;", "int stage_threads;", "int flush_every;"]
