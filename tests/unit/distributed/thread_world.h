// Ranks of one process for the distributed unit tests: threads sharing in-process collectives.
#pragma once

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <barrier>
#include <vector>

#include "distributed/communicator.h"

namespace keel::distributed {

// Ranks of one process: all-reduce and all-gather through a shared table and a barrier; the sum
// is taken in rank order, so a test can compute the very same mean.
class ThreadWorld {
  using Tensor = torch::Tensor;

 public:
  explicit ThreadWorld(int world) : world_(world), slots_(world), sync_(world) {}
  Tensor all_gather(int rank, const Tensor& t) {
    slots_[rank] = t.clone();
    sync_.arrive_and_wait();  // every part is in
    Tensor all = torch::cat(slots_);
    sync_.arrive_and_wait();  // every rank has read them before any writes the next
    return all;
  }
  void all_reduce_sum(int rank, Tensor& t) {
    slots_[rank] = t.clone();
    sync_.arrive_and_wait();
    Tensor sum = slots_[0].clone();
    for (int r = 1; r < world_; ++r) sum += slots_[r];
    sync_.arrive_and_wait();
    t.copy_(sum);
  }

 private:
  int world_;
  std::vector<Tensor> slots_;
  std::barrier<> sync_;
};

class ThreadComm final : public Communicator {
  using Tensor = torch::Tensor;

 public:
  ThreadComm(ThreadWorld* world, int rank, int size) : world_(world), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  bool is_process_group() const override { return world_ != nullptr; }
  void all_reduce_sum_(std::vector<Tensor>& tensors) override {
    for (auto& t : tensors) world_->all_reduce_sum(rank_, t);
  }
  void all_reduce_max_(std::vector<Tensor>&) override { ADD_FAILURE() << "not used"; }
  void broadcast_(std::vector<Tensor>&, int) override { ADD_FAILURE() << "not used"; }
  Tensor all_gather(const Tensor& t) override { return world_->all_gather(rank_, t); }
  void barrier() override {}

 private:
  ThreadWorld* world_;  // null: a rank that only loads state
  int rank_, size_;
};

}  // namespace keel::distributed
