/*
 * A wall clock a test can move forward, for one server process (LD_PRELOAD).
 *
 * Why not libfaketime: Debian's libfaketime resolves the real functions with dlsym, which
 * allocates, and redis-server's jemalloc reads the clock while allocating: the recursion makes
 * libfaketime return -1 from clock_gettime and the server misbehaves. Here the real clock comes
 * from the raw system call, so nothing recurses.
 *
 * The offset, in milliseconds (a little-endian int64), is read from the file named by
 * DISTLOCK_CLOCK_OFFSET_FILE, mapped shared at load: the harness writes the file and the
 * process sees the new offset at its next clock read. Only the wall clock moves
 * (CLOCK_REALTIME, gettimeofday, time); monotonic clocks stay true, as in a real clock step.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ms;

__attribute__((constructor)) static void map_offset(void) {
    const char *path = getenv("DISTLOCK_CLOCK_OFFSET_FILE");
    if (!path) {
        return;
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return;
    }
    void *p = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (p != MAP_FAILED) {
        offset_ms = p;
    }
}

static void shift(struct timespec *ts) {
    if (!offset_ms) {
        return;
    }
    int64_t ns = (int64_t)ts->tv_nsec + (*offset_ms % 1000) * 1000000;
    int64_t sec = (int64_t)ts->tv_sec + *offset_ms / 1000;
    while (ns < 0) {
        ns += 1000000000;
        sec -= 1;
    }
    while (ns >= 1000000000) {
        ns -= 1000000000;
        sec += 1;
    }
    ts->tv_sec = (time_t)sec;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int r = (int)syscall(SYS_clock_gettime, id, ts);
    if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
        shift(ts);
    }
    return r;
}

int gettimeofday(struct timeval *tv, void *tz) {
    (void)tz;
    struct timespec ts;
    int r = clock_gettime(CLOCK_REALTIME, &ts);
    if (r == 0 && tv) {
        tv->tv_sec = ts.tv_sec;
        tv->tv_usec = ts.tv_nsec / 1000;
    }
    return r;
}

time_t time(time_t *out) {
    struct timespec ts;
    if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
        return (time_t)-1;
    }
    if (out) {
        *out = ts.tv_sec;
    }
    return ts.tv_sec;
}
