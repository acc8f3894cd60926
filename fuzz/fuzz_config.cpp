// Fuzz target: the JSON config of `rewind train --config` and of a store's runs table
// (train::Config::from_json + validate), and one `--key value` override (set_config_value).
// A config that parses must survive to_json -> from_json unchanged.
#include "fuzz/fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text = rwd::fuzz::as_text(data, size);
  rwd::fuzz::expect_clean([&] {
    const rwd::train::Config c = rwd::train::Config::from_json(text);
    const std::string json = c.to_json();
    rwd::fuzz::require(rwd::train::Config::from_json(json).to_json() == json,
                       "to_json/from_json round trip differs", text);
    c.validate();
  });
  // The same bytes as a command-line override: key before the first '=', value after it.
  const size_t eq = text.find('=');
  if (eq != std::string::npos) {
    rwd::fuzz::expect_clean([&] {
      rwd::train::Config c;
      rwd::train::set_config_value(c, text.substr(0, eq), text.substr(eq + 1));
    });
  }
  return 0;
}
