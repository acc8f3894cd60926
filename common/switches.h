// The REWIND_* environment switches: one table (common/switches.cpp) that says each switch's
// type, default, meaning and whether it changes the bits of a run; typed accessors that read
// and check a switch in one place. `rewind --help-env` and docs/switches.md print the table.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rwd::switches {

enum class Switch {
  // numerics
  kFp32Gemm, kFusedNorm, kFusedLoss, kPlan, kPlanFrom,
  // speed, same bits
  kAttnWgmma, kAttnDsDq, kAttnDsWorkspace, kFastBlock, kFusedOptimizer, kCudaGraphs, kGraphBuckets,
  kGradBucketMb, kGradExchange, kBf16WeightCache, kAttentionFp32Path, kWarmBytes, kWarmTrainer,
  kScriptStop, kKeepInit, kWriterNice, kDistTimeout,
  // diagnostics
  kTimes,
  // set by rewind for the processes it starts
  kReplay, kServe, kServeSocket, kDoctor, kTokenFileFacts,
  kCount
};

enum class Type { kBool, kInt, kNumber, kEnum, kString, kList };

struct Spec {
  Switch id;
  const char* name;      // the environment variable
  Type type;
  const char* fallback;  // the value when unset or empty, as it would be written
  double lo, hi;         // kInt, kNumber: the accepted range
  const char* choices;   // kEnum, kList: the accepted words, comma-separated
  bool changes_bits;     // a run with another value computes other bits
  bool python;           // read by the Python package (python/rewind), not by this library
  bool internal;         // rewind sets it for a process it starts; a user does not
  const char* meaning;
};

// Every switch, in Switch order.
const std::vector<Spec>& table();
const Spec& spec(Switch s);
inline const char* name(Switch s) { return spec(s).name; }

// The value of a switch: the environment's when set and non-empty, else the default. The
// parsed value is cached; a changed environment (a test's or a benchmark's setenv) is parsed
// again, so each access costs one getenv. A value the table does not accept throws UsageError
// with one line, "REWIND_X=abc: expected 0 or 1".
bool on(Switch s);                      // kBool
int64_t integer(Switch s);              // kInt
double number(Switch s);                // kNumber
const std::string& text(Switch s);      // kEnum, kString ("" when unset without a default)
bool listed(Switch s, const char* item);  // kList: whether `item` is in the list
bool is_set(Switch s);                  // set in the environment, non-empty (and valid)
// The value in canonical form ("0"/"1", the number, the word): what a run's meta stores.
std::string value_text(Switch s);

// A variable another program sets and rewind only reads (a launcher's RANK, WORLD_SIZE and
// MASTER_ADDR, Slurm's task variables, CUDA_VISIBLE_DEVICES, TMPDIR): its text, nullptr when unset
// or empty. With the table's reads, the one place rewind reads its environment.
const char* external(const char* name);

// Checks every switch the environment sets; throws UsageError for the first bad one. The CLI
// calls it before a command runs, so that no background thread meets a bad value.
void check_all();

// The values of the switches that change bits and that this library reads, by name.
std::map<std::string, std::string> bit_values();
// Before a recorded run is computed again: refuses (UsageError, one line naming the switch and
// both values) a bit-changing switch whose value here differs from `recorded` (a run's meta;
// empty for stores older than the key, then nothing is checked). A switch in `follows_record`
// that the environment leaves unset takes the recorded value itself, so only a set one counts.
void check_recorded(const std::map<std::string, std::string>& recorded, const std::vector<Switch>& follows_record);

// The table as `rewind --help-env` prints it, and as docs/switches.md holds it.
std::string help_text();
std::string markdown();

}  // namespace rwd::switches
