// Whole-store summaries (info) and the integrity check (verify): every blob is decompressed
// and hashed, every reference resolved, and each problem is reported with its referrers.
#include <sys/stat.h>

#include <limits>
#include <map>
#include <utility>

#include "store/content_hash.h"
#include "store/row_sum.h"
#include "store/store.h"

namespace rwd::store {
namespace {

int64_t file_size(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 ? static_cast<int64_t>(st.st_size) : 0;
}

std::string where(int64_t run, int64_t step) {
  return "run " + std::to_string(run) + " step " + std::to_string(step);
}

// Each covered table: the query of its rows (the checksum last), the checksum of a row as
// read, and the row's name in a report.
struct SummedTable {
  const char* table;
  const char* columns;
  int n_columns;  // the checksum's column index
  int64_t (*sum)(const Statement&);
  std::string (*name)(const Statement&);
};

double real_or_nan(const Statement& st, int col) {
  return st.is_null(col) ? std::numeric_limits<double>::quiet_NaN() : st.col_double(col);
}

const SummedTable kSummedTables[] = {
    {"runs", "id, config, plan, meta", 4,
     [](const Statement& st) { return run_row_sum(st.col_int(0), st.col_text(1), st.col_text(2), st.col_text(3)); },
     [](const Statement& st) { return "run " + std::to_string(st.col_int(0)); }},
    {"steps", "run, step, lr, loss_bits, grad_norm_bits, param_digest, batch_ref, batch_hash, rng_ref, extra", 10,
     [](const Statement& st) { return step_row_sum(step_from_row(st)); },
     [](const Statement& st) { return where(st.col_int(0), st.col_int(1)); }},
    {"checkpoints", "run, step, name, blob, dtype, shape", 6,
     [](const Statement& st) {
       return checkpoint_row_sum(st.col_int(0), st.col_int(1), st.col_text(2), st.col_text(3),
                                 st.col_text(4), st.col_text(5));
     },
     [](const Statement& st) { return where(st.col_int(0), st.col_int(1)) + " tensor '" + st.col_text(2) + "'"; }},
    {"metrics", "run, step, key, value", 4,
     [](const Statement& st) { return metric_row_sum(st.col_int(0), st.col_int(1), st.col_text(2), real_or_nan(st, 3)); },
     [](const Statement& st) { return where(st.col_int(0), st.col_int(1)) + " metric '" + st.col_text(2) + "'"; }},
    {"probes", "key, job, plan, plan_hash, window, verdict, metrics, wall_s", 8,
     [](const Statement& st) { return probe_row_sum(probe_from_row(st, false)); },
     [](const Statement& st) { return "probe '" + st.col_text(0) + "'"; }},
    {"kv", "run, key, value", 3,
     [](const Statement& st) { return kv_row_sum(st.col_int(0), st.col_text(1), st.col_text(2)); },
     [](const Statement& st) { return "run " + std::to_string(st.col_int(0)) + " key '" + st.col_text(1) + "'"; }},
};

}  // namespace

std::vector<std::pair<std::string, int64_t>> Store::unchecked_rows() {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const SummedTable& t : kSummedTables) {
    const std::string sql = std::string("SELECT count(*) FROM ") + t.table + (row_sums_ ? " WHERE row_sum IS NULL" : "");
    const int64_t n = db_.query_int(sql, "counting rows without a checksum");
    if (n > 0) out.emplace_back(t.table, n);
  }
  return out;
}

