// Store access to checkpoints, per-step tensors, metrics, bisect probes and the kv table.
#include <limits>
#include <utility>

#include "store/row_sum.h"
#include "store/store.h"

namespace rwd::store {
namespace {

// `source` says where the bytes are: given by the caller, or in a stored blob.
void check_size(Dtype dtype, const std::vector<int64_t>& shape, uint64_t nbytes,
                const std::string& name, const std::string& source = "bytes given") {
  for (int64_t d : shape) {
    if (d < 0) throw StoreError(ExitCode::kInternal, "tensor '" + name + "': negative dimension");
  }
  const uint64_t want = static_cast<uint64_t>(shape_numel(shape)) * dtype_size(dtype);
  if (want != nbytes) {
    throw StoreError(ExitCode::kInternal, "tensor '" + name + "': " + std::to_string(nbytes) +
                                              " " + source + ", shape " + shape_to_json(shape) +
                                              " of " + dtype_name(dtype) + " needs " +
                                              std::to_string(want));
  }
}

// Columns: run, step, layer, head, name, dtype, shape, blob, raw_size, stored_size.
TensorInfo read_info(const Statement& st) {
  TensorInfo t;
  t.key.run = st.col_int(0);
  t.key.step = st.col_int(1);
  t.key.layer = static_cast<int>(st.col_int(2));
  t.key.head = static_cast<int>(st.col_int(3));
  t.key.name = st.col_text(4);
  t.dtype = dtype_from_name(st.col_text(5));
  t.shape = shape_from_json(st.col_text(6));
  t.blob = st.col_text(7);
  t.raw_size = st.col_int(8);
  t.stored_size = st.col_int(9);
  return t;
}

// Then the row checksum (column 10) and kCheckpointFrom.
constexpr const char* kCheckpointColumns =
    "SELECT c.run, c.step, -1, -1, c.name, c.dtype, c.shape, c.blob, "
    "coalesce(b.raw_size, -1), coalesce(b.stored_size, -1)";
constexpr const char* kCheckpointFrom = " FROM checkpoints c LEFT JOIN blobs b ON b.hash = c.blob ";
constexpr const char* kTensorColumns =
    "SELECT t.run, t.step, t.layer, t.head, t.name, t.dtype, t.shape, t.blob, "
    "coalesce(b.raw_size, -1), coalesce(b.stored_size, -1) "
    "FROM tensors t LEFT JOIN blobs b ON b.hash = t.blob ";

// Then the row checksum (column 9).
constexpr const char* kProbeColumns = "SELECT key, job, plan, plan_hash, window, verdict, metrics, wall_s, created";

}  // namespace

TensorInfo Store::read_checkpoint_info(const Statement& st) const {
  // Checked before the dtype and shape are parsed: a flipped byte there is corruption too.
  check_row(st, 10,
            checkpoint_row_sum(st.col_int(0), st.col_int(1), st.col_text(4), st.col_text(7),
                               st.col_text(5), st.col_text(6)),
            "checkpoints", [&] {
              return "run " + std::to_string(st.col_int(0)) + " step " +
                     std::to_string(st.col_int(1)) + " tensor '" + st.col_text(4) + "'";
            });
  return read_info(st);
}

std::string Store::checkpoint_select(const char* where) const {
  return std::string(kCheckpointColumns) + (row_sums_ ? ", c.row_sum" : ", NULL") + kCheckpointFrom + where;
}

void Store::put_checkpoint_tensor(int64_t run, int64_t step, const std::string& name, Dtype dtype,
                                  const std::vector<int64_t>& shape, const void* data,
                                  size_t nbytes) {
  require_writable("writing a checkpoint");
  check_size(dtype, shape, nbytes, name);
  in_transaction(db_, [&] {
    insert_checkpoint_row(run, step, name, dtype, shape,
                          write_blob(data, nbytes, tensor_shuffle(dtype)));
  });
}

void Store::put_checkpoint_blob(int64_t run, int64_t step, const std::string& name, Dtype dtype,
                                const std::vector<int64_t>& shape, const std::string& hash) {
  require_writable("writing a checkpoint");
  in_transaction(db_, [&] {
    const std::optional<BlobInfo> blob = blob_info(hash);
    if (!blob) {
      throw data_error("store " + path() + ": checkpoint tensor '" + name + "' at step " +
                       std::to_string(step) + ": blob " + hash + " is not stored");
    }
    check_size(dtype, shape, static_cast<uint64_t>(blob->raw_size), name, "bytes in blob " + hash);
    insert_checkpoint_row(run, step, name, dtype, shape, hash);
  });
}

void Store::insert_checkpoint_row(int64_t run, int64_t step, const std::string& name, Dtype dtype,
                                  const std::vector<int64_t>& shape, const std::string& hash) {
  Statement st(db_, row_sums_ ? "INSERT INTO checkpoints(run, step, name, blob, dtype, shape, row_sum) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?)"
                             : "INSERT INTO checkpoints(run, step, name, blob, dtype, shape) "
                               "VALUES (?, ?, ?, ?, ?, ?)");
  const std::string dtype_text = dtype_name(dtype), shape_text = shape_to_json(shape);
  st.bind(1, run).bind(2, step).bind(3, name).bind(4, hash);
  st.bind(5, dtype_text).bind(6, shape_text);
  if (row_sums_) st.bind(7, checkpoint_row_sum(run, step, name, hash, dtype_text, shape_text));
  st.run();
}

std::vector<int64_t> Store::checkpoint_steps(int64_t run) {
  std::vector<int64_t> out;
  Statement st(db_, "SELECT DISTINCT step FROM checkpoints WHERE run=? ORDER BY step");
  st.bind(1, run);
  while (st.step()) out.push_back(st.col_int(0));
  return out;
}

std::optional<int64_t> Store::nearest_checkpoint(int64_t run, int64_t step) {
  Statement st(db_, "SELECT max(step) FROM checkpoints WHERE run=? AND step<=?");
  st.bind(1, run).bind(2, step);
  if (!st.step() || st.is_null(0)) return std::nullopt;
  return st.col_int(0);
}

std::vector<TensorInfo> Store::checkpoint_entries(int64_t run, int64_t step) {
  std::vector<TensorInfo> out;
  Statement st(db_, checkpoint_select("WHERE c.run=? AND c.step=? ORDER BY c.name").c_str());
  st.bind(1, run).bind(2, step);
  while (st.step()) out.push_back(read_checkpoint_info(st));
  return out;
}

std::optional<TensorRecord> Store::read_tensor(TensorInfo info) {
  return std::move(read_tensors({std::move(info)}, 0).front());
}

std::vector<TensorRecord> Store::read_tensors(std::vector<TensorInfo> infos, int threads) {
  std::vector<TensorRecord> out(infos.size());
  read_tensors_into(infos, threads, [&](size_t i) {
    out[i].bytes.resize(static_cast<size_t>(shape_numel(infos[i].shape)) * dtype_size(infos[i].dtype));
    return out[i].bytes.data();
  });
  for (size_t i = 0; i < infos.size(); ++i) out[i].info = std::move(infos[i]);
  return out;
}

void Store::read_tensors_into(const std::vector<TensorInfo>& infos, int threads,
                              const std::function<uint8_t*(size_t)>& dest) {
  std::vector<std::string> hashes;
  for (const auto& info : infos) hashes.push_back(info.blob);
  get_blobs_into(hashes, threads, [&](size_t i, size_t bytes) {
    const TensorInfo& info = infos[i];
    const uint64_t want = static_cast<uint64_t>(shape_numel(info.shape)) * dtype_size(info.dtype);
    if (bytes != want) {
      throw data_error("store " + path() + ": tensor '" + info.key.name + "' at step " +
                       std::to_string(info.key.step) + " has " + std::to_string(bytes) +
                       " bytes, its shape needs " + std::to_string(want));
    }
    return dest(i);
  });
}

std::optional<TensorRecord> Store::get_checkpoint_tensor(int64_t run, int64_t step,
                                                         const std::string& name) {
  Statement st(db_, checkpoint_select("WHERE c.run=? AND c.step=? AND c.name=?").c_str());
  st.bind(1, run).bind(2, step).bind(3, name);
  if (!st.step()) return std::nullopt;
  return read_tensor(read_checkpoint_info(st));
}

void Store::put_tensor(const TensorKey& key, Dtype dtype, const std::vector<int64_t>& shape,
                       const void* data, size_t nbytes) {
  require_writable("writing a tensor");
  check_size(dtype, shape, nbytes, key.name);
  in_transaction(db_, [&] {
    const std::string hash = write_blob(data, nbytes, tensor_shuffle(dtype));
    Statement st(db_,
                 "INSERT INTO tensors(run, step, layer, head, name, dtype, shape, blob) "
                 "VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
    st.bind(1, key.run).bind(2, key.step).bind(3, int64_t{key.layer}).bind(4, int64_t{key.head});
    st.bind(5, key.name).bind(6, std::string(dtype_name(dtype))).bind(7, shape_to_json(shape));
    st.bind(8, hash);
    st.run();
  });
}

std::optional<TensorRecord> Store::get_tensor(const TensorKey& key) {
  Statement st(db_, (std::string(kTensorColumns) +
                     "WHERE t.run=? AND t.step=? AND t.layer=? AND t.head=? AND t.name=?")
                        .c_str());
  st.bind(1, key.run).bind(2, key.step).bind(3, int64_t{key.layer}).bind(4, int64_t{key.head});
  st.bind(5, key.name);
  if (!st.step()) return std::nullopt;
  return read_tensor(read_info(st));
}

std::vector<TensorInfo> Store::tensors(int64_t run, int64_t from, int64_t to) {
  std::vector<TensorInfo> out;
  Statement st(db_, (std::string(kTensorColumns) + "WHERE t.run=? AND t.step BETWEEN ? AND ? "
                                                   "ORDER BY t.step, t.layer, t.head, t.name")
                        .c_str());
  st.bind(1, run).bind(2, from).bind(3, to);
  while (st.step()) out.push_back(read_info(st));
  return out;
}

void Store::put_metric(int64_t run, int64_t step, const std::string& key, double value) {
  put_metrics(run, step, {{key, value}});
}

void Store::put_metrics(int64_t run, int64_t step,
                        const std::vector<std::pair<std::string, double>>& kv) {
  require_writable("writing a metric");
  in_transaction(db_, [&] {
    Statement st(db_, row_sums_ ? "INSERT OR REPLACE INTO metrics(run, step, key, value, row_sum) VALUES (?, ?, ?, ?, ?)"
                                 : "INSERT OR REPLACE INTO metrics(run, step, key, value) VALUES (?, ?, ?, ?)");
    for (const auto& [key, value] : kv) {
      st.reset();
      st.bind(1, run).bind(2, step).bind(3, key).bind(4, value);
      if (row_sums_) st.bind(5, metric_row_sum(run, step, key, value));
      st.run();
    }
  });
}

std::vector<MetricRow> Store::metrics(int64_t run, int64_t from, int64_t to,
                                      const std::string& key_prefix) {
  std::vector<MetricRow> out;
  // NaN is stored by SQLite as NULL; it comes back as NaN.
  Statement st(db_, (std::string("SELECT step, key, value") + row_sum_column() +
                     " FROM metrics WHERE run=? AND step BETWEEN ? AND ? "
                     "AND substr(key, 1, ?) = ? ORDER BY step, key")
                        .c_str());
  st.bind(1, run).bind(2, from).bind(3, to);
  st.bind(4, static_cast<int64_t>(key_prefix.size())).bind(5, key_prefix);
  while (st.step()) {
    double v = st.is_null(2) ? std::numeric_limits<double>::quiet_NaN() : st.col_double(2);
    MetricRow m{st.col_int(0), st.col_text(1), v};
    check_row(st, 3, metric_row_sum(run, m.step, m.key, v), "metrics", [&] {
      return "run " + std::to_string(run) + " step " + std::to_string(m.step) + " metric '" + m.key + "'";
    });
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<std::string> Store::metric_keys(int64_t run) {
  std::vector<std::string> out;
  Statement st(db_, "SELECT DISTINCT key FROM metrics WHERE run=? ORDER BY key");
  st.bind(1, run);
  while (st.step()) out.push_back(st.col_text(0));
  return out;
}

void Store::put_probe(const ProbeRecord& p) {
  require_writable("writing a probe");
  Statement st(db_, row_sums_ ? "INSERT OR REPLACE INTO probes(key, job, plan, plan_hash, window, verdict, "
                               "metrics, wall_s, row_sum) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                             : "INSERT OR REPLACE INTO probes(key, job, plan, plan_hash, window, verdict, "
                               "metrics, wall_s) VALUES (?, ?, ?, ?, ?, ?, ?, ?)");
  st.bind(1, p.key).bind(2, p.job).bind(3, p.plan).bind(4, p.plan_hash).bind(5, p.window);
  st.bind(6, p.verdict).bind(7, p.metrics).bind(8, p.wall_s);
  if (row_sums_) st.bind(9, probe_row_sum(p));
  st.run();
}

std::optional<ProbeRecord> Store::get_probe(const std::string& key) {
  Statement st(db_, (std::string(kProbeColumns) + row_sum_column() + " FROM probes WHERE key=?").c_str());
  st.bind(1, key);
  if (!st.step()) return std::nullopt;
  return read_checked_probe(st);
}

std::vector<ProbeRecord> Store::probes(const std::string& job) {
  std::vector<ProbeRecord> out;
  Statement st(db_, (std::string(kProbeColumns) + row_sum_column() +
                     " FROM probes WHERE ?='' OR job=? ORDER BY created, key")
                        .c_str());
  st.bind(1, job).bind(2, job);
  while (st.step()) out.push_back(read_checked_probe(st));
  return out;
}

ProbeRecord Store::read_checked_probe(const Statement& st) const {
  ProbeRecord p = probe_from_row(st, true);
  check_row(st, 9, probe_row_sum(p), "probes", [&] { return "probe '" + p.key + "'"; });
  return p;
}

void Store::put_kv(int64_t run, const std::string& key, const std::string& value) {
  require_writable("writing a kv entry");
  Statement st(db_, row_sums_ ? "INSERT OR REPLACE INTO kv(run, key, value, row_sum) VALUES (?, ?, ?, ?)"
                             : "INSERT OR REPLACE INTO kv(run, key, value) VALUES (?, ?, ?)");
  st.bind(1, run).bind(2, key).bind(3, value);
  if (row_sums_) st.bind(4, kv_row_sum(run, key, value));
  st.run();
}

std::optional<std::string> Store::get_kv(int64_t run, const std::string& key) {
  Statement st(db_, (std::string("SELECT value") + row_sum_column() + " FROM kv WHERE run=? AND key=?").c_str());
  st.bind(1, run).bind(2, key);
  if (!st.step()) return std::nullopt;
  std::string value = st.col_text(0);
  check_row(st, 1, kv_row_sum(run, key, value), "kv",
            [&] { return "run " + std::to_string(run) + " key '" + key + "'"; });
  return value;
}

std::vector<std::string> Store::kv_keys(int64_t run, const std::string& prefix) {
  std::vector<std::string> out;
  Statement st(db_, "SELECT key FROM kv WHERE run=? AND substr(key, 1, ?) = ? ORDER BY key");
  st.bind(1, run).bind(2, static_cast<int64_t>(prefix.size())).bind(3, prefix);
  while (st.step()) out.push_back(st.col_text(0));
  return out;
}

}  // namespace rwd::store
