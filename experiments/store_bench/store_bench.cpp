// store_bench: throughput (MB/s) and compression ratio of the store for the data rewind records
// (token batches, FP32 weights, BF16 activations) at zstd levels 1 and 3, each printed beside a
// plain file write+fsync / read of the same bytes measured in the same run, with and without
// the byte-shuffle filter; then the checkpoint writer's throughput on ~1 GB of FP32 tensors
// shaped like gpt2-small's parameters and first AdamW moments, on 0 to N preparation threads;
// then step-commit latency while such a checkpoint is written (where the WAL is checkpointed).
//
// Fairness: the store commits one transaction per item with synchronous=NORMAL in WAL mode, so
// commits do not fsync; durability is paid at close, when the WAL is checkpointed (fsync'd)
// into the main file. Store write time therefore includes open, every commit, and close. The
// plain baseline writes the same items to one file and fsyncs once at the end. Reads are from
// the page cache (files just written) for both: they measure CPU cost, not the disk.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint_pieces.h"
#include "store/byte_shuffle.h"
#include "store/content_hash.h"
#include "store/store.h"
#include "store/zstd_codec.h"

namespace {

using rwd::store::Dtype;
using rwd::store::Mode;
using rwd::store::Store;
using rwd::store::StoreOptions;
using Clock = std::chrono::steady_clock;

struct Workload {
  const char* name;
  Dtype dtype;
  std::vector<int64_t> shape;  // per item
  std::vector<std::vector<uint8_t>> items;
};

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Token ids < 50304 with a Zipf(s=1.0) rank distribution; ranks map to ids through a fixed
// random permutation, so frequent tokens are spread over the id range like a BPE vocabulary.
Workload tokens(int n_batches, int batch, int seq) {
  constexpr int kVocab = 50304;
  std::mt19937_64 rng(1);
  std::vector<double> cdf(kVocab);
  double acc = 0;
  for (int r = 0; r < kVocab; ++r) cdf[r] = acc += 1.0 / (r + 2.7);
  std::vector<uint16_t> perm(kVocab);
  for (int i = 0; i < kVocab; ++i) perm[i] = static_cast<uint16_t>(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  std::uniform_real_distribution<double> u(0, acc);
  Workload w{"tokens u16 (Zipf)", Dtype::kU16, {batch, seq}, {}};
  for (int b = 0; b < n_batches; ++b) {
    std::vector<uint16_t> t(static_cast<size_t>(batch) * seq);
    for (uint16_t& x : t) {
      x = perm[std::lower_bound(cdf.begin(), cdf.end(), u(rng)) - cdf.begin()];
    }
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t.data());
    w.items.emplace_back(p, p + t.size() * 2);
  }
  return w;
}

Workload weights(int n, int64_t rows, int64_t cols) {
  std::mt19937_64 rng(2);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  Workload w{"weights f32 N(0,.02)", Dtype::kF32, {rows, cols}, {}};
  for (int i = 0; i < n; ++i) {
    std::vector<float> v(static_cast<size_t>(rows * cols));
    for (float& x : v) x = nd(rng);
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    w.items.emplace_back(p, p + v.size() * 4);
  }
  return w;
}

Workload activations(int n, std::vector<int64_t> shape) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Workload w{"activations bf16 N(0,1)", Dtype::kBF16, shape, {}};
  const int64_t numel = rwd::store::shape_numel(shape);
  for (int i = 0; i < n; ++i) {
    std::vector<uint16_t> v(static_cast<size_t>(numel));
    for (uint16_t& x : v) x = rwd::store::f32_to_bf16(nd(rng));
    const uint8_t* p = reinterpret_cast<const uint8_t*>(v.data());
    w.items.emplace_back(p, p + v.size() * 2);
  }
  return w;
}

struct Result {
  double store_write_s = 1e30, store_read_s = 1e30, plain_write_s = 1e30, plain_read_s = 1e30;
  double codec_write_s = 1e30, codec_read_s = 1e30;  // hash + zstd only, in memory
  double store_loop_s = 1e30;  // the per-item commits alone: no create, no close/fsync
  double ratio = 0;
};

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_bench: %s\n", what);
    std::exit(1);
  }
}

