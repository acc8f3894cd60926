// Reading blobs: the frames of a batch of blobs are read on the calling thread (the store's one
// SQLite connection), then decompressed, unshuffled and hashed on worker threads.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "store/blob_format.h"
#include "store/byte_shuffle.h"
#include "store/content_hash.h"
#include "store/sqlite_db.h"
#include "store/store.h"
#include "store/store_error.h"

namespace rwd::store {

namespace {

// Compressed bytes read ahead of their decompression: what a batch holds at most (one blob's
// frames may exceed it on their own).
constexpr size_t kReadAheadBytes = size_t(256) << 20;

struct Frame {
  size_t blob;   // index into the request
  size_t off;    // into the blob's raw bytes
  size_t len;    // raw bytes of this chunk
  Bytes data;    // the zstd frame
  std::string what;
};

// Runs work(i, worker) for i in [0, n) on `threads` threads (0: the calling thread, worker 0);
// rethrows the first exception once all have stopped.
template <class F>
void parallel_for(size_t n, int threads, F work) {
  if (threads <= 0 || n <= 1) {
    for (size_t i = 0; i < n; ++i) work(i, 0);
    return;
  }
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex mu;
  std::vector<std::thread> pool;
  const int count = static_cast<int>(std::min<size_t>(static_cast<size_t>(threads), n));
  for (int w = 0; w < count; ++w)
    pool.emplace_back([&, w] {
      for (size_t i; (i = next.fetch_add(1)) < n;) {
        try {
          work(i, w);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          next = n;
        }
      }
    });
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace

std::vector<uint8_t> Store::get_blob(const std::string& hash) { return std::move(get_blobs({hash}, 0).front()); }

std::vector<std::vector<uint8_t>> Store::get_blobs(const std::vector<std::string>& hashes, int threads) {
  std::vector<std::vector<uint8_t>> out(hashes.size());
  std::vector<BlobInfo> infos;
  for (const std::string& hash : hashes) {
    std::optional<BlobInfo> info = blob_info(hash);
    const std::string what = "store " + path() + ": blob " + hash;
    if (!info) throw data_error(what + " is missing");
    if (info->raw_size < 0 || !valid_shuffle(info->shuffle) ||
        info->n_chunks != int64_t(chunk_count(static_cast<size_t>(info->raw_size))))
      throw data_error(what + ": inconsistent size/chunk count/shuffle in its row");
    infos.push_back(*info);
  }
  // Per worker: its decompressor and unshuffle scratch (worker 0 without threads: the store's).
  std::vector<ZstdDecompressor> own(threads > 0 ? static_cast<size_t>(threads) : 0);
  std::vector<Bytes> scratch(threads > 0 ? static_cast<size_t>(threads) : 0);
  auto decompressor = [&](int w) -> ZstdDecompressor& { return threads > 0 ? own[w] : decompressor_; };
  auto scratch_of = [&](int w) -> Bytes& { return threads > 0 ? scratch[w] : scratch_; };

  std::vector<Frame> frames;
  std::vector<size_t> batch;  // blobs whose frames are in `frames`
  size_t held = 0;
  auto flush = [&] {
    parallel_for(frames.size(), threads, [&](size_t i, int w) {
      Frame& f = frames[i];
      uint8_t* dst = out[f.blob].data() + f.off;
      if (infos[f.blob].shuffle == 1) {
        decompressor(w).decompress(f.data.data(), f.data.size(), dst, f.len, f.what.c_str());
      } else {
        Bytes& s = scratch_of(w);
        resize_for_overwrite(s, f.len);
        decompressor(w).decompress(f.data.data(), f.data.size(), s.data(), f.len, f.what.c_str());
        byte_unshuffle(s.data(), f.len, static_cast<size_t>(infos[f.blob].shuffle), dst);
      }
      f.data = Bytes();
    });
    parallel_for(batch.size(), threads, [&](size_t i, int) {
      const size_t b = batch[i];
      if (content_hash(out[b].data(), out[b].size()) != hashes[b])
        throw data_error("store " + path() + ": blob " + hashes[b] + ": content hash mismatch after decompression");
    });
    frames.clear();
    batch.clear();
    held = 0;
  };
  for (size_t b = 0; b < hashes.size(); ++b) {
    const std::string what = "store " + path() + ": blob " + hashes[b];
    out[b].resize(static_cast<size_t>(infos[b].raw_size));
    Statement st(db_, "SELECT idx, frame FROM blob_chunks WHERE hash=? ORDER BY idx");
    st.bind(1, hashes[b]);
    int64_t idx = 0;
    while (st.step()) {
      if (st.col_int(0) != idx || idx >= infos[b].n_chunks)
        throw data_error(what + ": unexpected chunk " + std::to_string(st.col_int(0)));
      const size_t off = static_cast<size_t>(idx) * kChunkBytes;
      Frame f{b, off, std::min(kChunkBytes, out[b].size() - off), Bytes(), what + " chunk " + std::to_string(idx)};
      resize_for_overwrite(f.data, st.col_bytes(1));  // (assign would construct byte by byte)
      if (!f.data.empty()) std::memcpy(f.data.data(), st.col_blob(1), f.data.size());
      held += f.data.size();
      frames.push_back(std::move(f));
      ++idx;
    }
    if (idx != infos[b].n_chunks)
      throw data_error(what + ": has " + std::to_string(idx) + " of " + std::to_string(infos[b].n_chunks) + " chunks");
    batch.push_back(b);
    if (held >= kReadAheadBytes) flush();
  }
  flush();
  return out;
}

}  // namespace rwd::store
