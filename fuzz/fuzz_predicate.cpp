// Fuzz target: the failure predicate of `rewind bisect --fail` (bisect::Predicate). A predicate
// that parses must keep its normalized text through a second parse, and evaluate on a window
// (steps 40..43 with NaN, infinities and zeros) without anything but a one-line error.
#include <cmath>
#include <limits>

#include "bisect/predicate.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = rwd::fuzz::as_text(data, size);
  rwd::fuzz::expect_clean([&] {
    const rwd::bisect::Predicate p = rwd::bisect::Predicate::parse(text);
    const std::string norm = p.text();
    const rwd::bisect::Predicate again = rwd::bisect::Predicate::parse(norm);
    rwd::fuzz::require(again.text() == norm, "parse(text()).text() != text()", text);
    rwd::fuzz::require(again.series_used() == p.series_used(), "series differ after round trip", text);
    const double inf = std::numeric_limits<double>::infinity();
    rwd::bisect::Series s;
    s.first_step = 40;
    s.values["loss"] = {2.5, 0.0, std::nan(""), 7.0};
    s.values["grad_norm"] = {1.0, inf, -inf, 0.5};
    s.values["lr"] = {1e-3, 1e-3, 1e-3, 1e-3};
    for (const std::string& key : p.series_used()) {
      if (!s.values.count(key)) s.values[key] = {0.0, -1.0, 3.0, 1e308};
    }
    p.validate(p.series_used());
    const bool first = p.eval(s);
    rwd::fuzz::require(first == again.eval(s), "normalized predicate evaluates differently", text);
  });
  return 0;
}
