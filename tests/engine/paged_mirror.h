// The CPU reference backend with a paged device's bookkeeping beside it: every call the engine
// makes also runs through paged::Ledger over a BlockPool, as the CUDA backend runs it, and writes
// into a simulated device memory (the target's KV pool and the batched drafter's context pool,
// one tag per position: which sequence wrote it) exactly what the device's kernels would write:
// a prefill's positions in both pools, a draft's positions in the drafter's pool, a verify's rows
// in the KV pool, a commit's rows in the drafter's pool, and the pool's copies before each write.
// After every call each open sequence must read back, through its table, what it wrote or
// inherited at every position it holds, and the ledger's lengths must equal the CPU's. What does
// not hold is recorded in errors(); the outputs are the CPU reference's, so the engine's own
// checks still apply.
#pragma once

#include <algorithm>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "paged/block_pool.h"
#include "paged/ledger.h"

namespace flashmap::engine::test {

class PagedMirror : public cpu::CpuBackend {
 public:
  // extra: a block drafter's block (DFlash: block_size + 1), else 0; blocks of block_tokens
  // positions; lanes: the sequences it holds at once (BackendInfo::max_sequences); tree_margin:
  // positions each sequence may take beyond its own for a draft tree's rows (the device caps a
  // trie at the positions a sequence has left, the CPU's proposer does not).
  PagedMirror(const Qwen3Model& target, const BlockProposer* proposer, int extra,
              int32_t blocks = 4096, int32_t block_tokens = 16, int lanes = 64, int tree_margin = 0)
      : CpuBackend(target, proposer),
        tree_margin_(tree_margin),
        pool_(blocks, block_tokens),
        ledger_(pool_, extra),
        kv_mem_(size_t(blocks) * size_t(block_tokens), -1),
        ctx_mem_(kv_mem_.size(), -1) {
    info_.max_sequences = lanes;
    info_.caps.prompt_logprobs = false;  // as the device
  }

  std::vector<std::string> errors() const {
    std::lock_guard lk(mutex_);
    return errors_;
  }
  // Sequences opened as copies of another's prefix, and block copies run.
  int copies_opened() const { return copies_opened_; }
  int64_t block_copies() const { return block_copies_; }
  const paged::BlockPool& pool() const { return pool_; }

  Slot open(const Open& o) override {
    const bool drafting = o.drafting && info_.has_drafter();
    const int64_t cap = info_.max_positions;
    const int64_t most =
        (o.max_positions > 0 ? std::min(o.max_positions, cap) : cap) + tree_margin_;
    paged::SeqBlocks b;
    Track t;
    if (o.from) {
      const int from = o.from->index();
      if (!ledger_.open(b, most, drafting, &seqs_.at(from).blocks, o.length)) return {};
      const Track& f = seqs_.at(from);
      t.kv.assign(f.kv.begin(), f.kv.begin() + o.length);
      if (drafting) t.ctx.assign(f.ctx.begin(), f.ctx.begin() + o.length);
    } else if (!ledger_.open(b, most, drafting)) {
      throw Error("out of KV blocks: " + std::to_string(most) + " positions");
    }
    Slot s = CpuBackend::open(o);
    if (!s) {
      ledger_.close(b);
      return s;
    }
    if (o.from) ++copies_opened_;
    t.blocks = b;
    t.writer = ++writers_;
    seqs_[s.index()] = std::move(t);
    verify("open");
    return s;
  }

  void prefill(std::span<const Prefill> ps) override {
    for (const Prefill& p : ps) {
      Track& t = seqs_.at(p.seq);
      const int64_t at = t.blocks.length, n = int64_t(p.tokens.size());
      reserve(t, n);
      write(t, kv_mem_, t.kv, at, n);
      if (t.blocks.drafting) write(t, ctx_mem_, t.ctx, at, n);
      guard("prefill", [&] { ledger_.wrote(t.blocks, n, true); });
    }
    CpuBackend::prefill(ps);
    verify("prefill");
  }

  void propose(std::span<const SeqStep> steps) override {
    for (const SeqStep& st : steps) {
      Track& t = seqs_.at(st.seq);
      std::vector<paged::BlockCopy> copies;
      guard("propose", [&] { ledger_.reserve_draft(t.blocks, copies); });
      run(copies);
      // Past the committed positions: not read back until a commit writes them again.
      write(t, ctx_mem_, t.ctx, ledger_.draft_first(t.blocks), ledger_.draft_count());
      t.ctx.resize(size_t(t.blocks.committed));
    }
    CpuBackend::propose(steps);
    verify("propose");
  }

  void forward(std::span<const SeqStep> steps) override {
    std::vector<int64_t> before;
    for (const SeqStep& st : steps) before.push_back(lengths(st.seq).kv);
    CpuBackend::forward(steps);
    for (size_t i = 0; i < steps.size(); ++i) {
      Track& t = seqs_.at(steps[i].seq);
      const int64_t rows = lengths(steps[i].seq).kv - before[i], at = t.blocks.length;
      reserve(t, rows);
      write(t, kv_mem_, t.kv, at, rows);
      guard("forward", [&] { ledger_.wrote(t.blocks, rows, false); });
    }
    verify("forward");
  }

