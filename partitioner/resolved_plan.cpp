#include "partitioner/resolved_plan.h"

#include <algorithm>
#include <map>

#include "memory/error.h"
#include "schedule/forward_only.h"
#include "schedule/generators.h"
#include "schedule/transfer.h"
#include "schedule/validate.h"
#include "stages/model.h"

namespace baton::partitioner {

using stages::Graph;

std::shared_ptr<Graph> shard_graph(const ResolvedPlan& r, int tp) {
  std::vector<int> index(size_t(r.graph->num_layers()));
  for (int l = 0; l < r.graph->num_layers(); ++l) index[size_t(l)] = tp % r.layer_tp[size_t(l)];
  return build_physical(*r.graph, r.sharding, index);
}

std::vector<int> ResolvedPlan::stages_of(int pp) const {
  return schedule::stages_of_rank(schedule, pp);
}

std::set<int> ResolvedPlan::recompute_layers() const {
  std::set<int> out;
  for (const auto& s : recompute) out.insert(s.begin(), s.end());
  return out;
}

std::shared_ptr<const Graph> load_plan_model(const Plan& plan, const stages::LoadOptions& options) {
  try {
    if (!plan.model_path.empty())
      return std::make_shared<const Graph>(stages::load_model(plan.model_path_resolved, options));
    return std::make_shared<const Graph>(
        stages::load_model_json(plan.model_json, plan.where("$.model"), options));
  } catch (const InputError& e) {
    if (!plan.model_path.empty()) throw InputError(plan.where("$.model") + ": " + e.what());
    throw;
  }
}

namespace {

std::string layer_ref(const Graph& g, int l) {
  return "layer " + std::to_string(l) + " ('" + g.layers[size_t(l)].name + "')";
}

// A parameter several pipeline ranks hold (tied embeddings) needs one degree of the split
// (`kind`: tensor-parallel or spatial) on all of them; `where` names the plan's field.
void require_one_degree(const std::string& where, const Graph& g, const stages::Param& prm,
                        const std::set<int>& degrees, const std::string& kind) {
  if (degrees.size() <= 1) return;
  throw InputError(where + ": parameter '" + prm.name + "' is used by " +
                   layer_ref(g, prm.layers.front()) + " and " + layer_ref(g, prm.layers.back()) +
                   " on pipeline ranks of different " + kind +
                   " degrees; a tied parameter needs one degree");
}

std::string list_str(const std::vector<int>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + "]";
}

// "[0 1 2]": the form use_schedule's messages use.
std::string space_list(const std::vector<int>& v) {
  std::string t;
  for (int x : v) t += (t.empty() ? "" : " ") + std::to_string(x);
  return "[" + t + "]";
}

void resolve_layers(const Plan& p, const Graph& g, ResolvedPlan& r) {
  const int L = g.num_layers();
  std::vector<int> owner(size_t(L), -1);
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const PlanStage& st = p.stages[k];
    std::vector<int> layers;
    if (st.every_layer) {
      for (int l = 0; l < L; ++l) layers.push_back(l);
    } else if (st.first_layer >= 0) {
      if (st.last_layer > L)
        throw InputError(st.json_path + ".layers: expected layer indices within the model's " +
                         std::to_string(L) + " layers (last <= " + std::to_string(L) +
                         "), found [" + std::to_string(st.first_layer) + ", " +
                         std::to_string(st.last_layer) + "]");
      for (int l = st.first_layer; l < st.last_layer; ++l) layers.push_back(l);
    } else {
      for (size_t i = 0; i < st.layer_names.size(); ++i) {
        int l = g.find_layer(st.layer_names[i]);
        if (l < 0)
          throw InputError(st.json_path + ".layers[" + std::to_string(i) + "]: no layer named '" +
                           st.layer_names[i] + "' in the model");
        layers.push_back(l);
      }
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      int l = layers[i];
      if (owner[size_t(l)] >= 0)
        throw InputError(
            st.json_path + ".layers: " + layer_ref(g, l) + " is placed twice (also in " +
            p.stages[size_t(owner[size_t(l)])].json_path.substr(p.where("").size()) + ")");
      owner[size_t(l)] = int(k);
      if (i > 0 && l != layers[i - 1] + 1)
        throw InputError(st.json_path +
                         ".layers: a stage holds consecutive layers in model order; " +
                         layer_ref(g, l) + " does not follow " + layer_ref(g, layers[i - 1]));
    }
    r.chunk_first.push_back(layers.front());
    r.chunk_last.push_back(layers.back() + 1);
  }
  for (int l = 0; l < L; ++l)
    if (owner[size_t(l)] < 0)
      throw InputError(p.where("$.stages") + ": " + layer_ref(g, l) + " is in no stage");
  for (int l = 1; l < L; ++l)
    if (owner[size_t(l)] < owner[size_t(l - 1)])
      throw InputError(p.stages[size_t(owner[size_t(l)])].json_path +
                       ".layers: stages hold the model's layers in order, but " + layer_ref(g, l) +
                       " comes after " + layer_ref(g, l - 1) + " of a later stage");
}

void resolve_recompute(const Plan& p, const Graph& g, ResolvedPlan& r) {
  r.recompute.assign(p.stages.size(), {});
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const PlanStage& st = p.stages[k];
    if (st.recompute_all)
      for (int l = r.chunk_first[k]; l < r.chunk_last[k]; ++l) r.recompute[k].insert(l);
    for (size_t i = 0; i < st.recompute_names.size(); ++i) {
      int l = g.find_layer(st.recompute_names[i]);
      if (l < r.chunk_first[k] || l >= r.chunk_last[k])
        throw InputError(st.json_path + ".recompute[" + std::to_string(i) +
                         "]: expected a layer of this stage (" +
                         g.layers[size_t(r.chunk_first[k])].name + " .. " +
                         g.layers[size_t(r.chunk_last[k] - 1)].name + "), found '" +
                         st.recompute_names[i] + "'");
      r.recompute[k].insert(l);
    }
  }
}

