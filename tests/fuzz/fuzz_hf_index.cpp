// Sharded Hugging Face checkpoints (HfCheckpoint): the bytes are the
// model.safetensors.index.json of a directory that also holds two small shards (named
// as the fixture's index names them), a file that is not safetensors and a
// subdirectory. Every tensor the index names is then looked up (its shard opened and
// its header read) and read, as a load does.
#include <vector>

#include "memory/tensor.h"
#include "stages/hf.h"
#include "stages/safetensors.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

struct Files {
  baton::fuzz::ScratchDir dir;
  Files() {
    using baton::memory::Tensor;
    auto t = [](std::vector<int64_t> shape) {
      Tensor x = Tensor::empty(baton::memory::Shape(shape.begin(), shape.end()),
                               baton::memory::DType::f32);
      float* p = x.data<float>();
      for (int64_t i = 0; i < x.numel(); ++i) p[i] = float(i);
      return x;
    };
    baton::stages::write_safetensors(dir.path() + "/model-00001-of-00002.safetensors",
                                     {{"model.embed_tokens.weight", t({4, 2})},
                                      {"model.layers.0.input_layernorm.weight", t({2})},
                                      {"model.norm.weight", t({2})}});
    baton::stages::write_safetensors(dir.path() + "/model-00002-of-00002.safetensors",
                                     {{"lm_head.weight", t({4, 2})}});
    dir.write("config.json", "{}", 2);
    std::filesystem::create_directory(dir.path() + "/sub");
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::stages;
  static Files files;
  files.dir.write("model.safetensors.index.json", data, size);
  baton::fuzz::expect_only_input_errors([&] {
    HfCheckpoint ckpt(files.dir.path());
    for (const std::string& name : ckpt.names())
      baton::fuzz::expect_only_input_errors([&] {
        const SafetensorsReader* file = nullptr;
        const SafetensorsEntry* e = ckpt.find(name, &file);
        if (e == nullptr || file == nullptr) std::abort();  // names() lists it
        (void)file->read(e->name);
      });
    (void)ckpt.opened();
  });
  return 0;
}
