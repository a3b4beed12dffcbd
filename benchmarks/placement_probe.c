// Where the two threads of a 2-core VM sit, and what that placement reads
// (benchmarks/bench_placement.py builds and runs it).
//
//   placement_probe rtt      one cache-line round trip between threads pinned to CPUs 0
//                            and 1, in ns (the median of 9 batches of 2000): ~70 ns for
//                            SMT siblings of one core, ~150-250 across cores of one CCD,
//                            ~500 across CCDs on the Zen 4 VM of RESULTS session 32
//   placement_probe read MB  the round trip, then the best of two 2-thread reads of an MB
//                            buffer in huge pages (GB/s), then the round trip again:
//                            "rtt_before gbps rtt_after"
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static void pin(int cpu) {
  cpu_set_t s;
  CPU_ZERO(&s);
  CPU_SET(cpu, &s);
  pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

enum { kTrips = 2000, kBatches = 9 };
static _Alignas(64) atomic_long flag;
static atomic_int ready;

static void* pong(void* arg) {
  (void)arg;
  pin(1);
  atomic_store(&ready, 1);
  for (long i = 0; i < (long)kTrips * kBatches; i++) {
    while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 1) _mm_pause();
    atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
  }
  return NULL;
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

// The median of kBatches batches of kTrips round trips; the partner thread is on CPU 1
// before the clock starts (a thread created by one spinning on its CPU would first wait
// for a time slice there).
static double rtt_ns(void) {
  atomic_store(&flag, 0);
  atomic_store(&ready, 0);
  pthread_t t;
  pthread_create(&t, NULL, pong, NULL);
  while (!atomic_load(&ready)) sched_yield();
  pin(0);
  double v[kBatches];
  long i = 0;
  for (int b = 0; b < kBatches; b++) {
    double t0 = now();
    for (long end = i + kTrips; i < end; i++) {
      atomic_store_explicit(&flag, 2 * i + 1, memory_order_release);
      while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 2) _mm_pause();
    }
    v[b] = (now() - t0) / kTrips * 1e9;
  }
  pthread_join(t, NULL);
  qsort(v, kBatches, sizeof v[0], cmp);
  return v[kBatches / 2];
}

static char* buf;
static size_t nbytes;

typedef struct {
  int cpu;
  long long sum;
} Reader;

static void* reader(void* arg) {
  Reader* r = arg;
  pin(r->cpu);
  size_t half = nbytes / 2;
  const char* p = buf + r->cpu * half;
  __m256i acc = _mm256_setzero_si256();
  for (size_t i = 0; i + 128 <= half; i += 128) {
    acc = _mm256_add_epi64(acc, _mm256_load_si256((const void*)(p + i)));
    acc = _mm256_add_epi64(acc, _mm256_load_si256((const void*)(p + i + 32)));
    acc = _mm256_add_epi64(acc, _mm256_load_si256((const void*)(p + i + 64)));
    acc = _mm256_add_epi64(acc, _mm256_load_si256((const void*)(p + i + 96)));
  }
  r->sum = _mm256_extract_epi64(acc, 0);
  return NULL;
}

static double read_gbps(void) {
  pthread_t t[2];
  Reader r[2] = {{0, 0}, {1, 0}};
  double t0 = now();
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, reader, &r[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  return nbytes / (now() - t0) / 1e9;
}

int main(int argc, char** argv) {
  if (argc == 2 && strcmp(argv[1], "rtt") == 0) {
    printf("%.0f\n", rtt_ns());
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "read") == 0) {
    nbytes = (size_t)atol(argv[2]) << 20;
    buf = aligned_alloc(2 << 20, nbytes);
    if (!buf) return 1;
    madvise(buf, nbytes, MADV_HUGEPAGE);
    memset(buf, 1, nbytes);
    double before = rtt_ns();
    double a = read_gbps(), b = read_gbps();
    printf("%.0f %.2f %.0f\n", before, a > b ? a : b, rtt_ns());
    return 0;
  }
  fprintf(stderr, "usage: placement_probe rtt | read MB\n");
  return 2;
}
