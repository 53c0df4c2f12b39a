// ZeRO-1 against the plain optimizer: ranks that each update their part and all-gather the rest
// end with the very weights one rank updating everything gets, and the parts they save load back
// at any world size. The ranks are threads sharing an in-process all-gather.
#include "dist/zero_optimizer.h"

#include <gtest/gtest.h>

#include <barrier>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "common/error.h"

namespace keel::dist {
namespace {

using torch::Tensor;
using Named = std::vector<std::pair<std::string, Tensor>>;

// Ranks of one process: all_gather through a shared table and a barrier; nothing else is used.
class ThreadWorld {
 public:
  explicit ThreadWorld(int world) : world_(world), slots_(world), sync_(world) {}
  int world() const { return world_; }
  Tensor all_gather(int rank, const Tensor& t) {
    slots_[rank] = t.clone();
    sync_.arrive_and_wait();  // every part is in
    Tensor all = torch::cat(slots_);
    sync_.arrive_and_wait();  // every rank has read them before any writes the next
    return all;
  }

 private:
  int world_;
  std::vector<Tensor> slots_;
  std::barrier<> sync_;
};

class ThreadComm final : public Communicator {
 public:
  ThreadComm(ThreadWorld* world, int rank, int size) : world_(world), rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int world_size() const override { return size_; }
  bool is_process_group() const override { return world_ != nullptr; }
  void all_reduce_sum_(std::vector<Tensor>&) override { FAIL() << "not used by ZeRO-1"; }
  void all_reduce_max_(std::vector<Tensor>&) override { FAIL() << "not used by ZeRO-1"; }
  void broadcast_(std::vector<Tensor>&, int) override { FAIL() << "not used by ZeRO-1"; }
  Tensor all_gather(const Tensor& t) override { return world_->all_gather(rank_, t); }
  void barrier() override {}

