// KvBlocks and Scheduler alone: the block allocator, then step plans checked against
// their invariants on hand-made and random workloads.
#include <algorithm>
#include <cstdio>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "engine/kv_blocks.h"
#include "engine/scheduler.h"
#include "harness.h"

namespace ninfer::fake {
namespace {

void test_kv_blocks() {
  KvBlocks kv(5, 4);  // blocks 1..4
  CHECK(kv.total() == 4 && kv.free() == 4 && kv.used() == 0);
  CHECK(kv.blocks_for(0) == 0 && kv.blocks_for(1) == 1 && kv.blocks_for(4) == 1 &&
        kv.blocks_for(5) == 2);
  std::vector<int32_t> a, b;
  CHECK(kv.grow(a, 5));
  CHECK(a.size() == 2 && a[0] == 1 && a[1] == 2 && kv.free() == 2);
  CHECK(kv.grow(a, 8) && a.size() == 2);  // still covered
  CHECK(!kv.grow(b, 13));                 // needs 4, 2 free: all or nothing
  CHECK(b.empty() && kv.free() == 2);
  CHECK(kv.grow(b, 8) && kv.free() == 0 && b[0] == 3 && b[1] == 4);
  kv.release(a);
  CHECK(a.empty() && kv.free() == 2 && kv.used() == 2);
  std::vector<int32_t> bogus = {3};
  kv.release(b);
  bool threw = false;
  try {
    kv.release(bogus);  // double free
  } catch (const std::logic_error&) {
    threw = true;
  }
  CHECK(threw);
  bool bad_pool = false;
  try {
    KvBlocks tiny(1, 4);
  } catch (const std::invalid_argument&) {
    bad_pool = true;
  }
  CHECK(bad_pool);

  // Placement: sequences that grow in step keep their blocks consecutive.
  KvBlocks pool(41, 4);  // blocks 1..40
  std::vector<int32_t> p, q, r;
  CHECK(pool.grow(p, 8) && p == std::vector<int32_t>({1, 2}));  // an empty pool: from 1
  // Behind p's last block: centred in what the 2 blocks leave of 3..40 (36 spare).
  CHECK(pool.grow(q, 8) && q == std::vector<int32_t>({21, 22}));
  for (int t = 12; t <= 40; t += 4) CHECK(pool.grow(p, t) && pool.grow(q, t));
  for (size_t i = 1; i < p.size(); ++i) CHECK(p[i] == p[i - 1] + 1 && q[i] == q[i - 1] + 1);
  CHECK(p.back() == 10 && q.back() == 30);
  // Two runs of 10 left (11..20, 31..40): the first; 9 spare, 5 of them left to p.
  CHECK(pool.grow(r, 1) && r[0] == 16);
  pool.release(q);  // 17..40 one run again
  CHECK(pool.grow(r, 8) && r[1] == 17 && pool.free() == 40 - 10 - 2);
  // 26 blocks: all of the largest run (18..40), then 3 of 11..15, 1 of its 2 spare first.
  std::vector<int32_t> big;
  CHECK(pool.grow(big, 26 * 4) && big.front() == 18 && big[22] == 40 && big[23] == 12 &&
        big[25] == 14 && pool.free() == 2);
  pool.release(p);
  pool.release(r);
  pool.release(big);
  std::vector<int32_t> all;
  CHECK(pool.grow(all, 40 * 4) && all.front() == 1 && all.back() == 40);  // runs merged

  std::vector<int32_t> tables(3 * 4, -1);
  std::vector<int32_t> s0 = {5, 6}, s2 = {7};
  fill_block_tables(tables.data(), 3, 4, {&s0, nullptr, &s2});
  const std::vector<int32_t> want = {5, 6, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0};
  CHECK(tables == want);
}

// Drives a Scheduler like the engine does, with "sampling" that appends a token after
// every logits row until the sequence has `total` tokens, and checks invariants each step.
struct SimSeq : Sequence {
  int total = 0;  // prompt + generated at the end
  int prompt = 0;
  int fed_to = 0;  // positions fed so far in this residency (checks order)
  bool done = false;
};

void check_plan(const Scheduler& sc, const StepPlan& plan) {
  const SchedulerConfig& cfg = sc.config();
  CHECK(plan.rows <= cfg.prefill_chunk);
  int rows = 0;
  std::set<const Sequence*> seen;
  bool prefill_seen = false;
  for (const Chunk& c : plan.chunks) {
    CHECK(seen.insert(c.seq).second);  // one chunk per sequence
    CHECK(c.count >= 1 && c.start == c.seq->num_computed);
    CHECK(c.start + c.count <= static_cast<int>(c.seq->tokens.size()));
    CHECK(c.logits == (c.start + c.count == static_cast<int>(c.seq->tokens.size())));
    CHECK(c.seq->slot >= 0 && c.seq->slot < cfg.max_concurrency);
    CHECK(static_cast<int>(c.seq->blocks.size()) * cfg.block_size >= c.start + c.count);
    const bool admitted =
        std::find(plan.admitted.begin(), plan.admitted.end(), c.seq) != plan.admitted.end();
    const bool decode = c.seq->pending() == 1 && !admitted;
    if (decode) CHECK(!prefill_seen);  // decode rows first
    else prefill_seen = true;
    // A prompt chunk that is not the prompt's last ends on the alignment.
    if (!decode && !c.logits) CHECK((c.start + c.count) % cfg.prefill_align == 0);
    rows += c.count;
  }
  CHECK(rows == plan.rows);
  // With a row per running request in the budget, no decode waits behind a prompt.
  if (cfg.prefill_chunk >= cfg.max_concurrency && plan.preempted.empty())
    for (const Sequence* s : sc.running())
      if (s->pending() == 1) CHECK(seen.count(s) == 1);
  // Running sequences own disjoint blocks, never block 0; the pool count is exact.
  std::set<int32_t> owned;
  int used = 0;
  std::set<int> slots;
  for (const Sequence* s : sc.running()) {
    CHECK(slots.insert(s->slot).second);
    for (int32_t b : s->blocks) {
      CHECK(b >= 1 && b < cfg.kv_blocks);
      CHECK(owned.insert(b).second);
    }
    used += static_cast<int>(s->blocks.size());
  }
  for (const Sequence* s : sc.waiting()) CHECK(s->blocks.empty() && s->slot == -1);
  CHECK(used == sc.kv().used());
  CHECK(static_cast<int>(sc.running().size()) <= cfg.max_concurrency);
}

// Runs sequences to completion; returns the number of steps.
int simulate(const SchedulerConfig& cfg, std::vector<SimSeq>& seqs, int max_steps = 100000,
             int prefill_limit = std::numeric_limits<int>::max()) {
  Scheduler sc(cfg);
  for (SimSeq& s : seqs) sc.add(&s);
  int steps = 0, live = static_cast<int>(seqs.size());
  std::vector<int32_t> tables(static_cast<size_t>(cfg.table_rows) * cfg.blocks_per_seq);
  while (live > 0) {
    CHECK(++steps < max_steps);
    StepPlan plan = sc.plan(prefill_limit);
    CHECK(plan.rows > 0);  // something always runs
    check_plan(sc, plan);
    sc.fill_block_tables(tables.data());
    for (Sequence* p : plan.preempted) static_cast<SimSeq&>(*p).fed_to = 0;  // KV gone
    for (const Chunk& c : plan.chunks) {
      SimSeq& s = static_cast<SimSeq&>(*c.seq);
      CHECK(c.start == s.fed_to);
      s.fed_to += c.count;
      const int32_t* row = tables.data() + static_cast<size_t>(s.slot) * cfg.blocks_per_seq;
      for (size_t i = 0; i < s.blocks.size(); ++i) CHECK(row[i] == s.blocks[i]);
    }
    sc.commit(plan);
    for (const Chunk& c : plan.chunks) {
      if (!c.logits) continue;
      SimSeq& s = static_cast<SimSeq&>(*c.seq);
      // The sampled token is the sequence's last (total - 1 tokens stored) or fed back.
      if (static_cast<int>(s.tokens.size()) + 1 >= s.total) s.done = true;
      else s.tokens.push_back(static_cast<int32_t>(s.tokens.size() % kVocab));
      if (s.done) {
        sc.remove(&s);
        --live;
      }
    }
  }
  CHECK(sc.kv().used() == 0 && sc.running().empty() && sc.waiting().empty());
  return steps;
}

std::vector<SimSeq> make_seqs(const std::vector<std::pair<int, int>>& prompt_total) {
  std::vector<SimSeq> seqs(prompt_total.size());
  for (size_t i = 0; i < seqs.size(); ++i) {
    seqs[i].prompt = prompt_total[i].first;
    seqs[i].total = prompt_total[i].second;
    for (int t = 0; t < seqs[i].prompt; ++t) seqs[i].tokens.push_back(t % kVocab);
  }
  return seqs;
}

}  // namespace

void test_scheduler() {
  test_kv_blocks();

  // A long prompt is chunked and never stalls the decode of a running request.
  {
    SchedulerConfig cfg{
        /*max_concurrency=*/2, /*table_rows=*/2, /*prefill_chunk=*/4,
        /*kv_blocks=*/65,      /*block_size=*/4, /*blocks_per_seq=*/16};
    Scheduler sc(cfg);
    auto seqs = make_seqs({{2, 40}, {20, 24}});
    sc.add(&seqs[0]);
    StepPlan p = sc.plan();  // admits A: its 2-token prompt
    CHECK(p.admitted.size() == 1 && p.rows == 2 && p.chunks[0].logits);
    sc.commit(p);
    seqs[0].tokens.push_back(1);  // sampled
    sc.add(&seqs[1]);
    int b_chunks = 0;
    for (int step = 0; step < 6; ++step) {
      p = sc.plan();
      check_plan(sc, p);
      CHECK(!p.chunks.empty() && p.chunks[0].seq == &seqs[0] && p.chunks[0].count == 1);
      for (const Chunk& c : p.chunks)
        if (c.seq == &seqs[1]) {
          ++b_chunks;
          CHECK(c.count <= 3);
        }
      sc.commit(p);
      seqs[0].tokens.push_back(2);
      if (seqs[1].pending() == 0) break;
    }
    CHECK(b_chunks == 6 && seqs[1].num_computed == 18);
  }

  // A prefill limit caps prompt rows only while something decodes (at least one row,
  // so the prompt still progresses); alone, a prompt takes the whole budget.
  {
    SchedulerConfig cfg{2,
                        2,
                        /*prefill_chunk=*/8,
                        /*kv_blocks=*/65,
                        /*block_size=*/4,
                        /*blocks_per_seq=*/16};
    Scheduler sc(cfg);
    auto seqs = make_seqs({{20, 40}, {30, 40}});
    sc.add(&seqs[0]);
    StepPlan p = sc.plan(/*prefill_limit=*/2);
    CHECK(p.rows == 8);  // nothing decodes yet: the limit does not apply
    sc.commit(p);
    for (int step = 0; step < 3; ++step) {  // finish A's prompt alone
      p = sc.plan(2);
      sc.commit(p);
    }
    CHECK(seqs[0].pending() == 0);
    seqs[0].tokens.push_back(1);
    sc.add(&seqs[1]);
    for (int limit : {3, 0, 1}) {
      p = sc.plan(limit);
      check_plan(sc, p);
      CHECK(p.chunks[0].seq == &seqs[0] && p.chunks[0].count == 1);
      CHECK(p.rows == 1 + std::max(1, limit));
      sc.commit(p);
      seqs[0].tokens.push_back(2);
    }
  }

  // Preemption: a pool far too small for everyone at once; all finish, none starve,
  // and the youngest is the one sent back.
  {
    SchedulerConfig cfg{4, 4, 8, /*kv_blocks=*/9, /*block_size=*/4, /*blocks_per_seq=*/8};
    auto seqs = make_seqs({{5, 30}, {9, 28}, {3, 31}, {12, 20}, {1, 25}, {7, 29}});
    simulate(cfg, seqs);
    int preempted = 0;
    for (auto& s : seqs) preempted += s.preemptions;
    CHECK(preempted > 0);
    CHECK(seqs[0].preemptions == 0);  // the oldest is never preempted
  }

  // Prefill alignment (a hybrid model's chunked recurrence): while two sequences decode
  // under a prefill limit of 2, the prompt still gets 8 rows a step, each chunk ending on
  // a multiple of 8, and its last chunk takes what is left; the next prompt is not
  // admitted into the 3 rows that step leaves (they reach no multiple of 8) but in the next.
  {
    SchedulerConfig cfg{4,
                        4,
                        /*prefill_chunk=*/12,
                        /*kv_blocks=*/65,
                        /*block_size=*/4,
                        /*blocks_per_seq=*/16};
    cfg.prefill_align = 8;
    Scheduler sc(cfg);
    auto seqs = make_seqs({{2, 40}, {2, 40}, {21, 30}, {19, 30}});
    sc.add(&seqs[0]);
    sc.add(&seqs[1]);
    StepPlan p = sc.plan();
    CHECK(p.rows == 4);
    sc.commit(p);
    for (int i : {0, 1}) seqs[i].tokens.push_back(1);
    sc.add(&seqs[2]);
    sc.add(&seqs[3]);
    std::vector<std::vector<int>> want = {{8}, {8}, {5}, {8}, {8}, {3}}, got;
    for (int step = 0; step < 6; ++step) {
      p = sc.plan(/*prefill_limit=*/2);
      check_plan(sc, p);
      CHECK(p.chunks[0].count == 1 && p.chunks[1].count == 1);  // the decode rows
      std::vector<int> prompt;
      for (size_t c = 2; c < p.chunks.size(); ++c) prompt.push_back(p.chunks[c].count);
      got.push_back(prompt);
      sc.commit(p);
      for (int i : {0, 1}) seqs[i].tokens.push_back(2);
    }
    CHECK(got == want);
    bool refused = false;
    try {
      SchedulerConfig bad = cfg;
      bad.prefill_align = 16;  // 12 - 3 decode rows cannot reach it
      Scheduler s2(bad);
    } catch (const std::logic_error&) {
      refused = true;
    }
    CHECK(refused);
  }

  // Random workloads over many configurations.
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 300; ++trial) {
    SchedulerConfig cfg;
    cfg.table_rows = 1 + rng() % 6;
    cfg.max_concurrency = 1 + rng() % cfg.table_rows;
    cfg.prefill_chunk = 1 + rng() % 12;
    cfg.block_size = 1 + rng() % 5;
    cfg.blocks_per_seq = 4 + rng() % 8;
    const int max_pos = cfg.blocks_per_seq * cfg.block_size;
    cfg.kv_blocks = 1 + cfg.blocks_per_seq + rng() % (cfg.blocks_per_seq * 3);
    std::vector<std::pair<int, int>> pt;
    const int n = 1 + rng() % 10;
    for (int i = 0; i < n; ++i) {
      const int total = 2 + rng() % (max_pos - 1);  // stored positions <= total - 1
      const int prompt = 1 + rng() % (total - 1);
      pt.push_back({prompt, total});
    }
    // every other trial aligned to a power of two the steps can reach, under a limit
    const int room = cfg.prefill_chunk - cfg.max_concurrency + 1;
    if (trial % 2 && room >= 2) {
      cfg.prefill_align = 2;
      while (cfg.prefill_align * 2 <= room && rng() % 2) cfg.prefill_align *= 2;
    }
    auto seqs = make_seqs(pt);
    simulate(cfg, seqs, 100000,
             trial % 4 == 3 ? 1 + static_cast<int>(rng() % 4) : std::numeric_limits<int>::max());
    for (auto& s : seqs) CHECK(static_cast<int>(s.tokens.size()) == s.total - 1 && s.done);
  }

