// The batched step over a paged KV cache (qwen3_cuda.h forward_step, paged_attention.h): the
// tensor-core attention against ops::attention (the CPU reference, with its draft-tree KeyMask)
// over scattered block tables, chains and trees, odd head dims and contexts across the tile,
// chunk and split edges, rows that see no key; a row's bits independent of the rows and sequences
// beside it (what greedy speculation's exactness on the device rests on); whole steps against the
// CPU model; the pool's copy-on-write copies; a backend's pool sized by what it admits; and the
// engine serving a batch exactly as it serves each request alone. Every test skips without a
// usable GPU.
//
// Tolerances as in test_cuda_qwen3.cpp: 5e-4 NMSE for one bf16 rounding of an op's output (the
// attention also rounds its queries and P to bf16 for the tensor cores), 1e-3 for whole-model
// logits against the fp32 CPU model.
#include <flashmap/engine.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/check.h"
#include "core/thread_pool.h"
#include "cuda/backend.h"
#include "cuda/device.h"
#include "cuda/flashmap_cuda.h"
#include "cuda/paged_attention.h"
#include "cuda/proposers.h"
#include "cuda/qwen3_cuda.h"
#include "gpu_test.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "ops/ops.h"
#include "paged/block_pool.h"
#include "paged/step_plan.h"

namespace flashmap::cuda {
namespace {

using test::Gpu;
using test::nmse;
using test::randn;
using test::to_bf16;
using test::widen;

constexpr double kBF16 = 5e-4;
constexpr double kModel = 1e-3;

using CudaPaged = test::GpuTest;

// A random tree over `rows` rows (row 0 the anchor), as parents.
std::vector<int32_t> random_tree(int rows, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> p(size_t(rows), -1);
  for (int r = 1; r < rows; ++r) p[size_t(r)] = int32_t(g() % uint64_t(r));
  return p;
}

// One attention problem: sequences with random tables over a shared pool, every position of the
// pool holding random keys and values, each sequence's rows a chain or a tree.
struct Problem {
  int nh, nkv, hd, bt;
  std::vector<paged::StepSeq> seqs;
  std::vector<std::vector<int32_t>> tables, parents;
  std::vector<uint16_t> k, v;  // [slots, nkv·hd] bf16
  paged::StepPlan plan;
  std::vector<uint16_t> q;  // [bucket·R, nh, hd] bf16
};

Problem make_problem(int nh, int nkv, int hd, const std::vector<std::pair<int64_t, int>>& shape,
                     bool trees, int R, uint64_t seed) {
  Problem p{nh, nkv, hd, 16, {}, {}, {}, {}, {}, {}, {}};
  int32_t blocks = 0;
  for (const auto& [base, rows] : shape) blocks += int32_t((base + rows + p.bt - 1) / p.bt);
  blocks += 7;  // blocks no sequence holds
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937_64(seed));
  size_t next = 0;
  for (size_t i = 0; i < shape.size(); ++i) {
    const auto [base, rows] = shape[i];
    const int64_t n = (base + rows + p.bt - 1) / p.bt;
    p.tables.emplace_back(ids.begin() + int64_t(next), ids.begin() + int64_t(next + size_t(n)));
    next += size_t(n);
    p.parents.push_back(trees && rows > 2 && i % 2 == 1 ? random_tree(rows, seed + i)
                                                        : std::vector<int32_t>{});
  }
  for (size_t i = 0; i < shape.size(); ++i)
    p.seqs.push_back({p.tables[i], shape[i].first, shape[i].second, p.parents[i]});
  const int64_t slots = int64_t(blocks) * p.bt, kvd = int64_t(nkv) * hd;
  p.k = to_bf16(randn(size_t(slots * kvd), seed + 1));
  p.v = to_bf16(randn(size_t(slots * kvd), seed + 2));
  const std::vector<int32_t> buckets = paged::default_buckets(64);
  p.plan = paged::plan_step(p.seqs, R, p.bt, buckets);
  p.q = to_bf16(randn(size_t(p.plan.bucket) * size_t(R) * size_t(nh * hd), seed + 3, 1.5f));
  return p;
}

// ops::attention of each sequence over its keys in logical order, masked as the plan says.
std::vector<float> cpu_attention(const Problem& p) {
  const int R = p.plan.R;
  const int64_t kvd = int64_t(p.nkv) * p.hd, qd = int64_t(p.nh) * p.hd;
  std::vector<float> out(size_t(p.plan.bucket) * size_t(R) * size_t(qd), 0.0f);
  const auto kf = widen(p.k), vf = widen(p.v), qf = widen(p.q);
  for (size_t b = 0; b < p.seqs.size(); ++b) {
    const auto& s = p.seqs[b];
    const int64_t n = s.base + s.rows;
    std::vector<float> k(size_t(n * kvd)), v(size_t(n * kvd));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = int64_t(s.table[size_t(j / p.bt)]) * p.bt + j % p.bt;
      std::copy_n(kf.begin() + slot * kvd, kvd, k.begin() + j * kvd);
      std::copy_n(vf.begin() + slot * kvd, kvd, v.begin() + j * kvd);
    }
    const int64_t words = (s.rows + 63) / 64;
    std::vector<uint64_t> bits(size_t(s.rows * words), 0);
    for (int r = 0; r < s.rows; ++r)
      for (int j = 0; j < s.rows; ++j) {
        const uint32_t w =
            p.plan.row_mask[size_t((int64_t(b) * R + r) * p.plan.mask_words + j / 32)];
        if ((w >> (j % 32)) & 1u) bits[size_t(r * words + j / 64)] |= uint64_t(1) << (j % 64);
      }
    const ops::KeyMask mask{s.base, words, bits.data()};
    // A row without a cached prefix whose mask shows no row sees no key: a query without keys.
    std::vector<int64_t> counts(size_t(s.rows), n);
    for (int r = 0; r < s.rows; ++r)
      if (s.base == 0 && std::all_of(bits.begin() + r * words, bits.begin() + (r + 1) * words,
                                     [](uint64_t w) { return w == 0; }))
        counts[size_t(r)] = 0;
    ops::attention(qf.data() + int64_t(b) * R * qd, s.rows, p.nh, p.nkv, p.hd, k.data(), v.data(),
                   counts.data(), 1.0f / std::sqrt(float(p.hd)), out.data() + int64_t(b) * R * qd,
                   ThreadPool::global(), &mask);
  }
  return out;
}

