// The pieces of a checkpoint write, each timed alone on one thread over the whole checkpoint:
// what bounds Store::put_blobs + checkpoint_wal against a plain write + fsync.
#include "checkpoint_pieces.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <optional>

#include "store/byte_shuffle.h"
#include "store/content_hash.h"
#include "store/schema.h"
#include "store/store.h"
#include "store/zstd_codec.h"

namespace rwd::bench {
namespace {

using Clock = std::chrono::steady_clock;
using store::Bytes;
using store::kChunkBytes;

void require(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "store_bench: %s\n", what);
    std::exit(1);
  }
}

// One 64 MiB chunk (or a tensor's last, shorter one), as put_blobs splits blobs.
struct Chunk {
  size_t tensor;
  const uint8_t* data;
  size_t size;
};

double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

std::vector<Chunk> chunks_of(const std::vector<TensorBytes>& tensors) {
  std::vector<Chunk> out;
  for (size_t t = 0; t < tensors.size(); ++t) {
    const uint8_t* p = static_cast<const uint8_t*>(tensors[t].data);
    for (size_t off = 0; off < tensors[t].size; off += kChunkBytes) {
      out.push_back({t, p + off, std::min(kChunkBytes, tensors[t].size - off)});
    }
  }
  return out;
}

// Writes the buffers to a new file at `path` and fsyncs it once.
void write_fsync(const std::string& path, const std::vector<std::pair<const void*, size_t>>& bufs) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  require(fd >= 0, "cannot create the plain file");
  for (const auto& [p, n] : bufs) {
    require(::write(fd, p, n) == static_cast<ssize_t>(n), "plain write");
  }
  require(::fsync(fd) == 0 && ::close(fd) == 0, "plain fsync");
}

void fsync_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDWR);
  require(fd >= 0, "cannot open a file to fsync");
  require(::fsync(fd) == 0 && ::close(fd) == 0, "fsync");
}

void remove_store(const std::string& path) {
  for (const char* side : {"", "-wal", "-shm", "-journal"}) std::remove((path + side).c_str());
}

// A new empty store at `path` (page size `page`), opened as a raw connection configured like
// the recorder's writer (synchronous=NORMAL, no auto-checkpoint); `journal` = WAL or DELETE.
store::Db empty_store(const std::string& path, int page, const char* journal) {
  remove_store(path);
  store::StoreOptions opt;
  opt.page_size = page;
  opt.wal_autocheckpoint = 0;
  { store::Store::create(path, opt); }
  store::Db db(path, SQLITE_OPEN_READWRITE);
  store::configure_connection(db, store::Mode::kReadWrite, opt);
  store::Statement mode(db, (std::string("PRAGMA journal_mode=") + journal).c_str());
  require(mode.step(), "setting the journal mode");
  return db;
}

// Inserts every blob's frames and row as put_blobs does; one transaction per blob when
// `per_blob`, else one for all.
void insert_frames(store::Db& db, const std::vector<Chunk>& chunks, const std::vector<Bytes>& frames,
                   const std::vector<std::string>& hashes, const std::vector<TensorBytes>& tensors,
                   int level, bool per_blob) {
  store::Statement ins(db, "INSERT INTO blob_chunks(hash, idx, frame) VALUES (?, ?, ?)");
  store::Statement row(db,
                       "INSERT INTO blobs(hash, raw_size, stored_size, n_chunks, level, shuffle) "
                       "VALUES (?, ?, ?, ?, ?, 4)");
  std::optional<store::Transaction> all;
  if (!per_blob) all.emplace(db);
  size_t k = 0;
  for (size_t t = 0; t < tensors.size(); ++t) {
    std::optional<store::Transaction> one;
    if (per_blob) one.emplace(db);
    int64_t idx = 0, stored = 0;
    for (; k < chunks.size() && chunks[k].tensor == t; ++k, ++idx) {
      ins.reset();
      ins.bind(1, hashes[t]).bind(2, idx).bind_blob(3, frames[k].data(), frames[k].size());
      ins.run();
      stored += static_cast<int64_t>(frames[k].size());
    }
    row.reset();
    row.bind(1, hashes[t]).bind(2, static_cast<int64_t>(tensors[t].size)).bind(3, stored);
    row.bind(4, idx).bind(5, static_cast<int64_t>(level));
    row.run();
    if (one) one->commit();
  }
  if (all) all->commit();
}

}  // namespace

