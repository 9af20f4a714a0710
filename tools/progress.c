#include "progress.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    interrupted = sig;
}

void ck_progress_catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: a blocked write returns and the loop notices */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

void ck_progress_die_if_interrupted(void)
{
    int sig = interrupted;
    if (!sig)
        return;
    signal(sig, SIG_DFL);
    raise(sig);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

void ck_bar_start(ck_bar *b, const char *label)
{
    *b = (ck_bar){.label = label, .start = now_s(), .tty = isatty(2)};
}

int ck_progress_tick(void *bar, uint64_t done, uint64_t total)
{
    ck_bar *b = bar;
    double t = now_s();
    if (b->tty && (t - b->last >= 0.1 || done == total)) {
        enum { WIDTH = 30 };
        char fill[WIDTH + 1];
        unsigned k = total ? (unsigned)(WIDTH * (double)done / (double)total) : WIDTH;
        for (unsigned i = 0; i < WIDTH; i++)
            fill[i] = i < k ? '#' : '.';
        fill[WIDTH] = 0;
        double rate = done / (t - b->start > 1e-6 ? t - b->start : 1e-6);
        double eta = rate > 0 ? (double)(total - done) / rate : 0;
        fprintf(stderr, "\r%s [%s] %.2f/%.2f GiB  %.0f MiB/s  ETA %d:%02d ", b->label, fill,
                done / 1073741824.0, total / 1073741824.0, rate / 1048576.0, (int)eta / 60,
                (int)eta % 60);
        b->last = t;
        b->drawn = 1;
    }
    return interrupted != 0;
}

double ck_bar_seconds(const ck_bar *b)
{
    return now_s() - b->start;
}

void ck_bar_end(ck_bar *b)
{
    if (b->drawn)
        fputc('\n', stderr);
}