struct Run {
  std::vector<float> out;  // [bucket·R, nh·hd] widened from bf16
};

Run device_attention(Context& ctx, const Problem& p) {
  const auto image = p.plan.image();
  DeviceBuffer<int32_t> d_image(ctx, image);
  DeviceBuffer<uint16_t> dq(ctx, p.q), dk(ctx, p.k), dv(ctx, p.v);
  const int R = p.plan.R;
  DeviceBuffer<float> partial(
      size_t(paged_attention_partial_floats(p.plan.bucket, R, p.nh, p.nkv, p.hd)));
  DeviceBuffer<uint16_t> out(size_t(p.plan.bucket) * size_t(R) * size_t(p.nh * p.hd));
  const StepView view = step_view(d_image.data(), p.plan.bucket, R, p.bt);
  paged_attention(dq.data(), view, p.nh, p.nkv, p.hd, dk.data(), dv.data(),
                  1.0f / std::sqrt(float(p.hd)), partial.data(), out.data(), ctx.stream());
  check(cudaGetLastError(), "paged_attention");
  ctx.sync();
  return {widen(out.download(ctx))};
}

// Head shapes of the fixtures and of Qwen3-8B; contexts below a tile, across tiles, chunks and
// more chunks than split slots (every slot then takes several); chains and trees.
TEST_F(CudaPaged, AttentionMatchesCpuAttention) {
  struct Heads {
    int nh, nkv, hd;
  };
  for (const Heads h :
       {Heads{4, 2, 24}, Heads{4, 4, 16}, Heads{8, 1, 16}, Heads{8, 4, 64}, Heads{32, 8, 128}})
    for (const bool trees : {false, true}) {
      const std::vector<std::pair<int64_t, int>> shape = {{0, 5},    {63, 17},   {300, 1},
                                                          {1000, 9}, {4100, 17}, {40, 12}};
      const Problem p = make_problem(h.nh, h.nkv, h.hd, shape, trees, 17, 7);
      const auto want = cpu_attention(p);
      const auto got = device_attention(*ctx, p);
      const double e = nmse(got.out, want);
      EXPECT_LE(e, kBF16) << "heads " << h.nh << "/" << h.nkv << " hd " << h.hd << " trees "
                          << trees;
      // Padding rows and sequences are zeros.
      const int64_t qd = int64_t(h.nh) * h.hd;
      for (int b = 0; b < p.plan.bucket; ++b)
        for (int r = b < int(shape.size()) ? shape[size_t(b)].second : 0; r < 17; ++r)
          for (int64_t d = 0; d < qd; ++d)
            ASSERT_EQ(got.out[size_t((int64_t(b) * 17 + r) * qd + d)], 0.0f)
                << "padding row " << r << " of sequence " << b;
    }
}

