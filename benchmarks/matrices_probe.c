// What a decode step's fork-join structure costs a read, by where the VM put its two vCPUs
// (benchmarks/RESULTS.md, sessions 28 and 33). Reads the q4g64 0.5B model's 169 matrices
// (bench_llamacpp's model: q, k, v, o, gate_up, down of 28 layers, scales included, then
// the lm_head; 252 MB in one huge-page mapping) with two threads pinned to CPUs 0 and 1,
// every mode once a round, for SECONDS:
//   range:    each thread reads its half of the whole buffer (the read probe's pattern)
//   barrier:  each thread reads its half of each matrix, then writes its half of a 1024-float
//             output and meets the other at a spin barrier, then reads the whole output
//             (a gemv launch: its x in, its halves out, a join)
//   2/layer:  the same with a barrier only after o and after down (and the lm_head): the
//             two all-reduces a layer of a tensor-parallel split
//   none:     each thread's halves of every matrix back to back, no barrier
//   dynamic:  the barrier mode with each matrix taken in 64 KB chunks from a shared atomic
//             counter (balanced, one atomic a chunk)
//   prefetch: the barrier mode, a waiting thread prefetching its half of the next matrix
//             (PF_KB, 8 lines a spin)
// Each round is bracketed by cache-line round trips between the two threads (as
// placement_probe.c: ~70 ns SMT siblings, ~150-350 one CCD, ~500 two CCDs); rounds whose
// two round trips name the same placement are summed up per placement at the end: the
// median GB/s of each mode, and its median ratio to "range" of the same round.
//   cc -O2 -march=native -pthread matrices_probe.c -o matrices_probe
//   ./matrices_probe SECONDS [PF_KB]      (e.g. 120)
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

enum { kModes = 6, kMaxRounds = 20000, kOut = 1024, kChunk = 65536 };
static const char* kNames[kModes] = {"range", "barrier", "2/layer", "none", "dynamic", "prefetch"};
static size_t sizes[200], offs[200], total;
static int nm, mode;
static size_t pf_bytes = 65536;
static uint8_t* buf;
static _Alignas(64) float outv[2][kOut];
static _Alignas(64) atomic_long bar;
static _Alignas(64) atomic_long cmd;
static _Alignas(64) atomic_long done;
static _Alignas(64) atomic_long flag;
static _Alignas(64) atomic_long chunk[200];
static long phase[2];
static volatile long long sink;

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

static __m512i rd(const uint8_t* p, size_t n, __m512i acc) {
  for (size_t i = 0; i + 256 <= n; i += 256) {
    acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i));
    acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 64));
    acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 128));
    acc = _mm512_xor_si512(acc, _mm512_load_si512(p + i + 192));
  }
  return acc;
}

// A spin barrier of the two threads; `next`/`n`: what a waiting thread prefetches.
static void barrier(int tid, const uint8_t* next, size_t n) {
  phase[tid]++;
  atomic_fetch_add(&bar, 1);
  size_t off = 0;
  if (n > pf_bytes) n = pf_bytes;
  while (atomic_load(&bar) < 2 * phase[tid]) {
    if (next && off < n) {
      for (int q = 0; q < 8; q++) _mm_prefetch((const char*)next + off + 64 * q, _MM_HINT_T0);
      off += 512;
    } else {
      _mm_pause();
    }
  }
}

static __m512i put(int tid, __m512i acc) {
  for (int i = 0; i < kOut; i += 16) _mm512_store_ps(outv[tid] + i, _mm512_castsi512_ps(acc));
  return acc;
}

static __m512i take(__m512i acc) {
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < kOut; i += 16)
      acc = _mm512_xor_si512(acc, _mm512_castps_si512(_mm512_load_ps(outv[t] + i)));
  return acc;
}

static void pass(int tid) {
  __m512i acc = _mm512_setzero_si512();
  if (mode == 0) {
    size_t h = total / 2 / 256 * 256;
    acc = rd(buf + tid * h, h, acc);
  }
  for (int m = 0; mode > 0 && m < nm; m++) {
    size_t h = sizes[m] / 2 / 256 * 256;
    const uint8_t* mine = buf + offs[m] + tid * h;
    int j = m % 6;
    if (mode == 1 || mode == 5) {
      acc = put(tid, rd(mine, h, take(acc)));
      int n = (m + 1) % nm;
      size_t hn = sizes[n] / 2 / 256 * 256;
      barrier(tid, mode == 5 ? buf + offs[n] + tid * hn : NULL, hn);
    } else if (mode == 2) {
      acc = rd(mine, h, acc);
      if (j == 3 || j == 5 || m == nm - 1) {
        acc = put(tid, acc);
        barrier(tid, NULL, 0);
        acc = take(acc);
      }
    } else if (mode == 3) {
      acc = rd(mine, h, acc);
    } else {
      acc = take(acc);
      size_t whole = sizes[m] / 256 * 256;
      for (;;) {
        size_t c = (size_t)atomic_fetch_add(&chunk[m], 1) * kChunk;
        if (c >= whole) break;
        acc = rd(buf + offs[m] + c, whole - c < kChunk ? whole - c : kChunk, acc);
      }
      acc = put(tid, acc);
      barrier(tid, NULL, 0);
    }
  }
  sink += _mm512_reduce_add_epi64(acc);
}

