// safetensors files (checkpoint shards, Hugging Face model.safetensors): the header
// checks, then reading every tensor whole and as a block, as the resharding loader does.
#include <algorithm>

#include "stages/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::stages;
  baton::fuzz::MemFile f(data, size);
  baton::fuzz::expect_only_input_errors([&] {
    SafetensorsReader r(f.path());
    for (const SafetensorsEntry& e : r.entries()) {
      if (e.bytes() > (64u << 20)) continue;  // the reader checked it; do not allocate it here
      DType d;
      if (!safetensors_dtype(e.dtype, d)) continue;
      baton::memory::Tensor whole = r.read(e.name);
      // The trailing half of every dimension, as a reshard would read it.
      Shape off(e.shape.size()), len(e.shape.size());
      for (size_t k = 0; k < e.shape.size(); ++k)
        off[k] = e.shape[k] / 2, len[k] = e.shape[k] - off[k];
      baton::memory::Tensor block = baton::memory::Tensor::empty(len, d);
      r.read_block(e, off, block);
    }
  });
  return 0;
}
