// The probe behind benchmarks/RESULTS.md "session 12": q8 gemv designs and plain reads over
// ~1 GB of int8 matrices cycled (each call one matrix, each thread its contiguous share).
//   cc -O2 -march=native -pthread [-DNSC=1|2|4] qgemv_probe.c -o qgemv_probe
//   ./qgemv_probe MODE K N THREADS ROUNDS PF_BYTES STREAMS MB   (STREAMS must equal NSC)
//   MODE 0: plain read, 512-bit loads;  MODE 5: plain read, 256-bit loads, 8 accumulators
//   MODE 1: ninfer's 256-bit group dot (vpsignb + vpdpbusd), STREAMS rows N/STREAMS apart
//   MODE 2: 512-bit group dot, two groups per vpdpbusd: weights xor 0x80 as the unsigned
//           operand, a per-lane -128 * sum(xq) correction as the accumulator
// PF_BYTES > 0: software prefetch that far ahead along each stream. MB: megabytes of copies
// (1 with a small matrix: hot in cache). Prints GB/s of q plus 2-byte scales.
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
static int MODE, K, N, T, COPIES, PF, NS;
#ifndef NSC
#define NSC 4
#endif
static int8_t* Q;
static float* S;  // per copy: N*K int8, N*NG float scales (d, as float for simplicity)
static int8_t *XQ, *XA;
static int32_t* XC;
static float* XS;
static float* OUT;
static atomic_int gen, done;
static size_t MAT, SMAT;
static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}
static inline float hsum8(__m256 v) {
  __m128 a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  a = _mm_hadd_ps(a, a);
  a = _mm_hadd_ps(a, a);
  return _mm_cvtss_f32(a);
}
static void run_part(int copy, int t) {
  const int8_t* q = Q + (size_t)copy * MAT;
  const float* s = S + (size_t)copy * SMAT;
  int NG = K / 32;
  int nj = N / NS;
  int j0 = nj * t / T, j1 = nj * (t + 1) / T;
  if (MODE == 5) {
    const __m256 *p = (const __m256*)(q + (size_t)j0 * NS * K),
                 *e = (const __m256*)(q + (size_t)j1 * NS * K);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (; p < e; p += 8) {
      a0 = _mm256_add_ps(a0, p[0]);
      a1 = _mm256_add_ps(a1, p[1]);
      a2 = _mm256_add_ps(a2, p[2]);
      a3 = _mm256_add_ps(a3, p[3]);
      a4 = _mm256_add_ps(a4, p[4]);
      a5 = _mm256_add_ps(a5, p[5]);
      a6 = _mm256_add_ps(a6, p[6]);
      a7 = _mm256_add_ps(a7, p[7]);
    }
    OUT[t] = hsum8(_mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                                 _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))));
    return;
  }
  if (MODE == 0) {
    const __m512i *p = (const __m512i*)(q + (size_t)j0 * NS * K),
                  *e = (const __m512i*)(q + (size_t)j1 * NS * K);
    __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
    for (; p < e; p += 4) {
      if (PF) _mm_prefetch((const char*)p + PF, _MM_HINT_T0);
      a0 = _mm512_add_epi64(a0, _mm512_load_si512(p));
      a1 = _mm512_add_epi64(a1, _mm512_load_si512(p + 1));
      a2 = _mm512_add_epi64(a2, _mm512_load_si512(p + 2));
      a3 = _mm512_add_epi64(a3, _mm512_load_si512(p + 3));
    }
    OUT[t] = (float)_mm512_reduce_add_epi64(
        _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
    return;
  }
  for (int jb = j0; jb < j1; ++jb) {
    if (MODE == 1) {  // current: ymm, psignb, one group per step, NS streams nj apart
      __m256 acc[8];
      _Pragma("GCC unroll 8") for (int c = 0; c < NSC; ++c) acc[c] = _mm256_setzero_ps();
      for (int g = 0; g < NG; ++g) {
        __m256i xq = _mm256_load_si256((const __m256i*)(XQ + g * 32)),
                xa = _mm256_load_si256((const __m256i*)(XA + g * 32));
        _Pragma("GCC unroll 8") for (int c = 0; c < NSC; ++c) {
          size_t row = (size_t)(jb + c * nj);
          if (PF) _mm_prefetch((const char*)(q + row * K + g * 32 + PF), _MM_HINT_T0);
          __m256i w = _mm256_load_si256((const __m256i*)(q + row * K + g * 32));
          __m256i d = _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), xa, _mm256_sign_epi8(w, xq));
          acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(s[row * NG + g] * XS[g]),
                                   acc[c]);
        }
      }
      _Pragma("GCC unroll 8") for (int c = 0; c < NSC; ++c) OUT[jb + c * nj] = hsum8(acc[c]);
    } else if (MODE == 2) {  // zmm, weights xor 0x80, two groups per step, per-lane corrections
      __m512 acc[8];
      _Pragma("GCC unroll 8") for (int c = 0; c < NSC; ++c) acc[c] = _mm512_setzero_ps();
      const __m512i idx = _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0);
      const __m512i m80 = _mm512_set1_epi8((char)0x80);
      for (int g = 0; g < NG; g += 2) {
        __m512i xq = _mm512_load_si512((const __m512i*)(XQ + g * 32)),
                xc = _mm512_load_si512((const __m512i*)(XC + g * 8));
        _Pragma("GCC unroll 8") for (int c = 0; c < NSC; ++c) {
          size_t row = (size_t)(jb + c * nj);
          if (PF) _mm_prefetch((const char*)(q + row * K + g * 32 + PF), _MM_HINT_T0);
          __m512i w =
              _mm512_xor_si512(_mm512_load_si512((const __m512i*)(q + row * K + g * 32)), m80);
          __m512i d = _mm512_dpbusd_epi32(xc, w, xq);
          __m512 sc = _mm512_permutexvar_ps(
              idx, _mm512_castps256_ps512(_mm256_castpd_ps(
                       _mm256_castpd128_pd256(_mm_load_sd((const double*)(s + row * NG + g))))));
          acc[c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(sc, _mm512_set1_ps(0.01f)),
                                   acc[c]);
        }
      }
      _Pragma("GCC unroll 8") for (int c = 0; c < NSC; ++c) OUT[jb + c * nj] =
          _mm512_reduce_add_ps(acc[c]);
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
  T = atoi(argv[4]);
  int rounds = atoi(argv[5]);
  PF = atoi(argv[6]);
  NS = atoi(argv[7]);
  int NG = K / 32;
  MAT = (size_t)N * K;
  SMAT = (size_t)N * NG;
  size_t mb = atoi(argv[8]);
  COPIES = (int)((mb << 20) / MAT);
  if (COPIES < 1) COPIES = 1;
  Q = aligned_alloc(1 << 21, MAT * COPIES);
  S = aligned_alloc(64, SMAT * 4 * COPIES);
  for (size_t i = 0; i < MAT * COPIES; ++i) {
    int v = (int8_t)((i * 2654435761u) >> 24);
    Q[i] = v == -128 ? 0 : v;
  }
  for (size_t i = 0; i < SMAT * COPIES; ++i) S[i] = 1e-3f * (1 + (i & 7));
  XQ = aligned_alloc(64, K);
  XA = aligned_alloc(64, K);
  XC = aligned_alloc(64, K);
  XS = aligned_alloc(64, NG * 4);
  for (int i = 0; i < K; ++i) {
    XQ[i] = (int8_t)((i * 7) % 255 - 127);
    XA[i] = abs(XQ[i]);
  }
  for (int i = 0; i < K / 4; ++i) {
    int sm = 0;
    for (int u = 0; u < 4; ++u) sm += XQ[i * 4 + u];
    XC[i] = -128 * sm;
  }
  for (int g = 0; g < NG; ++g) XS[g] = 0.01f;
  OUT = aligned_alloc(64, N * 4 + 64);
  pthread_t th[16];
  for (int t = 1; t < T; ++t) pthread_create(&th[t], NULL, worker, (void*)(intptr_t)t);
  double best = 1e9;
  for (int r = 0; r < rounds; ++r) {
    double t0 = now();
    for (int c = 0; c < COPIES; ++c) {
      atomic_store(&done, 0);
      atomic_fetch_add(&gen, 1);
      run_part((atomic_load(&gen) - 1) % COPIES, 0);
      while (atomic_load(&done) != T - 1) _mm_pause();
    }
    double dt = now() - t0;
    if (dt < best) best = dt;
  }
  printf("mode %d K %d N %d T %d PF %d NS %d: %.1f GB/s (%d copies) out %g\n", MODE, K, N, T, PF,
         NS, (MAT + SMAT * 2) * COPIES / best / 1e9, COPIES, OUT[3]);
  atomic_store(&gen, -1);
  return 0;
}