 private:
  ThreadWorld* world_;  // null: a rank that only loads state
  int rank_, size_;
};

// A small model's parameters: 2-D weights (decayed) and 1-D gains (not), 287 elements in all, so
// that parts of 2 and 3 ranks cut through parameters.
Named make_params() {
  torch::manual_seed(7);
  return {{"emb.weight", torch::randn({10, 8})},    {"layer0.attn.weight", torch::randn({8, 8})},
          {"layer0.norm.weight", torch::ones({8})}, {"layer1.mlp.weight", torch::randn({12, 8})},
          {"layer1.norm.weight", torch::ones({8})}, {"head.weight", torch::randn({3, 8})},
          {"head.bias", torch::zeros({7})}};
}

Named copy_of(const Named& params) {
  Named out;
  for (const auto& [n, p] : params) out.emplace_back(n, p.detach().clone().requires_grad_());
  return out;
}

config::OptimConfig adamw() {
  config::OptimConfig cfg;
  cfg.lr = 1e-2;
  cfg.weight_decay = 0.1;
  return cfg;
}

// The gradient of step `step` for parameter `i`: the same on every rank (already averaged).
Tensor grad_of(int step, size_t i, const Tensor& p) {
  auto gen = at::detail::createCPUGenerator(1000 * step + static_cast<uint64_t>(i));
  return at::randn(p.sizes(), gen);
}

void train(optim::Optimizer& opt, Named& params, int steps) {
  for (int s = 0; s < steps; ++s) {
    for (size_t i = 0; i < params.size(); ++i)
      params[i].second.mutable_grad() = grad_of(s, i, params[i].second);
    opt.step(1e-2);
    opt.zero_grad();
  }
}

// Runs `world` ranks of ZeRO-1 for `steps` and returns each rank's parameters and state.
struct RankResult {
  Named params;
  std::map<std::string, Tensor> state;
};
std::vector<RankResult> train_sharded(int world, int steps) {
  ThreadWorld shared(world);
  const Named init = make_params();  // here: the global generator is not for threads to share
  std::vector<RankResult> out(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      ThreadComm comm(&shared, r, world);
      out[r].params = copy_of(init);
      auto opt = make_zero_optimizer(out[r].params, adamw(), comm);
      train(*opt, out[r].params, steps);
      out[r].state = opt->state_dict();
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(ZeroOptimizer, ShardRangesCoverTheFlatOrderOnceInRankOrder) {
  for (int64_t n : {0, 1, 7, 10, 287, 1000})
    for (int world : {1, 2, 3, 4, 8}) {
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const ShardRange s = shard_range(n, r, world);
        EXPECT_EQ(s.begin, next) << n << " " << world << " " << r;
        EXPECT_LE(s.size(), (n + world - 1) / world);
        EXPECT_GE(s.size(), 0);
        next = s.end;
      }
      EXPECT_EQ(next, n);
    }
}

TEST(ZeroOptimizer, OneRankUpdatesAsThePlainOptimizer) {
  Named plain = copy_of(make_params()), sharded = copy_of(make_params());
  auto reference = optim::make_optimizer(optim::make_param_groups(plain, adamw()), adamw());
  ThreadComm one(nullptr, 0, 1);
  auto zero = make_zero_optimizer(sharded, adamw(), one);
  train(*reference, plain, 5);
  train(*zero, sharded, 5);
  for (size_t i = 0; i < plain.size(); ++i)
    EXPECT_TRUE(torch::equal(plain[i].second, sharded[i].second)) << plain[i].first;
  EXPECT_FALSE(sharded[0].second.grad().defined());  // zero_grad reached the model
  EXPECT_NE(zero->describe().find("zero1"), std::string::npos);
}

TEST(ZeroOptimizer, RanksThatEachUpdateTheirPartEndWithOneRanksWeights) {
  Named plain = copy_of(make_params());
  auto reference = optim::make_optimizer(optim::make_param_groups(plain, adamw()), adamw());
  train(*reference, plain, 5);
  for (int world : {2, 3}) {
    auto ranks = train_sharded(world, 5);
    for (int r = 0; r < world; ++r)
      for (size_t i = 0; i < plain.size(); ++i)
        EXPECT_TRUE(torch::equal(plain[i].second, ranks[r].params[i].second))
            << "world " << world << " rank " << r << " " << plain[i].first;
    // Each keeps only its part of the moments.
    int64_t held = 0;
    for (int r = 0; r < world; ++r) held += ranks[r].state.at("zero.exp_avg").numel();
    EXPECT_EQ(held, 287);
    EXPECT_LE(ranks[0].state.at("zero.exp_avg").numel(), (287 + world - 1) / world);
  }
}

// The parts saved by 2 ranks, given as load_checkpoint gives them at another world size, load at
// 1 and at 3 ranks into exactly the state those world sizes would have had.
TEST(ZeroOptimizer, PartsSavedAtOneWorldSizeLoadAtAnother) {
  auto two = train_sharded(2, 4);
  std::map<std::string, Tensor> saved;
  for (int r = 0; r < 2; ++r)
    for (auto& [k, v] : two[r].state) saved["rank" + std::to_string(r) + "/" + k] = v;
  ASSERT_TRUE(is_sharded_state(saved));

  auto one = train_sharded(1, 4);  // the state one rank has after the same steps
  Named params = copy_of(make_params());
  ThreadComm alone(nullptr, 0, 1);
  auto loaded = make_zero_optimizer(params, adamw(), alone);
  loaded->load_state_dict(saved);
  const auto state = loaded->state_dict();
  for (const auto& [k, v] : one[0].state) {
    ASSERT_TRUE(state.count(k)) << k;
    EXPECT_TRUE(torch::equal(state.at(k), v)) << k;
  }

  for (int r = 0; r < 3; ++r) {  // each of 3 ranks takes its range of the same flat state
    ThreadComm rank(nullptr, r, 3);
    Named p = copy_of(make_params());
    auto opt = make_zero_optimizer(p, adamw(), rank);
    opt->load_state_dict(saved);
    const ShardRange range = shard_range(287, r, 3);
    for (const char* what : {"zero.exp_avg", "zero.exp_avg_sq"})
      EXPECT_TRUE(torch::equal(opt->state_dict().at(what),
                               one[0].state.at(what).narrow(0, range.begin, range.size())))
          << what << " rank " << r;
  }

  // Its own state_dict back (the in-memory snapshot a rollback restores) is the same round trip.
  auto again = make_zero_optimizer(params, adamw(), alone);
  again->load_state_dict(state);
  EXPECT_TRUE(torch::equal(again->state_dict().at("zero.exp_avg_sq"), state.at("zero.exp_avg_sq")));
}

TEST(ZeroOptimizer, StateOfAnotherKindOrModelIsRefusedNamingWhy) {
  Named params = copy_of(make_params());
  ThreadComm alone(nullptr, 0, 1);
  auto zero = make_zero_optimizer(params, adamw(), alone);
  auto plain = optim::make_optimizer(optim::make_param_groups(params, adamw()), adamw());
  try {
    zero->load_state_dict(plain->state_dict());
    FAIL() << "loaded an unsharded state";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("distributed.zero: 0"), std::string::npos) << e.what();
  }
  Named smaller = copy_of(make_params());
  smaller.pop_back();
  auto other = make_zero_optimizer(smaller, adamw(), alone);
  try {
    zero->load_state_dict(other->state_dict());
    FAIL() << "loaded the state of another model";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("280 parameter elements"), std::string::npos) << e.what();
  }
  const auto ranks = train_sharded(2, 1);
  std::map<std::string, Tensor> half;  // a rank's file missing: part of the range uncovered
  for (auto& [k, v] : ranks[0].state) half["rank0/" + k] = v;
  try {
    zero->load_state_dict(half);
    FAIL() << "loaded half of the state";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("cover"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::dist
