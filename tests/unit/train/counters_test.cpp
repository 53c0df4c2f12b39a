// The trainer's counters through trainer_state.json, in the same and in another layout.
#include "train/counters.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace keel::train {
namespace {

TrainCounters sample() {
  TrainCounters c;
  c.step = 30;
  c.iteration = 33;
  c.micro_taken = 36;  // 36 micro-batches of 8 on each of 2 ranks: 576 samples
  c.quarantined_micro = 4;
  c.last_eval_step = 25;
  return c;
}

TEST(TrainCounters, RoundTripInTheSameLayout) {
  nlohmann::json state = nlohmann::json::object();
  sample().to_json(state, 8, 2, 64);
  EXPECT_EQ(state["samples_seen"], 576);
  const TrainCounters back = TrainCounters::from_json(state, 8, 2);
  EXPECT_EQ(back.step, 30);
  EXPECT_EQ(back.iteration, 33);
  EXPECT_EQ(back.micro_taken, 36);
  EXPECT_EQ(back.quarantined_micro, 4);
  EXPECT_EQ(back.last_eval_step, 25);
}

// A resume at another world size counts the same samples in its own micro-batches.
TEST(TrainCounters, MapsOntoAnotherWorldSize) {
  nlohmann::json state = nlohmann::json::object();
  sample().to_json(state, 8, 2, 64);
  const TrainCounters one = TrainCounters::from_json(state, 16, 1);
  EXPECT_EQ(one.micro_taken, 36);
  const TrainCounters four = TrainCounters::from_json(state, 8, 4);
  EXPECT_EQ(four.micro_taken, 18);
  EXPECT_EQ(four.quarantined_micro, 2);
  EXPECT_EQ(four.step, 30);
  EXPECT_THROW(TrainCounters::from_json(state, 5, 1), CheckpointError);  // 576 / 5
}

TEST(TrainCounters, NamesAMissingCounter) {
  nlohmann::json state = {{"step", 1}};
  try {
    TrainCounters::from_json(state, 8, 1);
    FAIL() << "no error for a state without counters";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("iteration"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace keel::train
