/*
 * clockshift: an LD_PRELOAD shim that shifts the wall clock of one process
 * (CLOCK_REALTIME and its coarse variant through clock_gettime,
 * gettimeofday, time) by SCHED_CLOCK_OFFSET_MS milliseconds (signed; read
 * once).  Monotonic clocks are left alone.
 *
 * Why not libfaketime: it resolves the real functions with dlsym, which
 * allocates, and a jemalloc build of redis-server reads the clock while
 * initialising its allocator: libfaketime gives up on the recursion and the
 * server does not start.  This shim asks the kernel directly (syscall), so
 * it allocates nothing and resolves nothing.
 *
 * Built by bench/clockshift.py with the system cc:
 *   cc -shared -fPIC -O2 -o clockshift.so clockshift.c
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long long offset_ms;
static int offset_read;

static long long offset(void) {
    if (!offset_read) {
        const char *text = getenv("SCHED_CLOCK_OFFSET_MS");
        offset_ms = text ? strtoll(text, NULL, 10) : 0;
        offset_read = 1;
    }
    return offset_ms;
}

static void shift(struct timespec *ts) {
    long long ns = (long long)ts->tv_nsec + (offset() % 1000) * 1000000LL;
    long long s = (long long)ts->tv_sec + offset() / 1000;
    while (ns < 0) { ns += 1000000000LL; s -= 1; }
    while (ns >= 1000000000LL) { ns -= 1000000000LL; s += 1; }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t clk, struct timespec *ts) {
    long r = syscall(SYS_clock_gettime, clk, ts);
    if (r == 0 && (clk == CLOCK_REALTIME || clk == CLOCK_REALTIME_COARSE)) shift(ts);
    return (int)r;
}

int gettimeofday(struct timeval *restrict tv, void *restrict tz) {
    struct timespec ts;
    (void)tz;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0) return -1;
    shift(&ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return 0;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (syscall(SYS_clock_gettime, CLOCK_REALTIME, &ts) != 0) return (time_t)-1;
    shift(&ts);
    if (out != NULL) *out = ts.tv_sec;
    return ts.tv_sec;
}