std::vector<std::string> Store::blob_references(const std::string& hash) {
  std::vector<std::string> out;
  {
    Statement st(db_,
                 "SELECT run, step, batch_ref=?1, rng_ref=?1 FROM steps "
                 "WHERE batch_ref=?1 OR rng_ref=?1 ORDER BY run, step");
    st.bind(1, hash);
    while (st.step()) {
      if (st.col_int(2)) out.push_back(where(st.col_int(0), st.col_int(1)) + " batch");
      if (st.col_int(3)) out.push_back(where(st.col_int(0), st.col_int(1)) + " rng state");
    }
  }
  {
    Statement st(db_,
                 "SELECT run, step, name FROM checkpoints WHERE blob=? ORDER BY run, step, name");
    st.bind(1, hash);
    while (st.step()) {
      out.push_back(where(st.col_int(0), st.col_int(1)) + " checkpoint '" + st.col_text(2) + "'");
    }
  }
  {
    Statement st(db_,
                 "SELECT run, step, layer, head, name FROM tensors WHERE blob=? "
                 "ORDER BY run, step, layer, head, name");
    st.bind(1, hash);
    while (st.step()) {
      std::string s = where(st.col_int(0), st.col_int(1)) + " tensor '" + st.col_text(4) + "'";
      if (st.col_int(2) >= 0) s += " L" + std::to_string(st.col_int(2));
      if (st.col_int(3) >= 0) s += " H" + std::to_string(st.col_int(3));
      out.push_back(s);
    }
  }
  return out;
}

std::vector<BadItem> Store::verify() {
  std::map<std::string, std::string> problems;  // blob hash -> first problem found
  std::vector<BadItem> out;
  const std::string prefix = "store " + path() + ": ";
  auto strip = [&](std::string msg) {
    if (msg.compare(0, prefix.size(), prefix) == 0) msg.erase(0, prefix.size());
    return msg;
  };
  {
    Statement st(db_, "PRAGMA quick_check");
    while (st.step()) {
      if (st.col_text(0) != "ok") out.push_back({"", "sqlite quick_check: " + st.col_text(0), {}, ""});
    }
  }
  {
    // Rows pointing at a missing run (blob references are checked below, by blob).
    Statement st(db_, "PRAGMA foreign_key_check");
    std::map<std::string, int64_t> orphans;
    while (st.step()) {
      if (st.col_text(2) == "runs") ++orphans[st.col_text(0)];
    }
    for (const auto& [table, n] : orphans) {
      out.push_back(
          {"", "table " + table + ": " + std::to_string(n) + " rows of a missing run", {}, ""});
    }
  }
  if (row_sums_) {
    for (const SummedTable& t : kSummedTables) {
      Statement st(db_, (std::string("SELECT ") + t.columns + ", row_sum FROM " + t.table +
                         " WHERE row_sum IS NOT NULL").c_str());
      const int col = t.n_columns;
      while (st.step()) {
        if (st.col_int(col) == t.sum(st)) continue;
        const std::string row = std::string("table ") + t.table + ", " + t.name(st);
        out.push_back({"", std::string("row checksum mismatch (it protects ") + row_sum_protects(t.table) + ")", {}, row});
      }
    }
  }
  std::vector<std::pair<std::string, int64_t>> blobs;
  {
    Statement st(db_, "SELECT hash, stored_size FROM blobs ORDER BY hash");
    while (st.step()) blobs.emplace_back(st.col_text(0), st.col_int(1));
  }
  for (const auto& [hash, stored] : blobs) {
    if (!is_content_hash(hash)) {
      problems.emplace(hash, "key is not a content hash");
      continue;
    }
    try {
      get_blob(hash);  // checks frames, sizes, zstd checksums and the content hash
    } catch (const StoreError& e) {
      if (e.code() != ExitCode::kData) throw;
      problems.emplace(hash, strip(e.what()));
      continue;
    }
    Statement st(db_, "SELECT coalesce(sum(length(frame)), 0) FROM blob_chunks WHERE hash=?");
    st.bind(1, hash);
    st.step();
    if (st.col_int(0) != stored) {
      problems.emplace(hash, "stored_size " + std::to_string(stored) + " but frames hold " +
                                 std::to_string(st.col_int(0)) + " bytes");
    }
  }
  {
    Statement st(
        db_, "SELECT DISTINCT hash FROM blob_chunks WHERE hash NOT IN (SELECT hash FROM blobs)");
    while (st.step()) problems.emplace(st.col_text(0), "chunks without a blob row");
  }
  {
    Statement st(db_,
                 "SELECT ref FROM (SELECT batch_ref AS ref FROM steps UNION "
                 "SELECT rng_ref FROM steps UNION SELECT blob FROM checkpoints UNION "
                 "SELECT blob FROM tensors) WHERE ref IS NOT NULL AND "
                 "ref NOT IN (SELECT hash FROM blobs)");
    while (st.step()) problems.emplace(st.col_text(0), "referenced blob is missing");
  }
  // A tensor row whose dtype/shape disagree with its blob's size is bad even if the blob is fine.
  {
    Statement st(db_,
                 "SELECT t.blob, t.dtype, t.shape, b.raw_size, t.name, t.run, t.step FROM "
                 "(SELECT blob, dtype, shape, name, run, step FROM tensors UNION ALL "
                 "SELECT blob, dtype, shape, name, run, step FROM checkpoints) t "
                 "JOIN blobs b ON b.hash = t.blob");
    while (st.step()) {
      const std::string what = where(st.col_int(5), st.col_int(6)) + " '" + st.col_text(4) + "': ";
      try {
        const int64_t want = shape_numel(shape_from_json(st.col_text(2))) *
                             static_cast<int64_t>(dtype_size(dtype_from_name(st.col_text(1))));
        if (want != st.col_int(3)) {
          problems.emplace(st.col_text(0), what + "dtype " + st.col_text(1) + " shape " +
                                               st.col_text(2) + " needs " + std::to_string(want) +
                                               " bytes, blob holds " +
                                               std::to_string(st.col_int(3)));
        }
      } catch (const StoreError& e) {
        problems.emplace(st.col_text(0), what + e.what());
      }
    }
  }
  for (const auto& [hash, problem] : problems) {
    out.push_back({hash, problem, blob_references(hash), ""});
  }
  return out;
}

