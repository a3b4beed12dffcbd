// The probe behind benchmarks/RESULTS.md "session 33": two gemm micro-kernels each for q8g32
// and q4g64 (4 rows of x by 3 weight rows; q8: k = 1024, 16 x 192 outputs; q4: k = 2048,
// 16 x 96; from cache, one thread), same exact integer dots, same d * dx table. q8g32:
//   cur:         ninfer's qmatmul step (64 k, two groups): vpdpbusd from the lanes'
//                -128 * (sums of 4 x), a conversion, the groups' d * dx pair by an 8-byte
//                load and a vpermps, an FMA, per (row, column)
//   interleaved: each row's 16-group blocks (512 k) stored so that step j holds bytes
//                4j..4j+3 of every group (lane l = group l), x in the same order: 8
//                vpdpbusd chained from the groups' -128 * (their x sums), then one
//                conversion and one FMA with the 16 groups' d * dx (contiguous)
// q4g64 likewise (two vpdpbusd a step on the low and high nibbles, values q + 8, against x
// at the even and odd k; the nibbles' offset taken back per group: in `cur` added at the
// end of the row as ninfer's block corrections, in `interleaved` as the chains' start).
// Prints each one's worst error against a double reference and GFLOP/s over 5 rounds.
//   cc -O3 -march=native interleave_probe.c -o interleave_probe -lm
#define _GNU_SOURCE
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}
enum { K = 1024, N = 192, M = 16, G = 32, NG = K / G, MR = 4, NR = 3 };
static _Alignas(64) int8_t W[N][K], WI[N][K];  // natural and interleaved

