// `rewind store info|ls|verify|export STORE`: inspect a recording store without LibTorch;
// `rewind store thin STORE`: delete checkpoints by a retention rule and give their space back.
// Every command but thin opens the store read-only; only errors thrown as rwd::Error leave here.
#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstdio>
#include <cxxopts.hpp>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cli/run_kind.h"
#include "common/error.h"
#include "common/utf8.h"
#include "store/npy.h"
#include "store/store.h"
#include "store/writer_lock.h"

namespace rwd::cli {
namespace {

using store::Store;

std::string human_bytes(int64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024.0 && u < 4) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.2f %s" : "%.0f %s", v, units[u]);
  return buf;
}

// One-line summary of JSON text: whitespace collapsed, cut to `width` bytes between characters.
std::string one_line(const std::string& text, size_t width) {
  std::string out;
  for (char c : text) {
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (space && (out.empty() || out.back() == ' ')) continue;
    out += space ? ' ' : c;
  }
  return utf8_shorten(out, width);
}

std::string steps_text(const std::vector<int64_t>& steps) {
  std::string s;
  for (size_t i = 0; i < steps.size(); ++i) {
    if (i == 8 && steps.size() > 10) {
      s += ", ... " + std::to_string(steps.back());
      break;
    }
    s += (i ? ", " : "") + std::to_string(steps[i]);
  }
  return s;
}

std::string tensor_label(const store::TensorInfo& t) {
  std::string s = "'" + t.key.name + "'";
  if (t.key.layer >= 0) s += " L" + std::to_string(t.key.layer);
  if (t.key.head >= 0) s += " H" + std::to_string(t.key.head);
  return s + " " + store::dtype_name(t.dtype) + " " + store::shape_to_json(t.shape);
}

std::string sizes_text(int64_t raw, int64_t stored) {
  return "raw " + human_bytes(raw) + ", stored " + human_bytes(stored);
}

// Parses `argv` (argv[0] = "store <sub>"); cxxopts errors become usage errors.
cxxopts::ParseResult parse(cxxopts::Options& opts, int argc, char** argv) {
  try {
    opts.parse_positional({"store"});
    opts.positional_help("STORE");
    return opts.parse(argc, argv);
  } catch (const cxxopts::exceptions::exception& e) {
    throw UsageError(std::string(e.what()) + " (try rewind " + opts.program() + " --help)");
  }
}

// Returns true when help was printed; throws when STORE is missing.
bool help_or_check(const cxxopts::Options& opts, const cxxopts::ParseResult& r) {
  if (r.count("help")) {
    std::printf("%s", opts.help().c_str());
    return true;
  }
  if (!r.count("store")) throw UsageError(opts.program() + ": STORE is required");
  return false;
}

int64_t pick_run(Store& s, const cxxopts::ParseResult& r) {
  if (r.count("run")) {
    const int64_t id = r["run"].as<int64_t>();
    if (!s.run(id)) throw store::data_error("store " + s.path() + ": no run " + std::to_string(id));
    return id;
  }
  const std::vector<store::RunInfo> runs = s.runs();
  if (runs.size() == 1) return runs[0].id;
  if (runs.empty()) throw store::data_error("store " + s.path() + ": has no runs");
  throw UsageError("store " + s.path() + " has " + std::to_string(runs.size()) +
                   " runs; choose one with --run");
}

// The retention options of `store thin` and `store info` (what thin would free).
void add_retention_options(cxxopts::Options& opts) {
  opts.add_options()("keep-last", "keep the last K checkpoints", cxxopts::value<int64_t>())(
      "keep-every", "and beyond them the first checkpoint of every M steps (0, M, 2M, ...)",
      cxxopts::value<int64_t>())(
      "keep-steps", "also keep the checkpoints replaying from these steps needs, e.g. 6550,6600",
      cxxopts::value<std::string>())(
      "force", "also remove checkpoints stored bisect probes need (never those a running replay or bisect reads)")(
      "run", "only this run (default: every run)", cxxopts::value<int64_t>());
}

// The rules given (rule inactive when neither --keep-last nor --keep-every is); bad values are
// usage errors in one line.
store::ThinRules retention_rules(const cxxopts::Options& opts, const cxxopts::ParseResult& r) {
  store::ThinRules rules;
  auto positive = [&](const char* key, int64_t& out) {
    if (!r.count(key)) return;
    out = r[key].as<int64_t>();
    if (out < 1) throw UsageError(opts.program() + ": --" + key + " must be 1 or more, got " + std::to_string(out));
  };
  positive("keep-last", rules.rule.keep_last);
  positive("keep-every", rules.rule.keep_every);
  if (r.count("keep-steps")) {
    const std::string list = r["keep-steps"].as<std::string>();
    size_t at = 0;
    while (at <= list.size()) {
      const size_t end = std::min(list.find(',', at), list.size());
      const std::string item = list.substr(at, end - at);
      char* stop = nullptr;
      errno = 0;
      const long long v = std::strtoll(item.c_str(), &stop, 10);
      if (item.empty() || *stop != '\0' || errno == ERANGE || v < 0)
        throw UsageError(opts.program() + ": --keep-steps takes steps (whole numbers >= 0) separated by commas, got '" +
                         list + "'");
      rules.keep_steps.push_back(v);
      at = end + 1;
    }
  }
  rules.force = r.count("force") > 0;
  if ((!rules.keep_steps.empty() || rules.force) && !rules.rule.active())
    throw UsageError(opts.program() + ": --keep-steps and --force go with --keep-last K and/or --keep-every M");
  return rules;
}

// The runs a retention option applies to: --run, or all.
std::vector<int64_t> retention_runs(Store& s, const cxxopts::ParseResult& r) {
  if (r.count("run")) return {pick_run(s, r)};
  std::vector<int64_t> ids;
  for (const store::RunInfo& run : s.runs()) ids.push_back(run.id);
  return ids;
}

// "7 of 12 checkpoints (steps 10, 30, ...): 84 blobs, 12.3 MiB stored (raw 14.0 MiB)"
std::string removal_text(const store::ThinPlan& p) {
  return std::to_string(p.remove.size()) + " of " + std::to_string(p.checkpoints.size()) + " checkpoints" +
         (p.remove.empty() ? "" : " (steps " + steps_text(p.remove) + ")") + ": " + std::to_string(p.n_blobs) +
         " blobs, " + human_bytes(p.stored_bytes) + " stored (raw " + human_bytes(p.raw_bytes) + ")";
}

void print_pinned(const store::ThinPlan& p) {
  for (const auto& [step, why] : p.in_use)
    std::printf("  checkpoint %lld kept: %s\n", static_cast<long long>(step), why.c_str());
  if (p.pinned.empty()) return;
  std::string s;
  for (size_t i = 0; i < p.pinned.size(); ++i)
    s += (i ? "; " : "") + std::string("step ") + std::to_string(p.pinned[i].first) + ": " + p.pinned[i].second;
  std::printf("  kept beyond the rule: %s\n", s.c_str());
}

int cmd_info(int argc, char** argv) {
  cxxopts::Options opts("store info",
                        "summary of a store: schema, runs, steps, checkpoints, sizes; with --keep-last "
                        "and/or --keep-every, what `rewind store thin` with those rules would remove and free");
  opts.add_options()("store", "store file", cxxopts::value<std::string>())("h,help", "show help");
  add_retention_options(opts);
  auto r = parse(opts, argc, argv);
  if (help_or_check(opts, r)) return 0;
  const store::ThinRules rules = retention_rules(opts, r);
  Store s = Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  const store::StoreInfo info = s.info();
  std::printf("store %s: schema version %d, %s on disk (free pages %s, auto-vacuum %s)\n", s.path().c_str(),
              info.schema_version, human_bytes(info.file_bytes).c_str(), human_bytes(info.free_bytes).c_str(),
              info.incremental_vacuum ? "incremental" : "none: thin rewrites the file once");
  const double ratio = info.stored_bytes ? double(info.raw_bytes) / double(info.stored_bytes) : 0;
  std::printf("blobs: %lld (%s, ratio %.2fx)\n", static_cast<long long>(info.n_blobs),
              sizes_text(info.raw_bytes, info.stored_bytes).c_str(), ratio);
  std::printf("probes: %lld, kv entries: %lld, runs: %zu\n", static_cast<long long>(info.n_probes),
              static_cast<long long>(info.n_kv), info.runs.size());
  // Where the bytes are: blobs by the kind of row that refers to them, then the largest tables.
  std::printf("stored by kind: checkpoints %s", human_bytes(info.checkpoint_bytes).c_str());
  if (info.n_checkpoints > 0)
    std::printf(" (%lld, %s each)", static_cast<long long>(info.n_checkpoints),
                human_bytes(info.checkpoint_bytes / info.n_checkpoints).c_str());
  std::printf(", captured tensors %s, batches and RNG states %s\n", human_bytes(info.tensor_bytes).c_str(),
              human_bytes(info.step_blob_bytes).c_str());
  if (!info.table_bytes.empty()) {
    std::string tables;
    for (size_t i = 0; i < info.table_bytes.size() && i < 6; ++i)
      tables += (i ? ", " : "") + info.table_bytes[i].first + " " + human_bytes(info.table_bytes[i].second);
    std::printf("pages by table: %s\n", tables.c_str());
  }
  for (const store::RunSummary& run : info.runs) {
    std::printf("run %lld  created %s  plan '%s'\n", static_cast<long long>(run.run.id),
                run.run.created.c_str(), one_line(run.run.plan, 60).c_str());
    std::printf("  config %s\n", one_line(run.run.config, 100).c_str());
    std::printf("  meta   %s\n", one_line(run.run.meta, 100).c_str());
    std::printf("  recorded by %s\n", recorded_by(run.run.meta).c_str());
    if (run.step_range) {
      std::printf(
          "  steps %lld..%lld (%lld recorded)\n", static_cast<long long>(run.step_range->first),
          static_cast<long long>(run.step_range->second), static_cast<long long>(run.n_steps));
    } else {
      std::printf("  steps: none\n");
    }
    std::printf("  checkpoints: %zu%s%s\n", run.checkpoint_steps.size(),
                run.checkpoint_steps.empty() ? "" : " at steps ",
                steps_text(run.checkpoint_steps).c_str());
    std::printf("  tensors: %lld, metric values: %lld\n", static_cast<long long>(run.n_tensors),
                static_cast<long long>(run.n_metrics));
  }
  if (!rules.rule.active()) return 0;
  for (int64_t run : retention_runs(s, r)) {
    const store::ThinPlan p = s.plan_thin(run, rules);
    std::printf("run %lld: thin %s would remove %s\n", static_cast<long long>(run), rules.rule.text().c_str(),
                removal_text(p).c_str());
    print_pinned(p);
  }
  return 0;
}

int cmd_thin(int argc, char** argv) {
  cxxopts::Options opts(
      "store thin",
      "delete checkpoints a retention rule drops, with the blobs nothing else refers to, and give their "
      "space back.\nThe first and the last checkpoint of each run are always kept, and so are those stored "
      "bisect probes\nneed (unless --force) and those a running replay or bisect reads; steps, metrics, "
      "batches and captured\ntensors all stay. A store being recorded is refused. Stores made before "
      "incremental auto-vacuum are\nrewritten once (VACUUM: needs room for a copy).\n"
      "  rewind store thin run.db --keep-last 20 --keep-every 1000 --keep-steps 6550");
  opts.add_options()("store", "store file", cxxopts::value<std::string>())("h,help", "show help");
  add_retention_options(opts);
  auto r = parse(opts, argc, argv);
  if (help_or_check(opts, r)) return 0;
  const store::ThinRules rules = retention_rules(opts, r);
  if (!rules.rule.active())
    throw UsageError("store thin: give --keep-last K and/or --keep-every M (the checkpoints to keep)");
  Store s = Store::open(r["store"].as<std::string>(), store::Mode::kReadWrite);
  const store::WriterLock lock(s.path(), "store thin");
  const std::vector<int64_t> runs = retention_runs(s, r);
  const int64_t before = s.file_bytes();
  int64_t stored = 0;
  for (int64_t run : runs) {
    const store::ThinPlan p = s.thin(run, rules);
    stored += p.stored_bytes;
    std::printf("run %lld: removed %s\n", static_cast<long long>(run), removal_text(p).c_str());
    print_pinned(p);
  }
  if (stored == 0 && s.free_bytes() == 0) {
    std::printf("nothing to give back: %s on disk\n", human_bytes(s.file_bytes()).c_str());
    return 0;
  }
  const bool vacuumed = s.reclaim_space();
  const int64_t after = s.file_bytes();
  std::printf("freed %s (%lld bytes): %s -> %s on disk (%s)\n", human_bytes(before - after).c_str(),
              static_cast<long long>(before - after), human_bytes(before).c_str(), human_bytes(after).c_str(),
              vacuumed ? "VACUUM: the store was made without incremental auto-vacuum; rewritten once, it has it now"
                         : "incremental vacuum");
  return 0;
}

int cmd_ls(int argc, char** argv) {
  cxxopts::Options opts("store ls",
                        "list recorded items (checkpoints, tensors, metrics, probes, "
                        "kv) with their raw and stored sizes");
  opts.add_options()("store", "store file", cxxopts::value<std::string>())(
      "run", "only this run", cxxopts::value<int64_t>())("h,help", "show help");
  auto r = parse(opts, argc, argv);
  if (help_or_check(opts, r)) return 0;
  Store s = Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  for (const store::RunInfo& run : s.runs()) {
    if (r.count("run") && run.id != r["run"].as<int64_t>()) continue;
    std::printf("run %lld\n", static_cast<long long>(run.id));
    const auto range = s.step_range(run.id);
    if (range) {
      std::printf("  steps       %lld..%lld\n", static_cast<long long>(range->first),
                  static_cast<long long>(range->second));
    }
    for (int64_t step : s.checkpoint_steps(run.id)) {
      for (const store::TensorInfo& t : s.checkpoint_entries(run.id, step)) {
        std::printf("  checkpoint  step %lld %s  %s\n", static_cast<long long>(step),
                    tensor_label(t).c_str(), sizes_text(t.raw_size, t.stored_size).c_str());
      }
    }
    for (const store::TensorInfo& t : s.tensors(run.id, INT64_MIN, INT64_MAX)) {
      std::printf("  tensor      step %lld %s  %s\n", static_cast<long long>(t.key.step),
                  tensor_label(t).c_str(), sizes_text(t.raw_size, t.stored_size).c_str());
    }
    for (const std::string& key : s.metric_keys(run.id)) {
      std::printf("  metric      %s\n", key.c_str());
    }
    for (const std::string& key : s.kv_keys(run.id)) {
      std::printf("  kv          %s (%zu bytes)\n", key.c_str(), s.get_kv(run.id, key)->size());
    }
  }
  if (!r.count("run")) {
    for (const std::string& key : s.kv_keys(0)) {
      std::printf("kv (store-wide) %s (%zu bytes)\n", key.c_str(), s.get_kv(0, key)->size());
    }
    for (const store::ProbeRecord& p : s.probes()) {
      std::printf("probe %s  job %s  window %s  verdict %s  %.1f s  plan '%s'\n", p.key.c_str(),
                  p.job.c_str(), p.window.c_str(), p.verdict.c_str(), p.wall_s,
                  one_line(p.plan, 60).c_str());
    }
  }
  return 0;
}

int cmd_verify(int argc, char** argv) {
  cxxopts::Options opts("store verify",
                        "decompress every blob, check every content hash and zstd checksum, every "
                        "row checksum (runs, steps, checkpoints, metrics, probes, kv), and "
                        "that every referenced blob exists.\nexit 0: sound; exit 3: problems "
                        "found (each bad blob is listed with what references it, each bad row "
                        "with its table and key)");
  opts.add_options()("store", "store file", cxxopts::value<std::string>())("h,help", "show help");
  auto r = parse(opts, argc, argv);
  if (help_or_check(opts, r)) return 0;
  Store s = Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  const std::vector<store::BadItem> bad = s.verify();
  std::string blobs = "blobs checked";  // with their count, unless a corrupt row stops info()
  try {
    blobs = std::to_string(s.info().n_blobs) + " " + blobs;
  } catch (const store::StoreError& e) {
    if (e.code() != ExitCode::kData) throw;
  }
  for (const store::BadItem& item : bad) {
    const std::string what = !item.row.empty()   ? item.row
                             : item.blob.empty() ? std::string("database")
                                                 : "blob " + item.blob;
    std::printf("BAD %s: %s\n", what.c_str(), item.problem.c_str());
    for (const std::string& ref : item.referenced_by) std::printf("    used by %s\n", ref.c_str());
    if (!item.blob.empty() && item.referenced_by.empty()) std::printf("    (unreferenced)\n");
  }
  // Rows stored before the checksums existed are read as they are: say so, once per table.
  int64_t unchecked = 0;
  for (const auto& [table, n] : s.unchecked_rows()) {
    std::printf("unchecked: %lld rows of table %s carry no checksum (%s); their values cannot be checked\n",
                static_cast<long long>(n), table.c_str(),
                s.has_row_sums() ? "written before the store had row checksums"
                                 : "schema version 1, before row checksums");
    unchecked += n;
  }
  std::printf("%s: %s, %zu problem%s%s\n", s.path().c_str(), blobs.c_str(), bad.size(), bad.size() == 1 ? "" : "s",
              unchecked == 0 ? "" : " (some rows unchecked, see above)");
  return bad.empty() ? 0 : static_cast<int>(ExitCode::kData);
}

int cmd_export(int argc, char** argv) {
  cxxopts::Options opts(
      "store export",
      "write one recorded tensor or checkpoint tensor to a numpy .npy file (v1.0, little-endian, "
      "C order).\nbf16 tensors are exported as float32 ('<f4', exact widening) because numpy has "
      "no bfloat16;\nother dtypes keep their type (f16 -> '<f2', u16 -> '<u2', bool -> '|b1').");
  opts.add_options()("store", "store file", cxxopts::value<std::string>())(
      "tensor", "recorded tensor name", cxxopts::value<std::string>())(
      "checkpoint", "checkpoint tensor name (instead of --tensor)", cxxopts::value<std::string>())(
      "step", "step", cxxopts::value<int64_t>())("layer",
                                                 "layer (tensors only; -1 = not per layer)",
                                                 cxxopts::value<int>()->default_value("-1"))(
      "head", "head (tensors only; -1 = not per head)", cxxopts::value<int>()->default_value("-1"))(
      "run", "run id (needed when the store holds several runs)", cxxopts::value<int64_t>())(
      "o,output", "output .npy file", cxxopts::value<std::string>())("h,help", "show help");
  auto r = parse(opts, argc, argv);
  if (help_or_check(opts, r)) return 0;
  if (r.count("tensor") == r.count("checkpoint")) {
    throw UsageError("store export: give exactly one of --tensor NAME or --checkpoint NAME");
  }
  if (!r.count("step")) throw UsageError("store export: --step is required");
  if (!r.count("output")) throw UsageError("store export: -o/--output is required");
  Store s = Store::open(r["store"].as<std::string>(), store::Mode::kReadOnly);
  const int64_t run = pick_run(s, r);
  const int64_t step = r["step"].as<int64_t>();
  std::optional<store::TensorRecord> rec;
  std::string label;
  if (r.count("checkpoint")) {
    label = "checkpoint '" + r["checkpoint"].as<std::string>() + "'";
    rec = s.get_checkpoint_tensor(run, step, r["checkpoint"].as<std::string>());
  } else {
    store::TensorKey key{run, step, r["layer"].as<int>(), r["head"].as<int>(),
                         r["tensor"].as<std::string>()};
    label = "tensor '" + key.name + "'" +
            (key.layer >= 0 ? " L" + std::to_string(key.layer) : std::string()) +
            (key.head >= 0 ? " H" + std::to_string(key.head) : std::string());
    rec = s.get_tensor(key);
  }
  if (!rec) {
    throw store::data_error("store " + s.path() + ": no " + label + " at step " +
                            std::to_string(step) + " in run " + std::to_string(run) +
                            " (see rewind store ls)");
  }
  const std::string out = r["output"].as<std::string>();
  store::write_npy(out, rec->info.dtype, rec->info.shape, rec->bytes.data(), rec->bytes.size());
  std::printf("wrote %s: %s %s %s as '%s'\n", out.c_str(), label.c_str(),
              store::dtype_name(rec->info.dtype), store::shape_to_json(rec->info.shape).c_str(),
              store::npy_descr(rec->info.dtype));
  return 0;
}

void print_help() {
  std::printf(
      "rewind store: inspect a recording store (read-only), or thin its checkpoints\n\n"
      "usage:\n"
      "  rewind store info STORE [--keep-last K] [--keep-every M]\n"
      "                               schema, runs, step ranges, checkpoints, sizes and ratio;\n"
      "                               with a rule: what `store thin` would remove and free\n"
      "  rewind store ls STORE        recorded checkpoints, tensors, metrics, probes, kv\n"
      "  rewind store verify STORE    check every blob and reference; exit 3 if any is bad\n"
      "  rewind store export STORE (--tensor NAME [--layer L --head H] | --checkpoint NAME)\n"
      "                      --step S [--run R] -o out.npy   (bf16 is exported as float32)\n"
      "  rewind store thin STORE [--keep-last K] [--keep-every M] [--keep-steps A,B] [--force] [--run R]\n"
      "                               delete the checkpoints the rule drops and give the space back\n"
      "each takes --help.\n");
}

}  // namespace

int run_store(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    print_help();
    return argc < 2 ? static_cast<int>(ExitCode::kUsage) : 0;
  }
  const std::string sub = argv[1];
  // The subcommand sees itself as argv[0], so cxxopts parses what follows it.
  if (sub == "info") return cmd_info(argc - 1, argv + 1);
  if (sub == "ls") return cmd_ls(argc - 1, argv + 1);
  if (sub == "verify") return cmd_verify(argc - 1, argv + 1);
  if (sub == "export") return cmd_export(argc - 1, argv + 1);
  if (sub == "thin") return cmd_thin(argc - 1, argv + 1);
  throw UsageError("store: unknown subcommand '" + sub + "' (info, ls, verify, export, thin)");
}

}  // namespace rwd::cli