// The spatial split of every pipeline rank with a degree > 1 (partitioner/spatial.h), and
// what it needs across stages: tiles cross a boundary only between equal degrees, a tied
// parameter sits on pipeline ranks of one degree.
void resolve_spatial_split(ResolvedPlan& r) {
  const Plan& p = r.plan;
  const Graph& g = *r.graph;
  r.spatial.assign(size_t(p.pp), SpatialSplit{});
  r.shard_spatial.assign(size_t(p.pp), SpatialSplit{});
  if (!p.has_spatial()) return;
  const int S = r.num_chunks();
  // The pipeline rank of each chunk in direction 0 (DualPipe holds a chunk on two, of
  // one degree), and a chunk of each pipeline rank (for the messages).
  std::vector<int> chunk_pp(static_cast<size_t>(S), 0), a_chunk(size_t(p.pp), -1);
  for (int st = 0; st < r.schedule.num_stages(); ++st) {
    const int k = r.chunk_of_stage[size_t(st)], pp = r.schedule.placement[size_t(st)];
    if (schedule::stage_direction(r.schedule, st) == 0) chunk_pp[size_t(k)] = pp;
    if (a_chunk[size_t(pp)] < 0) a_chunk[size_t(pp)] = k;
  }
  for (int pp = 0; pp < p.pp; ++pp) {
    const int d = p.spatial_of(pp);
    if (d <= 1 || a_chunk[size_t(pp)] < 0) continue;
    const std::string where =
        p.stages[size_t(a_chunk[size_t(pp)])].json_path.empty()
            ? p.where("$.stages[" + std::to_string(a_chunk[size_t(pp)]) + "].spatial")
            : p.stages[size_t(a_chunk[size_t(pp)])].json_path + ".spatial";
    r.spatial[size_t(pp)] = plan_spatial(g, d, where);
    // With tensor parallelism the tiles are cut from the channel shards' graph (the same
    // for every shard index).
    if (p.tp[size_t(pp)] > 1)
      r.shard_spatial[size_t(pp)] = plan_spatial(*shard_graph(r, 0), d, where);
    bool any = false;
    for (bool t : r.spatial[size_t(pp)].tiled) any = any || t;
    if (!any)
      throw InputError(where + ": spatial " + std::to_string(d) +
                       ", but the model has no floating image input [C, H, W] whose rows could "
                       "be tiled");
  }
  for (int k = 0; k + 1 < S; ++k) {
    const int a = chunk_pp[size_t(k)], b = chunk_pp[size_t(k + 1)];
    const int sa = p.spatial_of(a), sb = p.spatial_of(b);
    if (sa == sb) continue;
    // Tiles between different degrees are re-tiled by blocks of rows (partitioner/
    // routing.h): a receiving tile takes a block from each sending tile its rows meet
    // (either way: gradients return), at most schedule::kMaxValueParts (the tags' room).
    auto most_blocks = [](int from, int to) {  // on an image of from x to rows
      int most = 0;
      for (int j = 0; j < to; ++j) {
        int n = 0;
        for (int i = 0; i < from; ++i)
          if (std::max(i * to, j * from) < std::min((i + 1) * to, (j + 1) * from)) ++n;
        most = std::max(most, n);
      }
      return most;
    };
    const int blocks = std::max(most_blocks(sa, sb), most_blocks(sb, sa));
    if (blocks <= schedule::kMaxValueParts) continue;
    for (int v : g.cut_values(r.chunk_last[size_t(k)]))
      if (r.tiled(a, v) || r.tiled(b, v))
        throw InputError(p.where("$.stages[" + std::to_string(k + 1) + "].spatial") + ": " +
                         std::to_string(sb) + ", but value '" + g.values[size_t(v)].name +
                         "' crosses the boundary from $.stages[" + std::to_string(k) +
                         "] (spatial " + std::to_string(sa) + ") as image tiles, re-tiled in " +
                         std::to_string(blocks) + " blocks of rows per tile; at most " +
                         std::to_string(schedule::kMaxValueParts) +
                         " are supported (or cut after global_avgpool)");
  }
  for (const stages::Param& prm : g.params) {
    std::set<int> degrees;
    for (int l : prm.layers)
      for (int k = 0; k < S; ++k)
        if (l >= r.chunk_first[size_t(k)] && l < r.chunk_last[size_t(k)])
          degrees.insert(p.spatial_of(chunk_pp[size_t(k)]));
    require_one_degree(p.where("$.stages"), g, prm, degrees, "spatial");
  }
}

}  // namespace