static float DF[N][NG];
static _Alignas(64) int8_t XQ[M][K], XQI[M][K];
static _Alignas(64) float XS[M][NG];
static _Alignas(64) int32_t XC[M][K / 4];  // per-lane corrections: -128 * sum of 4 x
static _Alignas(64) int32_t XG[M][NG];     // per-group corrections: -128 * sum of 32 x
static _Alignas(64) float SG[M][N][NG];    // d * dx (precomputed, as ninfer's sg)
static float OUT[M][N], OUT2[M][N];
// interleave: within a block of 16 groups (512 k), position j*64 + l*4 + b <- k = 32 l + 4 j + b
static int perm(int p) {
  int blk = p / 512, r = p % 512, j = r / 64, l = (r % 64) / 4, b = r % 4;
  return blk * 512 + 32 * l + 4 * j + b;
}
static float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }
static void cur(
    void) {  // per step of 64 k (2 groups): dpbusd from lane corrections, cvt, pair scale, fma
  for (int j0 = 0; j0 < N; j0 += NR)
    for (int i0 = 0; i0 < M; i0 += MR) {
      __m512 acc[MR][NR];
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
      for (int s = 0; s < K / 64; s++) {
        __m512i w[NR];
        for (int c = 0; c < NR; c++)
          w[c] =
              _mm512_xor_si512(_mm512_load_si512(&W[j0 + c][s * 64]), _mm512_set1_epi8((char)0x80));
        for (int r = 0; r < MR; r++) {
          __m512i x = _mm512_load_si512(&XQ[i0 + r][s * 64]);
          __m512i cor = _mm512_load_si512(&XC[i0 + r][s * 16]);
          for (int c = 0; c < NR; c++) {
            __m512i d = _mm512_dpbusd_epi32(cor, w[c], x);
            __m128 pr = _mm_castpd_ps(_mm_load_sd((const double*)&SG[i0 + r][j0 + c][2 * s]));
            __m512 sc = _mm512_permutexvar_ps(
                _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                _mm512_castps128_ps512(pr));
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[r][c]);
          }
        }
      }
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) OUT[i0 + r][j0 + c] = hsum(acc[r][c]);
    }
}
static void il(void) {  // per block of 512 k (16 groups): 8 dpbusd chained from group corrections,
                        // cvt, fma with 16 scales
  for (int j0 = 0; j0 < N; j0 += NR)
    for (int i0 = 0; i0 < M; i0 += MR) {
      __m512 acc[MR][NR];
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
      for (int b = 0; b < K / 512; b++) {
        __m512i d[MR][NR];
        for (int r = 0; r < MR; r++) {
          __m512i cor = _mm512_load_si512(&XG[i0 + r][b * 16]);
          for (int c = 0; c < NR; c++) d[r][c] = cor;
        }
        for (int j = 0; j < 8; j++) {
          __m512i w[NR];
          for (int c = 0; c < NR; c++)
            w[c] = _mm512_xor_si512(_mm512_load_si512(&WI[j0 + c][b * 512 + j * 64]),
                                    _mm512_set1_epi8((char)0x80));
          for (int r = 0; r < MR; r++) {
            __m512i x = _mm512_load_si512(&XQI[i0 + r][b * 512 + j * 64]);
            for (int c = 0; c < NR; c++) d[r][c] = _mm512_dpbusd_epi32(d[r][c], w[c], x);
          }
        }
        for (int r = 0; r < MR; r++)
          for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][c]),
                                        _mm512_load_ps(&SG[i0 + r][j0 + c][b * 16]), acc[r][c]);
      }
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) OUT2[i0 + r][j0 + c] = hsum(acc[r][c]);
    }
}
static void q8_main(void) {
  srand(1);
  for (int n = 0; n < N; n++) {
    for (int k = 0; k < K; k++) W[n][k] = (int8_t)(rand() % 255 - 127);
    for (int g = 0; g < NG; g++) {
      DF[n][g] = 0.001f * (1 + rand() % 100);
    }
  }
  for (int n = 0; n < N; n++)
    for (int p = 0; p < K; p++) WI[n][p] = W[n][perm(p)];
  for (int m = 0; m < M; m++) {
    for (int k = 0; k < K; k++) XQ[m][k] = (int8_t)(rand() % 255 - 127);
    for (int g = 0; g < NG; g++) XS[m][g] = 0.01f * (1 + rand() % 50);
    for (int p = 0; p < K; p++) XQI[m][p] = XQ[m][perm(p)];
    for (int l = 0; l < K / 4; l++) {
      int s = 0;
      for (int b = 0; b < 4; b++) s += XQ[m][4 * l + b];
      XC[m][l] = -128 * s;
    }
    for (int g = 0; g < NG; g++) {
      int s = 0;
      for (int b = 0; b < 32; b++) s += XQ[m][32 * g + b];
      XG[m][g] = -128 * s;
    }
    for (int n = 0; n < N; n++)
      for (int g = 0; g < NG; g++) SG[m][n][g] = DF[n][g] * XS[m][g];
  }
  // reference
  double maxerr = 0, m1 = 0, m2 = 0;
  cur();
  il();
  for (int m = 0; m < M; m++)
    for (int n = 0; n < N; n++) {
      double ref = 0;
      for (int g = 0; g < NG; g++) {
        long dd = 0;
        for (int b = 0; b < 32; b++) dd += W[n][32 * g + b] * XQ[m][32 * g + b];
        ref += (double)dd * SG[m][n][g];
      }
      double e1 = fabs(OUT[m][n] - ref) / (fabs(ref) + 1),
             e2 = fabs(OUT2[m][n] - ref) / (fabs(ref) + 1);
      if (e1 > m1) m1 = e1;
      if (e2 > m2) m2 = e2;
    }
  printf("max rel err vs double: cur %.2e interleaved %.2e\n", m1, m2);
  (void)maxerr;
  for (int round = 0; round < 5; round++) {
    double t0 = now();
    for (int it = 0; it < 400; it++) cur();
    double t1 = now();
    for (int it = 0; it < 400; it++) il();
    double t2 = now();
    double fl = 2.0 * M * N * K * 400;
    printf("cur %.1f GFLOP/s   interleaved %.1f GFLOP/s\n", fl / (t1 - t0) / 1e9,
           fl / (t2 - t1) / 1e9);
  }
}

