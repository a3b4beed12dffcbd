// The machine's roofline for the benchmarks (ninfer/bench/roofline.py compiles this with
// the host's native flags): how fast T threads can read memory, and how many fused
// multiply-adds they can issue per second.
//
//   roofline read BYTES THREADS REPEATS HUGE   -> {"gbps": best, "runs": [...], "patterns": {...}}
//   roofline fma THREADS REPEATS               -> {"gflops": best}
//   roofline dpbf16 REPEATS                    -> {"dp_gmacs": best, "fma_gmacs": best}
//
// read: one buffer of BYTES, each thread reading its own contiguous 1/T of it with 256-bit
// loads into eight independent accumulators (no compute on the critical path), as a
// decode GEMV reads a weight matrix, in several access patterns (READ_PATTERNS): "plain",
// one stream per thread and the hardware prefetchers alone; "sNpD", the thread's part
// cut into N streams read side by side, each with a software prefetch of every cache line
// D bytes ahead (as ninfer's GEMVs read: several weight rows at once, prefetched). On the
// VMs this project ran on, the best prefetched pattern read 10-30% faster than the plain
// one, and the best of them is what the machine gives a well-shaped read, so "gbps" is the
// best pass of any pattern; "patterns" holds each pattern's best. Passes cycle through the
// patterns (REPEATS passes of each), so a slow spell of a VM lands on all of them. The
// buffer is written first by the thread that later reads each part (first touch: its
// pages on that thread's node). HUGE=1 asks the kernel for transparent huge pages
// (madvise MADV_HUGEPAGE) before the first touch. Each pass starts on a barrier, and every
// thread clocks its own read: a pass lasts from the first thread's start to the last one's
// end. (Timing it from the main thread is wrong where the readers fill every core: the
// main thread, woken by the start barrier, waits for a core and starts its clock late, by
// up to 5 ms of a 50 ms pass on this project's 2-core VM, so the best pass read 10% fast.)
// fma: ten independent chains of FMAs per thread, 256-bit and (where the host has AVX-512F)
// 512-bit; "gflops" is the faster of the two: the machine's peak, which the kernels'
// 256-bit code may reach only half of on a core with 512-bit FMA units.
// dpbf16: one thread's multiply-adds a second through ten chains of 512-bit vdpbf16ps
// (AVX512_BF16: 32 bf16 products an instruction) and of 512-bit FMAs (16 float32 ones):
// whether rounding x to bf16 for vdpbf16ps pays on this CPU (roofline.host_dpbf16_pays).
// It does not everywhere: on this project's Intel VM the instruction took 4x an FMA's time
// (half the FMAs' multiply-adds), on its Zen 4 VM the bf16 gemm ran 1.6-1.9x as fast.
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
  const char* name;
  int streams;   // streams per thread, read side by side
  int prefetch;  // software prefetch distance in bytes along each stream (0: none)
} ReadPattern;

static const ReadPattern READ_PATTERNS[] = {
    {"plain", 1, 0}, {"s2p512", 2, 512}, {"s2p1024", 2, 1024}, {"s4p512", 4, 512}};
enum { N_PATTERNS = sizeof(READ_PATTERNS) / sizeof(READ_PATTERNS[0]) };

typedef struct {
  const float* base;
  size_t floats;  // this thread's part
  int repeats;
  pthread_barrier_t* start;
  pthread_barrier_t* stop;
  double sink;
  double* began;  // per pass: when this thread started reading, and when it finished
  double* ended;
} Part;

#define LINE_FLOATS 16  // floats per 64-byte cache line
#define ADD8(q)                                       \
  do {                                                \
    a0 = _mm256_add_ps(a0, _mm256_load_ps((q)));      \
    a1 = _mm256_add_ps(a1, _mm256_load_ps((q) + 8));  \
    a2 = _mm256_add_ps(a2, _mm256_load_ps((q) + 16)); \
    a3 = _mm256_add_ps(a3, _mm256_load_ps((q) + 24)); \
    a4 = _mm256_add_ps(a4, _mm256_load_ps((q) + 32)); \
    a5 = _mm256_add_ps(a5, _mm256_load_ps((q) + 40)); \
    a6 = _mm256_add_ps(a6, _mm256_load_ps((q) + 48)); \
    a7 = _mm256_add_ps(a7, _mm256_load_ps((q) + 56)); \
  } while (0)

