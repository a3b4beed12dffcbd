// The machine's roofline for the benchmarks (ninfer/bench/roofline.py compiles this with
// the host's native flags): how fast T threads can read memory, and how many fused
// multiply-adds they can issue per second.
//
//   roofline read BYTES THREADS REPEATS HUGE   -> {"gbps": best, "runs": [...]}
//   roofline fma THREADS REPEATS               -> {"gflops": best}
//
// read: one buffer of BYTES, each thread reading its own contiguous 1/T of it with 256-bit
// loads into eight independent accumulators (no compute on the critical path), as a
// decode GEMV reads a weight matrix. The buffer is written first by the thread that later
// reads each part (first touch: its pages on that thread's node). HUGE=1 asks the kernel
// for transparent huge pages (madvise MADV_HUGEPAGE) before the first touch. Each pass
// starts on a barrier; its time is the slowest thread's; the best pass counts.
// fma: eight independent chains of 256-bit FMAs per thread (2 x 8 x 8 FLOP per issue).
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
  const float* base;
  size_t floats;  // this thread's part
  int repeats;
  pthread_barrier_t* start;
  pthread_barrier_t* stop;
  double sink;
} Part;

static double read_part(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
         a7 = a0;
  for (size_t i = 0; i + 64 <= n; i += 64) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    a4 = _mm256_add_ps(a4, _mm256_load_ps(p + i + 32));
    a5 = _mm256_add_ps(a5, _mm256_load_ps(p + i + 40));
    a6 = _mm256_add_ps(a6, _mm256_load_ps(p + i + 48));
    a7 = _mm256_add_ps(a7, _mm256_load_ps(p + i + 56));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                           _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7)));
  float out[8];
  _mm256_storeu_ps(out, s);
  return (double)out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

static void* read_worker(void* arg) {
  Part* part = (Part*)arg;
  float* p = (float*)part->base;
  for (size_t i = 0; i < part->floats; ++i) p[i] = (float)(i & 7);  // first touch
  for (int r = 0; r < part->repeats; ++r) {
    pthread_barrier_wait(part->start);
    part->sink += read_part(part->base, part->floats);
    pthread_barrier_wait(part->stop);
  }
  return NULL;
}

static int run_read(size_t bytes, int threads, int repeats, int huge) {
  const size_t align = 2u << 20;
  bytes = (bytes + align - 1) / align * align;
  float* buf = (float*)aligned_alloc(align, bytes);
  if (!buf) return fprintf(stderr, "roofline: cannot allocate %zu bytes\n", bytes), 1;
  if (huge && madvise(buf, bytes, MADV_HUGEPAGE) != 0) perror("roofline: madvise");
  pthread_barrier_t start, stop;
  pthread_barrier_init(&start, NULL, (unsigned)threads + 1);
  pthread_barrier_init(&stop, NULL, (unsigned)threads + 1);
  Part* parts = (Part*)calloc((size_t)threads, sizeof(Part));
  pthread_t* tids = (pthread_t*)calloc((size_t)threads, sizeof(pthread_t));
  const size_t floats = bytes / sizeof(float), chunk = floats / (size_t)threads / 64 * 64;
  for (int t = 0; t < threads; ++t) {
    parts[t] = (Part){buf + (size_t)t * chunk, chunk, repeats, &start, &stop, 0.0};
    pthread_create(&tids[t], NULL, read_worker, &parts[t]);
  }
  double best = 0;
  printf("{\"runs\": [");
  for (int r = 0; r < repeats; ++r) {
    pthread_barrier_wait(&start);
    const double t0 = now();
    pthread_barrier_wait(&stop);
    const double gbps = (double)(chunk * (size_t)threads * sizeof(float)) / (now() - t0) / 1e9;
    if (gbps > best) best = gbps;
    printf("%s%.2f", r ? ", " : "", gbps);
  }
  double sink = 0;
  for (int t = 0; t < threads; ++t) {
    pthread_join(tids[t], NULL);
    sink += parts[t].sink;
  }
  printf("], \"gbps\": %.2f, \"bytes\": %zu, \"sink\": %.1f}\n", best,
         chunk * (size_t)threads * sizeof(float), sink);
  free(buf);
  return 0;
}

typedef struct {
  long iters;
  pthread_barrier_t* start;
  double seconds, sink;
} FmaPart;

static void* fma_worker(void* arg) {
  FmaPart* part = (FmaPart*)arg;
  __m256 a[8], x = _mm256_set1_ps(0.999999f), y = _mm256_set1_ps(1e-7f);
  for (int j = 0; j < 8; ++j) a[j] = _mm256_set1_ps((float)j);
  pthread_barrier_wait(part->start);
  const double t0 = now();
  for (long i = 0; i < part->iters; ++i)
    for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(a[j], x, y);
  part->seconds = now() - t0;
  float out[8];
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_add_ps(a[0], a[7]), a[3]));
  part->sink = out[0];
  return NULL;
}

static int run_fma(int threads, int repeats) {
  const long iters = 50L * 1000 * 1000;
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    FmaPart* parts = (FmaPart*)calloc((size_t)threads, sizeof(FmaPart));
    pthread_t* tids = (pthread_t*)calloc((size_t)threads, sizeof(pthread_t));
    for (int t = 0; t < threads; ++t) {
      parts[t] = (FmaPart){iters, &start, 0, 0};
      pthread_create(&tids[t], NULL, fma_worker, &parts[t]);
    }
    double slowest = 0;
    for (int t = 0; t < threads; ++t) {
      pthread_join(tids[t], NULL);
      if (parts[t].seconds > slowest) slowest = parts[t].seconds;
    }
    const double gflops = 2.0 * 8 * 8 * (double)iters * threads / slowest / 1e9;
    if (gflops > best) best = gflops;
    free(parts);
    free(tids);
  }
  printf("{\"gflops\": %.1f}\n", best);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && strcmp(argv[1], "read") == 0)
    return run_read(strtoull(argv[2], NULL, 10), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  if (argc == 4 && strcmp(argv[1], "fma") == 0) return run_fma(atoi(argv[2]), atoi(argv[3]));
  fprintf(stderr, "usage: roofline read BYTES THREADS REPEATS HUGE | fma THREADS REPEATS\n");
  return 2;
}
