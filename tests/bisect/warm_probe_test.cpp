// Warm probes: bisect probes in one process reuse the warm trainer (its state before
// the window kept on its device) and take their checkpoint from the warm cache
// (replay::read_checkpoint_warm) after the first read. A probe restored either way must replay
// the very bits of one restored from the store (REWIND_WARM_TRAINER=0, REWIND_WARM_BYTES=0)
// and of the recording, whatever probes ran before it; the cache keys stores and steps apart,
// evicts the least recently used entry, and loading a state leaves the cached tensors unchanged.
#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "bisect/probe.h"
#include "bisect_test_util.h"
#include "replay/replayer.h"
#include "train/tensor_io.h"

namespace rwd::bisect::testing {
namespace {

uint64_t bits(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Byte-for-byte equality of two states (names, dtypes, shapes, contents).
void expect_same_state(const train::NamedTensors& a, const train::NamedTensors& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].first, b[i].first);
    const torch::Tensor x = a[i].second.contiguous(), y = b[i].second.contiguous();
    ASSERT_EQ(x.scalar_type(), y.scalar_type()) << a[i].first;
    ASSERT_EQ(x.sizes(), y.sizes()) << a[i].first;
    EXPECT_EQ(std::memcmp(x.data_ptr(), y.data_ptr(), x.numel() * x.element_size()), 0) << a[i].first;
  }
}

class WarmProbe : public TinyRunSuite {
 protected:
  // Two identical 40-step recordings (checkpoints at 0, 20, 40) with a planted o fault on L1.H2
  // from step 20: the same checkpoint bytes in two stores.
  static void SetUpTestSuite() {
    make_data("warm_probe");
    for (const char* name : {"a", "b"}) {
      const std::string store = dir_ + "/" + name + ".db";
      Cmd c = rewind_cmd(train_args(data_, store, 40, 20,
                                    "--plan-from '20:L1.H2.o=fault(strength=4096)' --learning-rate 0.01"));
      ASSERT_EQ(c.code, 0) << c.out;
    }
  }
  void SetUp() override {
    unsetenv("REWIND_WARM_BYTES");
    unsetenv("REWIND_WARM_TRAINER");
    replay::warm_clear();
  }
  void TearDown() override {
    unsetenv("REWIND_WARM_BYTES");
    unsetenv("REWIND_WARM_TRAINER");
  }

  static store::Store open(const char* name) {
    return store::Store::open(dir_ + "/" + name + ".db", store::Mode::kReadOnly);
  }
};

// The same probes twice in one process (the second restored from the cache), then with the
// cache off: every step's loss and grad norm agree bit for bit, and the recorded plan's probe
// reproduces the recording. Window 25:39 fast-forwards from the checkpoint at 20.
TEST_F(WarmProbe, CachedRestoreReplaysTheSameBits) {
  setenv("REWIND_WARM_TRAINER", "0", 1);  // the checkpoint cache alone; the trainer: below
  store::Store s = open("a");
  const train::RunSpec run = train::RunSpec::load(s, 0);
  at::set_num_threads(run.threads);
  const Predicate pred = Predicate::parse("mean(loss) > 100");  // not monotone: whole windows
  ASSERT_FALSE(pred.monotone());
  std::vector<ProbeSpec> probes(3);
  probes[1].candidate = parse_candidate("fp32{L1.H2.o,L1.H2.delta}");
  probes[2].from = 25;
  for (auto& p : probes) {
    p.run = run.run_id;
    if (p.from == 0) p.from = 20;
    p.to = 39;
    p.predicate = pred.source();
  }
  for (const ProbeSpec& p : probes) {
    SCOPED_TRACE(p.label() + " from " + std::to_string(p.from));
    replay::warm_clear();
    const ProbeOutcome cold = execute_probe(s, p, run, pred);
    EXPECT_EQ(replay::warm_stats().misses, 1);
    EXPECT_EQ(replay::warm_stats().entries, 1);
    const ProbeOutcome warm = execute_probe(s, p, run, pred);
    EXPECT_EQ(replay::warm_stats().hits, 1);
    setenv("REWIND_WARM_BYTES", "0", 1);
    const ProbeOutcome off = execute_probe(s, p, run, pred);
    unsetenv("REWIND_WARM_BYTES");
    EXPECT_EQ(replay::warm_stats().hits, 1);
    EXPECT_EQ(replay::warm_stats().entries, 0);  // 0 turns it off and empties it
    EXPECT_EQ(replay::warm_stats().capacity, 0);
    ASSERT_EQ(cold.loss.size(), 20u - (p.from - 20));
    for (const ProbeOutcome* o : {&warm, &off}) {
      ASSERT_EQ(o->loss.size(), cold.loss.size());
      ASSERT_EQ(o->grad_norm.size(), cold.grad_norm.size());
      for (size_t i = 0; i < cold.loss.size(); ++i) {
        EXPECT_EQ(bits(o->loss[i]), bits(cold.loss[i])) << "step " << p.from + i;
        EXPECT_EQ(bits(o->grad_norm[i]), bits(cold.grad_norm[i])) << "step " << p.from + i;
      }
      EXPECT_EQ(o->fails, cold.fails);
    }
    if (!p.candidate) {  // the recorded plan: the recording's bits
      for (size_t i = 0; i < cold.loss.size(); ++i) {
        auto rec = s.get_step(run.run_id, p.from + static_cast<int64_t>(i));
        ASSERT_TRUE(rec);
        EXPECT_EQ(store::float_bits(static_cast<float>(cold.loss[i])), rec->loss_bits);
        EXPECT_EQ(store::float_bits(static_cast<float>(cold.grad_norm[i])), rec->grad_norm_bits);
      }
    }
  }
  // Training from the cached state left it as stored.
  expect_same_state(replay::read_checkpoint_warm(s, run.run_id, 20), train::read_checkpoint(s, run.run_id, 20));
}

