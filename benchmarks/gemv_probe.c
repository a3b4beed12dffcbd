// The probe behind benchmarks/RESULTS.md "session 9": how an f16 GEMV over ~1 GB of
// weights compares with a plain read. cc -O2 -march=native -pthread gemv_probe.c -o gemv_probe
// ./gemv_probe MODE K N HUGE THREADS ROUNDS
//   MODE 0: plain read (sum of bytes as 32-byte loads), contiguous halves per thread
//   MODE 1: ninfer's pattern: 4-row tiles row-major, 4 rows streamed at once, prefetch
//           the tile 2 ahead every 2 k-vectors
//   MODE 2: the same without software prefetch
//   MODE 3: packed 4-row tiles (each k-vector's 4 rows adjacent): one stream
//   MODE 4: packed + prefetch 1 KiB ahead
//   MODE 5: row-major, one row at a time with 4 accumulators along k (llama.cpp's order)
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

static int MODE, K, N, T, COPIES;
static uint16_t* W;  // COPIES x N x K halves
static float* X;
static float* OUT;
static atomic_int gen, done;
static size_t MAT;  // halves per copy

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static inline float hsum(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_hadd_ps(a, a);
  a = _mm_hadd_ps(a, a);
  return _mm_cvtss_f32(a);
}

static void run_part(int copy, int t) {
  const uint16_t* w = W + (size_t)copy * MAT;
  int tiles = N / 4;
  int t0 = tiles * t / T, t1 = tiles * (t + 1) / T;
  if (MODE == 0) {
    const __m256i* p = (const __m256i*)(w + (size_t)t0 * 4 * K);
    const __m256i* e = (const __m256i*)(w + (size_t)t1 * 4 * K);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (; p < e; p += 4) {
      a0 = _mm256_add_epi64(a0, _mm256_load_si256(p));
      a1 = _mm256_add_epi64(a1, _mm256_load_si256(p + 1));
      a2 = _mm256_add_epi64(a2, _mm256_load_si256(p + 2));
      a3 = _mm256_add_epi64(a3, _mm256_load_si256(p + 3));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    OUT[t] = (float)_mm256_extract_epi64(a0, 0);
    return;
  }
  for (int jb = t0; jb < t1; ++jb) {
    if (MODE == 1 || MODE == 2) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      const uint16_t* r = w + (size_t)jb * 4 * K;
      for (int kv = 0; kv < K / 8; ++kv) {
        if (MODE == 1 && kv % 2 == 0) {
          int pr = jb * 4 + 8;
          if (pr + 3 < N)
            for (int c = 0; c < 4; ++c) _mm_prefetch((const char*)(w + (size_t)(pr + c) * K + kv * 8), _MM_HINT_T0);
        }
        __m256 xv = _mm256_load_ps(X + kv * 8);
        for (int c = 0; c < 4; ++c) {
          __m256 wv = _mm256_cvtph_ps(_mm_load_si128((const __m128i*)(r + (size_t)c * K + kv * 8)));
          acc[c] = _mm256_fmadd_ps(wv, xv, acc[c]);
        }
      }
      for (int c = 0; c < 4; ++c) OUT[jb * 4 + c] = hsum(acc[c]);
    } else if (MODE == 3 || MODE == 4) {
      __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
      const uint16_t* r = w + (size_t)jb * 4 * K;  // [kv][c][8]
      for (int kv = 0; kv < K / 8; ++kv) {
        if (MODE == 4 && kv % 2 == 0) _mm_prefetch((const char*)(r + kv * 32 + 512), _MM_HINT_T0);
        __m256 xv = _mm256_load_ps(X + kv * 8);
        for (int c = 0; c < 4; ++c) {
          __m256 wv = _mm256_cvtph_ps(_mm_load_si128((const __m128i*)(r + kv * 32 + c * 8)));
          acc[c] = _mm256_fmadd_ps(wv, xv, acc[c]);
        }
      }
      for (int c = 0; c < 4; ++c) OUT[jb * 4 + c] = hsum(acc[c]);
    } else {
      for (int c = 0; c < 4; ++c) {
        const uint16_t* r = w + (size_t)(jb * 4 + c) * K;
        __m256 a[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                       _mm256_setzero_ps()};
        for (int kv = 0; kv < K / 8; kv += 4)
          for (int q = 0; q < 4; ++q)
            a[q] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i*)(r + (kv + q) * 8))),
                                   _mm256_load_ps(X + (kv + q) * 8), a[q]);
        OUT[jb * 4 + c] = hsum(_mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3])));
      }
    }
  }
}

static void* worker(void* arg) {
  int t = (int)(intptr_t)arg;
  int seen = 0;
  for (;;) {
    int g;
    while ((g = atomic_load(&gen)) == seen) _mm_pause();
    if (g < 0) return NULL;
    seen = g;
    run_part((g - 1) % COPIES, t);
    atomic_fetch_add(&done, 1);
  }
}

int main(int argc, char** argv) {
  MODE = atoi(argv[1]);
  K = atoi(argv[2]);
  N = atoi(argv[3]);
  int huge = atoi(argv[4]);
  T = atoi(argv[5]);
  int rounds = atoi(argv[6]);
  MAT = (size_t)N * K;
  COPIES = (int)((1ull << 30) / (MAT * 2));
  if (COPIES < 1) COPIES = 1;
  size_t bytes = MAT * 2 * COPIES;
  W = mmap(NULL, bytes + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  W = (uint16_t*)(((uintptr_t)W + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1));
  if (huge) madvise(W, bytes, MADV_HUGEPAGE);
  else madvise(W, bytes, MADV_NOHUGEPAGE);
  for (size_t i = 0; i < MAT * COPIES; ++i) W[i] = 0x3c00 ^ (uint16_t)(i & 0x3ff);
  X = aligned_alloc(64, K * 4);
  for (int i = 0; i < K; ++i) X[i] = 1.0f / (1 + i);
  OUT = aligned_alloc(64, N * 4 + 64);
  pthread_t th[16];
  for (int t = 1; t < T; ++t) pthread_create(&th[t], NULL, worker, (void*)(intptr_t)t);
  double best = 1e9;
  int calls = 0;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    for (int c = 0; c < COPIES; ++c) {
      atomic_store(&done, 0);
      atomic_fetch_add(&gen, 1);
      calls++;
      run_part((atomic_load(&gen) - 1) % COPIES, 0);
      while (atomic_load(&done) != T - 1) _mm_pause();
    }
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  printf("mode %d K %d N %d huge %d threads %d: %.1f GB/s (%d copies, %.1f us per call)\n", MODE,
         K, N, huge, T, bytes / best / 1e9, COPIES, best / COPIES * 1e6);
  atomic_store(&gen, -1);
  return 0;
}
