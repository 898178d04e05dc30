/* The threads that copy run()'s staged input into the pinned ring and its output out of it.
 *
 * One thread's memcpy from pageable memory runs at ~7-8 GB/s, below a PCIe 5 DMA; several
 * reach the host's memory bandwidth. create() makes the pool once (aotrt_stage_setup); a copy
 * is split into contiguous parts, part 0 copied by the calling thread and part i by thread i,
 * and returns when every part is there. The bytes each thread writes are fixed by the length
 * alone, so the result is the same memcpy whatever the number of threads.
 *
 * Handing a copy over: the caller writes the job, then publishes a ticket (job number and
 * parts) under the lock and wakes the threads; a thread with a part copies it and counts it
 * off in `left`; the caller waits until `left` is 0 before it writes the next job. Threads
 * with no part in a job (a short copy) read only its ticket. Between copies a thread spins a
 * short while (yielding its CPU) before it sleeps, since run() hands over one chunk after
 * another and a futex wake-up on every chunk would cost about what a part takes to copy.
 *
 * pthreads, in glibc's libc since 2.34 (the build links -pthread for older ones). No call here
 * fails: a thread that cannot be made leaves the pool smaller, a pool that cannot be made
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
/* Part boundaries on cache lines, so no two threads write one line. */
#define ALIGN 64

typedef struct {
    aotrt_pool *pool;
    int index;                /* its part of each job: 1 .. threads */
} worker;

struct aotrt_pool {
    pthread_mutex_t lock;
    pthread_cond_t wake;      /* a ticket posted, or stop */
    pthread_cond_t done;      /* the last part of the job copied */
    int nthreads;             /* threads made and running */
    pthread_t *threads;
    worker *workers;
    size_t part;              /* the least bytes worth a part */
    uint64_t job;             /* the caller's count of jobs posted */
    /* the job: written by the caller before it posts the ticket, then left alone until
     * `left` is 0; read only by the threads with a part in it */
    unsigned char *dst;
    const unsigned char *src;
    size_t len, chunk;        /* chunk: the bytes of one part (the last may be shorter) */
    atomic_uint_least64_t ticket;   /* job << 8 | parts; 0 before the first */
    atomic_int left;          /* parts the threads have still to copy */
    atomic_int stop;
};

static long long now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

static void copy_part(aotrt_pool *p, int i)
{
    size_t off = (size_t)i * p->chunk;
    if (off < p->len)
        memcpy(p->dst + off, p->src + off, p->len - off < p->chunk ? p->len - off : p->chunk);
}

/* The ticket after `seen`: spun for, then slept for; `seen` again once the pool stops. */
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
    worker *w = arg;
    aotrt_pool *p = w->pool;
    uint64_t seen = 0;
    for (;;) {
        uint64_t t = next_ticket(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_relaxed))
            return NULL;
        seen = t;
        if (w->index >= (int)(t & 0xff))
            continue;          /* no part in this job */
        copy_part(p, w->index);
        if (atomic_fetch_sub_explicit(&p->left, 1, memory_order_acq_rel) == 1) {
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
    want = want < 254 ? want : 254;      /* parts fit the ticket's 8 bits */
    aotrt_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    p->threads = calloc((size_t)want, sizeof *p->threads);
    p->workers = calloc((size_t)want, sizeof *p->workers);
    p->part = part ? part : 1;
    atomic_init(&p->ticket, 0);
    atomic_init(&p->left, 0);
    atomic_init(&p->stop, 0);
    int mutex = 0, wake = 0, done = 0;
    if (!p->threads || !p->workers || !(mutex = !pthread_mutex_init(&p->lock, NULL)) ||
        !(wake = !pthread_cond_init(&p->wake, NULL)) ||
        !(done = !pthread_cond_init(&p->done, NULL))) {
        if (mutex)
            pthread_mutex_destroy(&p->lock);
        if (wake)
            pthread_cond_destroy(&p->wake);
        free(p->threads);
        free(p->workers);
        free(p);
        return NULL;
    }
    /* the threads take no signals: the application's handlers run on its own threads */
    sigset_t all, old;
    sigfillset(&all);
    int masked = !pthread_sigmask(SIG_SETMASK, &all, &old);
    for (int i = 0; i < want; ++i) {
        p->workers[i].pool = p;
        p->workers[i].index = i + 1;
        if (pthread_create(&p->threads[i], NULL, work, &p->workers[i]) != 0)
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
    size_t parts = p ? (len + p->part - 1) / p->part : 1;
    parts = p && parts > (size_t)p->nthreads + 1 ? (size_t)p->nthreads + 1 : parts;
    if (parts <= 1) {
        if (len)
            memcpy(dst, src, len);
        return;
    }
    size_t chunk = (len + parts - 1) / parts;
    chunk = (chunk + ALIGN - 1) / ALIGN * ALIGN;
    p->dst = dst;
    p->src = src;
    p->len = len;
    p->chunk = chunk;
    atomic_store_explicit(&p->left, (int)parts - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->lock);
    ++p->job;
    atomic_store_explicit(&p->ticket, p->job << 8 | parts, memory_order_release);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    copy_part(p, 0);
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
    free(p->workers);
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
