/* Cross-CPU round trip: two threads, pinned to two CPUs, bounce one cache
 * line. On a VM the time depends on where the host placed the vCPUs (same
 * core, same L3, another die), and it moves every loopback benchmark here:
 * each request and answer crosses between the client's and the server's CPU.
 * Usage: xcpu CPU_A CPU_B; prints the median of 5 runs in ns. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { TRIPS = 200000, RUNS = 5 };
static _Atomic long line;
static int cpu_b;

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  if (pthread_setaffinity_np(pthread_self(), sizeof s, &s)) {
    perror("pin");
    exit(1);
  }
}

static void *answer(void *unused) {
  (void)unused;
  pin(cpu_b);
  for (long i = 1; i <= (long)TRIPS * RUNS; i++) {
    while (atomic_load_explicit(&line, memory_order_acquire) != 2 * i - 1) {
    }
    atomic_store_explicit(&line, 2 * i, memory_order_release);
  }
  return NULL;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: xcpu CPU_A CPU_B\n");
    return 2;
  }
  cpu_b = atoi(argv[2]);
  pthread_t t;
  pthread_create(&t, NULL, answer, NULL);
  pin(atoi(argv[1]));
  double ns[RUNS];
  long i = 0;
  for (int r = 0; r < RUNS; r++) {
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long k = 0; k < TRIPS; k++) {
      i++;
      atomic_store_explicit(&line, 2 * i - 1, memory_order_release);
      while (atomic_load_explicit(&line, memory_order_acquire) != 2 * i) {
      }
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    ns[r] = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / TRIPS;
  }
  pthread_join(t, NULL);
  qsort(ns, RUNS, sizeof ns[0], cmp);
  printf("%.0f\n", ns[RUNS / 2]);
  return 0;
}