// q4g64: groups of 64 k (32 bytes, low nibble = even k); blocks of 16 groups (1024 k)
enum { K4 = 2048, KB4 = K4 / 2, N4 = 96, M4 = 16, G4 = 64, NG4 = K4 / G4 };
static _Alignas(64) uint8_t W4[N4][KB4],
    WI4[N4][KB4];  // byte p: lo nibble k=2p, hi k=2p+1 (values 0..15 = q+8)
static _Alignas(64) int8_t XE4[M4][KB4], XO4[M4][KB4], XEI4[M4][KB4],
    XOI4[M4][KB4];  // x at even / odd k by byte position
static _Alignas(64) float XS4[M4][NG4];
static float DF4[N4][NG4];
static _Alignas(64) int32_t XG4[M4][NG4];  // -8 * sum of group's x
static _Alignas(64) float SG4[M4][N4][NG4], COR4[M4][N4][NG4];
static float OUT4[M4][N4], OUT42[M4][N4];
// interleave bytes: block of 16 groups = 512 bytes; position j*64 + l*4 + b <- byte 32 l + 4 j + b
static int perm4(int p) {
  int blk = p / 512, r = p % 512, j = r / 64, l = (r % 64) / 4, b = r % 4;
  return blk * 512 + 32 * l + 4 * j + b;
}
static void cur4(void) {  // step = 64 bytes (2 groups): lo/hi split, 2 dpbusd from 0, cvt, pair
                          // scale, fma; corrections per block
  const __m512i m15 = _mm512_set1_epi8(15);
  for (int j0 = 0; j0 < N4; j0 += NR)
    for (int i0 = 0; i0 < M4; i0 += MR) {
      __m512 acc[MR][NR];
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
      for (int s = 0; s < KB4 / 64; s++) {
        __m512i lo[NR], hi[NR];
        for (int c = 0; c < NR; c++) {
          __m512i w = _mm512_load_si512(&W4[j0 + c][s * 64]);
          lo[c] = _mm512_and_si512(w, m15);
          hi[c] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m15);
        }
        for (int r = 0; r < MR; r++) {
          __m512i xe = _mm512_load_si512(&XE4[i0 + r][s * 64]),
                  xo = _mm512_load_si512(&XO4[i0 + r][s * 64]);
          for (int c = 0; c < NR; c++) {
            __m512i d = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[c], xe),
                                            hi[c], xo);
            __m128 pr = _mm_castpd_ps(_mm_load_sd((const double*)&SG4[i0 + r][j0 + c][2 * s]));
            __m512 sc = _mm512_permutexvar_ps(
                _mm512_set_epi32(1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0),
                _mm512_castps128_ps512(pr));
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), sc, acc[r][c]);
          }
        }
      }
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) {
          __m512 t = acc[r][c];
          for (int g = 0; g < NG4; g += 16)
            t = _mm512_add_ps(t, _mm512_load_ps(&COR4[i0 + r][j0 + c][g]));
          OUT4[i0 + r][j0 + c] = _mm512_reduce_add_ps(t);
        }
    }
}
static void il4(
    void) {  // block = 512 bytes (16 groups): 16 dpbusd chained from group corrections, cvt, fma
  const __m512i m15 = _mm512_set1_epi8(15);
  for (int j0 = 0; j0 < N4; j0 += NR)
    for (int i0 = 0; i0 < M4; i0 += MR) {
      __m512 acc[MR][NR];
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) acc[r][c] = _mm512_setzero_ps();
      for (int b = 0; b < KB4 / 512; b++) {
        __m512i d[MR][NR];
        for (int r = 0; r < MR; r++) {
          __m512i cor = _mm512_load_si512(&XG4[i0 + r][b * 16]);
          for (int c = 0; c < NR; c++) d[r][c] = cor;
        }
        for (int j = 0; j < 8; j++) {
          __m512i lo[NR], hi[NR];
          for (int c = 0; c < NR; c++) {
            __m512i w = _mm512_load_si512(&WI4[j0 + c][b * 512 + j * 64]);
            lo[c] = _mm512_and_si512(w, m15);
            hi[c] = _mm512_and_si512(_mm512_srli_epi16(w, 4), m15);
          }
          for (int r = 0; r < MR; r++) {
            __m512i xe = _mm512_load_si512(&XEI4[i0 + r][b * 512 + j * 64]),
                    xo = _mm512_load_si512(&XOI4[i0 + r][b * 512 + j * 64]);
            for (int c = 0; c < NR; c++)
              d[r][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(d[r][c], lo[c], xe), hi[c], xo);
          }
        }
        for (int r = 0; r < MR; r++)
          for (int c = 0; c < NR; c++)
            acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[r][c]),
                                        _mm512_load_ps(&SG4[i0 + r][j0 + c][b * 16]), acc[r][c]);
      }
      for (int r = 0; r < MR; r++)
        for (int c = 0; c < NR; c++) OUT42[i0 + r][j0 + c] = _mm512_reduce_add_ps(acc[r][c]);
    }
}
static void q4_main(void) {
  for (int n = 0; n < N4; n++) {
    for (int p = 0; p < KB4; p++) W4[n][p] = (uint8_t)(rand() % 256);
    for (int g = 0; g < NG4; g++) DF4[n][g] = 0.001f * (1 + rand() % 100);
  }
  for (int n = 0; n < N4; n++)
    for (int p = 0; p < KB4; p++) WI4[n][p] = W4[n][perm4(p)];
  for (int m = 0; m < M4; m++) {
    for (int p = 0; p < KB4; p++) {
      XE4[m][p] = (int8_t)(rand() % 255 - 127);
      XO4[m][p] = (int8_t)(rand() % 255 - 127);
    }
    for (int g = 0; g < NG4; g++) XS4[m][g] = 0.01f * (1 + rand() % 50);
    for (int p = 0; p < KB4; p++) {
      XEI4[m][p] = XE4[m][perm4(p)];
      XOI4[m][p] = XO4[m][perm4(p)];
    }
    for (int g = 0; g < NG4; g++) {
      int s = 0;
      for (int b = 0; b < 32; b++) s += XE4[m][32 * g + b] + XO4[m][32 * g + b];
      XG4[m][g] = -8 * s;
    }
    for (int n = 0; n < N4; n++)
      for (int g = 0; g < NG4; g++) {
        SG4[m][n][g] = DF4[n][g] * XS4[m][g];
        COR4[m][n][g] = SG4[m][n][g] * (float)XG4[m][g];
      }
  }
  double m1 = 0, m2 = 0;
  cur4();
  il4();
  for (int m = 0; m < M4; m++)
    for (int n = 0; n < N4; n++) {
      double ref = 0;
      for (int g = 0; g < NG4; g++) {
        long dd = 0;
        for (int b = 0; b < 32; b++) {
          int p = 32 * g + b;
          dd += ((W4[n][p] & 15) - 8) * XE4[m][p] + ((W4[n][p] >> 4) - 8) * XO4[m][p];
        }
        ref += (double)dd * SG4[m][n][g];
      }
      double e1 = fabs(OUT4[m][n] - ref) / (fabs(ref) + 1),
             e2 = fabs(OUT42[m][n] - ref) / (fabs(ref) + 1);
      if (e1 > m1) m1 = e1;
      if (e2 > m2) m2 = e2;
    }
  printf("max rel err vs double: cur %.2e interleaved %.2e\n", m1, m2);
  for (int round = 0; round < 5; round++) {
    double t0 = now();
    for (int it = 0; it < 400; it++) cur4();
    double t1 = now();
    for (int it = 0; it < 400; it++) il4();
    double t2 = now();
    double fl = 2.0 * M4 * N4 * K4 * 400;
    printf("cur %.1f GFLOP/s   interleaved %.1f GFLOP/s\n", fl / (t1 - t0) / 1e9,
           fl / (t2 - t1) / 1e9);
  }
}

int main(void) {
  srand(1);
  printf("q8g32\n");
  q8_main();
  printf("q4g64\n");
  q4_main();
  return 0;
}
