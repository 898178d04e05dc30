/* The threads that copy run()'s staged input into the pinned ring and its output out of it.
 *
 * One thread's memcpy from pageable memory runs at ~7-8 GB/s on a server's core, below a
 * PCIe 5 DMA; several reach the host's memory bandwidth. create() makes the pool once
 * (aotrt_stage_setup). A copy is cut into pieces of at least `part` bytes (at most MAX_PIECES),
 * which the calling thread and the pool's threads claim one at a time until none is left; the
 * call returns when every piece is there. Claimed, not dealt: a thread that the scheduler
 * holds back (more threads than free cores) leaves its share to the others, the caller
 * included, so a copy is never slower than by the caller alone by more than one piece. The
 * pieces are fixed by the length alone and each is a memcpy of its own bytes, so the result
 * is the same whatever the number of threads.
 *
 * Handing a copy over: the caller writes the job (dst, src, len, piece), sets `left` to its
 * pieces, publishes `claim` (job number, pieces, next piece), then the job number in `ticket`
 * under the lock, and wakes the threads. A thread claims piece i by moving `claim` from i to
 * i + 1 (compare-and-swap: the job number in the word keeps a late thread off the next job),
 * copies it and counts it off in `left`; the caller writes the next job only once `left` is
 * 0, so a thread reads the job's fields only while they hold. Between copies a thread spins a
 * short while (yielding its CPU) before it sleeps, since run() hands over one chunk after
 * another and a futex wake-up per chunk would cost about what a piece takes to copy.
 *
 * pthreads, in glibc's libc since 2.34 (the library links -pthread for older ones). No call
 * here fails: a thread that cannot be made leaves the pool smaller, a pool that cannot be made
 * leaves the caller to copy alone.
 */
#define _GNU_SOURCE   /* pthread_setname_np, sched_getaffinity (glibc); POSIX elsewhere */
#include "aotconv_rt.h"

#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* How long a thread (and the caller, for the others) spins before it sleeps. */
#define SPIN_NS 200000L
/* Piece boundaries on cache lines, so no two threads write one line. */
#define ALIGN 64
/* `claim`: job number << 24 | pieces << 12 | next piece */
#define MAX_PIECES 4095
#define CLAIM(job, pieces, next) ((job) << 24 | (uint64_t)(pieces) << 12 | (uint64_t)(next))

struct aotrt_pool {
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* a job posted, or stop */
    pthread_cond_t done;      /* the job's last piece copied */
    int nthreads;             /* threads made and running */
    pthread_t *threads;
    size_t part;              /* the least bytes worth a piece */
    uint64_t job;             /* the caller's count of jobs posted */
    /* the job: written by the caller before it posts it, then left alone until `left` is 0;
     * read only by a thread that holds a claimed piece of it */
    unsigned char *dst;
    const unsigned char *src;
    size_t len, piece;        /* piece: the bytes of one (the last may be shorter) */
    atomic_uint_least64_t claim;    /* CLAIM(job, pieces, next piece) */
    atomic_uint_least64_t ticket;   /* the job posted last; 0 before the first */
    atomic_int left;          /* pieces of the job not copied yet */
    atomic_int stop;
};

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Claim and copy pieces of the job posted until none is left; 1 if this thread copied its
 * last piece (`left` reached 0). */
static int drain(aotrt_pool *p)
{
    uint64_t c = atomic_load_explicit(&p->claim, memory_order_acquire);
    for (;;) {
        uint64_t pieces = c >> 12 & 0xfff, i = c & 0xfff;
        if (i >= pieces)
            return 0;
        if (!atomic_compare_exchange_weak_explicit(&p->claim, &c, c + 1, memory_order_acquire,
                                                   memory_order_acquire))
            continue;        /* c is the word now: another claimed first */
        size_t off = (size_t)i * p->piece;
        if (off < p->len)
            memcpy(p->dst + off, p->src + off,
                   p->len - off < p->piece ? p->len - off : p->piece);
        if (atomic_fetch_sub_explicit(&p->left, 1, memory_order_acq_rel) == 1)
            return 1;
        c = atomic_load_explicit(&p->claim, memory_order_acquire);
    }
}