// A row that sees no key (no cached prefix, and a mask that hides even its own row) gets zeros, as
// ops::attention gives a query without keys, never NaN; the rows beside it match the CPU.
TEST_F(CudaPaged, AttentionRowThatSeesNoKeyIsZeros) {
  for (const auto& [nh, nkv, hd] : {std::tuple{4, 2, 24}, std::tuple{32, 8, 128}}) {
    Problem p = make_problem(nh, nkv, hd, {{0, 5}, {40, 12}, {0, 3}}, false, 17, 9);
    const int R = p.plan.R, words = p.plan.mask_words;
    const std::pair<int, int> blind[] = {{0, 0}, {0, 3}, {2, 2}};  // (sequence, row)
    for (const auto& [b, r] : blind)
      std::fill_n(p.plan.row_mask.begin() + (int64_t(b) * R + r) * words, words, 0u);
    const auto want = cpu_attention(p);
    const auto got = device_attention(*ctx, p).out;
    const int64_t qd = int64_t(nh) * hd;
    for (const float x : got) ASSERT_TRUE(std::isfinite(x)) << "heads " << nh << "/" << nkv;
    for (const auto& [b, r] : blind)
      for (int64_t d = 0; d < qd; ++d) {
        const size_t at = size_t((int64_t(b) * R + r) * qd + d);
        ASSERT_EQ(want[at], 0.0f) << "the CPU's row " << r << " of sequence " << b;
        ASSERT_EQ(got[at], 0.0f) << "row " << r << " of sequence " << b << " sees no key";
      }
    EXPECT_LE(nmse(got, want), kBF16) << "heads " << nh << "/" << nkv << " hd " << hd;
  }
}

// A long prefill-shaped step (one sequence, 300 rows × a GQA group of 4: three passes of 128
// query rows) against the CPU.
TEST_F(CudaPaged, AttentionOfManyRowsTakesSeveralPasses) {
  const Problem p = make_problem(8, 2, 64, {{700, 300}}, false, 300, 11);
  EXPECT_LE(nmse(device_attention(*ctx, p).out, cpu_attention(p)), kBF16);
}

// Row r of a 17-row verify block, the same row in a block of r + 1 rows beside other sequences,
// and a decode step of that row alone (its earlier block rows then cached keys): the same bits.
TEST_F(CudaPaged, AttentionRowsDoNotDependOnTheirBatch) {
  const int nh = 32, nkv = 8, hd = 128;
  const int64_t base = 1500;
  const Problem full = make_problem(nh, nkv, hd, {{base, 17}}, false, 17, 21);
  const auto all = device_attention(*ctx, full).out;
  const int64_t qd = int64_t(nh) * hd;
  for (int r : {0, 1, 7, 16}) {
    // In a batch: other sequences around it, R = 17, only r + 1 rows of its own.
    Problem mixed = full;
    mixed.seqs = {{full.tables[0], 5, 3, {}}, {full.tables[0], base, r + 1, {}}};
    mixed.plan = paged::plan_step(mixed.seqs, 17, full.bt, paged::default_buckets(8));
    mixed.q.assign(size_t(mixed.plan.bucket) * 17 * size_t(qd), 0);
    std::copy_n(full.q.begin(), (r + 1) * qd, mixed.q.begin() + 17 * qd);
    const auto got = device_attention(*ctx, mixed).out;
    EXPECT_EQ(0, std::memcmp(got.data() + (17 + r) * qd, all.data() + r * qd, size_t(qd) * 4))
        << "row " << r << " in a batch";
    // As a decode step: one row at position base + r.
    Problem dec = full;
    dec.seqs = {{full.tables[0], base + r, 1, {}}};
    dec.plan = paged::plan_step(dec.seqs, 1, full.bt, paged::default_buckets(8));
    dec.q.assign(size_t(dec.plan.bucket) * size_t(qd), 0);
    std::copy_n(full.q.begin() + r * qd, qd, dec.q.begin());
    const auto one = device_attention(*ctx, dec).out;
    EXPECT_EQ(0, std::memcmp(one.data(), all.data() + r * qd, size_t(qd) * 4))
        << "row " << r << " as a decode step";
  }
}