// The warm trainer: probes of other plans and windows in between, and each probe replays the
// bits of a cold restore (no warm trainer, no cache); the recorded plan's those of the recording.
TEST_F(WarmProbe, WarmTrainerReplaysTheBitsOfAColdRestore) {
  store::Store s = open("a");
  const train::RunSpec run = train::RunSpec::load(s, 0);
  at::set_num_threads(run.threads);
  const Predicate pred = Predicate::parse("mean(loss) > 100");
  std::vector<ProbeSpec> probes(4);
  probes[1].candidate = parse_candidate("fp32{L1.H2.o,L1.H2.delta}");
  probes[2].candidate = parse_candidate("low{L1.H2.o}");
  probes[3].from = 25;  // fast-forwarded from the checkpoint at 20 on a miss
  for (auto& p : probes) {
    p.run = run.run_id;
    if (p.from == 0) p.from = 20;
    p.to = 39;
    p.predicate = pred.source();
  }
  setenv("REWIND_WARM_TRAINER", "0", 1);
  setenv("REWIND_WARM_BYTES", "0", 1);
  std::vector<ProbeOutcome> cold;
  for (const ProbeSpec& p : probes) cold.push_back(execute_probe(s, p, run, pred));
  unsetenv("REWIND_WARM_TRAINER");
  unsetenv("REWIND_WARM_BYTES");
  EXPECT_EQ(replay::warm_stats().trainer_hits + replay::warm_stats().trainer_misses, 0);
  for (size_t i : {0, 1, 0, 2, 1, 3, 3, 0, 2}) {
    SCOPED_TRACE(probes[i].label() + " from " + std::to_string(probes[i].from));
    const ProbeOutcome warm = execute_probe(s, probes[i], run, pred);
    ASSERT_EQ(warm.loss.size(), cold[i].loss.size());
    for (size_t k = 0; k < warm.loss.size(); ++k) {
      EXPECT_EQ(bits(warm.loss[k]), bits(cold[i].loss[k])) << "step " << probes[i].from + k;
      EXPECT_EQ(bits(warm.grad_norm[k]), bits(cold[i].grad_norm[k])) << "step " << probes[i].from + k;
    }
  }
  // Misses: the first probe, the window from 25, and the first back at 20; the rest reused it.
  EXPECT_EQ(replay::warm_stats().trainer_misses, 3);
  EXPECT_EQ(replay::warm_stats().trainer_hits, 6);
  for (size_t k = 0; k < cold[0].loss.size(); ++k) {
    auto rec = s.get_step(run.run_id, 20 + static_cast<int64_t>(k));
    ASSERT_TRUE(rec);
    EXPECT_EQ(store::float_bits(static_cast<float>(cold[0].loss[k])), rec->loss_bits);
  }
}

