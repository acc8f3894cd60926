// Fuzz target: the precision plan language (plan::parse). The first byte picks the model size
// (1..8 layers, 1..8 heads); a plan that parses must round-trip through its canonical text.
#include "fuzz/fuzz_util.h"
#include "plan/plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const int n_layer = 1 + (data[0] & 7), n_head = 1 + ((data[0] >> 3) & 7);
  const std::string spec = rwd::fuzz::as_text(data + 1, size - 1);
  rwd::fuzz::expect_clean([&] {
    const rwd::plan::Plan p = rwd::plan::parse(spec, n_layer, n_head);
    const std::string canon = p.canonical();
    const rwd::plan::Plan again = rwd::plan::parse(canon, n_layer, n_head);
    rwd::fuzz::require(again.canonical() == canon, "parse(canonical()) != plan", spec);
    rwd::fuzz::require(again.hash() == p.hash(), "hash differs after round trip", spec);
    rwd::plan::apply(p, spec);  // the same text applied on top of itself
  });
  return 0;
}