TEST_F(CudaPaged, BlockCopiesCopyTheirRowsInEveryPool) {
  const int pools = 6, bt = 16;
  const int64_t row = 40, blocks = 12, stride = blocks * bt * row;
  const auto host = to_bf16(randn(size_t(pools * stride), 3));
  DeviceBuffer<uint16_t> d(*ctx, host);
  const std::vector<int32_t> copies = {2, 9, 16, 5, 0, 3, 11, 4, 1};
  DeviceBuffer<int32_t> dc(*ctx, copies);
  copy_kv_blocks(d.data(), pools, stride, row, bt, dc.data(), 3, ctx->stream());
  auto want = host;
  for (int p = 0; p < pools; ++p)
    for (int c = 0; c < 3; ++c)
      std::copy_n(host.begin() + p * stride + copies[size_t(3 * c)] * bt * row,
                  copies[size_t(3 * c + 2)] * row,
                  want.begin() + p * stride + copies[size_t(3 * c + 1)] * bt * row);
  EXPECT_EQ(down(d), want);
}

// --- whole steps
// ----------------------------------------------------------------------------------

const std::vector<std::string> kTargets = {"tests/fixtures/tiny-a/target",
                                           "tests/fixtures/tiny-b/target",
                                           "tests/fixtures/tiny-c/target", "models/default/target"};

// A harness of the batched step: a pool, plans uploaded like the backend's, ids from the host.
struct Stepper {
  Context& ctx;
  Qwen3Model& dev;
  std::unique_ptr<PagedKV> kv;
  paged::BlockPool pool;
  std::vector<int32_t> buckets = paged::default_buckets(16);
  Stepper(Context& c, Qwen3Model& m) : ctx(c), dev(m), kv(m.new_paged(256, 16)), pool(256, 16) {}

  // One step: sequence i appends tokens[i] (all of them verify rows of R); returns the logits of
  // every row of the step [bucket·R, V].
  std::vector<float> step(const std::vector<int>& seqs,
                          const std::vector<std::vector<int32_t>>& tokens, int R, bool graph,
                          Qwen3Model::Logits logits = Qwen3Model::Logits::All) {
    std::vector<paged::StepSeq> ss;
    std::vector<paged::BlockCopy> copies;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int64_t base = pool.length(seqs[i]);
      pool.grow(seqs[i], base + int64_t(tokens[i].size()), copies);
    }
    for (size_t i = 0; i < seqs.size(); ++i)
      ss.push_back({pool.table(seqs[i]),
                    pool.length(seqs[i]) - int64_t(tokens[i].size()),
                    int(tokens[i].size()),
                    {}});
    const auto plan = paged::plan_step(ss, R, 16, buckets);
    const auto image = plan.image();
    std::vector<int32_t> ids(size_t(plan.bucket) * size_t(R), 0);
    for (size_t i = 0; i < seqs.size(); ++i)
      std::copy(tokens[i].begin(), tokens[i].end(), ids.begin() + int64_t(i) * R);
    check(cudaMemcpyAsync(dev.step_image(int64_t(image.size())), image.data(), image.size() * 4,
                          cudaMemcpyHostToDevice, ctx.stream()),
          "H2D image");
    check(cudaMemcpyAsync(dev.step_ids(int64_t(ids.size())), ids.data(), ids.size() * 4,
                          cudaMemcpyHostToDevice, ctx.stream()),
          "H2D ids");
    const auto out =
        dev.forward_step(*kv, plan.bucket, R, logits, {}, graph, int64_t(tokens[0].size()) - 1);
    ctx.sync();
    std::vector<float> h(size_t(out.logits_rows) * size_t(dev.config().vocab_size));
    check(cudaMemcpy(h.data(), out.logits, h.size() * 4, cudaMemcpyDeviceToHost), "D2H");
    return h;
  }
};

