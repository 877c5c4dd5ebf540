// Decoding with a drafter context window stays lossless: greedy and seeded output equal the
// target alone's with a windowed FlashMap or DFlash drafter (blocks and trees, windows shorter
// and longer than the context); bad --draft-window values are one-line errors before any model
// loads.
#include <flashmap/engine.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "bench/generate.h"
#include "cpu/backend.h"
#include "cpu/proposers.h"
#include "error_of.h"
#include "models/dflash.h"
#include "models/flashmap.h"
#include "models/qwen3.h"
#include "spec_inputs.h"

using flashmap::testing::error_of;
using namespace flashmap;
using flashmap::testing::greedy;
using flashmap::testing::kRepeatingPrompts;
using flashmap::testing::kTinyA;
using ::testing::HasSubstr;

TEST(DraftWindow, GreedyAndSeededEqualTargetAloneForBlocksAndTrees) {
  Qwen3Model target(kTinyA + "/target");
  FlashMapModel model(kTinyA + "/draft", target);
  FlashMapProposer flashmap(model, 1);
  DFlashModel dmodel("tests/fixtures/dflash/zlab", target);
  DFlashProposer dflash(dmodel, target);
  for (int64_t w : {1, 4, 16, 1000}) {
    model.set_draft_window(w);
    dmodel.set_draft_window(w);
    for (const BlockProposer* d :
         {static_cast<const BlockProposer*>(&flashmap), static_cast<const BlockProposer*>(&dflash)})
      for (const auto& prompt : kRepeatingPrompts)
        for (const std::string tree : {"off", "paths:3"}) {
          const auto alone = generate(target, nullptr, prompt, greedy(60)).ids;
          const auto r = generate(target, d, prompt, greedy(60, tree));
          EXPECT_EQ(r.ids, alone) << "window " << w << " " << tree;
          GenerateOptions o = greedy(40);
          o.sampling = {0.8f, 0, 0.95f, 0.0f};
          o.seeded = true;
          o.seed = 5;
          const auto seeded_alone = generate(target, nullptr, prompt, o).ids;
          o.draft_tree = tree;
          EXPECT_EQ(generate(target, d, prompt, o).ids, seeded_alone)
              << "seeded, window " << w << " " << tree;
        }
  }
}

TEST(DraftWindow, EngineLoadsItWithEitherDrafter) {
  flashmap::testing::expect_engine_equals_target_alone_with_either_drafter({.draft_window = 4});
}

TEST(DraftWindow, BadOptionsGiveOneLineNamingTheOption) {
  EngineOptions o;
  o.target = "no-such-dir";  // never read: every check comes before the target loads
  o.draft = kTinyA + "/draft";
  // Each error is one line.
  auto err = [&] {
    const std::string e = error_of([&] { Engine eng(o); });
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
    return e;
  };
  o.draft_window = -1;
  EXPECT_THAT(err(), HasSubstr("--draft-window -1: must be in [1, 16777216] (0: off)"));
  o.draft_window = (1 << 24) + 1;
  EXPECT_THAT(err(), HasSubstr("--draft-window 16777217: must be in [1, 16777216]"));
  o.draft_window = 8;
  o.draft = "ngram";
  EXPECT_THAT(err(), HasSubstr("--draft-window needs a FlashMap or DFlash drafter"));
  o.draft.clear();
  EXPECT_THAT(err(), HasSubstr("--draft-window needs a FlashMap or DFlash drafter"));
  o.draft = kTinyA + "/draft";
  o.device = "cuda";
  EXPECT_THAT(err(), HasSubstr("--draft-window runs on the CPU backend only"));
}
