/* How many threads the calling thread's kernel regions get: the whole OpenMP team, or one while
 * the machine is oversubscribed.
 *
 * A parallel region ends when its last thread does. When another process holds a core, one of
 * our threads waits for a CPU at most regions while the others wait for it at the barrier: a
 * 2-thread decode step of ~150 regions then takes many times what one thread needs (measured
 * on 2 AVX2 cores, default model, single stream: ~110 tok/s quiet; beside one busy process
 * 12-20 tok/s with 2 threads, ~70 with one). The big kernels time each region (team.h): its
 * length T and the spread S of its threads' finish times. A thread held off a CPU for S makes
 * a region of work W take W / 2 + S on two threads against W on one, so one thread is faster
 * once S > T / 2. When the spreads of a window of regions add up to more than half their time,
 * the calling thread's next regions run on one thread; then the team is tried again for a
 * window, and while the contention lasts each solo period is twice as long as the last (each
 * clean window halves it: a window can be clean by chance while both our threads happen to
 * hold the cores). Short blips, such as our own detokenizer waking once a step, do not
 * add up to half a window. A team size never changes a result: every output element is
 * computed by one thread in a fixed order whatever the team. RADIXGEN_CPU_ADAPTIVE_TEAM=0 turns
 * this off (comparisons).
 */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "radixgen_kernels.h"

#define TEAM_WINDOW 32      /* timed team regions per verdict */
#define TEAM_LATE_SHARE 0.5 /* spreads over this share of the regions' time: one thread is faster */
#define TEAM_SOLO_MIN 512   /* timed regions run on one thread at first (~4 decode steps) */
#define TEAM_SOLO_MAX 32768 /* the longest solo period (~270 decode steps) */

typedef struct {
    int64_t timed, late, solo_periods;
    double spread, time; /* this window's sums */
    int window, solo_left, backoff;
} TeamState;

static _Thread_local TeamState team = {.backoff = TEAM_SOLO_MIN};
static int team_enabled = -1; /* read once from the environment */

static int adaptive(void) {
    if (team_enabled < 0) {
        const char* env = getenv("RADIXGEN_CPU_ADAPTIVE_TEAM");
        team_enabled = !(env && strcmp(env, "0") == 0);
    }
    return team_enabled;
}

int team_threads(void) {
    int all = omp_get_max_threads();
    if (all <= 1 || !adaptive()) return all;
    return team.solo_left > 0 ? 1 : all;
}

void team_report(int threads, double t0, double spread, double t1) {
    if (!adaptive()) return;
    if (threads < 2) { /* a region of a solo period (or of a one-thread team) */
        if (team.solo_left > 0) --team.solo_left;
        return;
    }
    ++team.timed;
    if (spread > TEAM_LATE_SHARE * (t1 - t0)) ++team.late;
    team.spread += spread;
    team.time += t1 - t0;
    if (++team.window < TEAM_WINDOW) return;
    if (team.spread > TEAM_LATE_SHARE * team.time) {
        team.solo_left = team.backoff;
        ++team.solo_periods;
        if (team.backoff < TEAM_SOLO_MAX) team.backoff *= 2;
    } else {
        team.backoff = team.backoff / 2 > TEAM_SOLO_MIN ? team.backoff / 2 : TEAM_SOLO_MIN;
    }
    team.window = 0;
    team.spread = team.time = 0.0;
}

void team_stats(int64_t* out) {
    out[0] = team.timed;
    out[1] = team.late;
    out[2] = team.solo_periods;
    out[3] = team.solo_left;
    out[4] = team.backoff;
    out[5] = adaptive();
}

void team_reset(void) {
    memset(&team, 0, sizeof(team));
    team.backoff = TEAM_SOLO_MIN;
}