// n floats from p, as `streams` equal streams read 64 floats (4 cache lines) at a time
// each, every line prefetched `prefetch` bytes ahead.
static double read_part(const float* p, size_t n, int streams, int prefetch) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  const size_t len = n / (size_t)streams / 64 * 64;
  const size_t ahead = (size_t)prefetch / sizeof(float);
  for (size_t i = 0; i + 64 <= len; i += 64) {
    for (int s = 0; s < streams; ++s) {
      const float* q = p + (size_t)s * len + i;
      if (prefetch && i + ahead < len)
        for (int l = 0; l < 4; ++l)
          _mm_prefetch((const char*)(q + ahead + l * LINE_FLOATS), _MM_HINT_T0);
      ADD8(q);
    }
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
  for (int r = 0; r < part->repeats * N_PATTERNS; ++r) {
    const ReadPattern* pat = &READ_PATTERNS[r % N_PATTERNS];
    pthread_barrier_wait(part->start);
    part->began[r] = now();
    part->sink += read_part(part->base, part->floats, pat->streams, pat->prefetch);
    part->ended[r] = now();
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
  const size_t floats = bytes / sizeof(float), chunk = floats / (size_t)threads / 256 * 256;
  for (int t = 0; t < threads; ++t) {
    parts[t] = (Part){buf + (size_t)t * chunk,
                      chunk,
                      repeats,
                      &start,
                      &stop,
                      0.0,
                      (double*)calloc((size_t)(repeats * N_PATTERNS), sizeof(double)),
                      (double*)calloc((size_t)(repeats * N_PATTERNS), sizeof(double))};
    pthread_create(&tids[t], NULL, read_worker, &parts[t]);
  }
  // a pass reads each stream's whole 64-float blocks: every pattern reads the same bytes
  const size_t read_bytes = chunk * (size_t)threads * sizeof(float);
  double best = 0, pattern_best[N_PATTERNS] = {0};
  printf("{\"runs\": [");
  for (int r = 0; r < repeats * N_PATTERNS; ++r) {
    pthread_barrier_wait(&start);
    pthread_barrier_wait(&stop);
    double first = parts[0].began[r], last = parts[0].ended[r];
    for (int t = 1; t < threads; ++t) {
      if (parts[t].began[r] < first) first = parts[t].began[r];
      if (parts[t].ended[r] > last) last = parts[t].ended[r];
    }
    const double gbps = (double)read_bytes / (last - first) / 1e9;
    if (gbps > best) best = gbps;
    if (gbps > pattern_best[r % N_PATTERNS]) pattern_best[r % N_PATTERNS] = gbps;
    printf("%s%.2f", r ? ", " : "", gbps);
  }
  printf("], \"patterns\": {");
  for (int i = 0; i < N_PATTERNS; ++i)
    printf("%s\"%s\": %.2f", i ? ", " : "", READ_PATTERNS[i].name, pattern_best[i]);
  printf("}");
  double sink = 0;
  for (int t = 0; t < threads; ++t) {
    pthread_join(tids[t], NULL);
    sink += parts[t].sink;
    free(parts[t].began);
    free(parts[t].ended);
  }
  free(parts);
  free(tids);
  printf(", \"gbps\": %.2f, \"bytes\": %zu, \"sink\": %.1f}\n", best, read_bytes, sink);
  free(buf);
  return 0;
}

typedef struct {
  long iters;
  int wide;  // 512-bit FMAs (AVX-512F builds), else 256-bit
  pthread_barrier_t* start;
  double seconds, sink;
} FmaPart;

// Ten independent accumulator chains in registers, as named variables: an array of
// vectors indexed in a loop is kept in memory by the compiler, and its store-to-load
// forwarding then sits on every chain (4x under the peak on this project's VM).
#define FMA10(T, FMA, SET1, ADD)                                                               \
  do {                                                                                         \
    T x = SET1(0.999999f), y = SET1(1e-7f), a0 = SET1(0.f), a1 = SET1(1.f), a2 = SET1(2.f),    \
      a3 = SET1(3.f), a4 = SET1(4.f), a5 = SET1(5.f), a6 = SET1(6.f), a7 = SET1(7.f),          \
      a8 = SET1(8.f), a9 = SET1(9.f);                                                          \
    pthread_barrier_wait(part->start);                                                         \
    const double t0 = now();                                                                   \
    for (long i = 0; i < part->iters; ++i) {                                                   \
      a0 = FMA(a0, x, y);                                                                      \
      a1 = FMA(a1, x, y);                                                                      \
      a2 = FMA(a2, x, y);                                                                      \
      a3 = FMA(a3, x, y);                                                                      \
      a4 = FMA(a4, x, y);                                                                      \
      a5 = FMA(a5, x, y);                                                                      \
      a6 = FMA(a6, x, y);                                                                      \
      a7 = FMA(a7, x, y);                                                                      \
      a8 = FMA(a8, x, y);                                                                      \
      a9 = FMA(a9, x, y);                                                                      \
    }                                                                                          \
    part->seconds = now() - t0;                                                                \
    T s = ADD(ADD(ADD(a0, a1), ADD(a2, a3)), ADD(ADD(a4, a5), ADD(ADD(a6, a7), ADD(a8, a9)))); \
    float out[16];                                                                             \
    memcpy(out, &s, sizeof(float));                                                            \
    part->sink = out[0];                                                                       \
  } while (0)

// FmaPart.wide for vdpbf16ps chains (dpbf16): FMA10's x and y rounded to bf16 pairs (the
// conversions are loop-invariant, out of the timed loop), 32 products an instruction.
enum { kDpbf16 = 2 };
#ifdef __AVX512BF16__
#define DPBF16(a, x, y) _mm512_dpbf16_ps(a, _mm512_cvtne2ps_pbh(x, x), _mm512_cvtne2ps_pbh(y, y))
#endif

static void* fma_worker(void* arg) {
  FmaPart* part = (FmaPart*)arg;
#ifdef __AVX512BF16__
  if (part->wide == kDpbf16) {
    FMA10(__m512, DPBF16, _mm512_set1_ps, _mm512_add_ps);
    return NULL;
  }
#endif
#ifdef __AVX512F__
  if (part->wide) {
    FMA10(__m512, _mm512_fmadd_ps, _mm512_set1_ps, _mm512_add_ps);
    return NULL;
  }
#endif
  FMA10(__m256, _mm256_fmadd_ps, _mm256_set1_ps, _mm256_add_ps);
  return NULL;
}

// GFLOP/s of `threads` threads at one vector width (wide 0: 256 bits, 1: 512) or by
// vdpbf16ps (wide = kDpbf16), best of `repeats`.
static double fma_rate(int threads, int repeats, int wide) {
  const long iters = 20L * 1000 * 1000;
  const int lanes = wide == kDpbf16 ? 32 : wide ? 16 : 8;  // multiply-adds an instruction
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    FmaPart* parts = (FmaPart*)calloc((size_t)threads, sizeof(FmaPart));
    pthread_t* tids = (pthread_t*)calloc((size_t)threads, sizeof(pthread_t));
    for (int t = 0; t < threads; ++t) {
      parts[t] = (FmaPart){iters, wide, &start, 0, 0};
      pthread_create(&tids[t], NULL, fma_worker, &parts[t]);
    }
    double slowest = 0;
    for (int t = 0; t < threads; ++t) {
      pthread_join(tids[t], NULL);
      if (parts[t].seconds > slowest) slowest = parts[t].seconds;
    }
    const double gflops = 2.0 * 10 * lanes * (double)iters * threads / slowest / 1e9;
    if (gflops > best) best = gflops;
    free(parts);
    free(tids);
  }
  return best;
}

