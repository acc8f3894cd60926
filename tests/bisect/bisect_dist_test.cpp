// Bisect of a run recorded on 2 data-parallel ranks (c10d Gloo over loopback). Each
// probe runs on 2 ranks: the probe of the recorded plan reproduces the recording bit for bit,
// and a planted fault is localized exactly as in the same run recorded and bisected on 1 rank.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "bisect_test_util.h"
#include "store/store.h"

namespace rwd::bisect::testing {
namespace {

// Calibrated strength (bisect_test_util.h); two micro-batches per step, one per rank on 2.
const std::string kRun = " --learning-rate 0.01 --gradient-accumulation-steps 2 --threads 1"
                         " --plan-from '20:L1.H3.pv=fault(strength=25600)'";
const std::string kBisect = " --window 20:39 --fail 'nan || max(loss) > 3' --quiet";

using Names = std::vector<std::string>;

uint32_t bits(double v) {
  const float f = static_cast<float>(v);  // the curves hold FP32 values widened exactly
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

class BisectDist : public TinyRunSuite {
 protected:
  static void SetUpTestSuite() {
    make_data("bisect_dist");
    two_ = dir_ + "/ranks2.db";
    Cmd c = rewind_cmd(train_args(data_, two_, 40, 10, "--nproc-per-node 2" + kRun));
    ASSERT_EQ(c.code, 0) << c.out;
  }

  static nlohmann::json bisect(const std::string& store, const std::string& name, const std::string& extra) {
    const std::string report = dir_ + "/" + name;
    Cmd c = rewind_cmd("bisect --store " + store + kBisect + extra + " --report " + report);
    EXPECT_EQ(c.code, 4) << name << ": " << c.out;
    return read_json(report + "/report.json");
  }

  inline static std::string two_;
};

TEST_F(BisectDist, TwoRanksLocalizeThePlantedFaultAsOneRankDoes) {
  // The faulted recording replays bitwise on its 2 ranks (the --plan-from switch included).
  Cmd v = rewind_cmd("replay --nproc-per-node 2 --store " + two_ + " --from 15 --to 25 --verify");
  EXPECT_EQ(v.code, 0) << v.out;

  // No --nproc-per-node: the recording's 2 ranks.
  const nlohmann::json r2 = bisect(two_, "report2", "");
  EXPECT_EQ(r2["ranks"], 2);
  EXPECT_EQ(r2["narrowing"]["status"], "localized");
  EXPECT_EQ(strings(r2["narrowing"]["failing_set"]), Names{"L1.H3.pv"});
  EXPECT_EQ(strings(r2["narrowing"]["fixing_set"]), Names{"L1.H3.pv"});

  // The baseline probe (the recorded plan, nothing promoted) has the recording's loss and
  // grad-norm bits at every step it ran (it stops at the first non-finite loss).
  const nlohmann::json* baseline = nullptr;
  for (const auto& p : r2["probes"])
    if (p["candidate"] == "fp32{}") baseline = &p;
  ASSERT_NE(baseline, nullptr);
  EXPECT_NE((*baseline)["device"].get<std::string>().find("2 ranks"), std::string::npos) << (*baseline)["device"];
  auto st = rwd::store::Store::open(two_, rwd::store::Mode::kReadOnly);
  auto probe = st.get_probe((*baseline)["key"].get<std::string>());
  ASSERT_TRUE(probe.has_value());
  const nlohmann::json m = nlohmann::json::parse(probe->metrics);
  const auto recorded = st.steps(1, 20, 39);
  ASSERT_GE(m["loss"].size(), 1u);
  ASSERT_LE(m["loss"].size(), recorded.size());
  for (size_t i = 0; i < m["loss"].size(); ++i) {
    const auto& rec = recorded[i];
    if (m["loss"][i].is_null()) {  // NaN/Inf: stored as null, recorded as the same non-finite
      EXPECT_FALSE(std::isfinite(rec.loss())) << "step " << rec.step;
      continue;
    }
    EXPECT_EQ(bits(m["loss"][i].get<double>()), rec.loss_bits) << "step " << rec.step;
    if (!m["grad_norm"][i].is_null())
      EXPECT_EQ(bits(m["grad_norm"][i].get<double>()), rec.grad_norm_bits) << "step " << rec.step;
  }

  // The same run recorded and bisected on 1 rank: the same culprit.
  const std::string one = dir_ + "/ranks1.db";
  Cmd c = rewind_cmd(train_args(data_, one, 40, 10, kRun));
  ASSERT_EQ(c.code, 0) << c.out;
  const nlohmann::json r1 = bisect(one, "report1", "");
  EXPECT_EQ(r1["ranks"], 1);
  EXPECT_EQ(r1["narrowing"]["status"], r2["narrowing"]["status"]);
  EXPECT_EQ(r1["narrowing"]["failing_set"], r2["narrowing"]["failing_set"]);
  EXPECT_EQ(r1["narrowing"]["fixing_set"], r2["narrowing"]["fixing_set"]);

  // An explicit --nproc-per-node 2 is the same job: every probe is a cache hit.
  const nlohmann::json again = bisect(two_, "again2", " --nproc-per-node 2");
  EXPECT_EQ(again["probes_run"], 0);
  EXPECT_EQ(again["narrowing"]["failing_set"], r2["narrowing"]["failing_set"]);
}

// Parallel probes of a 2-rank recording run on groups of 2 ranks (--jobs 2: two
// workers, each rank 0 serving and rank 1 following). Same answer as one group, and a probe
// both ran has the same verdict and the same loss bits.
TEST_F(BisectDist, TwoGroupsOfTwoRanksProbeAsOneGroupDoes) {
  const nlohmann::json one = bisect(two_, "one_group", "");
  const nlohmann::json groups = bisect(two_, "two_groups", " --jobs 2 --fresh");
  EXPECT_EQ(groups["ranks"], 2);
  EXPECT_EQ(groups["jobs"], 2);
  EXPECT_EQ(groups["narrowing"]["status"], "localized");
  EXPECT_EQ(groups["narrowing"]["failing_set"], one["narrowing"]["failing_set"]);
  EXPECT_EQ(groups["narrowing"]["fixing_set"], one["narrowing"]["fixing_set"]);
  std::map<std::string, nlohmann::json> by_key;
  for (const auto& p : one["probes"]) by_key[p["key"].get<std::string>()] = p;
  int shared = 0;
  for (const auto& p : groups["probes"]) {
    EXPECT_NE(p["device"].get<std::string>().find("2 ranks"), std::string::npos) << p["device"];
    EXPECT_FALSE(p["cached"].get<bool>());
    auto it = by_key.find(p["key"].get<std::string>());
    if (it == by_key.end()) continue;
    ++shared;
    EXPECT_EQ(p["verdict"], it->second["verdict"]) << p["key"];
    EXPECT_EQ(p["loss"], it->second["loss"]) << p["key"];
  }
  EXPECT_GE(shared, 3);
  Cmd z = rewind_cmd("bisect --store " + two_ + kBisect + " --nproc-per-node 0");
  EXPECT_EQ(z.code, 2) << z.out;
}

}  // namespace
}  // namespace rwd::bisect::testing
