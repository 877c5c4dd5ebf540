// The round loop's view of a grammar (flashmap/request.h: TokenConstraint): a Matcher per
// sequence, made by the factory that a request's LogitControls::constraint holds.
#pragma once

#include <flashmap/request.h>  // TokenConstraint

#include <functional>
#include <memory>

#include "constrain/constrain.h"

namespace flashmap::constrain {

std::function<std::unique_ptr<TokenConstraint>()> constraint_factory(
    std::shared_ptr<const Grammar> grammar, std::shared_ptr<const Vocabulary> vocab);

}  // namespace flashmap::constrain
