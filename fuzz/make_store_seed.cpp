// Writes the fuzz seeds of fuzz_store: small, valid stores (512-byte pages) holding every kind
// of row the reader reads: a run, steps with a stored batch, metrics, a checkpoint, captured
// tensors of several dtypes, a probe and kv text. Usage: make_store_seed DIR.
#include <cstdio>
#include <string>
#include <vector>

#include "store/store.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_store_seed DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  for (int variant = 0; variant < 2; ++variant) {
    const std::string path = dir + "/seed" + std::to_string(variant);  // no .db: not ignored by git
    std::remove(path.c_str());
    rwd::store::StoreOptions opt;
    opt.page_size = 512;
    opt.byte_shuffle = variant == 1;
    {
      rwd::store::Store s = rwd::store::Store::create(path, opt);
      const int64_t run = s.add_run("{\"n_layer\":1}", "{\"base\":\"\"}", "{\"threads\":1}");
      for (int64_t step = 0; step < 3; ++step) {
        auto txn = s.begin_step();
        const std::vector<uint16_t> tokens = {1, 2, 3, uint16_t(step)};
        rwd::store::StepRecord r;
        r.run = run;
        r.step = step;
        r.lr = 1e-3;
        r.batch_hash = "00000000000000" + std::to_string(10 + step);
        r.batch_ref = s.put_blob(tokens.data(), tokens.size() * 2, 2);
        r.extra = "{\"offsets\":[[0]]}";
        s.put_step(r);
        s.put_metrics(run, step, {{"lr", 1e-3}, {"L0.H0.wq_sn", 1.5}});
        const std::vector<uint16_t> bf16 = {0x3f80, 0x4000, 0xbf80, 0x7fc0, 0, 0};
        s.put_tensor({run, step, 0, 0, "o"}, rwd::store::Dtype::kBF16, {2, 3}, bf16.data(), 12);
        txn.commit();
      }
      const std::vector<float> w = {0.5f, -0.25f, 1.0f, 2.0f};
      s.put_checkpoint_tensor(run, 0, "param/w", rwd::store::Dtype::kF32, {2, 2}, w.data(), 16);
      const std::vector<int64_t> n = {7};
      s.put_checkpoint_tensor(run, 0, "step", rwd::store::Dtype::kI64, {}, n.data(), 8);
      rwd::store::ProbeRecord p;
      p.key = "k";
      p.job = "j";
      p.plan = "L0.H0.pv=fp32";
      p.plan_hash = "0";
      p.window = "0:2";
      p.verdict = "pass";
      p.metrics = "{}";
      s.put_probe(p);
      s.put_kv(run, "curve", "[1,2]");
    }
    std::remove((path + "-wal").c_str());
    std::remove((path + "-shm").c_str());
  }
  return 0;
}