int64_t Store::file_bytes() const { return file_size(path()) + file_size(path() + "-wal"); }

StoreInfo Store::info() {
  StoreInfo info;
  info.schema_version = schema_version_;
  for (RunInfo& r : runs()) {
    RunSummary s;
    s.step_range = step_range(r.id);
    s.checkpoint_steps = checkpoint_steps(r.id);
    Statement st(db_,
                 "SELECT (SELECT count(*) FROM steps WHERE run=?1), "
                 "(SELECT count(*) FROM tensors WHERE run=?1), "
                 "(SELECT count(*) FROM metrics WHERE run=?1)");
    st.bind(1, r.id);
    st.step();
    s.n_steps = st.col_int(0);
    s.n_tensors = st.col_int(1);
    s.n_metrics = st.col_int(2);
    s.run = std::move(r);
    info.runs.push_back(std::move(s));
  }
  // Blobs by the kind of row that refers to them: checkpoints, captured tensors,
  // steps' batches and RNG states.
  Statement st(db_,
               "SELECT count(*), coalesce(sum(raw_size), 0), coalesce(sum(stored_size), 0), "
               "(SELECT count(*) FROM probes), (SELECT count(*) FROM kv), "
               "(SELECT count(*) FROM (SELECT DISTINCT run, step FROM checkpoints)), "
               "(SELECT coalesce(sum(stored_size), 0) FROM blobs WHERE hash IN (SELECT blob FROM checkpoints)), "
               "(SELECT coalesce(sum(stored_size), 0) FROM blobs WHERE hash IN (SELECT blob FROM tensors)), "
               "(SELECT coalesce(sum(stored_size), 0) FROM blobs WHERE hash IN "
               "(SELECT batch_ref FROM steps UNION SELECT rng_ref FROM steps)) FROM blobs");
  st.step();
  int64_t* out[] = {&info.n_blobs, &info.raw_bytes, &info.stored_bytes, &info.n_probes, &info.n_kv,
                    &info.n_checkpoints, &info.checkpoint_bytes, &info.tensor_bytes, &info.step_blob_bytes};
  for (int c = 0; c < 9; ++c) *out[c] = st.col_int(c);
  info.file_bytes = file_bytes();
  info.free_bytes = free_bytes();
  info.incremental_vacuum = incremental_vacuum();
  try {
    Statement pages(db_, "SELECT name, sum(pgsize) AS b FROM dbstat GROUP BY name ORDER BY b DESC, name");
    while (pages.step()) info.table_bytes.emplace_back(pages.col_text(0), pages.col_int(1));
  } catch (const StoreError&) {
    info.table_bytes.clear();  // no dbstat in this SQLite build: the per-table sizes are left out
  }
  return info;
}

}  // namespace rwd::store