namespace {

// The first node of layers [first, last) that moves running statistics, or "".
std::string running_statistics_node(const Graph& g, int first, int last) {
  for (const stages::Node& n : g.nodes)
    if (n.layer >= first && n.layer < last && n.op == "batchnorm2d" && n.params.size() > 2 &&
        n.params[2] >= 0)
      return n.name;
  return "";
}

}  // namespace

std::string running_statistics_node(const Graph& g) {
  return running_statistics_node(g, 0, g.num_layers());
}

std::string forward_order_note(const ResolvedPlan& r) {
  if (running_statistics_node(*r.graph).empty()) return "";
  // Each stage's own batch norm: a stage without one may run its forwards in any order (the
  // model's first had been named, whichever stage ran out of order, and for stages with none).
  std::vector<std::string> bn(size_t(r.num_chunks()));
  for (int k = 0; k < r.num_chunks(); ++k)
    bn[size_t(k)] =
        running_statistics_node(*r.graph, r.chunk_first[size_t(k)], r.chunk_last[size_t(k)]);
  for (size_t rank = 0; rank < r.schedule.ranks.size(); ++rank) {
    std::map<int, int> last;  // stage -> the micro-batch of its latest forward
    for (const schedule::Action& a : r.schedule.ranks[rank]) {
      if (a.kind != schedule::ActionKind::forward || a.stage < 0 || a.stage >= r.num_chunks() ||
          bn[size_t(a.stage)].empty())
        continue;
      auto [it, first] = last.emplace(a.stage, a.micro_batch);
      if (!first && a.micro_batch < it->second)
        return "rank " + std::to_string(rank) + " runs the forward of micro-batch " +
               std::to_string(a.micro_batch) + " on stage " + std::to_string(a.stage) +
               " after that of " + std::to_string(it->second) + ": the running statistics of '" +
               bn[size_t(a.stage)] +
               "' (batch norm) on that stage move in the order of the forwards, so each step ends "
               "with other ones than the one-process run's (the losses are the same); forwards "
               "in ascending micro-batch order per stage keep them";
      it->second = a.micro_batch;
    }
  }
  return "";
}

std::pair<std::string, int64_t> smallest_batchnorm_plane(const Graph& g) {
  std::pair<std::string, int64_t> least{"", 0};
  for (const stages::Node& n : g.nodes)
    if (n.op == "batchnorm2d" && !n.inputs.empty()) {
      const memory::Shape& shape = g.values[size_t(n.inputs[0])].type.shape;
      if (!shape.empty() && shape[0] > 0) {
        const int64_t plane = memory::shape_numel(shape) / shape[0];
        if (least.second == 0 || plane < least.second) least = {n.name, plane};
      }
    }
  return least;
}