enum { kTrips = 2000, kBatches = 9 };
static int pong;  // the worker's next command is a ping-pong, not a pass

static void* worker(void* arg) {
  (void)arg;
  pin(1);
  long seen = 0;
  for (;;) {
    long c;
    while ((c = atomic_load(&cmd)) == seen) _mm_pause();
    seen = c;
    if (pong) {
      for (long i = 0; i < (long)kTrips * kBatches; i++) {
        while (atomic_load_explicit(&flag, memory_order_acquire) != 2 * i + 1) _mm_pause();
        atomic_store_explicit(&flag, 2 * i + 2, memory_order_release);
      }
    } else {
      pass(1);
    }
    atomic_fetch_add(&done, 1);
  }
  return NULL;
}

static long ncmd;
static void run_both(void) {
  atomic_store(&cmd, ++ncmd);
  pass(0);
  while (atomic_load(&done) < ncmd) _mm_pause();
}

static int cmp(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double rtt_ns(void) {
  pong = 1;
  atomic_store(&flag, 0);
  atomic_store(&cmd, ++ncmd);
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
  while (atomic_load(&done) < ncmd) _mm_pause();
  pong = 0;
  qsort(v, kBatches, sizeof v[0], cmp);
  return v[kBatches / 2];
}

static int place(double rtt) { return rtt < 110 ? 0 : rtt < 350 ? 1 : 2; }

static double median(double* v, int n) {
  qsort(v, n, sizeof v[0], cmp);
  return n ? v[n / 2] : 0.0;
}

static double gbps[kMaxRounds][kModes];
static int where[kMaxRounds];

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: matrices_probe SECONDS [PF_KB]\n");
    return 2;
  }
  double seconds = atof(argv[1]);
  if (argc > 2) pf_bytes = (size_t)atol(argv[2]) << 10;
  size_t layer[] = {1114112, 557056, 557056, 1114112, 3342336, 1671168};
  for (int l = 0; l < 28; l++)
    for (int j = 0; j < 6; j++) sizes[nm++] = layer[j];
  sizes[nm++] = 17825792;
  for (int m = 0; m < nm; m++) {
    offs[m] = total;
    total += (sizes[m] + 4095) / 4096 * 4096;
  }
  buf = mmap(0, total + (2 << 20), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  buf = (uint8_t*)(((uintptr_t)buf + (2 << 20) - 1) & ~(uintptr_t)((2 << 20) - 1));
  madvise(buf, total, MADV_HUGEPAGE);
  for (size_t i = 0; i < total; i++) buf[i] = (uint8_t)(i * 7);
  pthread_t th;
  pthread_create(&th, NULL, worker, NULL);
  pin(0);
  int rounds = 0;
  double end = now() + seconds, before = rtt_ns();
  while (now() < end && rounds < kMaxRounds) {
    for (mode = 0; mode < kModes; mode++) {
      for (int m = 0; m < nm; m++) atomic_store(&chunk[m], 0);
      double t0 = now();
      run_both();
      gbps[rounds][mode] = total / (now() - t0) / 1e9;
    }
    double after = rtt_ns();
    where[rounds++] = place(before) == place(after) ? place(before) : -1;
    before = after;
  }
  const char* places[] = {"smt", "ccd", "far"};
  printf("%.0f MB, %d matrices, %d rounds; per placement: median GB/s (median ratio to range)\n",
         total / 1e6, nm, rounds);
  static double v[kMaxRounds];
  for (int p = 0; p < 3; p++) {
    int n = 0;
    for (int r = 0; r < rounds; r++) n += where[r] == p;
    if (!n) continue;
    printf("%s, %d rounds:", places[p], n);
    for (int m = 0; m < kModes; m++) {
      int k = 0;
      for (int r = 0; r < rounds; r++)
        if (where[r] == p) v[k++] = gbps[r][m];
      double g = median(v, k);
      k = 0;
      for (int r = 0; r < rounds; r++)
        if (where[r] == p) v[k++] = gbps[r][m] / gbps[r][0];
      printf("  %s %.1f (%.3f)", kNames[m], g, median(v, k));
    }
    printf("\n");
  }
  return 0;
}
