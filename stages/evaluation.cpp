#include "stages/evaluation.h"

#include "memory/error.h"

namespace baton::stages {

double evaluate_loss(Stage& stage, const Dataset& data, const EvalSpec& e) {
  BATON_CHECK(e.batches > 0 && e.batch > 0 && e.micro_batches > 0 && e.batch % e.micro_batches == 0,
              "evaluation batches");
  const Graph& g = stage.graph();
  const ValueType& tok = g.value("tokens").type;
  const ValueType& tgt = g.value("targets").type;
  const int64_t T = tok.shape[0];
  const bool per_position = !tgt.shape.empty();
  const int64_t n = e.batch / e.micro_batches;
  const double loss_tokens = double(e.batch * (per_position ? T : 1));
  const std::string& loss_name = g.values[size_t(g.loss)].name;
  Tensor tokens = Tensor::empty({n, T}, tok.dtype);
  Tensor targets = per_position ? Tensor::empty({n, T}, tgt.dtype) : Tensor::empty({n}, tgt.dtype);
  const uint64_t seed = evaluation_seed(e.seed);
  double sum = 0;
  for (int64_t k = 0; k < e.batches; ++k) {
    double batch_loss = 0;
    for (int64_t j = 0; j < e.micro_batches; ++j) {
      MicroBatch mb{j, j * n, n, e.batch, loss_tokens, k};
      data.fill(seed, k, mb.sample_offset, n, tokens, targets);
      TensorMap out =
          stage.forward(mb, {{"tokens", tokens}, {"targets", targets}}, /*training=*/false);
      batch_loss +=
          out.at(loss_name).to(memory::Device::cpu()).to(memory::DType::f64).to_vector<double>()[0];
    }
    sum += batch_loss;
  }
  return sum / double(e.batches);
}

}  // namespace baton::stages
