// Suggestions for a predicate that names an unknown series (used in predicate errors).
#pragma once

#include <string>
#include <vector>

namespace rwd::bisect {

// "did you mean 'loss'? available: grad_norm, loss, lr, L<i>.H<j>.{max_logit,wq_sn}".
std::string describe_keys(const std::string& name, const std::vector<std::string>& keys);

}  // namespace rwd::bisect
