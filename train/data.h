// Token data: nanoGPT-style uint16 token files (memory-mapped), deterministic batch sampling,
// and the generators behind `rewind data synth` / `rewind data text`. No LibTorch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace rwd::train {

class TokenFile {
 public:
  explicit TokenFile(const std::string& path);  // throws Error(kData) if unreadable/odd size
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  size_t size() const { return n_; }                 // tokens
  const uint16_t* data() const { return tokens_; }
  const std::string& path() const { return path_; }
  // "<tokens>:<fnv1a64 hex of the bytes>": recorded with a run, checked on replay.
  std::string fingerprint() const;
  uint16_t max_token() const;
  // Both read every byte (~1.5-2 s a GB for the hash): a process computes them once per file
  // (device, inode, size and modification time), however many replays and bisect probes
  // open it; a file rewritten in between is read again.
  struct Identity {
    uint64_t dev = 0, ino = 0, size = 0;
    int64_t mtime_s = 0, mtime_ns = 0;
    bool operator<(const Identity& o) const;
  };

 private:
  std::string path_;
  const uint16_t* tokens_ = nullptr;
  size_t n_ = 0;
  size_t mapped_bytes_ = 0;
  Identity id_;
};

// The token-file facts this process has computed, as one environment entry
// ("REWIND_TOKEN_FILE_FACTS=..."; "" when none), so that worker processes it starts for the
// same files (bisect --jobs) trust them instead of reading every byte again. A process reads
// the variable when it first opens a token file; entries whose file identity differs from
// the file it opens are ignored.
std::string token_file_facts_env();

// One micro-batch: `batch` rows of block_size+1 tokens starting at `offsets`.
struct Batch {
  std::vector<int64_t> offsets;  // (batch)
  std::vector<int64_t> x, y;     // (batch, block) inputs and next-token targets
  uint64_t hash = 0;             // fnv1a64 of the sampled tokens
};

// Offsets come from a counter-based generator: splitmix64(seed, step, micro, row), so the
// batch of any step is a pure function of (seed, step, micro) — replay needs no sampler state.
Batch sample_batch(const TokenFile& f, uint64_t data_seed, int64_t step, int micro, int batch,
                   int block);
Batch batch_from_offsets(const TokenFile& f, const std::vector<int64_t>& offsets, int block);

// Deterministic synthetic corpus with learnable structure: seeded bigram and trigram
// successors plus noise over `vocab` symbols (loss falls well below log(vocab)).
void write_synth_tokens(const std::string& path, size_t n_tokens, int vocab, uint64_t seed);
// Byte-level encoding of any file (vocab 256).
size_t write_text_tokens(const std::string& text_path, const std::string& out_path);

}  // namespace rwd::train
