// End-to-end `rewind bisect` on tiny recorded runs with planted faults: exact localization,
// two culprits, not-a-precision-failure, kill-and-resume through the probe cache, --jobs 2
// against serial, and the time bisection (--find-window) cases.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "bisect_test_util.h"

extern char** environ;

namespace rwd::bisect::testing {
namespace {

// Calibrated (see bisect_test_util.h): faults switched on at the window start, lr 0.01.
const char* kFail = "'nan || max(loss) > 3'";
const char* kO = "fault(strength=4096)";       // o: O pushed 4096 BF16 ulps toward -inf
const char* kStrong = "fault(strength=25600)";  // pv / delta: c = 100

class BisectCli : public TinyRunSuite {
 protected:
  static void SetUpTestSuite() { make_data("bisect_cli"); }

  // Records a 40-step run (checkpoints every 20, lr 0.01) with `plan` switched on at step 20.
  std::string record(const std::string& name, const std::string& plan, const std::string& extra = "") {
    const std::string store = dir_ + "/" + name + ".db";
    const std::string from = plan.empty() ? "" : "--plan-from '20:" + plan + "' ";
    Cmd c = rewind_cmd(train_args(data_, store, 40, 20, from + (extra.empty() ? "--learning-rate 0.01" : extra)));
    EXPECT_EQ(c.code, 0) << c.out;
    return store;
  }

