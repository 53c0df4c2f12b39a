// The trainer's view of the other ranks. Everything rank-dependent (data sharding, rank-0 logging,
// metric reduction, checkpoint writing) takes rank and world size from here, so one code path
// serves one process and many. SingleProcess is the identity; the c10d implementation (Gloo on
// CPU, NCCL on CUDA) plugs in behind the same interface.
#pragma once

#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

namespace keel::distributed {

// A collective in flight: wait() returns once it is done (or throws DistError past the timeout).
class PendingWork {
 public:
  virtual ~PendingWork() = default;
  virtual void wait() = 0;
};

// Waits out `work` if any is in flight and drops it, swallowing its error: for a step that has
// already failed (its own error is the one that matters) and must leave nothing in flight.
void wait_quietly(std::unique_ptr<PendingWork>& work);

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  bool is_main() const { return rank() == 0; }
  // A c10d process group, even of one rank: its collectives run (a 1-rank NCCL check on one GPU).
  // SingleProcess skips them.
  virtual bool is_process_group() const { return false; }

  // In-place sum across ranks (tensors on the communicator's device).
  virtual void all_reduce_sum_(std::vector<torch::Tensor>& tensors) = 0;
  // In-place max across ranks.
  virtual void all_reduce_max_(std::vector<torch::Tensor>& tensors) = 0;
  virtual void broadcast_(std::vector<torch::Tensor>& tensors, int root) = 0;
  // Every rank's `tensor` (the same shape on each), concatenated along dim 0 in rank order.
  virtual torch::Tensor all_gather(const torch::Tensor& tensor) = 0;
  virtual void barrier() = 0;
  // A barrier through the rendezvous store instead of the process group, so another thread can
  // pass it while this one runs collectives (the async checkpoint writer). `name` must be the
  // same on every rank and new for each barrier. Throws DistError after distributed.timeout_s.
  virtual void barrier_out_of_band(const std::string& name) { (void)name; }
  // Starts an in-place sum of `flat` across ranks and returns at once, so the caller can go on
  // computing while it runs (gradient buckets during the backward pass). Every rank must start
  // the same collectives in the same order. The default runs it to completion here.
  virtual std::unique_ptr<PendingWork> all_reduce_sum_async_(torch::Tensor flat);
  // Starts a sum of `input` (world_size x output.numel() elements) across ranks of which this
  // rank receives its part, elements [rank * n, (rank + 1) * n), in `output`. Same rules as
  // all_reduce_sum_async_. The default all-reduces `input` and copies the part.
  virtual std::unique_ptr<PendingWork> reduce_scatter_sum_async_(torch::Tensor input,
                                                                 torch::Tensor output);

  // Starts gathering every rank's `input` (the same number of elements on each) into `output`
  // (world_size x input.numel() elements, rank order). Same rules as all_reduce_sum_async_. The
  // default gathers at once.
  virtual std::unique_ptr<PendingWork> all_gather_async_(torch::Tensor input, torch::Tensor output);

  // Averages gradients in place: sum then divide by world size.
  void all_reduce_mean_(std::vector<torch::Tensor>& tensors);

  // Host seconds this process has spent waiting for collectives to finish, since its start. A
  // rank that the others wait for waits least: its step time less this is its own work.
  virtual double seconds_waiting() const { return 0.0; }
  // The host `rank` runs on ("name (address)") as it said at the start, or empty where the job
  // is on one host or the rank did not say.
  virtual std::string host_of(int /*rank*/) const { return {}; }
};

class SingleProcess final : public Communicator {
 public:
  int rank() const override { return 0; }
  int world_size() const override { return 1; }
  void all_reduce_sum_(std::vector<torch::Tensor>&) override {}
  void all_reduce_max_(std::vector<torch::Tensor>&) override {}
  void broadcast_(std::vector<torch::Tensor>&, int) override {}
  torch::Tensor all_gather(const torch::Tensor& tensor) override { return tensor; }
  void barrier() override {}
};

}  // namespace keel::distributed