namespace {

// The checks of a user's schedule against the plan's generated one (`want`).
void check_own_schedule(const Plan& p, const schedule::Schedule& want, const schedule::Schedule& s,
                        const std::string& source) {
  auto fail = [&](const std::string& what, const std::string& expected, const std::string& found) {
    throw InputError(source + ": " + what + ": the plan needs " + expected + ", the schedule has " +
                     found);
  };
  if (s.num_ranks != want.num_ranks)
    fail("ranks", std::to_string(want.num_ranks) + " (pipeline ranks)",
         std::to_string(s.num_ranks));
  if (s.num_micro_batches != want.num_micro_batches)
    fail("micro_batches", std::to_string(want.num_micro_batches),
         std::to_string(s.num_micro_batches));
  if (s.stages_per_direction() != want.stages_per_direction())
    fail("model chunks",
         std::to_string(want.stages_per_direction()) + " (placement " + space_list(want.placement) +
             ")",
         std::to_string(s.stages_per_direction()) + " (placement " + space_list(s.placement) + ")");
  schedule::check_valid(s, source);
  // An evaluation schedule (only forwards) trains nothing: no backward, no STEP.
  if (schedule::is_forward_only(s))
    throw InputError(source +
                     ": a forward-only schedule (evaluation) cannot train: expected "
                     "backwards (B and W, or BW) for every micro-batch");
  // A spatial split's degree belongs to a pipeline rank (its devices): each chunk must
  // land where the plan's placement put one of its degree.
  for (int st = 0; st < s.num_stages(); ++st) {
    const int k = schedule::stage_chunk(s, st), pp = s.placement[size_t(st)];
    const PlanStage& chunk = p.stages[size_t(k)];
    if (chunk.spatial != p.spatial_of(pp))
      throw InputError(source + ": placement: model chunk " + std::to_string(k) + " (spatial " +
                       std::to_string(chunk.spatial) + ") on pipeline rank " + std::to_string(pp) +
                       ", whose spatial degree is " + std::to_string(p.spatial_of(pp)) +
                       " under the plan's placement " + space_list(want.placement));
  }
}

}  // namespace

