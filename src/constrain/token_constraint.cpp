#include "constrain/token_constraint.h"

namespace flashmap::constrain {

namespace {
class MatcherConstraint : public TokenConstraint {
 public:
  explicit MatcherConstraint(Matcher m) : m_(std::move(m)) {}
  void fill_mask(std::span<uint32_t> mask) override { m_.fill_mask(mask); }
  bool can_end() const override { return m_.can_end(); }
  bool advance(int32_t token) override { return m_.advance(token); }
  size_t checkpoint() const override { return m_.checkpoint(); }
  void rollback(size_t checkpoint) override { m_.rollback(checkpoint); }

 private:
  Matcher m_;
};
}  // namespace

std::function<std::unique_ptr<TokenConstraint>()> constraint_factory(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab) {
  // Each sequence gets its own Matcher (n > 1 choices of one request included).
  return [grammar = std::move(grammar), vocab = std::move(vocab)] {
    return std::unique_ptr<TokenConstraint>(new MatcherConstraint(Matcher(grammar, vocab)));
  };
}

}  // namespace flashmap::constrain
