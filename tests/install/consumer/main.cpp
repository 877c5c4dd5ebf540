// consumer PAIR_DIR TEXT MAX_TOKENS: greedy speculative decoding of TEXT with the pair's target
// and drafter through the public API alone (every public header is included, so one that reached
// into the source tree would not compile against the installed package). Prints the prompt ids
// and the generated ids, one line each.
#include <flashmap/chat.h>
#include <flashmap/engine.h>
#include <flashmap/errors.h>
#include <flashmap/request.h>
#include <flashmap/stats.h>
#include <flashmap/text.h>
#include <flashmap/tokenizer.h>

#include <cstdlib>
#include <iostream>
#include <span>
#include <string>

namespace {

void print_ids(const char* name, std::span<const int32_t> ids) {
  std::cout << name;
  for (int32_t id : ids) std::cout << ' ' << id;
  std::cout << '\n';
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::cerr << "usage: consumer PAIR_DIR TEXT MAX_TOKENS\n";
    return 2;
  }
  const std::string pair = argv[1];
  try {
    const auto text = flashmap::TextCodec::from_dir(pair + "/target");
    flashmap::Engine engine({.target = pair + "/target",
                             .draft = pair + "/draft",
                             .sampled_vocab = int64_t(text.vocab_size()),
                             .spec_policy = flashmap::SpecPolicyKind::Always});
    flashmap::RequestParams params = engine.defaults().request();
    params.prompt = text.encode(argv[2]);
    params.max_tokens = std::atoi(argv[3]);
    const flashmap::GenerateResult r = engine.generate(params);
    print_ids("prompt", params.prompt);
    print_ids("ids", r.ids);
    std::cout << "finish " << r.finish_reason << "\nrounds " << r.rounds << '\n';
  } catch (const flashmap::Error& e) {
    std::cerr << "consumer: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
