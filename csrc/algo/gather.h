// The gather phase shared by two_step, ring and semi_ring, pipelined shard by shard: as soon as a
// shard of this rank's own chunk is summed, it is divided (AVG), encoded with the gather codec,
// sent to every peer, and decoded into place from those same bytes (the owner never keeps its
// private fp32 sum: DESIGN invariant 1). Every peer's shards are received into place as they
// arrive. All receives are posted when the pipeline is built, before the reduce phase starts.
#pragma once

#include <ATen/ATen.h>

#include <vector>

#include "plan/plan.h"
#include "transport/c10d_transport.h"

namespace qcomm {

class GatherPipeline {
 public:
  // tagBase: the first point-to-point tag this phase may use (above the reduce phase's tags).
  GatherPipeline(const Plan& plan, Transport& t, void* data, int tagBase);

  // Shard k of this rank's chunk is summed in `sum` (fp32, shard length); it may be modified.
  void ownShardReady(int k, float* sum);

  // Decode every peer's shards as they arrive; wait for this rank's sends.
  void finish();

 private:
  int64_t unit(int who, int k) const { return int64_t(who) * plan_.microshards + k; }

  const Plan& plan_;
  Transport& t_;
  void* data_;
  int tagBase_;
  int64_t unitBytes_;
  at::Tensor send_;  // [k]: this rank's encoded shard k
  at::Tensor recv_;  // [j][k]: rank j's encoded shard k of chunk j
  std::vector<c10::intrusive_ptr<c10d::Work>> recvs_;
  std::vector<c10::intrusive_ptr<c10d::Work>> sends_;
  std::vector<at::Tensor> inFlight_;
  std::vector<float> scratch_;
};

}  // namespace qcomm
