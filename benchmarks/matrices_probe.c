// The probe behind benchmarks/RESULTS.md "session 28": does the fork-join of a decode step
// cost read bandwidth? Reads the q4g64 0.5B model's 169 matrices (bench_llamacpp's model:
// q, k, v, o, gate_up, down of 28 layers, scales included, then the lm_head; 252 MB in one
// huge-page mapping) with 2 threads, three ways, alternated round by round:
//   one range:  each thread reads its half of the whole buffer
//   barriers:   each thread reads its half of each matrix, a spin barrier after every one
//   no barrier: the same halves back to back
//   cc -O2 -march=native -pthread matrices_probe.c -o matrices_probe
//   ./matrices_probe PASSES ROUNDS   (prints GB/s per round; e.g. 8 6)
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
static size_t sizes[200]; static size_t offs[200]; static int NM; static size_t TOTAL;
static uint8_t* BUF; static atomic_int bar; static atomic_int go; static int MODE, PASSES;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static __m512i rd(const uint8_t* p, size_t n, __m512i acc){
  for(size_t i=0;i+256<=n;i+=256){
    acc=_mm512_xor_si512(acc,_mm512_load_si512(p+i));
    acc=_mm512_xor_si512(acc,_mm512_load_si512(p+i+64));
    acc=_mm512_xor_si512(acc,_mm512_load_si512(p+i+128));
    acc=_mm512_xor_si512(acc,_mm512_load_si512(p+i+192));}
  return acc;}
static volatile long sink;
static void barrier(int tid, int* phase){ (*phase)++; atomic_fetch_add(&bar,1); while(atomic_load(&bar) < 2*(*phase)) _mm_pause(); }
static double tt[2];
static void* worker(void* a){int tid=(int)(long)a; int phase=0; __m512i acc=_mm512_setzero_si512();
  for(int p=0;p<PASSES;p++){
  double t0=now();
  if(MODE==0){ size_t h=TOTAL/2/256*256; acc=rd(BUF+tid*h,h,acc);}
  else for(int m=0;m<NM;m++){ size_t h=sizes[m]/2/256*256; acc=rd(BUF+offs[m]+tid*h,h,acc); if(MODE==1) barrier(tid,&phase);} 
  tt[tid]+=now()-t0; }
  sink+=_mm512_reduce_add_epi64(acc); return 0;}
int main(int argc,char**argv){ MODE=0; PASSES=atoi(argv[1]);
  size_t layer[]={1114112,557056,557056,1114112,3342336,1671168};
  for(int l=0;l<28;l++) for(int j=0;j<6;j++) sizes[NM++]=layer[j]; sizes[NM++]=17825792;
  for(int m=0;m<NM;m++){offs[m]=TOTAL; TOTAL+=(sizes[m]+4095)/4096*4096;}
  BUF=mmap(0,TOTAL+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  BUF=(uint8_t*)(((uintptr_t)BUF+(2<<20)-1)&~(uintptr_t)((2<<20)-1)); madvise(BUF,TOTAL,MADV_HUGEPAGE);
  for(size_t i=0;i<TOTAL;i++) BUF[i]=i*7;
  double res[3][64]; int rounds=atoi(argv[2]);
  for(int r=0;r<rounds;r++) for(MODE=0;MODE<3;MODE++){ bar=0; tt[0]=tt[1]=0; pthread_t th[2];
    double t0=now(); for(long i=0;i<2;i++) pthread_create(&th[i],0,worker,(void*)i); for(int i=0;i<2;i++) pthread_join(th[i],0);
    double t=now()-t0; res[MODE][r]=TOTAL*(double)PASSES/t/1e9; }
  const char* nm[]={"one range","barriers","no barrier"};
  for(int m=0;m<3;m++){printf("%-11s",nm[m]); for(int r=0;r<rounds;r++) printf(" %5.1f",res[m][r]); printf("\n");}
  printf("total %.0f MB, %d matrices\n",TOTAL/1e6,NM); }
