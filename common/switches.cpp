// The switch table and its reader. Each switch is one entry here; a reader elsewhere asks for
// it by Switch and never parses the environment itself, so every switch accepts one spelling
// and refuses a bad value the same way.
#include "common/switches.h"

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "common/error.h"

namespace rwd::switches {

namespace {

constexpr double kBytes = 4611686018427387904.0;  // 2^62: any byte count a machine holds

using T = Type;
using S = Switch;

// {id, name, type, default, lo, hi, choices, changes bits, python, internal, meaning}, in Switch
// order. A function's static, so that a reader running before main finds it built.
const std::vector<Spec>& build_table() {
  static const std::vector<Spec> t = {
      {S::kFp32Gemm, "REWIND_FP32_GEMM", T::kEnum, "simt", 0, 0, "simt,3xtf32", true, false, false,
       "GPU: FP32 linears and LM head as cuBLAS's FP32 GEMM (simt) or as 3 TF32 GEMMs of split operands "
       "(3xtf32: numerics 4 or 6, faster, outside the FP32 contract on cancelling sums); unset: a replay "
       "takes the recorded one"},
      {S::kFusedNorm, "REWIND_FUSED_NORM", T::kBool, "1", 0, 0, "", true, false, false,
       "GPU: LayerNorm in rewind's kernels (numerics 5 or 6); 0: LibTorch's (3 or 4); unset: a replay "
       "takes the recorded one"},
      {S::kFusedLoss, "REWIND_FUSED_LOSS", T::kBool, "1", 0, 0, "", true, false, false,
       "GPU: the loss as the fused cross-entropy over the BF16 logits; 0: the FP32 loss of GPU runs "
       "recorded under numerics 2"},
      {S::kPlan, "REWIND_PLAN", T::kString, "", 0, 0, "", true, true, false,
       "`rewind.record`: replaces the script's plan (stored as the run's plan; said on stderr)"},
      {S::kPlanFrom, "REWIND_PLAN_FROM", T::kString, "", 0, 0, "", true, true, false,
       "`rewind.record`: adds plan changes at steps, STEP:SPEC, several joined by |"},
      {S::kAttnWgmma, "REWIND_ATTN_WGMMA", T::kBool, "1", 0, 0, "", false, false, false,
       "attention products on Hopper's wgmma; 0: on mma.sync"},
      {S::kAttnDsDq, "REWIND_ATTN_DS_DQ", T::kBool, "1", 0, 0, "", false, false, false,
       "the attention backward reads dQ's dS from stored tiles (up to 16384 keys); 0: recomputes it"},
      {S::kAttnDsWorkspace, "REWIND_ATTN_DS_WORKSPACE", T::kInt, "1073741824", 1, kBytes, "", false, false, false,
       "bytes of dS tiles one attention backward holds at once (heads are taken in chunks that fit)"},
      {S::kFastBlock, "REWIND_FAST_BLOCK", T::kBool, "1", 0, 0, "", false, false, false,
       "a transformer block as one BF16 autograd node where its plan allows; 0: the module path everywhere"},
      {S::kFusedOptimizer, "REWIND_FUSED_OPTIMIZER", T::kBool, "1", 0, 0, "", false, false, false,
       "GPU: AdamW and the gradient norm as fused kernels; 0: LibTorch's ops"},
      {S::kCudaGraphs, "REWIND_CUDA_GRAPHS", T::kInt, "16", 0, 1 << 20, "", false, false, false,
       "GPU: eager steps of a plan before its step is captured as a CUDA graph; 0: no graphs"},
      {S::kGraphBuckets, "REWIND_GRAPH_BUCKETS", T::kBool, "0", 0, 0, "", false, false, false,
       "data-parallel ranks capture their bucketed gradient exchange inside the step's CUDA graph"},
      {S::kGradBucketMb, "REWIND_GRAD_BUCKET_MB", T::kNumber, "25", 0, 1 << 20, "", false, false, false,
       "MiB of the gradient buckets the exchange starts from the backward's hooks; 0: after the backward"},
      {S::kGradExchange, "REWIND_GRAD_EXCHANGE", T::kEnum, "sharded", 0, 0, "sharded,allgather", false, false, false,
       "how data-parallel ranks sum gradients in rank order: sharded, or every rank gathers all"},
      {S::kBf16WeightCache, "REWIND_BF16_WEIGHT_CACHE", T::kBool, "1", 0, 0, "", false, false, false,
       "the fast block casts weights to BF16 once a step; 0: in every micro-batch"},
      {S::kAttentionFp32Path, "REWIND_ATTENTION_FP32_PATH", T::kBool, "0", 0, 0, "", false, false, false,
       "`rewind.attention` widens BF16 inputs to FP32 instead of its BF16 path"},
      {S::kWarmBytes, "REWIND_WARM_BYTES", T::kInt, "8589934592", 0, kBytes, "", false, false, false,
       "bytes of decompressed checkpoints a bisect process keeps for its next probes (least recently "
       "used dropped first); 0: none"},
      {S::kWarmTrainer, "REWIND_WARM_TRAINER", T::kBool, "1", 0, 0, "", false, false, false,
       "a bisect process keeps its trainer between probes; 0: every probe builds its model and restores"},
      {S::kScriptStop, "REWIND_SCRIPT_STOP", T::kBool, "1", 0, 0, "", false, false, false,
       "served `bisect --cmd` probes end at their verdict, and race; 0: they run their windows whole"},
      {S::kKeepInit, "REWIND_KEEP_INIT", T::kBool, "0", 0, 0, "", false, true, false,
       "served `bisect --cmd` probes run `torch.nn.init`'s initializers"},
      {S::kWriterNice, "REWIND_WRITER_NICE", T::kInt, "10", 0, 19, "", false, false, false,
       "nice levels the store's writer threads drop to, so that compression yields to training"},
      {S::kDistTimeout, "REWIND_DIST_TIMEOUT", T::kInt, "300", 0, 1 << 20, "", false, false, false,
       "seconds before a collective or the rendezvous of a data-parallel job gives up on the other ranks"},
      {S::kTimes, "REWIND_TIMES", T::kList, "", 0, 0, "phase,restore,bisect,record,probe", false, false, false,
       "timers on stderr. phase: ms per step in data, forward, backward, loss, gradient norm, monitors, "
       "optimizer (synchronizing at each edge, no CUDA graphs); restore: each checkpoint restore; "
       "bisect: a bisect process outside its probes; record: `rewind.record`'s checkpoints on the loop's "
       "thread; probe: a script's replayed window"},
      {S::kReplay, "REWIND_REPLAY", T::kString, "", 0, 0, "", false, true, true,
       "`replay|bisect --cmd`: the window a script replays (JSON)"},
      {S::kServe, "REWIND_SERVE", T::kString, "", 0, 0, "", false, true, true,
       "a script process serving bisect probes: its two pipes' descriptors"},
      {S::kServeSocket, "REWIND_SERVE_SOCKET", T::kString, "", 0, 0, "", false, true, true,
       "the socket a served script's rank 0 connects to under a launcher"},
      {S::kDoctor, "REWIND_DOCTOR", T::kString, "", 0, 0, "", false, true, true,
       "`doctor --cmd`: the steps to hash and the report file (JSON)"},
      {S::kTokenFileFacts, "REWIND_TOKEN_FILE_FACTS", T::kString, "", 0, 0, "", false, false, true,
       "a bisect worker: the token files its parent has already checked"},
  };
  return t;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream in(s);
  while (std::getline(in, item, ',')) out.push_back(item);
  return out;
}

std::string joined(const char* choices, const char* sep) {
  std::string out;
  for (const std::string& c : split(choices)) out += (out.empty() ? "" : sep) + c;
  return out;
}

// One switch's value as read from one environment string.
struct Parsed {
  bool set = false;
  std::string raw;  // what the environment held
  std::string error;
  bool b = false;
  int64_t i = 0;
  double d = 0;
  std::string s;
  std::vector<std::string> items;
};

std::string range(const Spec& sp) {
  std::ostringstream o;
  o << static_cast<int64_t>(sp.lo) << ".." << static_cast<int64_t>(sp.hi);
  return o.str();
}

std::string expected(const Spec& sp) {
  switch (sp.type) {
    case T::kBool: return "0 or 1";
    case T::kInt: return "a whole number in " + range(sp);
    case T::kNumber: return "a number in " + range(sp);
    case T::kEnum: return joined(sp.choices, " or ");
    case T::kList: return "a comma-separated list of " + joined(sp.choices, ", ");
    case T::kString: return "text";
  }
  return "";
}

// Fills p from `v` (the environment's text or the default); false when the table refuses it.
bool parse_into(const Spec& sp, const std::string& v, Parsed& p) {
  switch (sp.type) {
    case T::kBool:
      p.b = v == "1";
      return v == "0" || v == "1";
    case T::kInt: {
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(v.c_str(), &end, 10);
      p.i = x;
      return !v.empty() && *end == '\0' && errno == 0 && x >= sp.lo && static_cast<double>(x) <= sp.hi;
    }
    case T::kNumber: {
      char* end = nullptr;
      p.d = std::strtod(v.c_str(), &end);
      return !v.empty() && *end == '\0' && p.d >= sp.lo && p.d <= sp.hi;
    }
    case T::kEnum: {
      p.s = v;
      for (const std::string& c : split(sp.choices))
        if (c == v) return true;
      return false;
    }
    case T::kList: {
      const std::vector<std::string> allowed = split(sp.choices);
      p.items = split(v);
      for (const std::string& item : p.items) {
        bool known = false;
        for (const std::string& c : allowed) known = known || c == item;
        if (!known) return false;
      }
      return true;
    }
    case T::kString:
      p.s = v;
      return true;
  }
  return false;
}

Parsed parse(const Spec& sp, const char* env) {
  Parsed p;
  p.set = env != nullptr && *env != '\0';
  if (p.set) p.raw = env;
  if (!parse_into(sp, p.set ? p.raw : sp.fallback, p))
    p.error = std::string(sp.name) + "=" + p.raw + ": expected " + expected(sp);
  return p;
}

// The last parse of each switch. A reader may still hold an older one when the environment
// changes under it, so they are never freed; only a setenv makes a new one.
std::atomic<const Parsed*> g_parsed[static_cast<size_t>(S::kCount)];
std::mutex g_parse_mu;

const Parsed& current(S s) {
  const Spec& sp = spec(s);
  const char* env = std::getenv(sp.name);
  const bool set = env != nullptr && *env != '\0';
  std::atomic<const Parsed*>& slot = g_parsed[static_cast<size_t>(s)];
  auto same = [&](const Parsed* p) { return p != nullptr && p->set == set && (!set || p->raw == env); };
  const Parsed* p = slot.load(std::memory_order_acquire);
  if (!same(p)) {
    std::lock_guard<std::mutex> lock(g_parse_mu);
    p = slot.load(std::memory_order_acquire);
    if (!same(p)) {
      p = new Parsed(parse(sp, env));
      slot.store(p, std::memory_order_release);
    }
  }
  if (!p->error.empty()) throw UsageError(p->error);
  return *p;
}

const Parsed& typed(S s, T type) {
  if (spec(s).type != type) throw Error(ExitCode::kInternal, std::string(spec(s).name) + " read as another type");
  return current(s);
}

std::string bits_word(const Spec& sp) { return sp.changes_bits ? "other bits" : "same bits"; }

std::string type_word(const Spec& sp) {
  switch (sp.type) {
    case T::kBool: return "0|1";
    case T::kInt:
      return sp.hi >= kBytes ? "bytes" : "integer " + range(sp);
    case T::kNumber: return "number " + range(sp);
    case T::kEnum: return joined(sp.choices, "|");
    case T::kList: return "list: " + joined(sp.choices, ",");
    case T::kString: return "text";
  }
  return "";
}

std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

std::string default_word(const Spec& sp) { return *sp.fallback ? sp.fallback : "unset"; }

}  // namespace

const std::vector<Spec>& table() { return build_table(); }

const char* external(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : nullptr;
}

const Spec& spec(Switch s) { return table().at(static_cast<size_t>(s)); }

bool on(Switch s) { return typed(s, T::kBool).b; }
int64_t integer(Switch s) { return typed(s, T::kInt).i; }
double number(Switch s) { return typed(s, T::kNumber).d; }

const std::string& text(Switch s) {
  const T t = spec(s).type;
  return typed(s, t == T::kEnum ? T::kEnum : T::kString).s;
}

bool listed(Switch s, const char* item) {
  for (const std::string& i : typed(s, T::kList).items)
    if (i == item) return true;
  return false;
}

bool is_set(Switch s) { return current(s).set; }

std::string value_text(Switch s) {
  const Parsed& p = current(s);
  switch (spec(s).type) {
    case T::kBool: return p.b ? "1" : "0";
    case T::kInt: return std::to_string(p.i);
    case T::kNumber: {
      std::ostringstream o;
      o << p.d;
      return o.str();
    }
    case T::kList: {
      std::string out;
      for (const std::string& i : p.items) out += (out.empty() ? "" : ",") + i;
      return out;
    }
    case T::kEnum:
    case T::kString: return p.s;
  }
  return "";
}

void check_all() {
  for (const Spec& sp : table()) current(sp.id);
}

std::map<std::string, std::string> bit_values() {
  std::map<std::string, std::string> out;
  for (const Spec& sp : table())
    if (sp.changes_bits && !sp.python) out[sp.name] = value_text(sp.id);
  return out;
}

void check_recorded(const std::map<std::string, std::string>& recorded, const std::vector<Switch>& follows_record) {
  for (const auto& [key, was] : recorded) {
    const Spec* sp = nullptr;
    for (const Spec& candidate : table())
      if (key == candidate.name && candidate.changes_bits) sp = &candidate;
    if (sp == nullptr) continue;  // a switch this build no longer has
    const bool set = is_set(sp->id);
    bool follows = false;
    for (Switch f : follows_record) follows = follows || f == sp->id;
    if (!set && follows) continue;
    const std::string here = value_text(sp->id);
    if (here == was) continue;
    throw UsageError(std::string(sp->name) + "=" + here + (set ? "" : " (the default)") +
                     ", but the run was recorded with " + sp->name + "=" + was +
                     ": it changes the bits, so replay the run with " + sp->name + "=" + was);
  }
}

std::string help_text() {
  std::ostringstream o;
  o << "rewind's environment switches (docs/switches.md). A bad value stops rewind with exit code 2.\n\n"
    << "  name                         type               default      bits\n";
  auto rows = [&](bool internal) {
    for (const Spec& sp : table()) {
      if (sp.internal != internal) continue;
      char line[256];
      std::snprintf(line, sizeof line, "  %-28s %-18s %-12s %s\n", sp.name, type_word(sp).c_str(),
                    default_word(sp).c_str(), bits_word(sp).c_str());
      o << line << "      " << sp.meaning << (sp.python ? " (read by the Python package)" : "") << "\n";
    }
  };
  rows(false);
  o << "\ninternal: set by rewind for the processes it starts; a user does not set them\n";
  rows(true);
  return o.str();
}

std::string markdown() {
  std::ostringstream o;
  o << "# Switches\n\n"
    << "<!-- Generated by `rewind --help-env markdown` from common/switches.cpp; "
       "tests/common/switches_test.cpp checks that it matches. -->\n\n"
    << "Environment variables read by `rewind` and the Python package, one table in\n"
    << "`common/switches.cpp`; `rewind --help-env` prints it. Empty counts as unset. A value the\n"
    << "table does not accept stops `rewind` before its command runs, with one line\n"
    << "(`rewind: error: REWIND_FUSED_NORM=yes: expected 0 or 1`) and exit code 2.\n\n"
    << "A switch marked \"other bits\" gives a run other bits than its default. A recording stores\n"
    << "the values of those read by `rewind` in the run's meta (`\"switches\"`); replay, step, bisect\n"
    << "and resume refuse a run whose recorded value differs from the one here, naming both (exit\n"
    << "code 2), except that an unset `REWIND_FP32_GEMM` or `REWIND_FUSED_NORM` takes the recorded\n"
    << "one ([design.md](design.md#determinism-and-numerics-versions)). Stores older than the key\n"
    << "are not checked.\n\n"
    << "| switch | type | default | bits | meaning |\n|---|---|---|---|---|\n";
  auto rows = [&](bool internal) {
    for (const Spec& sp : table()) {
      if (sp.internal != internal) continue;
      o << "| `" << sp.name << "` | " << md_cell(type_word(sp)) << " | " << md_cell(default_word(sp)) << " | "
        << bits_word(sp) << " | " << md_cell(sp.meaning) << (sp.python ? " (Python)" : "") << " |\n";
    }
  };
  rows(false);
  o << "\n## Set by rewind for its children\n\n"
    << "How rewind talks to a process it starts ([python.md](python.md)); a user does not set them.\n\n"
    << "| switch | type | default | bits | meaning |\n|---|---|---|---|---|\n";
  rows(true);
  o << "\n## Build options\n\n"
    << "`-DREWIND_CUDA=ON` adds the CUDA kernels and the GPU path ([cuda.md](cuda.md)). Kernel parts\n"
    << "can be turned off at configure time, same bits: `-DCMAKE_CUDA_FLAGS=\"-DREWIND_FWD_TMA=0\"`,\n"
    << "`\"-DREWIND_FWD_PIPE=0\"`, `\"-DREWIND_FWD_PRODUCER_WARP=0\"` (the D128 forward's TMA loads,\n"
    << "pipelining and producer warpgroup) and `-DREWIND_ORDER_HEADS=1` (causal launches in head\n"
    << "order instead of longest tiles first). `scripts/cuda_explore.sh` times kernel variants given as\n"
    << "`-D` knobs (`VARIANTS='a:-DREWIND_FWD64_TILE=warps(4)+m16(1)+min_blocks(3)+q_in_smem'`): the\n"
    << "forward's tiles `REWIND_FWD{32,64,80,96,128,256}_TILE`, `REWIND_FWD{64,128}_F32_TILE` and\n"
    << "`REWIND_FWD{64,128}_WG_TILE` as sums of named parts, the backward's `REWIND_DQ{64,128}_KV_STAGES`,\n"
    << "`REWIND_DQ_MIN_BLOCKS` and `REWIND_DKDV64_MIN_BLOCKS` (their headers say what each does).\n\n"
    << "Outside rewind: on CUDA, a script's replay is bitwise only with\n"
    << "`CUBLAS_WORKSPACE_CONFIG=:4096:8` set before CUDA starts ([python.md](python.md)).\n";
  return o.str();
}

}  // namespace rwd::switches