void store_once(const Workload& w, int level, bool shuffle, const std::string& path, Result& r) {
  std::remove(path.c_str());
  StoreOptions opt;
  opt.zstd_level = level;
  opt.byte_shuffle = shuffle;
  auto t0 = Clock::now();
  {
    Store s = Store::create(path, opt);
    const int64_t run = s.add_run("{}", "", "{}");
    const auto loop0 = Clock::now();
    for (size_t i = 0; i < w.items.size(); ++i) {
      rwd::store::Transaction txn = s.begin_step();  // one transaction per recorded item
      s.put_tensor({run, static_cast<int64_t>(i), -1, -1, "x"}, w.dtype, w.shape, w.items[i].data(),
                   w.items[i].size());
      txn.commit();
    }
    r.store_loop_s = std::min(r.store_loop_s, seconds_since(loop0));
    const auto info = s.info();
    r.ratio = double(info.raw_bytes) / double(info.stored_bytes);
  }  // close: WAL checkpoint + fsync
  r.store_write_s = std::min(r.store_write_s, seconds_since(t0));
  t0 = Clock::now();
  {
    Store s = Store::open(path, Mode::kReadOnly, opt);
    for (size_t i = 0; i < w.items.size(); ++i) {
      auto t = s.get_tensor({1, static_cast<int64_t>(i), -1, -1, "x"});
      check(t && t->bytes.size() == w.items[i].size(), "read back a wrong tensor");
    }
  }
  r.store_read_s = std::min(r.store_read_s, seconds_since(t0));
}

// The store's CPU floor: content hash + (shuffle) + compress per item, and decompress +
// (unshuffle) + hash back, all in memory.
void codec_once(const Workload& w, int level, bool shuffle, Result& r) {
  rwd::store::ZstdCompressor c(level);
  rwd::store::ZstdDecompressor d;
  const size_t elem = shuffle ? rwd::store::dtype_size(w.dtype) : 1;
  std::vector<rwd::store::Bytes> frames;
  std::vector<uint8_t> tmp;
  auto t0 = Clock::now();
  for (const auto& item : w.items) {
    volatile uint64_t h = rwd::store::xxh64(item.data(), item.size());
    (void)h;
    tmp.resize(item.size());
    rwd::store::byte_shuffle(item.data(), item.size(), elem, tmp.data());
    frames.emplace_back();
    c.compress(tmp.data(), tmp.size(), frames.back());
  }
  r.codec_write_s = std::min(r.codec_write_s, seconds_since(t0));
  t0 = Clock::now();
  for (size_t i = 0; i < frames.size(); ++i) {
    std::vector<uint8_t> out(w.items[i].size());
    tmp.resize(out.size());
    d.decompress(frames[i].data(), frames[i].size(), tmp.data(), tmp.size(), "bench");
    rwd::store::byte_unshuffle(tmp.data(), tmp.size(), elem, out.data());
    volatile uint64_t h = rwd::store::xxh64(out.data(), out.size());
    (void)h;
  }
  r.codec_read_s = std::min(r.codec_read_s, seconds_since(t0));
}

void plain_once(const Workload& w, const std::string& path, Result& r) {
  auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  check(fd >= 0, "cannot create the plain file");
  for (const auto& item : w.items) {
    check(::write(fd, item.data(), item.size()) == static_cast<ssize_t>(item.size()), "write");
  }
  check(::fsync(fd) == 0 && ::close(fd) == 0, "fsync");
  r.plain_write_s = std::min(r.plain_write_s, seconds_since(t0));
  t0 = Clock::now();
  fd = ::open(path.c_str(), O_RDONLY);
  check(fd >= 0, "cannot open the plain file");
  std::vector<uint8_t> buf;
  for (const auto& item : w.items) {
    buf.resize(item.size());  // a fresh buffer per item, like get_blob's result
    check(::read(fd, buf.data(), buf.size()) == static_cast<ssize_t>(buf.size()), "read");
  }
  ::close(fd);
  r.plain_read_s = std::min(r.plain_read_s, seconds_since(t0));
}

// A checkpoint like rewind's recorder writes: gpt2-small's parameters and first AdamW moments
// (2 x 124M floats, 296 tensors from 3 KB to 154 MB). Values are slices of one pool of N(0,.02)
// floats at distinct offsets, so every tensor is a distinct blob that compresses like weights.
struct Checkpoint {
  std::vector<float> pool;
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors;
  std::vector<size_t> offsets;  // into pool, per tensor
  double bytes = 0;
};