/* The ticket after `seen`: spun for, then slept for; returns early once the pool stops. */
static uint64_t next_ticket(aotrt_pool *p, uint64_t seen)
{
    long long until = now_ns() + SPIN_NS;
    for (unsigned k = 0;; ++k) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        if (t != seen || atomic_load_explicit(&p->stop, memory_order_relaxed))
            return t;
        if ((k & 15) == 15 && now_ns() > until)
            break;
        sched_yield();
    }
    uint64_t t;
    pthread_mutex_lock(&p->lock);
    while ((t = atomic_load_explicit(&p->ticket, memory_order_acquire)) == seen &&
           !atomic_load_explicit(&p->stop, memory_order_relaxed))
        pthread_cond_wait(&p->wake, &p->lock);
    pthread_mutex_unlock(&p->lock);
    return t;
}

static void *work(void *arg)
{
    aotrt_pool *p = arg;
    uint64_t seen = 0;
    for (;;) {
        seen = next_ticket(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            return NULL;
        if (drain(p)) {
            pthread_mutex_lock(&p->lock);
            pthread_cond_broadcast(&p->done);
            pthread_mutex_unlock(&p->lock);
        }
    }
}

static void stop_and_join(aotrt_pool *p)
{
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->stop, 1, memory_order_relaxed);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nthreads; ++i)
        pthread_join(p->threads[i], NULL);
    p->nthreads = 0;
}

aotrt_pool *aotrt_pool_new(int threads, size_t part)
{
    int want = threads - 1;
    if (want < 1)
        return NULL;
    aotrt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->threads = calloc((size_t)want, sizeof *p->threads);
    p->part = part ? part : 1;
    atomic_init(&p->claim, 0);
    atomic_init(&p->ticket, 0);
    atomic_init(&p->left, 0);
    atomic_init(&p->stop, 0);
    int mutex = 0, wake = 0, done = 0;
    if (!p->threads || !(mutex = !pthread_mutex_init(&p->lock, NULL)) ||
        !(wake = !pthread_cond_init(&p->wake, NULL)) ||
        !(done = !pthread_cond_init(&p->done, NULL))) {
        if (mutex)
            pthread_mutex_destroy(&p->lock);
        if (wake)
            pthread_cond_destroy(&p->wake);
        free(p->threads);
        free(p);
        return NULL;
    }
    /* the threads take no signals: the application's handlers run on its own threads */
    sigset_t all, old;
    sigfillset(&all);
    int masked = !pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < want; ++i) {
        if (pthread_create(&p->threads[i], NULL, work, p) != 0)
            break;           /* fewer threads, the same copies */
#if defined(__GLIBC__)
        pthread_setname_np(p->threads[i], "aotconv-stage");
#endif
        p->nthreads = i + 1;
    }
    if (masked)
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!p->nthreads) {
        aotrt_pool_free(p);
        return NULL;
    }
    return p;
}

int aotrt_pool_threads(const aotrt_pool *p)
{
    return p ? p->nthreads : 0;
}

void aotrt_pool_copy(aotrt_pool *p, void *dst, const void *src, size_t len)
{
    if (!p || len < 2 * p->part) {
        if (len)
            memcpy(dst, src, len);
        return;
    }
    size_t piece = len / MAX_PIECES + 1 > p->part ? len / MAX_PIECES + 1 : p->part;
    piece = (piece + ALIGN - 1) / ALIGN * ALIGN;
    size_t pieces = (len + piece - 1) / piece;
    p->dst = dst;
    p->src = src;
    p->len = len;
    p->piece = piece;
    ++p->job;
    atomic_store_explicit(&p->left, (int)pieces, memory_order_relaxed);
    atomic_store_explicit(&p->claim, CLAIM(p->job, pieces, 0), memory_order_release);
    pthread_mutex_lock(&p->lock);
    atomic_store_explicit(&p->ticket, p->job, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    if (drain(p))
        return;              /* the caller copied the last piece */
    long long until = now_ns() + SPIN_NS;
    for (unsigned k = 0; atomic_load_explicit(&p->left, memory_order_acquire); ++k) {
        if ((k & 15) == 15 && now_ns() > until) {
            pthread_mutex_lock(&p->lock);
            while (atomic_load_explicit(&p->left, memory_order_acquire))
                pthread_cond_wait(&p->done, &p->lock);
            pthread_mutex_unlock(&p->lock);
            break;
        }
        sched_yield();
    }
}

void aotrt_pool_free(aotrt_pool *p)
{
    if (!p)
        return;
    stop_and_join(p);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->wake);
    pthread_mutex_destroy(&p->lock);
    free(p->threads);
    free(p);
}

int aotrt_cpu_count(void)
{
#if defined(__linux__) && defined(__GLIBC__)
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0)
        return CPU_COUNT(&set);
#endif
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (c < 4096 ? (int)c : 4096) : 1;
}
