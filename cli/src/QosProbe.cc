// dsec-qos-probe: the latency-sensitive request loop of `dsec bench qos`, run inside a sandbox. Requests
// "arrive" on a fixed schedule (every --period-us); each does a fixed CPU work item (--work iterations of a
// xorshift loop, ~1 ms here) and its latency is measured from its scheduled arrival to its completion, so
// wake-up delay, preemption and time-sharing by other work all count. Prints one JSON object:
// {"requests","p50_us","mean_us","p99_us","max_us"}.
// Static and libc-only (no libstdc++), so it runs in a layer made of busybox and a few libraries.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

namespace {

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

volatile uint64_t g_sink;

void workItem(long iterations) {
  uint64_t x = 88172645463325252ULL;
  for (long i = 0; i < iterations; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  g_sink = x;
}

int compareDouble(const void* a, const void* b) {
  double x = *static_cast<const double*>(a), y = *static_cast<const double*>(b);
  return x < y ? -1 : (x > y ? 1 : 0);
}

long argValue(int argc, char** argv, const char* name, long fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (strcmp(argv[i], name) == 0) return strtol(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  long requests = argValue(argc, argv, "--requests", 1000);
  long period_us = argValue(argc, argv, "--period-us", 5000);
  long work = argValue(argc, argv, "--work", 300000);
  if (requests <= 0 || period_us <= 0 || work <= 0) {
    fprintf(stderr, "usage: dsec-qos-probe [--requests N] [--period-us US] [--work ITERATIONS]\n");
    return 2;
  }
  double* lat = static_cast<double*>(calloc(static_cast<size_t>(requests), sizeof(double)));
  if (lat == nullptr) return 1;
  workItem(work);  // warm up caches and the CPU's frequency
  int64_t next = nowNs() + period_us * 1000;
  for (long i = 0; i < requests; ++i) {
    timespec at = {static_cast<time_t>(next / 1000000000), static_cast<long>(next % 1000000000)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &at, nullptr) != 0) {
    }
    workItem(work);
    int64_t done = nowNs();
    lat[i] = static_cast<double>(done - next) / 1000.0;
    next += period_us * 1000;
    // Far behind schedule (more than a period): start the schedule again rather than queue up a backlog that
    // would count the same stall many times.
    if (done > next) next = done + period_us * 1000;
  }
  double sum = 0;
  for (long i = 0; i < requests; ++i) sum += lat[i];
  qsort(lat, static_cast<size_t>(requests), sizeof(double), compareDouble);
  auto pct = [&](double p) {
    long rank = static_cast<long>(p / 100.0 * static_cast<double>(requests) + 0.999999);
    if (rank < 1) rank = 1;
    if (rank > requests) rank = requests;
    return lat[rank - 1];
  };
  printf("{\"requests\": %ld, \"p50_us\": %.1f, \"mean_us\": %.1f, \"p99_us\": %.1f, \"max_us\": %.1f}\n", requests,
         pct(50), sum / static_cast<double>(requests), pct(99), lat[requests - 1]);
  free(lat);
  return 0;
}
