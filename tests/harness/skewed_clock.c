/* A wall clock GPUFLEET_CLOCK_OFFSET_S seconds off the machine's, preloaded into a test's
 * PostgreSQL (tests/harness/pg.py) so that clock_timestamp() differs from the replicas' clocks.
 *
 * Why not libfaketime: it wraps epoll_wait, poll and select and stops faking the clock while
 * one of them waits, so a signal handler that runs during a wait reads the real clock.
 * PostgreSQL's SIGALRM handler reads the clock to fire its timeouts; with the clock an hour
 * ahead it saw the timeout an hour early and set it again for an hour later, so
 * idle_in_transaction_session_timeout and lock_timeout never fired (measured: a session idle in
 * its transaction was never ended, against 0.2 s without the offset). This shim fakes the wall
 * clock and nothing else: the offset is read once, when the library is loaded (the postmaster;
 * backends inherit it), and every call afterwards is async-signal-safe arithmetic. The
 * monotonic clocks are left alone. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/time.h>
#include <time.h>

static long long offset_s;
static int (*real_clock_gettime)(clockid_t, struct timespec *);
static int (*real_gettimeofday)(struct timeval *, void *);

__attribute__((constructor)) static void load(void) {
    const char *text = getenv("GPUFLEET_CLOCK_OFFSET_S");
    offset_s = text ? atoll(text) : 0;
    real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    real_gettimeofday = (int (*)(struct timeval *, void *))dlsym(RTLD_NEXT, "gettimeofday");
}

static int wall(clockid_t id) {
    return id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE || id == CLOCK_TAI;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    if (!real_clock_gettime) load();
    int rc = real_clock_gettime(id, ts);
    if (rc == 0 && wall(id)) ts->tv_sec += offset_s;
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    if (!real_gettimeofday) load();
    int rc = real_gettimeofday(tv, tz);
    if (rc == 0 && tv) tv->tv_sec += offset_s;
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out) *out = ts.tv_sec;
    return ts.tv_sec;
}