  void commit(std::span<const Commit> cs) override {
    for (const Commit& c : cs) {
      Track& t = seqs_.at(c.seq);
      const int64_t at = t.blocks.committed;
      guard("commit", [&] { ledger_.commit(t.blocks, c.length, c.drafted); });
      // A tree's kept path moves within the sequence's own blocks: its tags stay its own.
      t.kv.resize(size_t(t.blocks.length));
      if (t.blocks.drafting && c.drafted > 0) write(t, ctx_mem_, t.ctx, at, c.drafted);
    }
    CpuBackend::commit(cs);
    verify("commit");
  }

  Held held(int seq) const override {
    const Held h = CpuBackend::held(seq);
    const int64_t mine = ledger_.held(seqs_.at(seq).blocks);
    if (mine != h.positions)
      note("held: the ledger says " + std::to_string(mine) + " positions, the CPU " +
           std::to_string(h.positions));
    return {mine, h.bytes};
  }

  size_t admissible(std::span<const int64_t> positions) const override {
    return ledger_.admissible(positions, info_.max_positions,
                              int64_t(info_.max_sequences) - int64_t(seqs_.size()));
  }

  void settle(int seq) override {
    ledger_.settle(seqs_.at(seq).blocks);
    CpuBackend::settle(seq);
  }

 protected:
  void close(int seq) override {
    ledger_.close(seqs_.at(seq).blocks);
    seqs_.erase(seq);
    CpuBackend::close(seq);
    verify("close");
  }

 private:
  struct Track {
    paged::SeqBlocks blocks;
    int64_t writer = 0;
    std::vector<int64_t> kv, ctx;  // the tag each position it holds must read back
  };

  template <class F>
  void guard(const char* where, F&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      note(std::string(where) + ": " + e.what());
    }
  }
  void note(const std::string& what) const {
    std::lock_guard lk(mutex_);
    if (errors_.size() < 20) errors_.push_back(what);
  }
  int64_t slot(const Track& t, int64_t p) const {
    const auto table = pool_.table(t.blocks.kv);
    const int32_t bt = pool_.block_tokens();
    return int64_t(table[size_t(p / bt)]) * bt + p % bt;
  }
  void reserve(Track& t, int64_t n) {
    std::vector<paged::BlockCopy> copies;
    guard("reserve", [&] { ledger_.reserve(t.blocks, n, copies); });
    run(copies);
  }
  // BlockPool's copies, in both pools, as the device runs them before the write.
  void run(const std::vector<paged::BlockCopy>& copies) {
    const int32_t bt = pool_.block_tokens();
    for (const paged::BlockCopy& c : copies) {
      ++block_copies_;
      for (int32_t r = 0; r < c.tokens; ++r) {
        kv_mem_[size_t(c.dst) * bt + r] = kv_mem_[size_t(c.src) * bt + r];
        ctx_mem_[size_t(c.dst) * bt + r] = ctx_mem_[size_t(c.src) * bt + r];
      }
    }
  }
  // The sequence writes positions [at, at + n) of a pool; `expect` follows.
  void write(Track& t, std::vector<int64_t>& mem, std::vector<int64_t>& expect, int64_t at,
             int64_t n) {
    if (at + n > pool_.length(t.blocks.kv)) {
      note("a write of positions " + std::to_string(at) + ".." + std::to_string(at + n) +
           " past the " + std::to_string(pool_.length(t.blocks.kv)) + " reserved");
      return;
    }
    if (expect.size() < size_t(at + n)) expect.resize(size_t(at + n), -1);
    for (int64_t p = at; p < at + n; ++p) {
      mem[size_t(slot(t, p))] = t.writer;
      expect[size_t(p)] = t.writer;
    }
  }
  void verify(const char* after) {
    for (const auto& [seq, t] : seqs_) {
      const CpuBackend::Lengths cpu = lengths(seq);
      if (cpu.kv != t.blocks.length || (t.blocks.drafting && cpu.context != t.blocks.committed)) {
        note(std::string(after) + ": sequence " + std::to_string(seq) + " holds " +
             std::to_string(cpu.kv) + " KV and " + std::to_string(cpu.context) +
             " context positions on the CPU, the ledger " + std::to_string(t.blocks.length) +
             " and " + std::to_string(t.blocks.committed));
        continue;
      }
      if (pool_.length(t.blocks.kv) < t.blocks.length) note(std::string(after) + ": table short");
      for (int64_t p = 0; p < t.blocks.length; ++p)
        if (kv_mem_[size_t(slot(t, p))] != t.kv[size_t(p)]) {
          note(std::string(after) + ": sequence " + std::to_string(seq) + " reads another's KV" +
               " at position " + std::to_string(p));
          break;
        }
      for (int64_t p = 0; t.blocks.drafting && p < t.blocks.committed; ++p)
        if (ctx_mem_[size_t(slot(t, p))] != t.ctx[size_t(p)]) {
          note(std::string(after) + ": sequence " + std::to_string(seq) +
               " reads another's drafter context at position " + std::to_string(p));
          break;
        }
    }
    guard(after, [&] { pool_.check_invariants(); });
  }

  int tree_margin_;
  paged::BlockPool pool_;
  paged::Ledger ledger_;
  std::vector<int64_t> kv_mem_, ctx_mem_;
  std::map<int, Track> seqs_;
  int64_t writers_ = 0, block_copies_ = 0;
  int copies_opened_ = 0;
  mutable std::mutex mutex_;
  mutable std::vector<std::string> errors_;
};

}  // namespace flashmap::engine::test