  // reserve (the MTP chain's lookahead): grows a running sequence's blocks, is a no-op
  // when they are held, and never takes the blocks the waiting head needs.
  {
    SchedulerConfig cfg{2,
                        2,
                        /*prefill_chunk=*/8,
                        /*kv_blocks=*/7,
                        /*block_size=*/4,
                        /*blocks_per_seq=*/4};
    Scheduler sc(cfg);
    auto seqs = make_seqs({{6, 12}, {9, 12}});
    CHECK(!sc.reserve(&seqs[0], 8));  // not running
    sc.add(&seqs[0]);
    StepPlan p = sc.plan();
    sc.commit(p);
    seqs[0].tokens.push_back(1);
    CHECK(seqs[0].blocks.size() == 2 && sc.reserve(&seqs[0], 8) && seqs[0].blocks.size() == 2);
    CHECK(sc.reserve(&seqs[0], 9) && seqs[0].blocks.size() == 3 && sc.kv().free() == 3);
    CHECK(!sc.reserve(&seqs[0], 17));  // past the block table
    sc.add(&seqs[1]);  // waits for a slot: its 9-token prompt needs the 3 free blocks
    CHECK(!sc.reserve(&seqs[0], 13) && seqs[0].blocks.size() == 3);
    sc.remove(&seqs[1]);
    CHECK(sc.reserve(&seqs[0], 13) && seqs[0].blocks.size() == 4 && sc.kv().free() == 2);
  }
  std::puts("scheduler ok");
}

}  // namespace ninfer::fake
