// Megatron-LM indexed datasets (TokenStore::open_megatron): the bytes are the .idx; the
// .bin beside it is a fixed 1024 bytes (enough for the fixtures' sequences), so the
// index's lengths and byte offsets are checked against a real file. What opens is read
// whole, its documents looked up and its vocabulary checked, as a data loader would.
#include <algorithm>
#include <vector>

#include "stages/token_store.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Files {
  baton::fuzz::ScratchDir dir;
  std::string prefix = dir.path() + "/data";
  Files() {
    std::vector<unsigned char> bin(1024);
    for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<unsigned char>((i * 37) % 251);
    dir.write("data.bin", bin.data(), bin.size());
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::stages;
  static Files files;
  files.dir.write("data.idx", data, size);
  baton::fuzz::expect_only_input_errors([&] {
    auto s = TokenStore::open_megatron(files.prefix);
    const int64_t n = std::min<int64_t>(s->num_tokens(), 1 << 16);
    std::vector<int64_t> tokens(static_cast<size_t>(n));
    if (n > 0) s->read(0, n, tokens.data());
    for (int64_t pos : {int64_t(0), n / 2, n - 1})
      if (pos >= 0 && pos < s->num_tokens()) {
        (void)s->document_of(pos);
        (void)s->where(pos);
        (void)s->token(pos);
      }
    if (s->num_tokens() <= (1 << 16)) {
      (void)s->token_range();
      s->check_vocabulary(65536);
    }
  });
  return 0;
}