  nlohmann::json bisect(const std::string& store, const std::string& name, const std::string& extra,
                        int want_code) {
    const std::string report = dir_ + "/" + name;
    Cmd c = rewind_cmd("bisect --store " + store + " --window 20:39 --fail " + kFail + " --quiet --report " +
                       report + " " + extra);
    EXPECT_EQ(c.code, want_code) << c.out;
    return read_json(report + "/report.json");
  }

};

TEST_F(BisectCli, UnfaultedRunIsNotReproducible) {
  const std::string store = record("clean", "");
  nlohmann::json r = bisect(store, "clean_report", "", 0);
  EXPECT_EQ(r["narrowing"]["status"], "not-reproducible");
  EXPECT_EQ(r["probes_total"], 1);
}

// One planted fault, over several heads and ops, is found exactly. An `o` fault acts through
// the backward: delta = rowsum(dO * O) reads the faulted BF16 O, while delta=fp32 reads the
// unrounded O (kernels/attention_cpu.h). So its 1-minimal failing set is {o, delta} of the
// planted head, and promoting either fixes the run; pv and delta faults act alone.
TEST_F(BisectCli, PlantedFaultFoundExactly) {
  struct Case {
    std::string loc, fault;
    std::vector<std::string> failing;
  };
  // The last three: other layers, heads and ops than the first three. In layer 0
  // the o fault fails on its own (kept low with delta in FP32 it still fails, a probe shows),
  // so there the failing set is {o} alone.
  const std::vector<Case> cases = {{"L1.H2.o", kO, {"L1.H2.o", "L1.H2.delta"}},
                                   {"L1.H0.pv", kStrong, {"L1.H0.pv"}},
                                   {"L0.H1.delta", kStrong, {"L0.H1.delta"}},
                                   {"L0.H3.pv", kStrong, {"L0.H3.pv"}},
                                   {"L1.H1.delta", kStrong, {"L1.H1.delta"}},
                                   {"L0.H0.o", kO, {"L0.H0.o"}}};
  for (const auto& c : cases) {
    const std::string name = "one_" + c.loc;
    const std::string store = record(name, c.loc + "=" + c.fault);
    nlohmann::json r = bisect(store, name + "_report", "", 4);
    const auto& w = r["narrowing"];
    EXPECT_EQ(w["status"], "localized") << c.loc;
    EXPECT_EQ(strings(w["failing_set"]), c.failing) << c.loc;
    ASSERT_EQ(w["fixing_set"].size(), 1u) << c.loc;
    const std::string fix = w["fixing_set"][0];
    EXPECT_NE(std::find(c.failing.begin(), c.failing.end(), fix), c.failing.end()) << fix;
    EXPECT_LE(r["probes_total"].get<int>(), 30) << c.loc;
    EXPECT_LT(r["probes_total"].get<int>(), w["naive_sweep"].get<int>()) << c.loc;
    // Stochastic rounding is checked beside the stabilized softmax, in the planted head and in
    // every head. A pv fault biases P̄ before it is rounded, and SR keeps that bias: no fix.
    std::map<std::string, nlohmann::json> checks;
    for (const auto& f : w["fix_checks"]) checks[f["name"].get<std::string>()] = f;
    const std::string guilty = "stochastic rounding (pv=sr) in the guilty heads";
    ASSERT_TRUE(checks.count(guilty) && checks.count("stochastic rounding (pv=sr) in every head")) << w.dump();
    EXPECT_EQ(checks[guilty]["spec"], c.loc.substr(0, 4) + "{" + c.loc.substr(4, 1) + "}.pv=sr") << c.loc;
    EXPECT_GE(checks[guilty]["probe"].get<int>(), 0) << c.loc;
    if (c.loc.substr(6) == "pv") EXPECT_FALSE(checks[guilty]["fixes"].get<bool>()) << c.loc;
  }
}

// A learning rate far too high explodes in FP32 too: no narrowing, exit 0.
TEST_F(BisectCli, AllFp32FailureIsNotAPrecisionFailure) {
  const std::string store = record("hot", "", "--learning-rate 0.5 --warmup-iters 0");
  nlohmann::json r = bisect(store, "hot_report", "", 0);
  EXPECT_EQ(r["narrowing"]["status"], "not-a-precision-failure");
  EXPECT_EQ(r["probes_total"], 2);  // baseline and all-FP32 only
  EXPECT_EQ(r["narrowing"]["failing_set"].size(), 0u);
}

// SIGKILL a bisect midway; the rerun reuses every finished probe and reaches the same
// verdict; a third run costs no probes at all.
TEST_F(BisectCli, KilledBisectResumesFromTheCache) {
  const std::string store = record("kill", std::string("L1.H2.o=") + kO);
  const std::string args = std::string("bisect --store ") + store + " --window 20:39 --fail " + kFail + " --quiet";
  std::vector<std::string> argv_s = {"/bin/sh", "-c", std::string("exec ") + REWIND_BIN + " " + args + " >/dev/null 2>&1"};
  std::vector<char*> argv;
  for (auto& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  ASSERT_EQ(posix_spawn(&pid, "/bin/sh", nullptr, nullptr, argv.data(), environ), 0);
  // Wait until a few probes are in the cache, then kill -9.
  int cached = 0;
  for (int i = 0; i < 600 && cached < 5; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Cmd info = rewind_cmd("store info " + store);
    auto at = info.out.find("probes");
    if (at != std::string::npos) cached = std::atoi(info.out.c_str() + info.out.find_first_of("0123456789", at));
  }
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  ASSERT_TRUE(WIFSIGNALED(st)) << "bisect finished before it could be killed";
  ASSERT_GE(cached, 5);

  nlohmann::json resumed = bisect(store, "kill_resumed", "", 4);
  EXPECT_GE(resumed["probes_cached"].get<int>(), cached);
  EXPECT_EQ(resumed["probes_run"].get<int>() + resumed["probes_cached"].get<int>(),
            resumed["probes_total"].get<int>());
  EXPECT_EQ(strings(resumed["narrowing"]["failing_set"]), (std::vector<std::string>{"L1.H2.o", "L1.H2.delta"}));
  nlohmann::json again = bisect(store, "kill_again", "", 4);
  EXPECT_EQ(again["probes_run"], 0);
  EXPECT_EQ(again["verdict_text"].get<std::string>().substr(0, 200),
            resumed["verdict_text"].get<std::string>().substr(0, 200));
  EXPECT_EQ(again["narrowing"]["failing_set"], resumed["narrowing"]["failing_set"]);
  EXPECT_EQ(again["narrowing"]["fixing_set"], resumed["narrowing"]["fixing_set"]);
  Cmd log = rewind_cmd("bisect log --store " + store);
  EXPECT_EQ(log.code, 0);
  EXPECT_NE(log.out.find("localized"), std::string::npos) << log.out;
}

// Two faults in different layers that each fail alone: the failing set is one of them, the
// fixing set must cover both (the delta of L0.H1 and the o/delta pair of L1.H2). Worker
// processes (--jobs 2, --gpus recorded per probe) and the serial run agree.
TEST_F(BisectCli, TwoFaultsFoundAndParallelMatchesSerial) {
  const std::string store = record("two", std::string("L0.H1.delta=") + kStrong + ";L1.H2.o=" + kO);
  nlohmann::json serial = bisect(store, "two_serial", "", 4);
  const auto& w = serial["narrowing"];
  EXPECT_EQ(w["status"], "separate-fix");
  std::vector<std::string> fixing = strings(w["fixing_set"]);
  ASSERT_EQ(fixing.size(), 2u);
  EXPECT_EQ(fixing[0], "L0.H1.delta");
  EXPECT_TRUE(fixing[1] == "L1.H2.o" || fixing[1] == "L1.H2.delta") << fixing[1];
  ASSERT_GE(w["failing_set"].size(), 1u);

  nlohmann::json par = bisect(store, "two_jobs", "--fresh --jobs 2 --gpus 0,1", 4);
  EXPECT_EQ(serial["narrowing"]["status"], par["narrowing"]["status"]);
  EXPECT_EQ(serial["narrowing"]["failing_set"], par["narrowing"]["failing_set"]);
  EXPECT_EQ(serial["narrowing"]["fixing_set"], par["narrowing"]["fixing_set"]);
  EXPECT_GT(par["probes_run"].get<int>(), 0);
  std::set<std::string> devices;
  for (const auto& p : par["probes"]) devices.insert(p["device"].get<std::string>());
  EXPECT_TRUE(devices.count("cpu (CUDA_VISIBLE_DEVICES=0)") || devices.count("cpu (CUDA_VISIBLE_DEVICES=1)"));
  for (size_t i = 0; i < serial["narrowing"]["fix_checks"].size(); ++i)
    EXPECT_EQ(serial["narrowing"]["fix_checks"][i]["fixes"], par["narrowing"]["fix_checks"][i]["fixes"]);
}

// Over two workers a failing probe's early verdict ends its round (a race): the
// same culprit as the serial search, with the probes the race no longer needed cut short and
// marked so in the report.
TEST_F(BisectCli, RacedProbesOverTwoWorkersFindTheSerialCulprit) {
  const std::string store = record("race_pv", std::string("L1.H0.pv=") + kStrong);
  nlohmann::json serial = bisect(store, "race_serial", "", 4);
  nlohmann::json par = bisect(store, "race_jobs", "--fresh --jobs 2", 4);
  EXPECT_EQ(strings(par["narrowing"]["failing_set"]), std::vector<std::string>{"L1.H0.pv"});
  EXPECT_EQ(serial["narrowing"]["failing_set"], par["narrowing"]["failing_set"]);
  EXPECT_EQ(serial["narrowing"]["fixing_set"], par["narrowing"]["fixing_set"]);
  const int cut = par["probe_count"]["cut_short"].get<int>() + par["probe_count"]["not_started"].get<int>();
  EXPECT_GT(cut, 0) << par["probe_count"]["text"];
  int marked = 0;
  for (const auto& p : par["probes"]) marked += p["verdict"] == "cut short";
  EXPECT_EQ(marked, cut);
}

// --reference names the healthy end of the search: with the fault's removal as the reference
// the space is that one op kind, and failing probes stop at the step where the predicate
// (monotone: `nan || max(loss) > 3`) first holds.
TEST_F(BisectCli, ReferencePlanNarrowsItsSpaceAndFailingProbesStopEarly) {
  const std::string store = record("ref_pv", std::string("L1.H0.pv=") + kStrong);
  nlohmann::json r = bisect(store, "ref_pv_report", "--reference 'L1.H0.pv=low'", 4);
  const auto& w = r["narrowing"];
  EXPECT_EQ(w["status"], "localized");
  EXPECT_EQ(strings(w["failing_set"]), std::vector<std::string>{"L1.H0.pv"});
  EXPECT_EQ(strings(w["space"]), std::vector<std::string>{"pv"});
  EXPECT_EQ(w["reference"], "L1.H0.pv=low");
  int early = 0;
  for (const auto& p : r["probes"]) {
    if (!p.contains("stopped_at")) continue;
    ++early;
    EXPECT_EQ(p["verdict"], "fail");
    EXPECT_LT(p["stopped_at"].get<int>(), 39);
    EXPECT_EQ(p["steps"].get<int>(), p["stopped_at"].get<int>() - 20 + 1);
  }
  EXPECT_GE(early, 1);
  // The page fits a phone: viewport, wrapping verdict, the culprit and the early stops named.
  std::ifstream f(dir_ + "/ref_pv_report/report.html");
  const std::string html((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  for (const char* want : {"<meta name='viewport'", "<html lang='en'>", "<main>", "white-space:pre-wrap",
                           "L1.H0.pv", "stopped at", "reference <code>L1.H0.pv=low</code>"})
    EXPECT_NE(html.find(want), std::string::npos) << want;
  // A predicate that is not monotone (last) never stops a probe early.
  Cmd c = rewind_cmd("bisect --store " + store + " --window 20:39 --fail 'last(loss) > 3' --fresh --quiet --report " +
                     dir_ + "/ref_pv_last --reference 'L1.H0.pv=low'");
  nlohmann::json l = read_json(dir_ + "/ref_pv_last/report.json");
  for (const auto& p : l["probes"]) EXPECT_FALSE(p.contains("stopped_at")) << p.dump();
}

// `train --fork STORE --at S`: a new run from step S; with no plan of its own it continues the
// recording bit for bit, and it replays bitwise from the checkpoint it starts with.
TEST_F(BisectCli, ForkContinuesTheRecordingAndTakesAPlan) {
  const std::string store = record("fork_src", "");
  const std::string same = dir_ + "/fork_same.db", fixed = dir_ + "/fork_fixed.db";
  Cmd a = rewind_cmd("train --fork " + store + " --at 25 --record " + same + " --steps 40 --log-every 1000");
  ASSERT_EQ(a.code, 0) << a.out;
  Cmd b = rewind_cmd("train --fork " + store + " --at 25 --plan 'L1.H2.pv=fp32' --record " + fixed +
                     " --steps 40 --log-every 1000");
  ASSERT_EQ(b.code, 0) << b.out;
  auto losses = [&](const std::string& db, const std::string& name) {
    Cmd c = rewind_cmd("replay --store " + db + " --from 30 --to 39 --json " + dir_ + "/" + name + ".json");
    EXPECT_EQ(c.code, 0) << c.out;
    std::vector<double> v;
    const nlohmann::json j = read_json(dir_ + "/" + name + ".json");
    for (const auto& row : j["steps"]) v.push_back(row["recorded_loss"]);
    return v;
  };
  const std::vector<double> orig = losses(store, "orig"), cont = losses(same, "same"), fix = losses(fixed, "fixed");
  ASSERT_EQ(orig.size(), 10u);
  EXPECT_EQ(cont, orig);
  EXPECT_NE(fix, orig);
  Cmd v = rewind_cmd("replay --store " + fixed + " --from 25 --to 39 --verify");
  EXPECT_EQ(v.code, 0) << v.out;
  EXPECT_EQ(rewind_cmd("train --fork " + store + " --steps 40").code, 2);
  EXPECT_EQ(rewind_cmd("train --fork " + store + " --at 500 --steps 40").code, 2);
  EXPECT_EQ(rewind_cmd("train --fork " + store + " --at 25 --resume " + store).code, 2);
  EXPECT_EQ(rewind_cmd("train --fork " + store + " --at 25 --record " + same).code, 3);  // never overwritten
}

}  // namespace
}  // namespace rwd::bisect::testing