Checkpoint gpt2_small_state() {
  Checkpoint c;
  std::vector<std::pair<std::string, std::vector<int64_t>>> params = {{"wte", {50304, 768}},
                                                                      {"wpe", {1024, 768}}};
  for (int l = 0; l < 12; ++l) {
    const std::string p = "h" + std::to_string(l) + ".";
    for (auto& [n, shape] : std::vector<std::pair<std::string, std::vector<int64_t>>>{
             {"ln_1.weight", {768}}, {"ln_1.bias", {768}}, {"attn.c_attn.weight", {768, 2304}},
             {"attn.c_attn.bias", {2304}}, {"attn.c_proj.weight", {768, 768}},
             {"attn.c_proj.bias", {768}}, {"ln_2.weight", {768}}, {"ln_2.bias", {768}},
             {"mlp.c_fc.weight", {768, 3072}}, {"mlp.c_fc.bias", {3072}},
             {"mlp.c_proj.weight", {3072, 768}}, {"mlp.c_proj.bias", {768}}}) {
      params.emplace_back(p + n, shape);
    }
  }
  params.push_back({"ln_f.weight", {768}});
  params.push_back({"ln_f.bias", {768}});
  for (const char* prefix : {"param/", "exp_avg/"}) {
    for (const auto& [n, shape] : params) c.tensors.emplace_back(prefix + n, shape);
  }
  c.pool.resize(size_t(40) << 20);  // 160 MB: larger than the largest tensor
  std::mt19937_64 rng(4);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  for (float& x : c.pool) x = nd(rng);
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const size_t numel = static_cast<size_t>(rwd::store::shape_numel(c.tensors[i].second));
    c.offsets.push_back(rng() % (c.pool.size() - numel + 1));
    c.bytes += double(numel) * 4;
  }
  return c;
}

// Writes `c` as checkpoint (run, step 0) the way write_checkpoint does (`parallel`: put_blobs
// on the store's zstd_workers threads, then rows by hash) or did before (put_blob per tensor
// with that many zstd workers, then put_checkpoint_tensor, which hashes again).
void store_checkpoint(Store& s, int64_t run, const Checkpoint& c, bool parallel) {
  std::vector<rwd::store::BlobSource> blobs;
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const size_t numel = static_cast<size_t>(rwd::store::shape_numel(c.tensors[i].second));
    blobs.push_back({c.pool.data() + c.offsets[i], numel * 4, s.tensor_shuffle(Dtype::kF32)});
  }
  std::vector<std::string> hashes;
  if (parallel) {
    hashes = s.put_blobs(blobs);
  } else {
    for (const auto& b : blobs) hashes.push_back(s.put_blob(b.data, b.size, b.shuffle_elem));
  }
  rwd::store::Transaction txn = s.begin_step();
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const auto& [name, shape] = c.tensors[i];
    if (parallel) {
      s.put_checkpoint_blob(run, 0, name, Dtype::kF32, shape, hashes[i]);
    } else {
      s.put_checkpoint_tensor(run, 0, name, Dtype::kF32, shape, blobs[i].data, blobs[i].size);
    }
  }
  txn.commit();
}

// Seconds to write `c` as one checkpoint into a new store (store_checkpoint) until it is in
// the main file and fsync'd (a final WAL checkpoint), as durable as the plain write + fsync it
// is compared with. Excludes create and close: the recorder's writer keeps its store open.
double checkpoint_once(const Checkpoint& c, const StoreOptions& opt, bool parallel,
                       const std::string& path, double& ratio) {
  for (const char* side : {"", "-wal", "-shm"}) std::remove((path + side).c_str());
  Store s = Store::create(path, opt);
  const int64_t run = s.add_run("{}", "", "{}");
  s.checkpoint_wal();
  const auto t0 = Clock::now();
  store_checkpoint(s, run, c, parallel);
  s.checkpoint_wal();
  const double secs = seconds_since(t0);
  const auto info = s.info();
  ratio = double(info.raw_bytes) / double(info.stored_bytes);
  return secs;
}

// The same bytes as one plain file: write + fsync (the baseline of the checkpoint rows).
double plain_checkpoint_once(const Checkpoint& c, const std::string& path) {
  const auto t0 = Clock::now();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  check(fd >= 0, "cannot create the plain file");
  for (size_t i = 0; i < c.tensors.size(); ++i) {
    const size_t n = static_cast<size_t>(rwd::store::shape_numel(c.tensors[i].second)) * 4;
    check(::write(fd, c.pool.data() + c.offsets[i], n) == static_cast<ssize_t>(n), "write");
  }
  check(::fsync(fd) == 0 && ::close(fd) == 0, "fsync");
  return seconds_since(t0);
}

