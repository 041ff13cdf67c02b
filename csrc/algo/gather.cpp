// GatherPipeline: the pipelined gather phase (gather_pipeline.h).
#include "algo/gather.h"

#include "algo/algorithms.h"
#include "codec/codec_cpu.h"

namespace qcomm {

GatherPipeline::GatherPipeline(const Plan& plan, Transport& t, void* data, int tagBase)
    : plan_(plan), t_(t), data_(data), tagBase_(tagBase) {
  const int world = plan.world;
  const int shards = plan.microshards;
  const int rank = t.rank();
  unitBytes_ = alignUp16(encodedBytes(plan.shardElems, plan.ag));
  send_ = byteBuffer(unitBytes_ * shards);
  recv_ = byteBuffer(unitBytes_ * world * shards);
  recvs_.resize(size_t(world * shards));
  for (int k = 0; k < shards; ++k) {
    for (int off = 1; off < world; ++off) {
      const int j = (rank + off) % world;
      const ChunkRange sh = plan.shard(j, k);
      if (sh.len == 0) continue;
      at::Tensor slice = recv_.narrow(0, unit(j, k) * unitBytes_, encodedBytes(sh.len, plan.ag));
      inFlight_.push_back(slice);
      recvs_[unit(j, k)] = t.irecv(slice, j, tagBase + k);
    }
  }
}

void GatherPipeline::ownShardReady(int k, float* sum) {
  const int rank = t_.rank();
  const ChunkRange sh = plan_.shard(rank, k);
  if (sh.len == 0) return;
  divideByWorld(plan_, sum, sh.len);
  uint8_t* enc = send_.data_ptr<uint8_t>() + int64_t(k) * unitBytes_;
  encodeBlock(sum, kFloat32, sh.len, plan_.ag, enc, agNoise(plan_, rank, sh.begin));
  const int64_t bytes = encodedBytes(sh.len, plan_.ag);
  for (int off = 1; off < plan_.world; ++off) {
    at::Tensor slice = send_.narrow(0, int64_t(k) * unitBytes_, bytes);
    inFlight_.push_back(slice);
    sends_.push_back(t_.isend(slice, (rank + off) % plan_.world, tagBase_ + k));
  }
  decodeToOutput(plan_, enc, sh, data_, scratch_);
}

void GatherPipeline::finish() {
  const int rank = t_.rank();
  for (int k = 0; k < plan_.microshards; ++k) {
    for (int off = 1; off < plan_.world; ++off) {
      const int j = (rank + off) % plan_.world;
      const ChunkRange sh = plan_.shard(j, k);
      if (sh.len == 0) continue;
      t_.wait(recvs_[unit(j, k)],
              "gather phase, shard " + std::to_string(k) + " from rank " + std::to_string(j));
      decodeToOutput(plan_, recv_.data_ptr<uint8_t>() + unit(j, k) * unitBytes_, sh, data_,
                     scratch_);
    }
  }
  for (auto& w : sends_) t_.wait(w, "gather phase send");
}

}  // namespace qcomm