TEST_F(CudaPaged, StepMatchesTheCpuModel) {
  for (const auto& dir : kTargets) {
    SCOPED_TRACE(dir);
    ::flashmap::Qwen3Model cpu(dir);
    const int64_t V = cpu.config().vocab_size;
    Qwen3Model dev(*ctx, cpu, 1);
    Stepper st(*ctx, dev);
    std::mt19937_64 g(5);
    auto ids = [&](size_t n) {
      std::vector<int32_t> t(n);
      for (auto& x : t) x = int32_t(g() % uint64_t(V));
      return t;
    };
    // Two sequences: prefills of 70 and 33 tokens (eager, each alone), then two verify steps of
    // both together (R = 9, the second sequence 5 rows), the second through a graph.
    const std::vector<std::vector<int32_t>> prompts = {ids(70), ids(33)};
    std::vector<::flashmap::KVCache> caches;
    std::vector<int> seqs;
    for (const auto& pr : prompts) {
      seqs.push_back(st.pool.open(400));
      caches.push_back(cpu.new_cache());
      ::flashmap::Qwen3Model::SeqInput si{&caches.back(), pr};
      ::flashmap::Qwen3Model::Output ref;
      cpu.forward({&si, 1}, ::flashmap::Qwen3Model::Logits::Last, {}, ref);
      const auto got =
          st.step({seqs.back()}, {pr}, int(pr.size()), false, Qwen3Model::Logits::Last);
      EXPECT_LE(nmse(got, ref.logits), kModel) << "prefill of " << pr.size();
    }
    for (int pass = 0; pass < 2; ++pass) {
      const std::vector<std::vector<int32_t>> blocks = {ids(9), ids(5)};
      const auto got = st.step(seqs, blocks, 9, pass == 1);
      for (size_t i = 0; i < 2; ++i) {
        ::flashmap::Qwen3Model::SeqInput si{&caches[i], blocks[i]};
        ::flashmap::Qwen3Model::Output ref;
        cpu.forward({&si, 1}, ::flashmap::Qwen3Model::Logits::All, {}, ref);
        const std::vector<float> rows(
            got.begin() + int64_t(i) * 9 * V,
            got.begin() + (int64_t(i) * 9 + int64_t(blocks[i].size())) * V);
        EXPECT_LE(nmse(rows, ref.logits), kModel) << "verify pass " << pass << ", sequence " << i;
      }
    }
  }
}

// A sequence's verify rows alone (bucket 1) and beside 5 others (bucket 8), and the same tokens
// decoded one step at a time: bit-identical logits, eager and through graphs.
TEST_F(CudaPaged, StepRowsAreBatchInvariant) {
  ::flashmap::Qwen3Model cpu("models/default/target");
  const int64_t V = cpu.config().vocab_size;
  Qwen3Model dev(*ctx, cpu, 1);
  for (const bool graph : {false, true}) {
    Stepper st(*ctx, dev);
    std::mt19937_64 g(9);
    auto ids = [&](size_t n) {
      std::vector<int32_t> t(n);
      for (auto& x : t) x = int32_t(g() % uint64_t(V));
      return t;
    };
    const auto prompt = ids(40);
    std::vector<int> a;  // three copies of one sequence
    for (int i = 0; i < 3; ++i) {
      a.push_back(st.pool.open(200));
      st.step({a.back()}, {prompt}, int(prompt.size()), false, Qwen3Model::Logits::None);
    }
    std::vector<int> others;
    for (int i = 0; i < 5; ++i) {
      others.push_back(st.pool.open(200));
      const auto p = ids(size_t(10 + 7 * i));
      st.step({others.back()}, {p}, int(p.size()), false, Qwen3Model::Logits::None);
    }
    const auto block = ids(9);
    const auto alone = st.step({a[0]}, {block}, 9, graph);
    std::vector<int> batch = {others[0], others[1], a[1], others[2], others[3], others[4]};
    std::vector<std::vector<int32_t>> toks;
    for (int s : batch) toks.push_back(s == a[1] ? block : ids(9));
    const auto mixed = st.step(batch, toks, 9, graph);
    EXPECT_EQ(0, std::memcmp(alone.data(), mixed.data() + 2 * 9 * V, size_t(9 * V) * 4))
        << "alone vs in a batch (graph " << graph << ")";
    for (int r = 0; r < 9; ++r) {
      const auto one = st.step({a[2]}, {{block[size_t(r)]}}, 1, graph);
      EXPECT_EQ(0, std::memcmp(one.data(), alone.data() + r * V, size_t(V) * 4))
          << "row " << r << " as a decode step (graph " << graph << ")";
    }
  }
}