static int run_fma(int threads, int repeats) {
  const double narrow = fma_rate(threads, repeats, 0);
#ifdef __AVX512F__
  const double wide = fma_rate(threads, repeats, 1);
#else
  const double wide = 0;
#endif
  printf("{\"gflops\": %.1f, \"gflops_256\": %.1f, \"gflops_512\": %.1f}\n",
         narrow > wide ? narrow : wide, narrow, wide);
  return 0;
}

static int run_dpbf16(int repeats) {
  double dp = 0, fma = 0;
#ifdef __AVX512BF16__
  for (int r = 0; r < repeats; ++r) {  // alternated, so a slow spell lands on both
    const double d = fma_rate(1, 1, kDpbf16) / 2, f = fma_rate(1, 1, 1) / 2;  // MACs: FLOPs / 2
    if (d > dp) dp = d;
    if (f > fma) fma = f;
  }
#else
  (void)repeats;
#endif
  printf("{\"dp_gmacs\": %.1f, \"fma_gmacs\": %.1f}\n", dp, fma);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && strcmp(argv[1], "read") == 0)
    return run_read(strtoull(argv[2], NULL, 10), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
  if (argc == 4 && strcmp(argv[1], "fma") == 0) return run_fma(atoi(argv[2]), atoi(argv[3]));
  if (argc == 3 && strcmp(argv[1], "dpbf16") == 0) return run_dpbf16(atoi(argv[2]));
  fprintf(stderr,
          "usage: roofline read BYTES THREADS REPEATS HUGE | fma THREADS REPEATS | dpbf16 "
          "REPEATS\n");
  return 2;
}