// Rows: a plain write + fsync of the same bytes (the baseline, best of reps interleaved with
// the store rows), then the store's write at `level` (3 by default, zstd's own default):
// the path before put_blobs (put_blob with the recorder's zstd workers) and put_blobs with
// SQLite's auto-checkpoint in every blob commit (both at the largest thread count only); then
// per thread count 0 (the calling thread), 1, 2, 4 .. max_threads: put_blobs with one WAL
// checkpoint after the checkpoint at 16 KiB pages (the recorder before this change), at
// 64 KiB pages, with the WAL also checkpointed beside the inserts
// (StoreOptions::overlap_checkpoint_bytes), and the store's defaults (the recorder now: zstd 1,
// 16 KiB pages, checkpointed beside).
void bench_checkpoint_write(const std::string& dir, int reps, int max_threads, int level) {
  const Checkpoint c = gpt2_small_state();
  std::printf(
      "\ncheckpoint write: %zu FP32 tensors, %.0f MB (gpt2-small params + exp_avg), +s, best of "
      "%d, %u hardware threads; until fsync'd in the main file\n%-50s %8s %8s %6s %8s %8s\n",
      c.tensors.size(), c.bytes / 1e6, reps, std::thread::hardware_concurrency(), "path",
      "seconds", "MB/s", "ratio", "plain", "x plain");
  const std::string plain_path = dir + "/store_bench.bin";
  // Each row's plain baseline is measured in its own reps, interleaved with the store writes,
  // so a row's ratio compares two writes made under the same load. `opt` starts from the
  // store's defaults; the rows below change what they name.
  auto row = [&](const std::string& what, int threads, StoreOptions opt, bool parallel = true) {
    opt.zstd_workers = threads;
    double best = 1e30, plain = 1e30, ratio = 0;
    for (int i = 0; i < reps; ++i) {
      plain = std::min(plain, plain_checkpoint_once(c, plain_path));
      best = std::min(best, checkpoint_once(c, opt, parallel, dir + "/store_bench.db", ratio));
    }
    const std::string label = what + ", zstd " + std::to_string(opt.zstd_level) + ", " +
                              std::to_string(threads) + " thr";
    std::printf("%-50s %8.2f %8.0f %6.3f %8.0f %8.2f\n", label.c_str(), best, c.bytes / 1e6 / best,
                ratio, c.bytes / 1e6 / plain, plain / best);
    std::fflush(stdout);
  };
  StoreOptions one_ckpt;  // the recorder's options before this change
  one_ckpt.zstd_level = level;
  one_ckpt.page_size = 16384;
  one_ckpt.wal_autocheckpoint = 0;
  one_ckpt.overlap_checkpoint_bytes = 0;
  StoreOptions auto_ckpt = one_ckpt;
  auto_ckpt.wal_autocheckpoint = 1000;
  StoreOptions big_pages = one_ckpt;
  big_pages.page_size = 65536;
  StoreOptions overlap = big_pages;
  overlap.overlap_checkpoint_bytes = StoreOptions{}.overlap_checkpoint_bytes;
  StoreOptions now;
  now.wal_autocheckpoint = 0;  // as the recorder's writer
  const int top = std::min(max_threads, 8);
  row("put_blob, zstd workers, auto-ckpt", top, auto_ckpt, false);
  row("put_blobs, auto-ckpt per commit", top, auto_ckpt);
  std::vector<int> counts;
  for (int t = 0; t <= max_threads; t = t == 0 ? 1 : t * 2) counts.push_back(t);
  if ((max_threads & (max_threads - 1)) != 0) counts.push_back(max_threads);
  for (int t : counts) {
    row("one WAL ckpt, 16 KiB pages (before)", t, one_ckpt);
    row("one WAL ckpt, 64 KiB pages", t, big_pages);
    row("64 KiB, WAL ckpts beside the inserts", t, overlap);
    row("store defaults (now: 16 KiB, beside)", t, now);
  }
}