void bench_checkpoint_pieces(const std::string& dir, int reps, int level,
                             const std::vector<TensorBytes>& tensors) {
  const std::vector<Chunk> chunks = chunks_of(tensors);
  double raw = 0;
  for (const TensorBytes& t : tensors) raw += double(t.size);
  const std::string plain_path = dir + "/store_bench.bin";
  const std::string db_path = dir + "/store_bench_pieces.db";

  Bytes scratch(kChunkBytes), copy(kChunkBytes);
  std::vector<Bytes> frames(chunks.size());
  std::vector<std::string> hashes(tensors.size());
  store::ZstdCompressor zstd(level);
  double stored = 0;
  std::vector<std::pair<const void*, size_t>> raw_bufs, frame_bufs;
  for (const Chunk& c : chunks) raw_bufs.emplace_back(c.data, c.size);

  struct Piece {
    const char* name;
    std::function<void()> setup;  // untimed, before each rep
    std::function<void()> body;   // timed
    double best = 1e30;
    double cpu = 1e30;  // this thread's CPU seconds (user + system): robust to a busy machine
  };
  std::vector<Piece> pieces;
  auto add = [&](const char* name, std::function<void()> body, std::function<void()> setup = {}) {
    pieces.push_back({name, std::move(setup), std::move(body)});
  };
  add("plain write + fsync, raw bytes (baseline)", [&] { write_fsync(plain_path, raw_bufs); });
  add("memcpy 64 MiB chunks", [&] {
    for (const Chunk& c : chunks) std::memcpy(copy.data(), c.data, c.size);
  });
  add("content hash (xxh64)", [&] {
    for (size_t t = 0; t < tensors.size(); ++t) {
      hashes[t] = store::content_hash(tensors[t].data, tensors[t].size);
    }
  });
  add("byte shuffle (4-byte elements)", [&] {
    for (const Chunk& c : chunks) store::byte_shuffle(c.data, c.size, 4, scratch.data());
  });
  const std::string zstd_name = "shuffle + zstd " + std::to_string(level) + ", 1 thread";
  add(zstd_name.c_str(), [&] {
    stored = 0;
    for (size_t k = 0; k < chunks.size(); ++k) {
      store::byte_shuffle(chunks[k].data, chunks[k].size, 4, scratch.data());
      zstd.compress(scratch.data(), chunks[k].size, frames[k]);
      stored += double(frames[k].size());
    }
  });
  // Level 1 beside the chosen one, in the same run (its frames are not kept).
  store::ZstdCompressor zstd1(1);
  Bytes frame1;
  double stored1 = 0;
  if (level != 1) {
    add("  the same at zstd 1", [&] {
      stored1 = 0;
      for (const Chunk& c : chunks) {
        store::byte_shuffle(c.data, c.size, 4, scratch.data());
        zstd1.compress(scratch.data(), c.size, frame1);
        stored1 += double(frame1.size());
      }
    });
  }
  add("plain write + fsync, compressed frames", [&] {
    if (frame_bufs.empty()) {
      for (const Bytes& f : frames) frame_bufs.emplace_back(f.data(), f.size());
    }
    write_fsync(plain_path, frame_bufs);
  });
  // The SQLite pieces share one store per rep, made untimed by the first one's setup.
  store::Db db;
  auto fresh = [&](int page, const char* journal) {
    return [&, page, journal] { db = empty_store(db_path, page, journal); };
  };
  auto wal_pieces = [&](const char* inserts, const char* wal_sync, const char* backfill, int page) {
    add(inserts, [&] { insert_frames(db, chunks, frames, hashes, tensors, level, true); },
        fresh(page, "WAL"));
    add(wal_sync, [&] { fsync_file(db_path + "-wal"); });
    add(backfill, [&] {
      int rc = sqlite3_wal_checkpoint_v2(db.get(), "main", SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
      require(rc == SQLITE_OK, "WAL checkpoint");
    });
  };
  wal_pieces("SQLite inserts + commits into the WAL", "  fsync of the WAL",
             "  WAL checkpoint: copy into the db + fsync", 16384);
  wal_pieces("  the same, 64 KiB pages", "  fsync of the WAL, 64 KiB pages",
             "  WAL checkpoint, 64 KiB pages", 65536);
  add("rollback journal: inserts + one commit", [&] {
    insert_frames(db, chunks, frames, hashes, tensors, level, false);
    fsync_file(db_path);  // synchronous=NORMAL syncs the journal, not always the grown db
  }, fresh(16384, "DELETE"));

  for (int r = 0; r < reps; ++r) {
    for (Piece& p : pieces) {
      if (p.setup) p.setup();
      const auto t0 = Clock::now();
      const double c0 = thread_cpu_seconds();
      p.body();
      p.cpu = std::min(p.cpu, thread_cpu_seconds() - c0);
      p.best = std::min(p.best, std::chrono::duration<double>(Clock::now() - t0).count());
    }
  }
  db = store::Db();
  remove_store(db_path);
  const double plain = pieces.front().best;
  std::printf(
      "\ncheckpoint write pieces: %.0f MB raw -> %.0f MB zstd %d+s (ratio %.3f), each piece alone "
      "on one thread, best of %d; x plain = plain write+fsync s / piece s; cpu = the thread's "
      "user+sys s\n%-46s %8s %8s %8s %8s\n",
      raw / 1e6, stored / 1e6, level, raw / stored, reps, "piece", "seconds", "cpu s", "MB/s raw",
      "x plain");
  for (const Piece& p : pieces) {
    std::printf("%-46s %8.2f %8.2f %8.0f %8.2f\n", p.name, p.best, p.cpu, raw / 1e6 / p.best,
                plain / p.best);
  }
  if (level != 1) std::printf("(zstd 1: ratio %.3f)\n", raw / stored1);
  std::fflush(stdout);
}

}  // namespace rwd::bench
