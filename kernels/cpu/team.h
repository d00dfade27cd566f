/* Timing a kernel's parallel region for team.c: each thread's finish time, whose spread says
 * whether a thread of the team was kept off a CPU (another process holds it). Use:
 *
 *     TeamClock clock;
 *     team_clock_start(&clock);
 *     #pragma omp parallel num_threads(team_threads())
 *     {
 *         #pragma omp for schedule(static) nowait
 *         for (...) { ... }
 *         team_clock_done(&clock);
 *     }
 *     team_clock_report(&clock);
 */
#ifndef RADIXGEN_TEAM_H
#define RADIXGEN_TEAM_H

#include <omp.h>

#include "radixgen_kernels.h"

#define TEAM_CLOCK_MAX 64 /* threads timed (a larger team's others are not) */

typedef struct {
    double t0;
    double done[TEAM_CLOCK_MAX];
    int threads;
} TeamClock;

static inline void team_clock_start(TeamClock* c) {
    c->t0 = omp_get_wtime();
    c->threads = 1;
}

/* In the region, after this thread's share of the work. */
static inline void team_clock_done(TeamClock* c) {
    int t = omp_get_thread_num();
    if (t < TEAM_CLOCK_MAX) c->done[t] = omp_get_wtime();
    if (t == 0) c->threads = omp_get_num_threads();
}

/* After the region. */
static inline void team_clock_report(const TeamClock* c) {
    int n = c->threads < TEAM_CLOCK_MAX ? c->threads : TEAM_CLOCK_MAX;
    if (n < 2) {
        team_report(1, c->t0, 0.0, omp_get_wtime());
        return;
    }
    double lo = c->done[0], hi = c->done[0];
    for (int i = 1; i < n; ++i) {
        if (c->done[i] < lo) lo = c->done[i];
        if (c->done[i] > hi) hi = c->done[i];
    }
    team_report(n, c->t0, hi - lo, omp_get_wtime());
}

#endif /* RADIXGEN_TEAM_H */
