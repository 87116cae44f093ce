// Runs a logical graph on one thread, its tensor-parallel (or spatial) physical graphs on
// t threads (one Stage each, the local transport backend), and whole plans through the
// engine, and returns losses, parameters and gradients with the shards put back together,
// so tests can compare them.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "partitioner/evaluate.h"
#include "partitioner/spatial.h"
#include "partitioner/tensor_parallel.h"
#include "stages/graph.h"
#include "stages/stage.h"

namespace baton::partitioner::testing {

struct RunOutput {
  std::vector<double> losses;                    // per micro-batch
  std::map<std::string, memory::Tensor> params;  // logical name -> whole parameter (f64)
  std::map<std::string, memory::Tensor> grads;   // logical name -> whole gradient (f64)
  // After the micro-batches (no optimizer step: the buffers a forward updates, such as
  // batch norm's running statistics, differ from `params`).
  std::map<std::string, memory::Tensor> final_params;
  double replica_mismatch = 0;  // largest difference between ranks of a replicated tensor
  // Largest |element| of a shard's padding (the rows or columns no piece covers: a
  // vocabulary the degree does not divide), in its parameters and gradients: must be 0.
  double padding_max = 0;
};

struct RunSpec {
  int micro_batches = 2;
  int64_t samples = 3;  // per micro-batch
  uint64_t seed = 5;
  uint64_t data_seed = 11;
  std::set<int> recompute_layers;
};

RunOutput run_logical(std::shared_ptr<const stages::Graph> g, const RunSpec& spec);
RunOutput run_tensor_parallel(std::shared_ptr<const stages::Graph> g, int tp,
                              const SplitOverrides& overrides, const RunSpec& spec);
// The spatial split over `degree` threads: each gets its rows of the images; the
// gradients of parameters used on tiles are summed over the group (as the engine's
// gradient reduction would), the others must be equal on every rank.
RunOutput run_spatial(std::shared_ptr<const stages::Graph> g, int degree, const RunSpec& spec);

// Runs one step of a whole plan through the engine, every rank a thread of a local world
// (engine::RankEngine: its physical graph and Stages, the executor on the plan's lowered
// schedule, boundary routes and gradient groups); the replicas' micro-batches are
// micro-batches dp * M of one global batch. Returns the initial parameters, the reduced
// gradients (before the optimizer step) and the micro-batches' losses. Compare with
// run_logical(g, {dp * M micro-batches of micro_batch_size samples}).
RunOutput run_plan(const ResolvedPlan& plan, const RunSpec& spec);

// max |a - b| / max(max |b|, tiny) over the elements.
double rel_diff(const memory::Tensor& a, const memory::Tensor& b);

// A split run `got` against the logical graph's `want` (EXPECT): the losses within `tol`
// relative; the same parameters, bit for bit at the start (initialisation from (seed,
// name, block): shards are bit-identical to their blocks); the gradients within `tol`;
// with `final_params`, the parameters after the micro-batches too (batch norm's running
// statistics, moved by every training forward); replicated tensors within `tol`.
void expect_same_run(const RunOutput& want, const RunOutput& got, double tol,
                     bool final_params = false);

// A model JSON loaded with its floating-point tensors in `dtype`.
std::shared_ptr<stages::Graph> load_in_dtype(const nlohmann::json& model, memory::DType dtype,
                                             const std::string& name = "model.json");

}  // namespace baton::partitioner::testing
