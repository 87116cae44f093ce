// The spatial split's halo messages (partitioner/spatial.h) of the ops with a "halo":
// [top, bottom] (conv2d, maxpool2d, avgpool2d; stages/ops/vision.cpp). A rank of the spatial group
// holds rows [r h, (r + 1) h) of every image; its `top` halo rows are the last rows of the tile
// above, its `bottom` halo rows the first rows of the tile below. Messages go over
// OpContext::spatial, tagged by node, micro-batch and direction (engine/rank_engine.cpp
// reads the micro-batch and direction back from the tag for the measured timeline).
#pragma once

#include <string>
#include <vector>

#include "stages/op.h"
#include "transport/communicator.h"

namespace baton::stages::ops {

transport::Communicator& spatial_comm(const OpContext& ctx, const std::string& node);

// Where a convolution or pooling records the rows it computes while its halo is in flight
// ("INTERIOR_F", "INTERIOR_B") on the measured timeline (the executor's clock, seconds):
// the spatial communicator implements it when the engine records a timeline
// (engine/rank_engine.cpp's HaloTimelineComm); otherwise nothing is recorded.
class SpatialTracer {
 public:
  virtual ~SpatialTracer() = default;
  virtual double now() const = 0;
  virtual void record(const std::string& label, int micro_batch, double start, double end) = 0;
};
// The spatial communicator's tracer, or null.
SpatialTracer* spatial_tracer(const OpContext& ctx);

// A halo exchange in flight: the messages are posted when it is made, wait() returns
// when every one has arrived (and the sends have left).
class HaloTransfer {
 public:
  // Forward: sends tile x's [N, C, h, W] rows its neighbours need and receives
  // `above` [N, C, top, W] and `below` [N, C, bottom, W]; at the image's edges they are
  // rows of `fill` at once (undefined when 0 rows).
  static HaloTransfer forward(const OpContext& ctx, const std::string& node, const Tensor& x,
                              int64_t top, int64_t bottom, double fill);
  // Backward: sends the gradients of the halo rows (d_above [N, C, top, W] to the rank
  // above, d_below [N, C, bottom, W] to the rank below; undefined or unused at the edges)
  // and receives the gradients of this tile's rows that were its neighbours' halos.
  static HaloTransfer backward(const OpContext& ctx, const std::string& node, const Tensor& d_above,
                               const Tensor& d_below, const Shape& tile, int64_t top,
                               int64_t bottom);
  void wait();
  // Backward, after wait(): adds the received gradients into dx [N, C, h, W] (its last
  // `top` rows from the rank below, its first `bottom` rows from the rank above).
  void add_received(Tensor& dx) const;

  Tensor above, below;
  bool above_received = false, below_received = false;  // from a neighbour, not the fill

 private:
  std::vector<transport::WorkPtr> work_;
  Tensor send_up_, send_down_;
  int64_t top_ = 0, bottom_ = 0;
};

}  // namespace baton::stages::ops