// One recorded step's transaction: its row and gpt2-small's 576 per-head monitors.
std::vector<std::pair<std::string, double>> gpt2_small_monitors() {
  std::vector<std::pair<std::string, double>> metrics;
  for (int l = 0; l < 12; ++l)
    for (int h = 0; h < 12; ++h)
      for (const char* k : {"wq_sn", "max_logit", "repmax_rate", "pbar_one"})
        metrics.emplace_back("L" + std::to_string(l) + ".H" + std::to_string(h) + "." + k, 0.5);
  return metrics;
}
double commit_step_ms(Store& s, int64_t run, int64_t step,
                      const std::vector<std::pair<std::string, double>>& metrics) {
  const auto t0 = Clock::now();
  rwd::store::Transaction txn = s.begin_step();
  rwd::store::StepRecord rec;
  rec.run = run;
  rec.step = step;
  rec.batch_hash = "0123456789abcdef";
  s.put_step(rec);
  s.put_metrics(run, step, metrics);
  txn.commit();
  return seconds_since(t0) * 1e3;
}

// Recording: one thread commits a step (a row and gpt2-small's 576 per-head monitors) every
// `step_ms` on its own connection while a writer stores checkpoint `c` on another, as the
// recorder's two connections do. Returns the writer's seconds and each step commit's ms.
std::pair<double, std::vector<double>> recording_once(const Checkpoint& c, int threads,
                                                      double step_ms, int autockpt,
                                                      const std::string& path) {
  for (const char* side : {"", "-wal", "-shm"}) std::remove((path + side).c_str());
  StoreOptions opt;
  opt.zstd_workers = threads;
  opt.wal_autocheckpoint = autockpt;
  int64_t run = 0;
  { run = Store::create(path, opt).add_run("{}", "", "{}"); }
  Store steps = Store::open(path, Mode::kReadWrite, opt);
  Store writer = Store::open(path, Mode::kReadWrite, opt);
  const auto metrics = gpt2_small_monitors();
  std::atomic<bool> done{false};
  double writer_s = 0;
  std::thread w([&] {
    const auto t0 = Clock::now();
    store_checkpoint(writer, run, c, /*parallel=*/true);
    writer.checkpoint_wal();  // the recorder's writer does this after each checkpoint
    writer_s = seconds_since(t0);
    done = true;
  });
  std::vector<double> commit_ms;
  for (int64_t step = 0; !done; ++step) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(step_ms * 1000)));
    commit_ms.push_back(commit_step_ms(steps, run, step, metrics));
  }
  w.join();
  return {writer_s, commit_ms};
}

// Step-commit latency beside a checkpoint writer, against the same commits with no writer
// (measured in the same run): what a training thread committing its own steps would wait.
// The recorder commits steps on a thread of its own for this reason.
void bench_recording(const std::string& dir, int reps, int threads, double step_ms) {
  const Checkpoint c = gpt2_small_state();
  std::printf(
      "\nrecording: step commits (row + 576 metrics, one every %.0f ms) while a writer stores a "
      "%.0f MB checkpoint on %d threads, all %d reps\n%-28s %8s %7s %8s %8s %8s %10s\n",
      step_ms, c.bytes / 1e6, threads, reps, "commits", "writer s", "count", "p50 ms", "p99 ms",
      "max ms", "max/alone");
  // Alone: the same commits, 200 of them, into a store with no writer.
  std::vector<double> alone;
  {
    std::remove((dir + "/store_bench.db").c_str());
    Store s = Store::create(dir + "/store_bench.db");
    const int64_t run = s.add_run("{}", "", "{}");
    const auto metrics = gpt2_small_monitors();
    for (int64_t step = 0; step < 200; ++step) alone.push_back(commit_step_ms(s, run, step, metrics));
  }
  auto row = [&](const char* what, double writer_s, std::vector<double> v, double base_max) {
    std::sort(v.begin(), v.end());
    std::printf("%-28s %8.2f %7zu %8.2f %8.2f %8.2f %10.1f\n", what, writer_s, v.size(),
                v[v.size() / 2], v[std::min(v.size() - 1, v.size() * 99 / 100)], v.back(),
                v.back() / base_max);
    return v.back();
  };
  const double base = row("alone (no writer)", 0, alone, *std::max_element(alone.begin(), alone.end()));
  for (int i = 0; i < reps; ++i) {
    auto r = recording_once(c, threads, step_ms, 1000, dir + "/store_bench.db");
    row("beside writer, auto-ckpt", r.first, r.second, base);
    r = recording_once(c, threads, step_ms, 0, dir + "/store_bench.db");
    row("beside writer, no auto-ckpt", r.first, r.second, base);
  }
}

