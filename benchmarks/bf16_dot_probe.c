// The probe behind benchmarks/RESULTS.md "session 28": the bf16 gemm micro-kernel's
// arithmetic rate with AVX512_BF16 against ninfer's widen + FMA, one core, a 64-column panel
// and k = 512 in L1/L2, 6 x 4 zmm accumulators:
//   widen+fma          w widened to f32 (zero-extend, shift), x broadcast, vfmadd231ps
//   paired dpbf16      w stored as (k, k+1) pairs per column, x pairs broadcast, vdpbf16ps
//   interleave dpbf16  the pairs made in registers from the panel layout [k][64 columns]
//   cc -O3 -funroll-all-loops -march=native bf16_dot_probe.c -o bf16_dot_probe  (AVX512_BF16 host)
// (at -O2, GCC keeps the accumulators in memory and the rates mean nothing)
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#define KK 512
#define MR 6
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static uint16_t W[KK*64] __attribute__((aligned(64)));   // [k][64 cols]
static uint16_t WP[KK*64] __attribute__((aligned(64)));  // [k/2][64 cols][2]
static float X[MR*KK]; static uint16_t XB[MR*KK];
static float OUT[MR*64];
static void __attribute__((noinline)) kA(void){ // widen + fma, 6 x 4
  __m512 acc[MR][4]; for(int r=0;r<MR;r++)for(int c=0;c<4;c++)acc[r][c]=_mm512_setzero_ps();
  for(int k=0;k<KK;k++){ __m512 w[4];
    for(int c=0;c<4;c++) w[c]=_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_load_si256((__m256i*)(W+k*64+c*16))),16));
    for(int r=0;r<MR;r++){ __m512 xb=_mm512_set1_ps(X[r*KK+k]); for(int c=0;c<4;c++) acc[r][c]=_mm512_fmadd_ps(xb,w[c],acc[r][c]);}}
  for(int r=0;r<MR;r++)for(int c=0;c<4;c++)_mm512_storeu_ps(OUT+r*64+c*16,acc[r][c]);}
static void __attribute__((noinline)) kB(void){ // paired layout + vdpbf16ps
  __m512 acc[MR][4]; for(int r=0;r<MR;r++)for(int c=0;c<4;c++)acc[r][c]=_mm512_setzero_ps();
  for(int k=0;k<KK;k+=2){ __m512bh w[4];
    for(int c=0;c<4;c++) w[c]=(__m512bh)_mm512_load_si512((__m512i*)(WP+k*64+c*32));
    for(int r=0;r<MR;r++){ __m512bh xb=(__m512bh)_mm512_set1_epi32(*(int32_t*)(XB+r*KK+k)); for(int c=0;c<4;c++) acc[r][c]=_mm512_dpbf16_ps(acc[r][c],xb,w[c]);}}
  for(int r=0;r<MR;r++)for(int c=0;c<4;c++)_mm512_storeu_ps(OUT+r*64+c*16,acc[r][c]);}
static void __attribute__((noinline)) kC(void){ // current layout, pairs made in registers
  __m512 acc[MR][4]; for(int r=0;r<MR;r++)for(int c=0;c<4;c++)acc[r][c]=_mm512_setzero_ps();
  for(int k=0;k<KK;k+=2){ __m512bh w[4];
    for(int c=0;c<4;c++){ __m512i a=_mm512_cvtepu16_epi32(_mm256_load_si256((__m256i*)(W+k*64+c*16)));
      __m512i b=_mm512_cvtepu16_epi32(_mm256_load_si256((__m256i*)(W+(k+1)*64+c*16)));
      w[c]=(__m512bh)_mm512_or_si512(a,_mm512_slli_epi32(b,16)); }
    for(int r=0;r<MR;r++){ __m512bh xb=(__m512bh)_mm512_set1_epi32(*(int32_t*)(XB+r*KK+k)); for(int c=0;c<4;c++) acc[r][c]=_mm512_dpbf16_ps(acc[r][c],xb,w[c]);}}
  for(int r=0;r<MR;r++)for(int c=0;c<4;c++)_mm512_storeu_ps(OUT+r*64+c*16,acc[r][c]);}
int main(){ for(int i=0;i<KK*64;i++){W[i]=0x3f80+(i%7);} for(int k=0;k<KK;k+=2)for(int c=0;c<64;c++){WP[k*64+c*2]=W[k*64+c];WP[k*64+c*2+1]=W[(k+1)*64+c];}
  for(int i=0;i<MR*KK;i++){X[i]=1.0f/(1+i%5); XB[i]=0x3f80;}
  void (*f[3])(void)={kA,kB,kC}; const char* nm[3]={"widen+fma","paired dpbf16","interleave dpbf16"};
  for(int rep=0;rep<3;rep++) for(int i=0;i<3;i++){ double best=1e9; for(int t=0;t<20;t++){double t0=now(); for(int j=0;j<200;j++) f[i](); double d=now()-t0; if(d<best)best=d;}
    printf("%-18s %.1f GFLOP/s\n",nm[i],2.0*MR*64*KK*200/best/1e9);} }