// --- the engine
// -----------------------------------------------------------------------------------

// A backend's KV pool holds what its sequences can be admitted to (max_sequences sequences of
// max_positions, the batched drafter's context beside the keys and values), not all the free
// memory: a fixture's backend takes a small part of the GPU, and starts fast (the engine tests make
// dozens). The time one takes is printed and recorded in the test's XML (backend_ms).
TEST_F(CudaPaged, BackendPoolIsSizedByWhatItAdmits) {
  const std::string dir = "tests/fixtures/tiny-b";
  ::flashmap::Qwen3Model cpu(dir + "/target");
  ::flashmap::FlashMapModel cpu_draft(dir + "/draft", cpu);
  Qwen3Model target(*ctx, cpu, 1);
  FlashMapModel draft(*ctx, cpu_draft, target.embedding(), target.lm_head(),
                      cpu.config().vocab_size, cpu.config().hidden_size);
  FlashMapDeviceProposer proposer(draft, 1);
  ASSERT_TRUE(proposer.paged());
  ctx->sync();
  const size_t before = ctx->free_bytes();
  const auto t0 = std::chrono::steady_clock::now();
  auto backend = make_backend(target, &proposer, 4096);
  ctx->sync();
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const size_t after = ctx->free_bytes();
  const size_t used = before > after ? before - after : 0;
  const auto& info = backend->info();
  const int64_t blocks = int64_t(info.max_sequences) * ((info.max_positions + 15) / 16);
  const int64_t pool = blocks * (target.paged_block_bytes(16) + proposer.paged_block_bytes(16));
  std::printf("  backend on %s: %.1f ms, %.1f MiB (pool at most %.1f MiB: %d sequences of %lld)\n",
              dir.c_str(), ms, double(used) / double(1 << 20), double(pool) / double(1 << 20),
              info.max_sequences, (long long)info.max_positions);
  RecordProperty("backend_ms", int(ms));
  RecordProperty("backend_mib", int(used >> 20));
  // The lanes' buffers, the step's and the batched draft's work come on top of the pool: well under
  // 1 GiB at this shape.
  EXPECT_LE(used, size_t(pool) + (size_t(1) << 30));
}

// The device backend serving 12 requests at once (one target forward and one batched draft per
// round for all of them) gives each the tokens it gets alone: greedy and seeded, with the trained
// drafter; greedy, those are the target's own tokens.
TEST_F(CudaPaged, BatchedServingEqualsEachRequestAlone) {
  auto run = [&](int max_running, bool sampled, bool draft = true) {
    EngineOptions o;
    o.target = "models/default/target";
    if (draft) o.draft = "models/default/draft";
    o.device = "cuda";
    o.max_running = max_running;
    o.max_context = 512;
    Engine engine(o);
    std::vector<std::shared_ptr<Request>> reqs;
    for (int i = 0; i < 12; ++i) {
      RequestParams r;
      r.prompt = {3, int32_t(141 + 7 * i), int32_t(59 + i), 265};
      r.max_tokens = 40 + 3 * i;
      if (sampled) {
        r.sampling.temperature = 1.0f;
        r.seed = uint64_t(100 + i);
        r.seeded = true;
      }
      reqs.push_back(engine.submit(r));
    }
    std::vector<std::vector<int32_t>> out;
    for (auto& r : reqs) {
      Request::Update u;
      size_t seen = 0;
      for (int t = 0; t < 600 && !(u = r->wait(seen, std::chrono::milliseconds(100))).finished; ++t)
        seen += u.tokens.size();
      EXPECT_TRUE(u.finished);
      out.push_back(r->tokens());
    }
    return out;
  };
  for (const bool sampled : {false, true}) {
    const auto together = run(12, sampled), alone = run(1, sampled);
    for (size_t i = 0; i < together.size(); ++i)
      EXPECT_EQ(together[i], alone[i]) << "request " << i << " sampled " << sampled;
    if (sampled) continue;
    const auto target = run(12, false, false);
    for (size_t i = 0; i < together.size(); ++i)
      EXPECT_EQ(together[i], target[i]) << "request " << i << ": speculative != target alone";
  }
}

}  // namespace
}  // namespace flashmap::cuda
