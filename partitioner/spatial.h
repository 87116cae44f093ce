// The spatial split of convolutional networks: a spatial group of s ranks, each holding
// rows [r H/s, (r + 1) H/s) of every image [C, H, W] of the micro-batch (a tile), the
// parameters replicated. `build_spatial` makes the physical graph of tile r:
//   conv2d, maxpool2d, avgpool2d   "halo": [top, bottom] (its top padding's rows from
//       the tile above, the rows below its tile that its last window reaches from the tile
//       below; zeros at the image's edges, -inf for max pooling), exchanged by the op
//       itself, which computes the interior rows while the halo is in flight; no padding
//       along the height; the output a tile of H_out / s rows
//   batchnorm2d     "spatial": true (statistics reduced over the group)
//   relu, add, dropout p = 0   pass a tile
//   tp_copy, tp_reduce, tp_gather and bias_add (not along the height)   pass a tile: a
//       tensor-parallel graph's channel split (build_physical) is tiled the same way, its
//       collectives running within the tile's tensor-parallel group
//   global_avgpool  the tile's mean, then spatial_mean: the image's, replicated after it
// Everything after the image is pooled runs replicated. Parameters used on tiles get
// partial gradients (summed over the group, as data-parallel replicas' are); the others
// get complete, equal ones. Refused, naming the node and the sizes: a height or a tile
// not divisible by the strides below it, a halo taller than a tile, an op that needs a
// whole image (anything else reading a tile), average pooling with
// count_include_pad = false and padding along the height.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "stages/graph.h"

namespace baton::partitioner {

struct Sharding;  // partitioner/tensor_parallel.h

struct SpatialHalo {
  int64_t top = 0, bottom = 0;  // rows from the tile above / below
};

struct SpatialSplit {
  int degree = 1;
  std::vector<bool> tiled;         // per logical value: held as tiles
  std::vector<SpatialHalo> halos;  // per logical node (conv2d and pooling)
  std::vector<bool> partial_grad;  // per logical parameter: used on tiles
};

// Decides the tiling for `degree` ranks; InputError naming `where` and the node when the
// graph cannot be tiled so.
SpatialSplit plan_spatial(const stages::Graph& g, int degree, const std::string& where);

// The physical graph of tile `index` (same layers, node and value names).
std::shared_ptr<stages::Graph> build_spatial(const stages::Graph& logical, const SpatialSplit& s,
                                             int index);

// Bytes one tile receives in halos per micro-batch of `batch` samples in layers
// [first, last) of g (each halo row C x W elements of the convolution's input); the
// backward returns as many. With `tp` (the tensor-parallel sharding of g), a halo of an
// input split by channels holds the rank's C / t of them.
double spatial_halo_bytes(const stages::Graph& g, const SpatialSplit& s, int first, int last,
                          int64_t batch, const Sharding* tp = nullptr);

// The group's exchanges a tile makes per micro-batch in layers [first, last) of g: per
// pass, one halo exchange (both neighbours at once) for each convolution and pooling
// with a halo; a tiled batch norm's all-reduces (two in F: the means, then the
// variances; one in B); the pooled image's mean (F). What Machine::spatial_exchange costs
// each of beyond the link model.
struct SpatialExchanges {
  int forward = 0, backward = 0;
};
SpatialExchanges spatial_exchanges(const stages::Graph& g, const SpatialSplit& s, int first,
                                   int last);

// sync_batchnorm: every batchnorm2d of g reduces its statistics over the stage's
// batch-norm group ("spatial": true; the group is the spatial group and the replicas).
void sync_batchnorm(stages::Graph& g);

}  // namespace baton::partitioner