ResolvedPlan resolve_plan(const Plan& p, std::shared_ptr<const Graph> graph,
                          const schedule::Schedule* own_schedule, const std::string& source) {
  ResolvedPlan r;
  r.plan = p;
  r.given = p;
  r.graph = graph;
  const Graph& g = *graph;
  r.layout = plan_layout(p);
  std::string name;
  try {
    name = schedule::canonical_training_schedule_name(p.schedule);
  } catch (const InputError& e) {
    throw InputError(p.where("$.schedule.name") + ": " + e.what());
  }
  // The op would refuse it on every rank at the first step (a tile's statistics span
  // the whole image, so the logical graph's plane is the one that counts).
  if (const auto [bn, plane] = smallest_batchnorm_plane(g); plane > 0) {
    const bool own = p.dp > 1 && !p.sync_batchnorm;  // each replica's own statistics
    const int64_t values = p.micro_batch_size * plane * (own ? 1 : p.dp);
    if (values < 2)
      throw InputError(p.where("$.batch.micro_batch_size") + ": micro-batches of " +
                       std::to_string(p.micro_batch_size) + " sample(s) leave the batch norm '" +
                       bn + "' (batchnorm2d, " + std::to_string(plane) +
                       " position(s) per sample) " + std::to_string(values) + " value per channel" +
                       (own ? " on each replica" : "") +
                       ": its variance is 0 and the layers before it would learn nothing; "
                       "expected micro-batches of at least 2 samples" +
                       (own ? std::string(", or \"sync_batchnorm\": true") : std::string()));
  }
  try {
    r.schedule = schedule::generate(name, p.pp, p.micro_batches, p.chunks);
  } catch (const InputError& e) {
    throw InputError(p.where("$.schedule") + ": " + e.what());
  }
  const int S = r.schedule.stages_per_direction();
  const bool every_layer = p.stages.size() == 1 && p.stages[0].every_layer;
  check_stage_count(p, S, name);
  if (own_schedule != nullptr) {
    check_own_schedule(p, r.schedule, *own_schedule, source);
    r.schedule = *own_schedule;
    if (r.schedule.name.empty()) r.schedule.name = source;
    name = source;  // the placement below is the file's
  }
  // Of the schedule that runs: a file of two directions keeps copies of each chunk as
  // DualPipe does (it had passed this under a plan naming 1f1b, and its checkpoint kept
  // one copy's statistics).
  if (r.schedule.num_directions > 1)
    if (const std::string bn = running_statistics_node(g); !bn.empty())
      throw InputError((own_schedule != nullptr ? source : p.where("$.schedule.name")) + ": \"" +
                       (own_schedule != nullptr ? source : name) +
                       "\" keeps two copies of each chunk (two directions), each seeing half the "
                       "micro-batches, and merges only their gradients: the running statistics of "
                       "'" +
                       bn +
                       "' (batchnorm2d) would differ between the copies and a "
                       "checkpoint would keep one; expected a schedule of one direction for a "
                       "model with batch-norm running statistics");
  if (S > g.num_layers())
    throw InputError(p.where("$.stages") + ": " + std::to_string(S) + " stages for a model of " +
                     std::to_string(g.num_layers()) + " layers");
  resolve_layers(p, g, r);
  if (every_layer) {
    PlanStage& st = r.plan.stages[0];
    st.every_layer = false;
    st.first_layer = 0;
    st.last_layer = g.num_layers();
  }

  // Placement: which pipeline ranks hold each chunk, and the degree of its layers.
  std::vector<std::set<int>> holders(static_cast<size_t>(S));
  for (int s = 0; s < r.schedule.num_stages(); ++s) {
    int k = schedule::stage_chunk(r.schedule, s);
    r.chunk_of_stage.push_back(k);
    holders[size_t(k)].insert(r.schedule.placement[size_t(s)]);
  }
  // Refusals the file's placement causes say so: they had named only the plan's fields.
  const std::string placed_by = own_schedule != nullptr ? " (under " + source + "'s placement " +
                                                              space_list(r.schedule.placement) + ")"
                                                        : "";
  r.layer_tp.assign(size_t(g.num_layers()), 1);
  for (int k = 0; k < S; ++k) {
    std::vector<int> expect(holders[size_t(k)].begin(), holders[size_t(k)].end());
    const PlanStage& st = p.stages[size_t(k)];
    if (!st.pipeline_ranks.empty() && st.pipeline_ranks != expect)
      throw InputError(st.json_path + ".pipeline_ranks: expected " + list_str(expect) + " (the " +
                       name + " placement of model chunk " + std::to_string(k) + "), found " +
                       list_str(st.pipeline_ranks) +
                       (own_schedule != nullptr
                            ? "; a plan run with a schedule of another placement "
                              "lists that placement's ranks, or none"
                            : ""));
    r.plan.stages[size_t(k)].pipeline_ranks = expect;
    std::set<int> degrees;
    for (int pp : expect) degrees.insert(p.tp[size_t(pp)]);
    if (degrees.size() > 1)
      throw InputError(p.where("$.parallel.tp") + ": model chunk " + std::to_string(k) +
                       " runs on pipeline ranks " + list_str(expect) + placed_by +
                       " with different tensor-parallel degrees; a chunk needs one degree");
    for (int l = r.chunk_first[size_t(k)]; l < r.chunk_last[size_t(k)]; ++l)
      r.layer_tp[size_t(l)] = *degrees.begin();
  }
  // A parameter several pipeline ranks hold (tied embeddings) needs the same split there.
  for (const stages::Param& prm : g.params) {
    std::set<int> degrees;
    for (int l : prm.layers) degrees.insert(r.layer_tp[size_t(l)]);
    try {
      require_one_degree(p.where("$.parallel.tp"), g, prm, degrees, "tensor-parallel");
    } catch (const InputError& e) {
      throw InputError(e.what() + placed_by);
    }
  }
  SplitOverrides ov{p.splits, p.split_paths};
  r.sharding = plan_sharding(g, r.layer_tp, ov, p.where("$.parallel.tp"));
  resolve_spatial_split(r);
  if (!p.boundaries.is_null()) {
    nlohmann::json want = derive_boundaries(r.plan);
    for (size_t i = 0; i < std::max(want.size(), p.boundaries.size()); ++i)
      if (i >= want.size() || i >= p.boundaries.size() || want[i] != p.boundaries[i])
        throw InputError(
            p.boundaries_path + "[" + std::to_string(i) + "]: expected " +
            (i < want.size() ? want[i].dump() : std::string("no entry")) +
            " (from the degrees and the placement), found " +
            (i < p.boundaries.size() ? p.boundaries[i].dump() : std::string("no entry")) +
            (own_schedule != nullptr ? "; a plan run with a schedule of another placement lists "
                                       "that placement's boundaries, or none"
                                     : ""));
  }
  resolve_recompute(p, g, r);
  return r;
}

void use_schedule(ResolvedPlan& r, const schedule::Schedule& s, const std::string& source) {
  r = resolve_plan(r.given, r.graph, &s, source);
}

}  // namespace baton::partitioner