// replay::run_window, the loop under replay and probes: a callback that says stop after step 24
// ends the window 22:39 there, after exactly 24 - 22 + 1 steps, each run under its plan with its
// recorded row beside it; under the recorded plan, the recording's bits.
TEST_F(WarmProbe, RunWindowStopsWhereTheCallbackSays) {
  store::Store s = open("a");
  const train::RunSpec run = train::RunSpec::load(s, 0);
  at::set_num_threads(run.threads);
  replay::Restored r = replay::restore_before(s, run.run_id, 22);
  ASSERT_EQ(r.trainer->step(), 22);
  replay::WindowOptions w;
  w.from = 22;
  w.to = 39;
  std::vector<int64_t> planned, seen;
  w.plan_at = [&](int64_t step) {
    planned.push_back(step);
    return run.plan.at(step, run.config.n_layer, run.config.n_head);
  };
  w.on_step = [&](int64_t step, replay::ReplayedStep& rs) {
    seen.push_back(step);
    EXPECT_EQ(rs.replayed.step, step);
    EXPECT_GE(rs.step_s, 0);
    EXPECT_TRUE(rs.recorded && rs.recorded->loss_bits == store::float_bits(rs.replayed.loss)) << "step " << step;
    return step < 24;
  };
  EXPECT_EQ(replay::run_window(s, r, w), 3);
  EXPECT_EQ(planned, (std::vector<int64_t>{22, 23, 24}));
  EXPECT_EQ(seen, planned);
  EXPECT_EQ(r.trainer->step(), 25);
}

// Another store with the same bytes, another step, another run id: each its own entry. The
// least recently used entry goes first when REWIND_WARM_BYTES holds fewer.
TEST_F(WarmProbe, KeysAndLeastRecentlyUsedEviction) {
  store::Store a = open("a"), b = open("b");
  const int64_t run = train::RunSpec::load(a, 0).run_id;
  const train::NamedTensors a20 = replay::read_checkpoint_warm(a, run, 20);
  replay::read_checkpoint_warm(b, run, 20);
  replay::read_checkpoint_warm(a, run, 0);
  replay::WarmStats st = replay::warm_stats();
  EXPECT_EQ(st.misses, 3);
  EXPECT_EQ(st.hits, 0);
  EXPECT_EQ(st.entries, 3);
  EXPECT_THROW(replay::read_checkpoint_warm(a, run + 1, 20), Error);  // no such checkpoint
  expect_same_state(replay::read_checkpoint_warm(a, run, 20), a20);  // a20 is now the most recent
  st = replay::warm_stats();
  EXPECT_EQ(st.hits, 1);
  const int64_t one = st.bytes / 3;  // three checkpoints of one model: the same size each
  ASSERT_GT(one, 0);
  setenv("REWIND_WARM_BYTES", std::to_string(2 * one).c_str(), 1);
  replay::read_checkpoint_warm(a, run, 20);  // hit; b@20, the least recent, is evicted
  st = replay::warm_stats();
  EXPECT_EQ(st.hits, 2);
  EXPECT_EQ(st.entries, 2);
  EXPECT_EQ(st.bytes, 2 * one);
  replay::read_checkpoint_warm(b, run, 20);  // miss; evicts a@0
  replay::read_checkpoint_warm(a, run, 20);  // hit
  replay::read_checkpoint_warm(a, run, 0);   // miss
  st = replay::warm_stats();
  EXPECT_EQ(st.hits, 3);
  EXPECT_EQ(st.misses, 6);  // the missing run's lookup counted as one
  EXPECT_EQ(st.entries, 2);
  setenv("REWIND_WARM_BYTES", std::to_string(one - 1).c_str(), 1);  // too small for one
  replay::read_checkpoint_warm(a, run, 20);
  st = replay::warm_stats();
  EXPECT_EQ(st.entries, 0);
  EXPECT_EQ(st.bytes, 0);
  EXPECT_EQ(st.misses, 7);
}

// The probe rows and probe descriptions read their integers with a range check.
TEST(ProbeJson, OutOfRangeNumbersAreRefusedNotCast) {
  store::ProbeRecord r;
  r.verdict = "fail";
  r.metrics = R"({"format":"rewind-probe-v1","loss":[1.0],"grad_norm":[1.0],"steps":1})";
  ASSERT_TRUE(from_record(r).has_value());
  for (const char* bad : {R"("steps":1.1e28)", R"("steps":1.5)", R"("steps":-3)", R"("stopped_at":1e300)"}) {
    r.metrics = std::string(R"({"format":"rewind-probe-v1","loss":[1.0],"grad_norm":[1.0],)") + bad + "}";
    EXPECT_FALSE(from_record(r).has_value()) << bad;
  }
  ProbeSpec p;
  p.from = 3;
  p.to = 9;
  EXPECT_EQ(ProbeSpec::from_json(p.to_json()).to, 9);
  std::string text = p.to_json();
  text.replace(text.find("\"to\":9"), 6, "\"to\":1.1e28");
  EXPECT_THROW(ProbeSpec::from_json(text), UsageError);
}

}  // namespace
}  // namespace rwd::bisect::testing
