// `baton profile`: times each op of a model on this machine (F, B, W; warm-up, median
// of repeats) and writes the cost file `baton plan --costs` uses instead of FLOPs at a
// nominal rate (docs/formats/costs.md).
#include <cstdio>
#include <map>

#include "engine/loop.h"
#include "kernels/precision.h"
#include "memory/error.h"
#include "partitioner/profile.h"
#include "stages/model.h"
#include "tools/command.h"

namespace baton::tools {
namespace {

namespace pt = baton::partitioner;

int run_profile(const std::vector<std::string>& args) {
  po::options_description opts("options");
  std::string model_path, out, device, precision;
  pt::ProfileOptions o;
  opts.add_options()("model", po::value(&model_path)->required(),
                     "model JSON (as for baton train)")(
      "batch", po::value(&o.batch)->default_value(1), "samples per micro-batch to time at")(
      "repeats", po::value(&o.repeats)->default_value(5), "timed runs per op (the median is kept)")(
      "warmup", po::value(&o.warmup)->default_value(2), "untimed runs per op first")(
      "device", po::value(&device)->default_value("cpu"), "cpu, cuda or cuda:N: where the ops run")(
      "precision", po::value(&precision)->default_value("f32"),
      "f32, tf32, bf16 or fp16: the model's float type as baton train --precision runs it")(
      "out,o", po::value(&out)->required(), "the cost file to write (JSON)");
  add_common_options(opts);
  po::variables_map vm;
  if (!parse_args(args,
                  "baton profile --model M [--batch b] [--threads t] [--device cuda --precision "
                  "bf16] --out costs.json",
                  opts, vm))
    return 0;
  apply_common_options(vm);
  o.threads = vm["threads"].as<int>();
  if (o.threads <= 0) o.threads = 1;
  engine::LoopOptions run;  // the device and precision as baton train sets them up
  run.device = o.device = memory::parse_device(device);
  run.precision = kernels::parse_precision(precision);
  engine::prepare_device(run);
  stages::LoadOptions lo;
  lo.float_dtype = kernels::compute_dtype(run.precision);
  stages::Graph g = stages::load_model(model_path, lo);
  pt::ProfileSummary summary;
  pt::MeasuredCosts costs = pt::profile_model(g, o, &summary);
  pt::write_measured_costs(costs, out);

  struct Row {
    int count = 0;
    double f = 0, b = 0, w = 0, flops = 0;
  };
  std::map<std::string, Row> by_type;
  Row total;
  for (const stages::Node& n : g.nodes) {
    const pt::MeasuredCosts::Op& m = costs.ops.at(n.name);
    for (Row* r : {&by_type[n.op], &total}) {
      r->count++;
      r->f += m.forward;
      r->b += m.backward_input;
      r->w += m.backward_weight;
      r->flops += m.flops;
    }
  }
  std::printf("%s: %zu ops (%d distinct timed) at batch %lld on %s, %.2f s\n", g.name.c_str(),
              g.nodes.size(), summary.distinct_ops, (long long)o.batch,
              o.device.is_cuda() ? (o.device.str() + ", " + precision).c_str()
                                 : (std::to_string(costs.threads) + " thread(s)").c_str(),
              summary.seconds);
  std::printf("%-30s %6s %12s %12s %12s %10s\n", "op", "count", "F ms", "B ms", "W ms", "GFLOP/s");
  auto line = [](const std::string& name, const Row& r) {
    double t = r.f + r.b + r.w;
    std::printf("%-30s %6d %12.3f %12.3f %12.3f %10.1f\n", name.c_str(), r.count, 1e3 * r.f,
                1e3 * r.b, 1e3 * r.w, t > 0 ? r.flops / t / 1e9 : 0.0);
  };
  for (const auto& [name, r] : by_type) line(name, r);
  line("total (one micro-batch)", total);
  std::printf("wrote %s\n", out.c_str());
  return 0;
}

const RegisterCommand register_profile(
    {"profile", "time each op of a model on this machine; write the cost file baton plan uses",
     run_profile});

}  // namespace
}  // namespace baton::tools