// The per-item table: every workload at zstd 1 and 3, with and without the shuffle.
void bench_items(const std::string& dir, int reps) {
  std::printf(
      "store_bench: dir %s, best of %d, one transaction per item, synchronous=NORMAL "
      "(WAL), fsync at close; plain = write + one fsync\n"
      "MB/s columns: st = store (create .. close incl. fsync), pl = plain file, st.loop = "
      "the store's per-item commits alone,\ncodec = xxh64 + zstd in memory (the store's "
      "CPU floor); reads are from the page cache; zstd column: level, +s = byte shuffle\n",
      dir.c_str(), reps);
  std::vector<Workload> loads;
  loads.push_back(tokens(256, 8, 1024));               // 256 x 16 KiB = 4 MiB
  loads.push_back(weights(8, 1024, 1024));             // 8 x 4 MiB = 32 MiB
  loads.push_back(activations(4, {8, 12, 1024, 64}));  // 4 x 12 MiB = 48 MiB (B, H, T, D)
  std::printf("%-24s %5s %6s %6s | %8s %8s %6s %8s %8s | %8s %8s %6s %8s\n", "workload", "zstd",
              "MiB", "ratio", "st.wr", "pl.wr", "st/pl", "st.loop", "codec.wr", "st.rd", "pl.rd",
              "st/pl", "codec.rd");
  for (const Workload& w : loads) {
    double bytes = 0;
    for (const auto& item : w.items) bytes += double(item.size());
    for (auto [level, shuffle] : {std::pair{1, true}, {3, true}, {3, false}}) {
      Result r;
      for (int i = 0; i < reps; ++i) {
        store_once(w, level, shuffle, dir + "/store_bench.db", r);
        plain_once(w, dir + "/store_bench.bin", r);
        codec_once(w, level, shuffle, r);
      }
      const double mb = bytes / 1e6;
      std::printf(
          "%-24s %5s %6.1f %6.3f | %8.0f %8.0f %6.2f %8.0f %8.0f | %8.0f %8.0f %6.2f %8.0f\n",
          w.name, (std::to_string(level) + (shuffle ? "+s" : "")).c_str(), bytes / (1 << 20),
          r.ratio, mb / r.store_write_s, mb / r.plain_write_s, r.plain_write_s / r.store_write_s,
          mb / r.store_loop_s, mb / r.codec_write_s, mb / r.store_read_s, mb / r.plain_read_s,
          r.plain_read_s / r.store_read_s, mb / r.codec_read_s);
    }
  }
}

}  // namespace

// store_bench DIR [reps] [max_threads] [checkpoint|pieces|recording] [level]: max_threads
// (default: the hardware threads) is the largest preparation thread count of the checkpoint
// rows (the recording rows use at most 8, as the recorder does); `checkpoint` runs the
// checkpoint pieces and rows, `pieces` or `recording` only that table; level (default 3, zstd's
// own default; the store's is 1) is the zstd level of the pieces and of the checkpoint rows
// but the last of each thread count (a negative one, zstd's fast mode, leaves mostly SQLite
// and the disk to time).
int main(int argc, char** argv) {
  const std::string dir = argc > 1 ? argv[1] : ".";
  const int reps = argc > 2 ? std::atoi(argv[2]) : 3;
  const int max_threads =
      argc > 3 ? std::atoi(argv[3])
               : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::string only = argc > 4 ? argv[4] : "";
  const int level = argc > 5 ? std::atoi(argv[5]) : 3;
  if (only.empty()) bench_items(dir, reps);
  if (only.empty() || only == "checkpoint" || only == "pieces") {
    const Checkpoint c = gpt2_small_state();
    std::vector<rwd::bench::TensorBytes> tensors;
    for (size_t i = 0; i < c.tensors.size(); ++i) {
      tensors.push_back({c.pool.data() + c.offsets[i],
                         static_cast<size_t>(rwd::store::shape_numel(c.tensors[i].second)) * 4});
    }
    rwd::bench::bench_checkpoint_pieces(dir, reps, level, tensors);
  }
  if (only.empty() || only == "checkpoint") bench_checkpoint_write(dir, reps, max_threads, level);
  if (only.empty() || only == "recording") bench_recording(dir, reps, std::min(max_threads, 8), 5.0);
  std::remove((dir + "/store_bench.db").c_str());
  std::remove((dir + "/store_bench.bin").c_str());
  return 0;
}
