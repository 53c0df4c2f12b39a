// GradReducer against a stand-in for the other rank: every collective it starts is recorded (in
// order, with the moment it started), and "the other rank" contributes a known gradient.
#include "distributed/grad_reducer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace keel::distributed {
namespace {

// A world of two where the other rank's gradients are `other` times this rank's.
class RecordingComm final : public Communicator {
 public:
  explicit RecordingComm(double other) : other_(other) {}
  int rank() const override { return 0; }
  int world_size() const override { return 2; }
  void all_reduce_sum_(std::vector<torch::Tensor>& tensors) override {
    for (auto& t : tensors) t.mul_(1.0 + other_);
  }
  void all_reduce_max_(std::vector<torch::Tensor>&) override {}
  void broadcast_(std::vector<torch::Tensor>&, int) override {}
  torch::Tensor all_gather(const torch::Tensor& t) override { return torch::cat({t, t}); }
  void barrier() override {}
  std::unique_ptr<PendingWork> all_reduce_sum_async_(torch::Tensor flat) override {
    started.push_back({flat.numel(), phase});
    return Communicator::all_reduce_sum_async_(std::move(flat));
  }

  struct Start {
    int64_t numel;
    std::string phase;  // what the test was doing when the collective started
  };
  std::vector<Start> started;
  std::string phase;

 private:
  double other_;
};

// Three "layers" of 300k floats (1.2 MB) each: with bucket_mb 1 every layer is its own bucket.
struct Net {
  std::vector<torch::Tensor> params;
  Net() {
    for (int i = 0; i < 3; ++i) params.push_back(torch::full({300000}, 0.5).requires_grad_());
  }
  torch::Tensor loss(double w) const {  // d loss / d p_i = w * (i + 1)
    torch::Tensor l = torch::zeros({});
    for (size_t i = 0; i < params.size(); ++i)
      l = l + params[i].sum() * (w * static_cast<double>(i + 1));
    return l;
  }
};

TEST(GradReducer, BucketsStartDuringTheBackwardInOrderAndAverageOverRanks) {
  Net net;
  RecordingComm comm(/*other=*/3.0);  // the other rank's gradient is 3x: the mean is 2x
  GradReducer reducer(comm, net.params, /*bucket_mb=*/1.0);
  ASSERT_EQ(reducer.buckets(), 3);

  comm.phase = "backward";
  reducer.arm();
  net.loss(1.0).backward();
  comm.phase = "finish";
  reducer.finish();

  ASSERT_EQ(comm.started.size(), 3u);
  for (const auto& s : comm.started) {
    EXPECT_EQ(s.phase, "backward");  // overlapped: none waited for finish()
    EXPECT_EQ(s.numel, 300000);
  }
  EXPECT_EQ(reducer.started_in_backward(), 3);
  for (size_t i = 0; i < net.params.size(); ++i)
    EXPECT_TRUE(net.params[i].grad().eq(2.0 * static_cast<double>(i + 1)).all().item<bool>()) << i;
}

TEST(GradReducer, OnlyTheArmedBackwardCommunicatesAndAccumulatedGradientsAreReduced) {
  Net net;
  RecordingComm comm(/*other=*/1.0);  // the mean equals this rank's gradient
  GradReducer reducer(comm, net.params, /*bucket_mb=*/64.0);
  comm.phase = "micro 0";
  net.loss(1.0).backward();  // not armed: a non-final micro-step of gradient accumulation
  EXPECT_TRUE(comm.started.empty());
  comm.phase = "micro 1";
  reducer.arm();
  net.loss(1.0).backward();
  reducer.finish();
  EXPECT_FALSE(reducer.armed());
  ASSERT_FALSE(comm.started.empty());
  for (const auto& s : comm.started) EXPECT_EQ(s.phase, "micro 1");
  for (size_t i = 0; i < net.params.size(); ++i)  // both micro-steps' sum, averaged over ranks
    EXPECT_TRUE(net.params[i].grad().eq(2.0 * static_cast<double>(i + 1)).all().item<bool>()) << i;
}

TEST(GradReducer, AParameterWithoutAGradientStillTakesPartInOrder) {
  Net net;
  RecordingComm comm(/*other=*/1.0);
  GradReducer reducer(comm, net.params, /*bucket_mb=*/1.0);
  comm.phase = "backward";
  reducer.arm();
  (net.params[1].sum() + net.params[2].sum()).backward();  // params[0] unused this step
  comm.phase = "finish";
  reducer.finish();
  // Buckets run in reverse parameter order: params[2], params[1] overlap; params[0]'s bucket
  // is started by finish() with zeros, so the other rank's collective still has its partner.
  ASSERT_EQ(comm.started.size(), 3u);
  EXPECT_EQ(comm.started[0].phase, "backward");
  EXPECT_EQ(comm.started[1].phase, "backward");
  EXPECT_EQ(comm.started[2].phase, "finish");
  ASSERT_TRUE(net.params[0].grad().defined());
  EXPECT_TRUE(net.params[0].grad().eq(0.0).all().item<bool>());
}

}  // namespace
}  // namespace keel::distributed
